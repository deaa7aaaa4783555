"""The CPU side that feeds a card: tokenize on several cores, sort, batch, collate, launch.

One path for every card (STYLE.md, habit 23: torch's DataLoader, text-embeddings-inference)::

    texts ─> tokenize (a pool of threads) ─> sort in a window ─> batches ─> collate
             (RustTokenizer, or the WordCache      (by tokens)      (by count,   (into the card's
              in front of it where it vouches)                       or tokens)   staging arrays)
                                                                                      │
    rows in the texts' order <── card.collect (the wait) <────────── card.submit(ids, mask)

The tokenizer (helpers.workloads.embedding.rust_tokenizer, or the word cache in front of it) gives
sentence-transformers' ids without the wrapper's Python; the tokenizing runs on the worker's
thread, a pool of threads, or processes of the worker's own (helpers.workloads.embedding.tokenizing).

``Feeder`` runs one workunit through it the way torch's DataLoader workers feed a model: the
texts are cut into chunks that a pool of tokenizing threads encodes ahead (Rust releases the GIL,
so the threads use as many cores), and each chunk, as it comes back, is sorted by token count,
cut into batches (by count, or by a token budget as text-embeddings-inference batches),
collated into padded id and mask arrays the card hands out (``staging``: pinned memory on a
GPU) and submitted. A card that computes asynchronously (a GPU, the simulated card) works while
the next chunks are tokenized; the workunit waits for it only at the end, for its rows
(``finish``), and a worker that has its next workunit launches that one first (the engine's
worker overlaps workunits so, helpers.engine.workers.worker.serve), so the card is not left
idle while the worker collects, writes and answers.

The card is the last stage, behind one small protocol (``helpers.workloads.embedding.cards``):
the torch card (the model's own modules on its device), the onnx card, the simulated card. Every
one of them is fed by this module, so a figure measured on the simulated card is a figure of
the path real models take.

What each stage cost is counted (``FeedCounts``): CPU microseconds per stage on the threads that
ran it, the card's seconds where the card knows them, and the tokens computed and needed.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np



def available_cores() -> int:
    """Cores this process may run on (as the engine's ``available_cores``: a workload sees
    only the engine's protocol)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


CHUNK_TEXTS = 64  # most texts a tokenizing thread encodes at a time (fewer where a workunit
# holds too few for every thread to get a chunk)
SORT_WINDOW = 3  # batches kept back to sort by tokens with the next chunks (texts arrive
# sorted by characters, which put batches of the sample at 1.17x the padding of a sort by tokens)


def collate(ids: list[list[int]], pad_id: int,
            out: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ids padded to its longest, and the attention mask: int64 ``[b, L]`` each, as
    the model reads them; written into ``out`` (a card's staging arrays of that shape) if given.
    """
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    longest = int(lengths.max())
    batch, mask = out if out is not None else (np.empty((len(ids), longest), dtype=np.int64),
                                               np.empty((len(ids), longest), dtype=np.int64))
    keep = np.arange(longest) < lengths[:, None]
    batch.fill(pad_id)
    batch[keep] = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    mask[...] = keep
    return batch, mask


def batches(lengths: list[int], batch_size: int, batch_tokens: int | None) -> list[list[int]]:
    """Positions grouped into batches, longest first: ``batch_size`` texts each, or, with
    ``batch_tokens``, as many as fit that many padded tokens (at least one) and at most
    ``batch_size`` (as text-embeddings-inference caps a batch's tokens and its requests)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if batch_tokens is None:
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    groups: list[list[int]] = []
    for position in order:  # longest first: the first text of a batch sets its length
        if groups and len(groups[-1]) < batch_size \
                and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= batch_tokens:
            groups[-1].append(position)
        else:
            groups.append([position])
    return groups


@dataclass
class FeedCounts:
    """What one workunit's feeding cost (microseconds are summed as the engine sums counts).
    ``card_busy_us``: the card's own seconds, where the card knows them (the simulated card's
    cost model); None otherwise, and then left out of ``as_dict``."""

    tokenize_cpu_us: int = 0
    tokenize_outside_us: int = 0  # the part of tokenize_cpu_us spent in tokenizing processes
    # (outside the worker's own process: its CPU figures do not hold it)
    collate_cpu_us: int = 0
    launch_cpu_us: int = 0  # submitting: a GPU's kernel launches; a CPU's whole forward pass
    card_busy_us: int | None = None
    card_wait_us: int = 0  # the worker's wait for the card at the workunit's end
    tokens_computed: int = 0
    tokens_needed: int = 0
    texts_fast: int = 0  # texts tokenized by the word cache (WordCache), not the tokenizer

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Launched:
    """A workunit handed to the card: each batch's positions in the workunit and the card's
    ticket for it, and what feeding it cost so far."""

    texts: int
    tickets: list[tuple[np.ndarray, Any]]
    counts: FeedCounts
    phases: dict[str, float] = field(default_factory=dict)


class Feeder:
    """One worker's feeding side for a card (the module docstring). ``threads``: tokenizing
    threads (1: the worker's own thread); ``processes``: tokenizing processes instead
    (helpers.workloads.embedding.tokenizing; 0: none). ``tokenizer``: what gives ids
    (``encode``) and ``pad_id``: a RustTokenizer, or a WordCache in front of one."""

    def __init__(self, tokenizer: Any, card: Any, threads: int, processes: int = 0) -> None:
        self.tokenizer, self.card = tokenizer, card
        self.threads, self.processes = (1 if processes else threads), processes
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the threads are the parallelism
        # (Rust's own would oversubscribe the cores, and its CPU would go uncounted)
        self._pool: Any = None
        if processes:
            from helpers.workloads.embedding.tokenizing import TokenizerProcesses

            self._pool = TokenizerProcesses(tokenizer, processes)
        elif threads > 1:
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="gpufeed-tokenize")
            weakref.finalize(self, self._pool.shutdown, wait=False)

    def close(self) -> None:
        """End the tokenizing threads or processes (also when the feeder is collected)."""
        if self._pool is not None:
            closing = getattr(self._pool, "close", None)
            closing() if closing is not None else self._pool.shutdown(wait=False)

    def _tokenize(self, texts: list[str]) -> tuple[list[list[int]], float, int]:
        started = time.thread_time()
        ids = self.tokenizer.encode(texts)
        fast = getattr(self.tokenizer, "last_fast", None)
        return ids, time.thread_time() - started, fast() if fast is not None else 0

    def run(self, texts: list[str], batch_size: int, batch_tokens: int | None
            ) -> tuple[np.ndarray, Launched]:
        """Feed ``texts`` to the card and wait for it: ``launch`` then ``finish``."""
        launched = self.launch(texts, batch_size, batch_tokens)
        return self.finish(launched), launched

    def launch(self, texts: list[str], batch_size: int, batch_tokens: int | None) -> Launched:
        """Hand ``texts`` to the card, batch by batch, without waiting for it (a card that
        computes as it is called, a CPU, has computed them when this returns); what ``finish``
        collects, with the counts and the wall seconds by phase (tokenize: the wait for tokens;
        forward: submitting, and ``finish``'s wait for the card; copy_out: collating and
        putting the rows in order).

        The texts go to the tokenizing threads longest first by characters, in chunks; as each
        chunk comes back, the texts waiting are sorted by tokens and cut into batches, and all
        but the last SORT_WINDOW batches are submitted (those wait for the next chunks), so that
        batches pad about as little as a sort of the whole workunit by tokens would, while the
        card starts before the workunit is tokenized. A card that computes as it is fed (a
        CPU's) gets its batches once the whole workunit is tokenized and sorted."""
        counts = FeedCounts()
        launched = Launched(len(texts), [], counts,
                            {"tokenize": 0.0, "forward": 0.0, "copy_out": 0.0})
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        size = max(1, min(CHUNK_TEXTS, -(-len(texts) // max(self.threads, self.processes))))
        # (every thread a chunk: a workunit of 64 texts in chunks of 64 kept one thread of 2
        # busy, 19 % of the card where workunits of 256 got 31 %: notebook 03)
        chunks = [order[start:start + size] for start in range(0, len(order), size)]
        if self.processes:
            futures = [self._pool.submit([texts[i] for i in chunk]) for chunk in chunks]
            results = (future.result() for future in futures)
        elif self.threads > 1:
            futures = [self._pool.submit(self._tokenize, [texts[i] for i in chunk])
                       for chunk in chunks]
            results = (future.result() for future in futures)
        else:
            results = (self._tokenize([texts[i] for i in chunk]) for chunk in chunks)
        waiting: list[list[int]] = []
        positions: list[int] = []
        for number, chunk in enumerate(chunks):
            started = time.perf_counter()
            ids, tokenize_cpu, fast = next(results)
            launched.phases["tokenize"] += time.perf_counter() - started
            counts.tokenize_cpu_us += int(tokenize_cpu * 1e6)
            if self.processes:
                counts.tokenize_outside_us += int(tokenize_cpu * 1e6)
            counts.texts_fast += fast
            waiting += ids
            positions += chunk
            last = number == len(chunks) - 1
            if not (last or self.card.asynchronous):
                continue  # (a card that computes as it is fed gains nothing by starting early:
                # the whole workunit is sorted once, as encode sorts it, and pads least)
            groups = batches([len(tokens) for tokens in waiting], batch_size, batch_tokens)
            held = 0 if last else SORT_WINDOW  # batches kept back for the next chunks
            for group in groups[:max(0, len(groups) - held)]:
                self._submit([waiting[i] for i in group],
                             np.array([positions[i] for i in group], dtype=np.int64), launched)
            kept = sorted(i for group in groups[max(0, len(groups) - held):] for i in group)
            waiting, positions = [waiting[i] for i in kept], [positions[i] for i in kept]
        return launched

    def finish(self, launched: Launched) -> np.ndarray:
        """Wait for the card's rows of what ``launched`` handed it (counted); the rows in the
        order of the texts launched."""
        started = time.perf_counter()
        rows = self.card.collect([ticket for _, ticket in launched.tickets])
        collected = time.perf_counter()
        launched.counts.card_wait_us += int((collected - started) * 1e6)
        launched.phases["forward"] += collected - started
        if not rows:
            return np.empty((launched.texts, self.card.dim), dtype=np.float32)
        out = np.empty((launched.texts, rows[0].shape[1]), dtype=rows[0].dtype)
        for (where, _), got in zip(launched.tickets, rows):
            out[where] = got
        launched.phases["copy_out"] += time.perf_counter() - collected
        return out

    def _submit(self, ids: list[list[int]], where: np.ndarray, launched: Launched) -> None:
        """Collate a batch into the card's staging arrays and submit it."""
        counts = launched.counts
        wall, started = time.perf_counter(), time.thread_time()
        batch, mask = collate(ids, self.tokenizer.pad_id,
                              self.card.staging(len(ids), max(map(len, ids))))
        needed = int(sum(map(len, ids)))
        middle, collated = time.thread_time(), time.perf_counter()
        ticket = self.card.submit(batch, mask)
        busy = getattr(ticket, "busy_s", None)
        if busy is not None:
            counts.card_busy_us = (counts.card_busy_us or 0) + int(busy * 1e6)
        launched.tickets.append((where, ticket))
        counts.collate_cpu_us += int((middle - started) * 1e6)
        counts.launch_cpu_us += int((time.thread_time() - middle) * 1e6)
        computed = getattr(ticket, "tokens", None)  # (a card that pads further says so)
        counts.tokens_computed += int(computed if computed is not None else batch.size)
        counts.tokens_needed += needed
        launched.phases["copy_out"] += collated - wall
        launched.phases["forward"] += time.perf_counter() - collated


class FedModel:
    """What a worker holds on the feeder's path: the feeder, its card, and what the workload
    reads of a model (its width; the last workunit's phases and counts, per calling thread,
    since the thread backend's workers share one model). ``model``: the model the card runs
    (a SentenceTransformer; None on a simulated card), for what is said of it."""

    def __init__(self, feeder: Feeder, model: Any = None) -> None:
        self.feeder, self.card, self.model = feeder, feeder.card, model
        self.label = self.card.label
        self._local = threading.local()

    def close(self) -> None:
        """End the feeder's tokenizing threads or processes."""
        self.feeder.close()

    def get_embedding_dimension(self) -> int:
        return self.card.dim

    @property
    def asynchronous(self) -> bool:
        """Whether ``launch`` returns before the card is done (the worker then overlaps
        workunits)."""
        return bool(self.card.asynchronous)

    def launch(self, texts: list[str], batch_size: int, batch_tokens: int | None) -> Any:
        """Hand ``texts`` to the card; what waits for it and gives their rows (float32, or the
        card's float16)."""
        launched = self.feeder.launch(texts, batch_size, batch_tokens)

        def finish() -> np.ndarray:
            rows = self.feeder.finish(launched)
            self._local.counts, self._local.phases = launched.counts.as_dict(), launched.phases
            return rows
        return finish

    def encode(self, texts: list[str], batch_size: int, **_: Any) -> np.ndarray:
        """``texts``' rows in float32 (the quality guard's call, as it calls ``encode``)."""
        return np.asarray(self.launch(list(texts), batch_size, None)(), dtype=np.float32)

    def take(self) -> dict[str, float]:
        return dict(getattr(self._local, "phases", {}))

    def take_counts(self) -> dict[str, int]:
        return dict(getattr(self._local, "counts", {}))
