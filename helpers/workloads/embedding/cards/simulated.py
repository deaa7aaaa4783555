"""A simulated card: what a GPU would take to run a transformer's forward pass, without the GPU.

Everything around the forward pass stays real (reading, the model's own tokenizer, batching,
collating, the writer); the forward pass becomes a wait that holds no CPU and no GIL, as a card's
kernels do, and the launching of its kernels is CPU time spent on the worker's thread, as it is on
a real card. So a run on a simulated card shows what the study asks: whether the CPU side keeps a
card of that speed busy.

The cost model of one batch of ``b`` texts padded to ``L`` tokens, for a model of ``n`` layers,
hidden size ``h`` and feed-forward size ``i``:

- FLOPs: ``2 · b · L · n · (4h² + 2hi)`` (the matrix products) ``+ 4 · b · n · L² · h``
  (attention's scores and weighted sum: the quadratic term);
- card seconds: FLOPs ÷ the card's effective rate, at least ``kernels × KERNEL_FLOOR_US``;
- the effective rate comes from the card's measured or estimated tokens per second for the
  reference model (all-MiniLM-L6-v2 at 128 tokens: ``REFERENCE``) times that model's FLOPs a
  token, so a larger model or longer texts cost what their arithmetic says;
- launching: ``kernels = n · KERNELS_PER_LAYER + KERNELS_OUTSIDE`` kernels of the profile's
  ``launch_us`` CPU each (``LAUNCH_US`` for a card not measured), spun on the launching thread;
- with CUDA graphs (``graphs``: the torch card's, helpers.workloads.embedding.cards.graphs): the
  batch is computed as its bucket (rows to a power of two, tokens to a multiple of 8), and its
  launch is GRAPH_OPS calls at the profile's CPU a kernel each (the copies into the bucket, the
  replay, the rows out; dear: the profile's figure holds the modules' Python too) instead of a
  call a kernel; the card's rate and its kernels' floor are the same (a graph launches the same
  kernels). An estimate until a card measures a graphed pass's launching CPU.

The profiles: the H100, A100 and L4 from cited figures (``source``); the H200 and its compiled
variant calibrated from the one card this project measured (its rate from the forward's largest
batches, its launch CPU from the smallest, where the launches bound the card).

A *scaled* card (``cores`` given) divides the card's rate by the cores a real machine gives each
GPU and multiplies it by the cores this machine has, so the ratio of CPU to card is a real node's
(the device machines here: 16 cores for one GPU; an 8-GPU node gives each card 12 to 16).

Several workers on one card share it: each batch starts when the card is free (its queue, kept in
a small file every worker copy maps, so that processes share it as they share a real card), and a
worker waits for its own batches only when it needs their results (at the end of its workunit, as
``encode`` copies the embeddings back).

``SimulatedCard`` is that queue behind the cards' protocol (``helpers.workloads.embedding.cards``):
the feeder that feeds it is the one real models are fed by; its rows are zeros of the model's
width.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from helpers.workloads.embedding.cards import host_staging

LAUNCH_US = 5.0  # CPU a kernel launch costs in eager PyTorch (CUDA's launch, 2-5 µs, plus
# PyTorch's dispatch of the op)
KERNEL_FLOOR_US = 2.0  # the least a kernel takes on the card
KERNELS_PER_LAYER = 16  # a BERT layer in eager PyTorch: 4 projections, 2 attention products,
# softmax, 2 feed-forward products, GELU, 2 residual adds, 2 layer norms, masks and reshapes
KERNELS_OUTSIDE = 8  # embeddings, their norm, pooling, normalizing, the copies
GRAPH_OPS = 5  # a graphed batch's calls: ids and mask into its bucket, the mask's tail zeroed,
# the replay, the rows cloned out (cards/graphs.py), the profile's launch_us each: not measured
REFERENCE = {"name": "all-MiniLM-L6-v2", "layers": 6, "hidden": 384, "intermediate": 1536,
             "tokens": 128}  # what each card's rate is given for
H200_SOURCE = ("measured: this project's GPU check on one H200 with 16 host cores "
               "(data/results/gpu/gpu_model.csv, commit 6c41bae, 2026-11-28), MiniLM-L6's "
               "forward alone, {variant}: {rate} TFLOP/s of this cost model at batch {at} (the "
               "rate), {batch} ms a batch at batch 64, where the launches bound it (taken as "
               "the launching thread's CPU, 104 modelled kernels a batch; the check now "
               "measures that thread's CPU, cpu_s, and the next card run confirms it or not)")
# (tests/test_cards.py recomputes both figures from the committed table)


@dataclass(frozen=True)
class CardProfile:
    """A card's speed on the reference model, and where the figure comes from; ``launch_us``:
    the launching thread's CPU per modelled kernel (a measured card's own; else LAUNCH_US)."""

    name: str
    tokens_per_second: float  # REFERENCE model, 128-token texts
    source: str
    launch_us: float = LAUNCH_US

    def flops_per_second(self) -> float:
        """The card's effective rate, in FLOP/s of the cost model."""
        return self.tokens_per_second * flops_per_token(
            REFERENCE["layers"], REFERENCE["hidden"], REFERENCE["intermediate"],
            REFERENCE["tokens"])


CARDS = {card.name: card for card in (
    CardProfile("h100", 17.5e6,
                "arithmetic in ANCHORS.md: IgniteMS's A100 figure (3.41 M tokens/s, e5-small, "
                "TensorRT fp16; Artain-AI/ignite-ms BENCHMARKING.md) scaled by the H100's "
                "2.15x bandwidth to 3.2x compute: 14-21 M tokens/s, the middle"),
    CardProfile("a100", 6.8e6,
                "IgniteMS: 50,127 texts/s of ~68 tokens for e5-small-v2 (12 layers) on one "
                "A100 (Artain-AI/ignite-ms BENCHMARKING.md), 3.41 M tokens/s; MiniLM-L6 has "
                "half its layers: ~6.8 M tokens/s"),
    CardProfile("l4", 1.6e6,
                "estimate: the A100's figure times the L4's share of its memory bandwidth "
                "(300 of 1,555 GB/s, NVIDIA datasheets) and of its dense bf16 rate (121 of "
                "312 TFLOP/s): between 0.19x and 0.39x, taken at 0.24x"),
    CardProfile("h200", 9.07e6, H200_SOURCE.format(
        variant="fp16 eager", rate=203.2, at=1024, batch=3.25), launch_us=31.3),
    CardProfile("h200-compiled", 1.08e7, H200_SOURCE.format(
        variant="fp16 torch.compile (default mode)", rate=242.5, at=1024, batch=1.97),
        launch_us=18.9),
)}


def flops_per_token(layers: int, hidden: int, intermediate: int, tokens: int) -> float:
    """The forward pass's FLOPs a token in a ``tokens``-long text (the module docstring)."""
    matrices = 2 * layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    return matrices + 4 * layers * tokens * hidden


def parse_card(card: str) -> CardProfile:
    """The profile called ``card`` (one of CARDS); ValueError naming the choices."""
    found = CARDS.get(str(card).lower()) if isinstance(card, str) else None
    if found is None:
        raise ValueError(f"card: expected one of {', '.join(CARDS)}, got {card!r}")
    return found


@dataclass(frozen=True)
class CardModel:
    """A card's cost model for one model: seconds a batch takes, CPU its launch costs."""

    profile: CardProfile
    layers: int
    hidden: int
    intermediate: int
    scale: float = 1.0  # the card's rate times this (a scaled card: cores here ÷ cores per GPU)
    graphs: tuple[int, int] | None = None  # with CUDA graphs: the buckets' bounds (the batch
    # size, the longest text in tokens); None: eager

    @property
    def kernels(self) -> int:
        return self.layers * KERNELS_PER_LAYER + KERNELS_OUTSIDE

    def launch_s(self) -> float:
        calls = GRAPH_OPS if self.graphs is not None else self.kernels
        return calls * self.profile.launch_us / 1e6

    def shape(self, texts: int, tokens: int) -> tuple[int, int]:
        """What a batch of ``texts`` padded to ``tokens`` is computed as (with graphs: its
        bucket)."""
        if self.graphs is None:
            return texts, tokens
        from helpers.workloads.embedding.cards.graphs import bucket

        return bucket(texts, tokens, *self.graphs)

    def seconds(self, texts: int, tokens: int) -> float:
        """The card's time for a batch of ``texts`` texts padded to ``tokens`` tokens."""
        texts, tokens = self.shape(texts, tokens)
        flops = texts * tokens * flops_per_token(self.layers, self.hidden, self.intermediate,
                                                 tokens)
        return max(flops / (self.profile.flops_per_second() * self.scale),
                   self.kernels * KERNEL_FLOOR_US / 1e6)


def scale_for(cores: int | None, here: int) -> float:
    """A scaled card's factor: ``here`` cores against the ``cores`` a real node gives each GPU
    (None: the card at full speed)."""
    return 1.0 if cores is None else here / cores


def spin(seconds: float) -> None:
    """Hold this thread (and the GIL, as Python's dispatch of each op does) for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class CardQueue:
    """One simulated card's queue of batches, shared by every worker copy on it.

    ``submit`` launches a batch (CPU spun on the calling thread) and queues its work after
    whatever the card holds; ``wait`` sleeps until the last batch this thread submitted is done
    (or until an earlier moment ``done`` gave: the batches submitted by then).
    The queue's end is a float64 of CLOCK_MONOTONIC (the same in every process of the machine)
    in ``path``, under a lock: threads of one process and processes share it.
    """

    _FORMAT = "dd"  # the queue's end; the card's busy seconds since the file was made

    def __init__(self, model: CardModel, path: str) -> None:
        self.model, self.path = model, path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = struct.calcsize(self._FORMAT)
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._file = open(path, "rb")  # (flock's handle)
        self._lock, self._local = threading.Lock(), threading.local()
        weakref.finalize(self, _close, self._map, self._file)

    def submit(self, texts: int, tokens: int) -> float:
        """Launch a batch; returns the card's seconds for it (what the card is busy with)."""
        spin(self.model.launch_s())
        seconds = self.model.seconds(texts, tokens)
        with self._lock:
            fcntl.flock(self._file, fcntl.LOCK_EX)
            try:
                end, busy = struct.unpack_from(self._FORMAT, self._map)
                done = max(time.monotonic(), end) + seconds
                struct.pack_into(self._FORMAT, self._map, 0, done, busy + seconds)
            finally:
                fcntl.flock(self._file, fcntl.LOCK_UN)
        self._local.done = max(getattr(self._local, "done", 0.0), done)
        return seconds

    def done(self) -> float:
        """When this thread's batches so far will be done (CLOCK_MONOTONIC)."""
        return getattr(self._local, "done", 0.0)

    def wait(self, until: float | None = None) -> float:
        """Sleep (no CPU, no GIL) until ``until`` (what ``done`` said), else until this thread's
        batches are done; the seconds waited."""
        left = (self.done() if until is None else until) - time.monotonic()
        if left > 0:
            time.sleep(left)
        return max(0.0, left)

    def busy_s(self) -> float:
        """Every worker's batches on this card so far, in card seconds."""
        return struct.unpack_from(self._FORMAT, self._map)[1]

    def queue_end(self) -> float:
        """When the card will have done every batch queued so far (CLOCK_MONOTONIC)."""
        return struct.unpack_from(self._FORMAT, self._map)[0]

    def __getstate__(self) -> Any:
        raise TypeError("a CardQueue is opened in each worker (its path travels, not the "
                        "queue)")


def _close(mapped: mmap.mmap, handle: Any) -> None:
    mapped.close()
    handle.close()


@dataclass(frozen=True)
class SimulatedTicket:
    """A batch on the simulated card: when the card will be done with it, its card seconds, the
    tokens it computed (its bucket's, with graphs)."""

    done: float
    busy_s: float
    texts: int
    tokens: int


class SimulatedCard:
    """The cards' protocol over a ``CardQueue``: ``submit`` spins the launch's CPU and queues
    the batch's cost; ``collect`` sleeps until the card is done with the batches asked for and
    gives zeros of the model's width."""

    asynchronous = True

    def __init__(self, queue: CardQueue, dim: int, label: str) -> None:
        self.queue, self.dim, self.label = queue, dim, label

    def staging(self, texts: int, tokens: int) -> tuple[Any, Any]:
        return host_staging(texts, tokens)

    def submit(self, ids: Any, mask: Any) -> SimulatedTicket:
        texts, tokens = (int(n) for n in ids.shape)
        seconds = self.queue.submit(texts, tokens)
        rows, length = self.queue.model.shape(texts, tokens)
        return SimulatedTicket(self.queue.done(), seconds, texts, rows * length)

    def collect(self, tickets: list[SimulatedTicket]) -> list[Any]:
        if tickets:
            self.queue.wait(max(ticket.done for ticket in tickets))
        return [np.zeros((ticket.texts, self.dim), dtype=np.float32) for ticket in tickets]
