"""The reader: a thread that cuts a source into workunits and feeds the pipeline's bounded queue."""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from helpers.worker import POLL_SECONDS, Workunit


class Reader(threading.Thread):
    """Cuts the source into workunits and feeds the bounded work queue.

    ``slices``: ``(ids, records)`` pairs of an int64 array and a list (helpers.sources.read_slices).
    ``units_put`` counts the workunits on the queue; ``done`` turns True after the last one.
    ``notify`` is called after each put (and at the end) so that the consumer need not poll.

    With a ``cost`` function it reads ``window`` records ahead and orders them by cost before
    cutting, so a workunit holds records of similar size (texts of similar length pad less). Work
    is done a window at a time: costs through one ``map``, one argsort, array slices for the ids.
    """

    def __init__(self, slices: Iterable[tuple[np.ndarray, list]], work: Any, workunit_size: int,
                 stop: threading.Event, window: int = 0,
                 cost: Callable[[Any], float] | None = None,
                 notify: Callable[[], None] | None = None) -> None:
        super().__init__(name="gpufeed-reader", daemon=True)
        self._slices, self._work, self._size = slices, work, workunit_size
        self._halt = stop
        self._window, self._cost = max(window, workunit_size), cost
        self._notify = notify or (lambda: None)
        self.error: BaseException | None = None
        self.read_seconds = self.blocked_seconds = 0.0
        self.units_put = 0
        self.done = False
        self._rest: tuple[np.ndarray, list] = (np.empty(0, np.int64), [])  # read, not yet cut

    def run(self) -> None:
        try:
            for unit in self._workunits():
                if not self._put(unit):
                    return
                self.units_put += 1
                self._notify()
            self.done = True
            self._notify()
        except BaseException as exc:  # the writer re-raises it in the main thread
            self.error = exc

    def _workunits(self) -> Iterator[Workunit]:
        slices, index = iter(self._slices), itertools.count()
        while True:
            started = time.perf_counter()
            ids, records = self._next_window(slices)
            if self._cost is not None and len(records) > 1:  # similar records together
                order = np.argsort(_costs(self._cost, records), kind="stable")
                ids, records = ids[order], [records[i] for i in order.tolist()]
            self.read_seconds += time.perf_counter() - started
            if not len(records):
                return
            for start in range(0, len(records), self._size):
                yield Workunit(next(index), ids[start:start + self._size],
                               records[start:start + self._size])

    def _next_window(self, slices: Iterator[tuple[np.ndarray, list]]) -> tuple[np.ndarray, list]:
        """The next ``window`` records (fewer only at the end); what a slice holds beyond them
        waits for the next window."""
        id_parts, records = [self._rest[0]], self._rest[1]
        while len(records) < self._window:
            piece = next(slices, None)
            if piece is None:
                break
            id_parts.append(piece[0])
            records.extend(piece[1])
        ids = np.concatenate(id_parts)
        self._rest = (ids[self._window:], records[self._window:])
        return ids[:self._window], records[:self._window]

    def _put(self, item: Any) -> bool:
        started = time.perf_counter()
        try:
            while not self._halt.is_set():
                try:
                    self._work.put(item, timeout=POLL_SECONDS)
                    return True
                except queue.Full:  # both backends' queues raise queue.Full
                    pass
            return False
        finally:
            self.blocked_seconds += time.perf_counter() - started


def _costs(cost: Callable[[Any], float], records: list) -> np.ndarray:
    """``cost`` of every record; a record it fails on (a bad one) sorts first, and its worker
    reports it."""
    try:
        return np.fromiter(map(cost, records), dtype=np.float64, count=len(records))
    except Exception:
        return np.array([_safe_cost(cost, record) for record in records], dtype=np.float64)


def _safe_cost(cost: Callable[[Any], float], record: Any) -> float:
    try:
        return float(cost(record))
    except Exception:
        return 0.0
