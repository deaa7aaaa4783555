"""The reader: a thread that cuts a source into workunits and queues them, a bounded number
ahead."""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from helpers.engine.contract.messages import POLL_SECONDS, Workunit


class Reader(threading.Thread):
    """Cuts the source into workunits and puts them on its bounded work queue, ``depth`` deep.

    ``slices``: ``(ids, records)`` pairs of an int64 array and a list
    (helpers.engine.inputs.sources.read_slices), or Rows (a source's ``rows``). ``wake`` ends the
    scheduler's wait on its workers' messages (so that it need not poll) after a workunit it may
    want: once it has asked this feed and not taken (it found the queue empty, or too short to
    give a worker a second), not after every workunit — a scheduler busy with its workers' results
    takes the next workunit anyway, and a wake-up per workunit was a turn of its loop for nothing.
    At the end (and on an error) it is always woken.

    The scheduler's side (helpers.engine.dispatch.scheduler.Feed): ``take()`` the next workunit or
    None, ``backlog()``, ``remaining()`` records (known once the source is read, or from ``total``),
    ``resize()`` for the workunits still to cut, ``ahead()`` to queue more of them, and
    ``exhausted()``, which re-raises in the scheduler's thread whatever stopped the reader (an
    unreadable input). ``stop()`` ends the thread early and joins it.

    With a ``cost`` function it reads ``window`` records ahead and orders them by cost before
    cutting, so a workunit holds records of similar size (texts of similar length pad less). Work
    is done a window at a time: costs through one ``map``, one argsort, array slices for the ids.
    """

    def __init__(self, slices: Iterable[tuple[np.ndarray, list]], workunit_size: int, depth: int,
                 wake: Callable[[], None] = lambda: None, window: int = 0,
                 cost: Callable[[Any], float] | None = None, total: int | None = None,
                 stop_at: float | None = None) -> None:
        super().__init__(name="gpufeed-reader", daemon=True)
        self._slices, self._size, self._wake = slices, workunit_size, wake
        self._work: queue.Queue[Workunit] = queue.Queue(depth)
        self._halt = threading.Event()
        self._window, self._cost, self._total = window, cost, total
        self._stop_at = stop_at  # (time.monotonic()) after it, no workunit is given out
        self.cut = False  # whether ``stop_at`` ended the feed before the source did
        self._records_put = self._records_taken = 0  # each written by one thread only
        self.error: BaseException | None = None
        self.read_s = self.blocked_s = 0.0
        self.units_put = 0
        self._wanted = True  # the scheduler found too little here: wake it at the next workunit
        self.done = False
        self._rest: tuple[np.ndarray, list, int] = (np.empty(0, np.int64), [], 0)  # read;
        # its records from the offset on not yet cut

    def run(self) -> None:
        try:
            for unit in self._workunits():
                if not self._put(unit):
                    return
                self.units_put += 1
                self._records_put += len(unit)
                if self._wanted:
                    self._wake()
            self.done = True
            self._wake()
        except BaseException as exc:  # exhausted() re-raises it in the scheduler's thread
            self.error = exc
            self._wake()

    def _past(self) -> bool:
        """Whether ``stop_at`` has passed with workunits still to give (the feed is cut)."""
        if self._stop_at is not None and not self.cut and time.monotonic() > self._stop_at \
                and not (self.done and self._work.empty()):
            self.cut = True
        return self.cut

    def take(self) -> Workunit | None:
        if self._past():
            return None
        self._wanted = True  # (before the look: a workunit put meanwhile then wakes it)
        try:
            unit = self._work.get_nowait()
        except queue.Empty:
            return None
        self._wanted = False
        self._records_taken += len(unit)
        return unit

    def backlog(self) -> int:
        if self._past():
            return 0
        self._wanted = True  # asked, then maybe not taken: too few for a second per worker
        return self._work.qsize() + (not self.done)

    def remaining(self) -> int | None:
        if self._past():
            return 0
        self._wanted = True
        if self.done:
            return self._records_put - self._records_taken
        return None if self._total is None else max(0, self._total - self._records_taken)

    def resize(self, size: int) -> None:
        self._size = max(1, int(size))

    def ahead(self, units: int) -> None:
        if units <= self._work.maxsize:  # (asked at every dispatch: mostly nothing to do)
            return
        with self._work.mutex:  # a put waiting on the full queue goes on at once
            self._work.maxsize = max(self._work.maxsize, units)
            self._work.not_full.notify_all()

    def exhausted(self) -> bool:
        """True once the source is read and every workunit taken; raises the reader's error."""
        if self.error is not None:
            raise self.error
        return self._past() or self.done and self._work.empty()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()

    def _workunits(self) -> Iterator[Workunit]:
        slices, index = iter(self._slices), itertools.count()
        while True:
            started = time.perf_counter()
            ids, records = self._next_window(slices, max(self._window, self._size))
            if self._cost is not None and isinstance(records, list) and len(records) > 1:
                # similar records together (Rows, which workers read, cannot be weighed here)
                order = np.argsort(_costs(self._cost, records), kind="stable")
                ids, records = ids[order], [records[i] for i in order.tolist()]
            self.read_s += time.perf_counter() - started
            if not len(records):
                return
            start = 0
            while start < len(records):
                size = self._size  # resize() may change it between two workunits
                yield Workunit(next(index), ids[start:start + size], records[start:start + size])
                start += size

    def _next_window(self, slices: Iterator[tuple[np.ndarray, list]],
                     window: int) -> tuple[np.ndarray, list]:
        """The next ``window`` records (fewer only at the end). What a slice holds beyond them
        stays where it is, its first record's offset kept: a window is a view of the slice, so
        that cutting a slice of 65,536 into workunits of 16 copies nothing of the rest each time
        (a copy of the rest per window made the reader's work grow with the slice)."""
        ids, records, at = self._rest
        if len(records) - at < window:  # what is left, then the next slices behind it
            id_parts, records = [ids[at:]], records[at:]
            while len(records) < window:
                piece = next(slices, None)
                if piece is None:
                    break
                id_parts.append(piece[0])
                if isinstance(records, list) and isinstance(piece[1], list):
                    records.extend(piece[1])  # (a copy of the rest: never the source's list)
                else:  # Rows (helpers.engine.contract.protocol): records a worker reads itself
                    records = records + piece[1]
            ids, at = np.concatenate(id_parts), 0
        self._rest = (ids, records, at + window)
        return ids[at:at + window], records[at:at + window]

    def _put(self, item: Any) -> bool:
        started = time.perf_counter()
        try:
            while not self._halt.is_set():
                try:
                    self._work.put(item, timeout=POLL_SECONDS)
                    return True
                except queue.Full:  # checks _halt every POLL_SECONDS
                    pass
            return False
        finally:
            self.blocked_s += time.perf_counter() - started


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
