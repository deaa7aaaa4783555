"""CUDA graphs of the torch card's forward pass: one per padded batch shape, replayed by one call.

Eager PyTorch launches each of a forward pass's kernels from Python: on a fast card the launching
thread, not the card, sets the pace (the H200 ran all-MiniLM-L6-v2 at 78,000 texts/s eager and
99,000 compiled from pre-tokenized batches; docs/gpu-check.md). A CUDA graph replays the whole
pass (transformer, pooling, dense, normalize, ``truncate_dim``) with one launch. A graph holds
one shape, so a batch is padded up to a **bucket**: its rows to the next power of two (at least
MIN_ROWS, at most the batch size), its tokens to the next multiple of LENGTH_STEP (at most the
model's ``max_seq_length``). The padded tokens are masked out of attention and pooling, so the
vectors are the eager pass's (tests/test_graphs.py); the padding is counted in the tokens
the card computed (a ticket's ``tokens``), as the feeder counts its own.

A bucket owns static buffers on the device: ids and mask, and the graph's output. A batch (on
the device, on the forward's stream) is copied into the top-left corner of its bucket's ids and
mask, the mask's columns past its tokens zeroed for its rows; the rows below it keep an earlier
batch's texts of that bucket (or one padding token: the start), which are computed and dropped.
The graph is replayed and the batch's rows cloned out of its output (the output's memory is the
graph pool's, which the next replay of any bucket may reuse).

The buckets of full batches (``batch_size`` rows) of every length up to the model's (at most
AHEAD_TOKENS) are captured in the worker's load (``capture_ahead``, the longest first, so that
the pool is sized once); any other bucket on its first batch. Each, as torch's recipe does: a
warm-up pass on a side stream, then the capture on that stream
(``capture_error_mode="thread_local"``; without ``torch.cuda.graph``'s device-wide synchronize
and cache flush, which would stall every worker's batches at each new bucket), every graph of
the card in one memory pool. The graphs are the
card's, shared by the threads that feed it (the thread backend's workers share one model): a
process-wide lock makes one capture at a time (torch's documented rule) and one thread at a time
write a bucket's buffers, replay and clone, and a thread's stream waits for the last replay's
event first. transformers builds the attention mask without its data-dependent shortcut
(``mask.all()``, a sync no capture allows) while a stream captures: it asks
``torch.cuda.is_current_stream_capturing``. A card's graph past MAX_GRAPHS runs eager.

The lock is the engine's ``CUDA_GRAPHS_LOCK``, which its ``torch.cuda.empty_cache()`` after an
out-of-memory error also holds: another worker of the thread backend emptying the cache during a
capture would trip torch's allocator.

The CUDA calls are the card's ``CudaCalls`` (``graph``, ``pool``, ``capture``), which tests fake:
the fake capture refuses a sync, as CUDA does, and a second capture under way; its replay runs a
trace of the captured pass (its Python branches as they were at capture) on the static buffers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from helpers.engine.contract.protocol import CUDA_GRAPHS_LOCK

LENGTH_STEP = 8  # a bucket's tokens are a multiple of this: 10,674 of the sample's paragraphs
# (78 tokens on average) sorted by tokens, in batches of 32-512, computed 1.044-1.048x the tokens
# of each batch padded to its longest (steps of 16: 1.09-1.10x; of 32: 1.18-1.19x)
MIN_ROWS = 8  # the fewest rows a bucket has (smaller batches: a workunit's last)
MAX_GRAPHS = 512  # graphs a card captures at most (batch 256, 512 tokens: 6 x 64 buckets; a
# count-batched workunit's batches are full but its last, so most runs see a few rows' buckets)
WARMUPS = 1  # eager passes on the side stream before a bucket's capture
AHEAD_TOKENS = 512  # capture_ahead's longest bucket (longer ones are captured as they come)


def bucket(texts: int, tokens: int, batch_size: int, longest: int) -> tuple[int, int]:
    """The (rows, tokens) a batch of ``texts`` padded to ``tokens`` is computed as: rows the next
    power of two (MIN_ROWS at least, ``batch_size`` at most), tokens the next multiple of
    LENGTH_STEP (``longest``, the model's max_seq_length, at most)."""
    rows = min(max(MIN_ROWS, 1 << (texts - 1).bit_length()), max(batch_size, texts))
    length = min(-(-tokens // LENGTH_STEP) * LENGTH_STEP, max(longest, tokens))
    return rows, length


@dataclass
class _Graph:
    """One bucket's captured pass and its static buffers."""

    graph: Any
    ids: Any
    mask: Any
    out: Any


@dataclass
class GraphCounts:
    """What a card's graphs did: buckets captured, batches replayed, batches run eager (past
    MAX_GRAPHS), the seconds the captures took (warm-up included)."""

    captured: int = 0
    replayed: int = 0
    eager: int = 0
    capture_s: float = 0.0


_LOCK = CUDA_GRAPHS_LOCK  # one capture at a time in a process (and no cache emptied through
# it), and a bucket's buffers written, replayed and read out by one thread at a time


class CardGraphs:
    """The torch card's graphs (the module docstring). ``forward(ids, mask)``: the card's pass
    over device tensors, rows ``[texts, dim]``; ``batch_size``, ``longest``: the buckets'
    bounds; ``pad_id``: the padding token; ``cuda``: the card's CUDA calls."""

    def __init__(self, forward: Callable[[Any, Any], Any], batch_size: int, longest: int,
                 pad_id: int, cuda: Any) -> None:
        self.forward, self.cuda = forward, cuda
        self.batch_size, self.longest, self.pad_id = batch_size, longest, pad_id
        self.counts = GraphCounts()
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self._side, self._pool = cuda.stream(), cuda.pool()  # (made with the card, just
        # after its copy stream: torch's pool of streams hands out two in a row apart)
        self._done: Any = None  # the event after the last replay's rows were cloned

    def run(self, ids: Any, mask: Any) -> tuple[Any, int]:
        """The rows of a batch on the device (``[texts, tokens]`` ids and mask, on the current
        stream), their own memory, and the tokens computed for them (its bucket's)."""
        texts, tokens = int(ids.shape[0]), int(ids.shape[1])
        rows, length = bucket(texts, tokens, self.batch_size, self.longest)
        with _LOCK:
            current = self.cuda.current()
            graph = self.graphs.get((rows, length))
            if graph is None and len(self.graphs) >= MAX_GRAPHS:
                self.counts.eager += 1
                return self.forward(ids, mask), texts * tokens
            if graph is None:
                graph = self.graphs[rows, length] = self._capture(ids, rows, length, current)
            if self._done is not None:
                current.wait_event(self._done)  # (another thread's stream may still read)
            graph.ids[:texts, :tokens].copy_(ids)
            graph.mask[:texts, :tokens].copy_(mask)
            if tokens < length:
                graph.mask[:texts, tokens:].zero_()
            graph.graph.replay()
            out = graph.out[:texts].clone()
            self._done = self.cuda.event()
            self._done.record(current)
            self.counts.replayed += 1
        return out, rows * length

    def capture_ahead(self, like: Any) -> None:
        """Capture the full batches' buckets now (the module docstring), on ``like``'s device:
        their cost is the worker's load, so that a run's batches, and a tuner's short trial,
        replay from the start (a workunit's last, short batch, or a batch cut by a token budget,
        may still meet a new bucket)."""
        top = min(self.longest, AHEAD_TOKENS)
        lengths = sorted({min(length, self.longest)
                          for length in range(LENGTH_STEP, top + LENGTH_STEP, LENGTH_STEP)},
                         reverse=True)
        with _LOCK:
            current = self.cuda.current()
            for length in lengths:
                key = bucket(self.batch_size, length, self.batch_size, self.longest)
                if key not in self.graphs and len(self.graphs) < MAX_GRAPHS:
                    self.graphs[key] = self._capture(like, *key, current)

    def _capture(self, like: Any, rows: int, length: int, current: Any) -> _Graph:
        """A bucket's static buffers on ``like``'s device (every row one padding token), its
        warm-up and capture on the card's side stream."""
        cuda = self.cuda
        started = time.perf_counter()
        ids = like.new_full((rows, length), self.pad_id)
        mask = like.new_zeros((rows, length))
        mask[:, 0] = 1
        self._side.wait_stream(current)  # (the buffers are written on the forward's stream)
        with cuda.use(self._side):
            for _ in range(WARMUPS):
                self.forward(ids, mask)
        graph = cuda.graph()
        try:
            out = cuda.capture(graph, lambda: self.forward(ids, mask), self._pool, self._side)
        except Exception as exc:
            if type(exc).__name__ == "OutOfMemoryError":
                raise  # (as it is: the worker backs off and splits on out-of-memory)
            raise RuntimeError(f"cuda_graphs: capturing the forward pass of {rows} rows x "
                               f"{length} tokens failed ({type(exc).__name__}: {exc}); run "
                               f"without CUDA graphs") from exc
        current.wait_stream(self._side)
        self.counts.captured += 1
        self.counts.capture_s += time.perf_counter() - started
        return _Graph(graph, ids, mask, out)
