"""The CPU side that feeds a card: tokenize on several cores, sort, batch, collate, launch.

``RustTokenizer`` is the model's tokenizer called as sentence-transformers calls it (truncated
to the model's ``max_seq_length``, special tokens added) but in Rust, without the Python
wrapper's per-call work (its padding into tensors, its checks): the same ids, about half the CPU.

``Feeder`` runs one workunit through it the way torch's DataLoader workers feed a model: the
texts are cut into chunks that a pool of tokenizing threads encodes ahead (Rust releases the GIL,
so the threads use as many cores), and each chunk, as it comes back, is sorted by token count,
cut into batches (by count, or by a token budget as text-embeddings-inference batches),
collated into padded id and mask arrays and handed to the card. The card works while the next
chunks are tokenized; the workunit waits for it only at the end, for its embeddings, and a
worker that has its next workunit launches that one first (``launch``, then ``finish``: the
engine's worker overlaps workunits so, helpers.engine.workers.worker.serve), so the card is not left
idle while the worker collects, writes and answers.

What each stage cost is counted (``FeedCounts``): CPU microseconds per stage on the threads that
ran it, the card's seconds, and the tokens computed and needed.
"""
from __future__ import annotations

import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


class RustTokenizer:
    """``tokenizer(texts, truncation=True, max_length=...)``'s ids, from the Rust tokenizer
    ``rust`` (truncation and padding set here on it: give it a copy); ``pad_id``: the id that
    pads a batch."""

    def __init__(self, rust: Any, pad_id: int, max_length: int) -> None:
        self.rust, self.pad_id, self.max_length = rust, pad_id, max_length
        self.rust.enable_truncation(max_length=max_length)
        self.rust.no_padding()
        self._encode = getattr(self.rust, "encode_batch_fast", self.rust.encode_batch)  # (no
        # character offsets: 5-10 % less CPU, the same ids; tokenizers >= 0.21)

    @classmethod
    def of(cls, tokenizer: Any, max_length: int) -> RustTokenizer:
        """From a transformers tokenizer (a copy of its Rust one: its own is left as it was)."""
        from tokenizers import Tokenizer

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(f"{type(tokenizer).__name__} has no Rust tokenizer (a 'fast' "
                             f"tokenizer): the simulated card needs one")
        return cls(Tokenizer.from_str(backend.to_str()), int(tokenizer.pad_token_id or 0),
                   max_length)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, special tokens included."""
        return [encoding.ids for encoding in self._encode(texts)]


def collate(ids: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ids padded to its longest, and the attention mask: int64 ``[b, L]`` each, as
    the model reads them."""
    longest = max(map(len, ids))
    batch = np.full((len(ids), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), longest), dtype=np.int64)
    for row, tokens in enumerate(ids):
        batch[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = 1
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
    """What one workunit's feeding cost (microseconds are summed as the engine sums counts)."""

    tokenize_cpu_us: int = 0
    collate_cpu_us: int = 0
    launch_cpu_us: int = 0
    card_busy_us: int = 0
    card_wait_us: int = 0  # the worker's wait for the card at the workunit's end
    tokens_computed: int = 0
    tokens_needed: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Launched:
    """A workunit handed to the card: when the card will be done with it (CLOCK_MONOTONIC),
    and what feeding it cost so far."""

    done: float
    counts: FeedCounts
    phases: dict[str, float]


class Feeder:
    """One worker's feeding side for a card (the module docstring). ``threads``: tokenizing
    threads (1: the worker's own thread)."""

    def __init__(self, tokenizer: RustTokenizer, card: Any, threads: int) -> None:
        self.tokenizer, self.card, self.threads = tokenizer, card, threads
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the threads are the parallelism
        # (Rust's own would oversubscribe the cores, and its CPU would go uncounted)
        if threads > 1:
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="gpufeed-tokenize")
            weakref.finalize(self, self._pool.shutdown, wait=False)

    def _tokenize(self, texts: list[str]) -> tuple[list[list[int]], float]:
        started = time.thread_time()
        ids = self.tokenizer.encode(texts)
        return ids, time.thread_time() - started

    def run(self, texts: list[str], batch_size: int, batch_tokens: int | None
            ) -> tuple[FeedCounts, dict[str, float]]:
        """Feed ``texts`` to the card and wait for it: ``launch`` then ``finish``."""
        launched = self.launch(texts, batch_size, batch_tokens)
        self.finish(launched)
        return launched.counts, launched.phases

    def launch(self, texts: list[str], batch_size: int, batch_tokens: int | None) -> Launched:
        """Hand ``texts`` to the card, batch by batch, without waiting for it; what ``finish``
        waits on, with the counts and the wall seconds by phase (tokenize: the wait for tokens;
        forward: launching, and ``finish``'s wait for the card; copy_out: collating).

        The texts go to the tokenizing threads longest first by characters, in chunks; as each
        chunk comes back, the texts waiting are sorted by tokens and cut into batches, and all
        but the last SORT_WINDOW batches are launched (those wait for the next chunks), so that
        batches pad about as little as a sort of the whole workunit by tokens would, while the
        card starts before the workunit is tokenized."""
        counts, phases = FeedCounts(), {"tokenize": 0.0, "forward": 0.0, "copy_out": 0.0}
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        size = max(1, min(CHUNK_TEXTS, -(-len(texts) // self.threads)))  # (every thread a
        # chunk: a workunit of 64 texts in chunks of 64 kept one thread of 2 busy, 19 % of the
        # card where workunits of 256 got 31 %: notebook 03)
        chunks = [[texts[i] for i in order[start:start + size]]
                  for start in range(0, len(order), size)]
        if self.threads > 1:
            futures = [self._pool.submit(self._tokenize, chunk) for chunk in chunks]
            results = (future.result() for future in futures)
        else:
            results = (self._tokenize(chunk) for chunk in chunks)
        waiting: list[list[int]] = []
        for number in range(len(chunks)):
            started = time.perf_counter()
            ids, tokenize_cpu = next(results)
            phases["tokenize"] += time.perf_counter() - started
            counts.tokenize_cpu_us += int(tokenize_cpu * 1e6)
            waiting += ids
            groups = batches([len(tokens) for tokens in waiting], batch_size, batch_tokens)
            held = 0 if number == len(chunks) - 1 else SORT_WINDOW  # batches kept back
            for group in groups[:max(0, len(groups) - held)]:
                self._launch([waiting[i] for i in group], counts, phases)
            kept = {i for group in groups[max(0, len(groups) - held):] for i in group}
            waiting = [waiting[i] for i in sorted(kept)]
        return Launched(self.card.done(), counts, phases)

    def finish(self, launched: Launched) -> None:
        """Wait for the card to be done with what ``launched`` handed it (counted)."""
        started = time.perf_counter()
        launched.counts.card_wait_us += int(self.card.wait(launched.done) * 1e6)
        launched.phases["forward"] += time.perf_counter() - started

    def _launch(self, ids: list[list[int]], counts: FeedCounts, phases: dict[str, float]) -> None:
        """Collate a batch and hand it to the card."""
        wall, started = time.perf_counter(), time.thread_time()
        batch, mask = collate(ids, self.tokenizer.pad_id)
        middle, collated = time.thread_time(), time.perf_counter()
        counts.card_busy_us += int(self.card.submit(*batch.shape) * 1e6)
        counts.collate_cpu_us += int((middle - started) * 1e6)
        counts.launch_cpu_us += int((time.thread_time() - middle) * 1e6)
        counts.tokens_computed += int(batch.size)
        counts.tokens_needed += int(mask.sum())
        phases["copy_out"] += collated - wall
        phases["forward"] += time.perf_counter() - collated
