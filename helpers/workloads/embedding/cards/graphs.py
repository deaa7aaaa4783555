"""CUDA graphs of the torch card's forward pass: one per padded batch shape, replayed by one call.

Eager PyTorch launches each of a forward pass's kernels from Python: on a fast card the launching
thread, not the card, sets the pace (the H200 ran all-MiniLM-L6-v2 at 78,000 texts/s eager and
99,000 compiled from pre-tokenized batches; docs/gpu-check.md). A CUDA graph replays the whole
pass (transformer, pooling, dense, normalize, ``truncate_dim``) with one launch. A graph holds
one shape, so a batch is padded up to a **bucket**: its rows to the next power of two (at least
MIN_ROWS, at most the batch size), its tokens to the next multiple of LENGTH_STEP (at most the
model's ``max_seq_length``). The padded tokens are masked out of attention and pooling, so the
vectors are the eager pass's (tests/test_torch_card.py); the padding is counted in the tokens
the card computed (a ticket's ``tokens``), as the feeder counts its own.

A bucket owns static buffers on the device: ids, mask (and token types, zeros), and the graph's
output. A batch (on the device, on the forward's stream) is copied into the top-left corner of
its bucket's ids and mask, the mask's columns past its tokens zeroed for its rows; the rows
below it keep an earlier batch's texts of that bucket (or one padding token: the start), which
are computed and dropped. The graph is replayed, and the first rows of its output are the
batch's; they stay valid until the bucket's next replay, which the stream orders after the copy
that takes them to the host.

A bucket is captured on its first batch, as torch's recipe does: a warm-up pass on a side stream
of this thread's, then the capture on that stream (``capture_error_mode="thread_local"``: other
workers' threads may allocate meanwhile), every graph of a thread in one memory pool (they
replay one at a time, on its stream). Per calling thread, as the card's streams are (the thread
backend's workers share one model). transformers builds the attention mask without its
data-dependent shortcut (``mask.all()``, a sync no capture allows) while a stream captures: it
asks ``torch.cuda.is_current_stream_capturing``. A thread's graph past MAX_GRAPHS runs eager.

The CUDA calls are the card's ``CudaCalls`` (``graph``, ``pool``, ``capture``), which tests fake:
the fake capture refuses a sync, as CUDA does, and its replay computes from the static buffers.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

LENGTH_STEP = 8  # a bucket's tokens are a multiple of this: 10,674 of the sample's paragraphs
# (78 tokens on average) sorted by tokens, in batches of 32-512, computed 1.044-1.048x the tokens
# of each batch padded to its longest (steps of 16: 1.09-1.10x; of 32: 1.18-1.19x)
MIN_ROWS = 8  # the fewest rows a bucket has (smaller batches: a workunit's last)
MAX_GRAPHS = 512  # graphs a thread captures at most (batch 256, 512 tokens: 6 x 64 buckets; a
# count-batched workunit's batches are full but its last, so most runs see a few rows' buckets)
WARMUPS = 1  # eager passes on the side stream before a bucket's capture


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
    """What the graphs did, over every thread: buckets captured, batches replayed, batches run
    eager (past MAX_GRAPHS), the seconds the captures took."""

    captured: int = 0
    replayed: int = 0
    eager: int = 0
    capture_s: float = 0.0


class CardGraphs:
    """The torch card's graphs (the module docstring). ``forward(ids, mask)``: the card's pass
    over device tensors, rows ``[texts, dim]``; ``batch_size``, ``longest``: the buckets'
    bounds; ``pad_id``: the padding token; ``cuda``: the card's CUDA calls."""

    def __init__(self, forward: Callable[[Any, Any], Any], batch_size: int, longest: int,
                 pad_id: int, cuda: Any) -> None:
        self.forward, self.cuda = forward, cuda
        self.batch_size, self.longest, self.pad_id = batch_size, longest, pad_id
        self.counts = GraphCounts()
        self._lock = threading.Lock()  # (the counts, from every thread)
        self._local = threading.local()

    def run(self, ids: Any, mask: Any) -> tuple[Any, int]:
        """The rows of a batch on the device (``[texts, tokens]`` ids and mask, on the current
        stream), and the tokens computed for it (its bucket's)."""
        texts, tokens = int(ids.shape[0]), int(ids.shape[1])
        rows, length = bucket(texts, tokens, self.batch_size, self.longest)
        local = self._thread()
        graph = local.graphs.get((rows, length))
        if graph is None:
            if len(local.graphs) >= MAX_GRAPHS:
                self._count(eager=1)
                return self.forward(ids, mask), texts * tokens
            graph = local.graphs[rows, length] = self._capture(local, ids, rows, length)
        graph.ids[:texts, :tokens].copy_(ids)
        graph.mask[:texts, :tokens].copy_(mask)
        if tokens < length:
            graph.mask[:texts, tokens:].zero_()
        graph.graph.replay()
        self._count(replayed=1)
        return graph.out[:texts], rows * length

    def _thread(self) -> Any:
        local = self._local
        if not hasattr(local, "graphs"):
            local.graphs, local.pool, local.side = {}, self.cuda.pool(), self.cuda.stream()
        return local

    def _capture(self, local: Any, like: Any, rows: int, length: int) -> _Graph:
        """A bucket's static buffers on ``like``'s device (every row one padding token), its
        warm-up and capture on this thread's side stream."""
        cuda = self.cuda
        started = time.perf_counter()
        ids = like.new_full((rows, length), self.pad_id)
        mask = like.new_zeros((rows, length))
        mask[:, 0] = 1
        current = cuda.current()
        local.side.wait_stream(current)  # (the buffers are written on the forward's stream)
        with cuda.use(local.side):
            for _ in range(WARMUPS):
                self.forward(ids, mask)
        graph = cuda.graph()
        try:
            out = cuda.capture(graph, lambda: self.forward(ids, mask), local.pool, local.side)
        except Exception as exc:
            raise RuntimeError(f"cuda_graphs: capturing the forward pass of {rows} rows x "
                               f"{length} tokens failed ({type(exc).__name__}: {exc}); run "
                               f"without CUDA graphs") from exc
        current.wait_stream(local.side)
        self._count(captured=1, capture_s=time.perf_counter() - started)
        return _Graph(graph, ids, mask, out)

    def _count(self, **added: float) -> None:
        with self._lock:
            for name, value in added.items():
                setattr(self.counts, name, getattr(self.counts, name) + value)
