"""The path through sentence-transformers' own ``encode``: the reference every other path is
compared with (the quality guard, the tests), and the path of a model the feeder cannot run
(helpers.workloads.embedding.cards says which).

``encode`` tokenizes with the wrapper (transformers' Python around the Rust tokenizer) and waits
for each batch; what gpufeed adds around it: batches by token count (``TokenOrder``), the next
batch tokenized ahead in a helper thread (``TokenizeAhead``), and where the time goes
(``PhaseClock``).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from helpers.workloads.embedding.runtimes import token_lengths

PHASES = ("tokenize", "forward", "copy_out")  # copy_out: the rest of encode (to the device,
# normalizing, back to the host, reordering, to NumPy)


def tokenizer_name(model: Any) -> str:
    """The method ``encode`` tokenizes a batch with: ``preprocess`` (sentence-transformers 6),
    ``tokenize`` before."""
    return "preprocess" if hasattr(model, "preprocess") else "tokenize"


def encode_order(model: Any, texts: list[str]) -> np.ndarray:
    """The order ``encode`` batches ``texts`` in: longest first (interleaved where the model
    flattens its inputs), as sentence-transformers computes it."""
    length = getattr(model, "_input_length", len)
    order = np.argsort([-length(text) for text in texts])
    flatten = getattr(model, "_can_flatten_inputs", None)
    if flatten is not None and flatten():
        order = model._interleave_sorted_indices(order)
    return order


class TokenizeAhead:
    """A model's tokenizer, run one batch ahead in a helper thread while ``encode`` runs the
    forward pass of the current batch (``EmbeddingWorkload(tokenize_ahead=True)``).

    ``expect(batches)`` tells it the batches the next ``encode`` call will ask for, in order (see
    ``encode_order``); when ``encode`` asks for batch k, the answer is the one tokenized while batch
    k - 1 ran, and batch k + 1 starts. A batch asked for that was not expected (another
    sentence-transformers version ordering them otherwise) is tokenized there and then: never a
    wrong answer, only no gain. State is per calling thread (threads may share one model).
    """

    def __init__(self, tokenize: Any) -> None:
        self.tokenize, self._local = tokenize, threading.local()

    def _helper(self) -> ThreadPoolExecutor:
        if not hasattr(self._local, "helper"):  # one per worker thread, for its life
            self._local.helper = ThreadPoolExecutor(1, thread_name_prefix="gpufeed-tokenize")
        return self._local.helper

    def expect(self, batches: list[list[str]]) -> None:
        self._local.batches, self._local.ahead = batches, None

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        batches = getattr(self._local, "batches", [])
        ahead: tuple[int, tuple, Future] | None = getattr(self._local, "ahead", None)
        position = ahead[0] if ahead is not None else 0
        if position < len(batches) and list(inputs) == batches[position] and \
                (ahead is None or ahead[1] == (args, kwargs)):
            features = ahead[2].result() if ahead is not None else \
                self.tokenize(inputs, *args, **kwargs)
            following = position + 1
            self._local.ahead = None if following >= len(batches) else (
                following, (args, kwargs),
                self._helper().submit(self.tokenize, batches[following], *args, **kwargs))
            return features
        return self.tokenize(inputs, *args, **kwargs)


class TokenOrder:
    """Makes ``encode`` batch texts by their token counts, not their characters (``encode``
    sorts by ``model._input_length``: here a look-up of the counts ``measure`` found for the
    calling thread's texts; a text it did not measure falls back to characters). Sorted by
    characters, the sample's batches computed 1.30x the tokens they needed; by tokens, 1.01x.
    """

    def __init__(self, model: Any) -> None:
        self.model, self._local = model, threading.local()
        model._input_length = self._length  # (the instance's attribute: encode's sort key)

    def measure(self, texts: list[str]) -> None:
        self._local.lengths = dict(zip(texts, token_lengths(self.model, texts)))

    def _length(self, text: Any) -> int:
        lengths = getattr(self._local, "lengths", None)
        found = lengths.get(text) if lengths is not None and isinstance(text, str) else None
        return found if found is not None else len(text)


class PhaseClock:
    """Where a model's ``encode`` calls spend their time, per calling thread (threads may share
    one model): tokenizing (the model's ``preprocess``, or ``tokenize`` in older
    sentence-transformers), the forward pass (from its first module's start to its last module's
    end; on CUDA it waits for the device, so the time is the GPU's, not the launch's), and the rest.
    """

    def __init__(self, model: Any, cuda: bool) -> None:
        self._local, self.cuda = threading.local(), cuda
        name = tokenizer_name(model)
        tokenize = getattr(model, name)  # with tokenize_ahead: the wait for the helper's batch

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                features = tokenize(*args, **kwargs)
            finally:
                self._add("tokenize", time.perf_counter() - started)
            self.count(features)
            return features

        setattr(model, name, timed)  # encode calls self.<name>: the instance's attribute wins
        modules = list(model.children())
        modules[0].register_forward_pre_hook(self._forward_starts)
        modules[-1].register_forward_hook(self._forward_ends)

    def _totals(self) -> dict[str, float]:
        if not hasattr(self._local, "totals"):
            self._local.totals = {}
        return self._local.totals

    def count(self, features: Any) -> None:
        """A batch's tokens: those its forward pass computes (the padded batch), those its
        texts needed (padding: the ratio)."""
        mask = features.get("attention_mask") if hasattr(features, "get") else None
        if mask is not None:
            totals = self._totals()
            totals["tokens_computed"] = totals.get("tokens_computed", 0) + int(mask.numel())
            totals["tokens_needed"] = totals.get("tokens_needed", 0) + int(mask.sum())

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

    def add(self, phase: str, seconds: float) -> None:
        """Time spent in ``phase`` outside the model's own calls (counting tokens to sort)."""
        self._add(phase, seconds)

    def stop(self) -> None:
        self._local.seconds = time.perf_counter() - self._local.started

    def take(self) -> dict[str, float]:
        """This thread's last call, from ``start`` to ``stop``, by phase."""
        totals = self._totals()
        tokenize, forward = totals.get("tokenize", 0.0), totals.get("forward", 0.0)
        seconds = getattr(self._local, "seconds", 0.0)
        return {"tokenize": tokenize, "forward": forward,
                "copy_out": max(0.0, seconds - tokenize - forward)}

    def take_counts(self) -> dict[str, int]:
        """This thread's last call's tokens (``count``)."""
        totals = self._totals()
        return {k: int(totals.get(k, 0)) for k in ("tokens_computed", "tokens_needed")}
