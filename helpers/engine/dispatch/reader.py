"""The reader: a thread that reads a source ahead of the scheduler and queues its records, a
bounded number of them; the taker (helpers.engine.dispatch.taker) takes them in workunits of the
sizes it decides."""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from helpers.engine.contract.messages import POLL_SECONDS, Workunit


class Reader(threading.Thread):
    """Reads the source in a thread and queues its records for the taker, which takes them
    ``take(n)`` at a time: a workunit's size is the taker's alone (helpers.engine.dispatch.taker),
    and so is its number (a workunit taken here is not numbered); the taker tells it the largest
    it will take (``expect(n)``), for room to queue that many.

    ``slices``: ``(ids, records)`` pairs of an int64 array and a list
    (helpers.engine.inputs.sources.read_slices), or Rows (a source's ``rows``). ``wake`` ends the
    scheduler's wait on its workers' messages (so that it need not poll) after records it asked
    for: the scheduler asks (``wake_on_more(mark)``) when its dispatch left a worker short, not
    after every window — a scheduler busy with its workers' results takes the next records
    anyway, and a wake-up per window was a turn of its loop for nothing. At the end (and on an
    error) it is always woken.

    How much is queued follows what is taken: ``depth`` workunits of ``size`` records to start
    with, then ``depth`` of the largest the taker expects to take (``expect``), or what it took
    in the last ``ahead_s`` seconds if that is more (workers added, messages grown: the
    scheduler's demand, whatever made it so); with ``ahead_s`` 0 (a ``queue_depth`` the user set)
    ``depth`` workunits at most. A window is queued whole once there is room.

    The taker's side (helpers.engine.dispatch.taker.Feed): ``expect(n)``, ``take(n)`` a workunit
    of up to ``n`` records or None, ``backlog(n)``, ``remaining()`` records (known once the
    source is read, or from ``total``), and ``exhausted()``, which re-raises in the scheduler's
    thread whatever stopped the reader (an unreadable input); the scheduler's: ``records_put``
    and ``wake_on_more``. None of the looks changes what the reader does. ``stop()`` ends the
    thread early and joins it.

    It queues windows of the largest workunit asked for (views of a slice where one holds
    them). With a ``cost`` function it reads ``window`` records ahead (or that, if more) and
    orders them by cost, so a workunit holds records of similar size (texts of similar length
    pad less): such a window is taken from until it is used up, a take never holding records of
    two windows (with auto sizes the scheduler joins a window's short end to the next, up to its
    worker's size). Without, a workunit is taken across windows, ``n`` records whenever the
    source has them. Work is done a window at a time: costs through one ``map``, one argsort,
    array slices for the ids.
    """

    def __init__(self, slices: Iterable[tuple[np.ndarray, list]], depth: int, size: int,
                 wake: Callable[[], None] = lambda: None, window: int = 0,
                 cost: Callable[[Any], float] | None = None, total: int | None = None,
                 stop_at: float | None = None, ahead_s: float = 0.0) -> None:
        super().__init__(name="gpufeed-reader", daemon=True)
        self._slices, self._wake = slices, wake
        self._depth, self._largest, self._ahead_s = max(1, depth), max(1, int(size)), ahead_s
        self._sorts = cost is not None and window > 0
        self._window, self._cost, self._total = window, cost, total
        self._queue: deque[list] = deque()  # [ids, records, offset taken to]: a window
        self._queued = 0  # records queued, not taken
        self._room = threading.Condition(threading.Lock())
        self._recent: deque[tuple[float, int]] = deque()  # (when, records) taken, ahead_s back
        self._recent_records = self._peak = 0  # records taken in ahead_s; the most so far
        self._halt = threading.Event()
        self._stop_at = stop_at  # (time.monotonic()) after it, no workunit is given out
        self.cut = False  # whether ``stop_at`` ended the feed before the source did
        self._records_put = self._records_taken = 0  # each written by one thread only
        self.error: BaseException | None = None
        self.read_s = self.blocked_s = 0.0
        self._wanted = True  # the scheduler asked to be woken at the next records (and waits
        # for the first)
        self.done = False
        self._rest: tuple[np.ndarray, list, int] = (np.empty(0, np.int64), [], 0)  # read;
        # its records from the offset on not yet in a window

    def run(self) -> None:
        try:
            for ids, records in self._pieces():
                if not self._put(ids, records):
                    return
                if self._wanted:
                    self._wanted = False
                    self._wake()
            self.done = True
            self._wake()
        except BaseException as exc:  # exhausted() re-raises it in the scheduler's thread
            self.error = exc
            self._wake()

    def _past(self) -> bool:
        """Whether ``stop_at`` has passed with records still to give (the feed is cut)."""
        if self._stop_at is not None and not self.cut and time.monotonic() > self._stop_at \
                and not (self.done and not self._queued):
            self.cut = True
        return self.cut

    @property
    def bound(self) -> int:
        """Records the reader queues before it waits for the scheduler to take some."""
        return max(self._depth * self._largest, self._peak)

    def expect(self, n: int) -> None:
        """The taker's word that it may take ``n`` records at a time from now on: room is kept
        for ``depth`` workunits of the largest it said (a take larger than the queue's bound
        would wait for ever)."""
        if n > self._largest:
            with self._room:
                self._largest = max(self._largest, n)
                self._room.notify()  # (a reader waiting on a smaller bound goes on)

    def take(self, n: int) -> Workunit | None:
        """A workunit of up to ``n`` records (fewer only at a window's end or the source's), or
        None if not that many are queued yet (the queue makes room for ``n`` only once the
        taker said it ``expect``s it)."""
        if self._past():
            return None
        n = max(1, n)
        with self._room:
            if not self._queued or not (self._sorts or self.done or self._queued >= n):
                return None  # a workunit is cut short only at a window's end or the source's
            ids, records = self._cut(n)
            self._queued -= len(ids)
            if self._ahead_s:
                self._note(len(ids))
            self._room.notify()
        self._records_taken += len(ids)
        return Workunit(0, ids, records)  # (numbered by the taker)

    def _cut(self, n: int) -> tuple[np.ndarray, list]:
        """Up to ``n`` records from the head of the queue: from its first window only, or across
        windows (the caller holds ``_room``)."""
        id_parts, records = [], None
        while n and self._queue:
            entry = self._queue[0]
            ids, items, at = entry
            k = min(n, len(ids) - at)
            id_parts.append(ids[at:at + k])
            part = items[at:at + k]
            records = part if records is None else records + part
            n -= k
            entry[2] = at + k
            if entry[2] == len(ids):
                self._queue.popleft()
            if self._sorts:
                break
        ids = id_parts[0] if len(id_parts) == 1 else np.concatenate(id_parts)
        return ids, records

    def _note(self, records: int) -> None:
        """Records taken now: the most taken within ``ahead_s`` so far is the bound's other
        half (the caller holds ``_room``)."""
        now = time.monotonic()
        self._recent.append((now, records))
        self._recent_records += records
        while self._recent[0][0] < now - self._ahead_s:
            self._recent_records -= self._recent.popleft()[1]
        self._peak = max(self._peak, self._recent_records)

    def backlog(self, n: int) -> int:
        """Workunits of ``n`` records queued, and one more while the source is still being read."""
        if self._past():
            return 0
        return -(-self._queued // max(1, n)) + (not self.done)

    def remaining(self) -> int | None:
        if self._past():
            return 0
        if self.done:
            return self._records_put - self._records_taken
        return None if self._total is None else max(0, self._total - self._records_taken)

    @property
    def records_put(self) -> int:
        """Records queued so far: the mark a scheduler takes before it looks at the feed."""
        return self._records_put

    def wake_on_more(self, mark: int) -> None:
        """Wake the scheduler once records are put after ``mark`` (``records_put`` when it
        started looking): at once if some came while it looked, else at the next ones."""
        self._wanted = True  # (before the check: records put meanwhile see it and wake)
        if self._records_put != mark and self._wanted:
            self._wanted = False
            self._wake()

    def exhausted(self) -> bool:
        """True once the source is read and every record taken; raises the reader's error."""
        if self.error is not None:
            raise self.error
        return self._past() or self.done and not self._queued

    def stop(self) -> None:
        self._halt.set()
        with self._room:
            self._room.notify()
        if self.is_alive():
            self.join()

    def _pieces(self) -> Iterator[tuple[np.ndarray, list]]:
        """Windows of the source's records: the largest workunit asked for (so that a take is
        mostly one view, not slices joined in the scheduler's thread), or with a cost,
        ``window`` records if more, ordered by it."""
        slices = iter(self._slices)
        while True:
            started = time.perf_counter()
            ids, records = self._next_window(
                slices, max(self._window, self._largest) if self._sorts else self._largest)
            if self._sorts and isinstance(records, list) and len(records) > 1:
                # similar records together (Rows, which workers read, cannot be weighed here)
                order = np.argsort(_costs(self._cost, records), kind="stable")
                ids, records = ids[order], [records[i] for i in order.tolist()]
            self.read_s += time.perf_counter() - started
            if not len(records):
                return
            yield ids, records

    def _next_window(self, slices: Iterator[tuple[np.ndarray, list]],
                     window: int) -> tuple[np.ndarray, list]:
        """The next ``window`` records (fewer only at the end). What a slice holds beyond them
        stays where it is, its first record's offset kept: a window is a view of the slice, so
        that cutting a large slice into windows copies nothing of the rest each time."""
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

    def _put(self, ids: np.ndarray, records: list) -> bool:
        """Queue a window once there is room (checking ``stop`` every POLL_SECONDS);
        False if stopped first."""
        started = time.perf_counter()
        try:
            with self._room:
                while self._queued and self._queued >= self.bound:
                    if self._halt.is_set():
                        return False
                    self._room.wait(POLL_SECONDS)
                if self._halt.is_set():
                    return False
                self._queue.append([ids, records, 0])
                self._queued += len(ids)
                self._records_put += len(ids)
            return True
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
