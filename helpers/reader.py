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


def _safe_cost(cost: Callable[[Any], float], record: Any) -> float:
    try:
        return float(cost(record))
    except Exception:  # a bad record sorts first; its worker reports it
        return 0.0


class Reader(threading.Thread):
    """Cuts the source into workunits and feeds the bounded work queue.

    ``units_put`` counts the workunits on the queue; ``done`` turns True after the last one.
    ``notify`` is called after each put (and at the end) so that the consumer need not poll.

    With a ``cost`` function it reads ``window`` records ahead and orders them by cost before
    cutting, so a workunit holds records of similar size (texts of similar length pad less).
    """

    def __init__(self, records: Iterable[tuple[int, Any]], work: Any, workunit_size: int,
                 stop: threading.Event, window: int = 0,
                 cost: Callable[[Any], float] | None = None,
                 notify: Callable[[], None] | None = None) -> None:
        super().__init__(name="gpufeed-reader", daemon=True)
        self._records, self._work, self._size = records, work, workunit_size
        self._halt = stop
        self._window, self._cost = max(window, workunit_size), cost
        self._notify = notify or (lambda: None)
        self.error: BaseException | None = None
        self.read_seconds = self.blocked_seconds = 0.0
        self.records_read = self.units_put = 0
        self.done = False

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
        records, index = iter(self._records), itertools.count()
        while True:
            started = time.perf_counter()
            window = list(itertools.islice(records, self._window))
            if self._cost is not None:  # similar records together: less padding in a batch
                window.sort(key=lambda pair: _safe_cost(self._cost, pair[1]))
            self.read_seconds += time.perf_counter() - started
            if not window:
                return
            self.records_read += len(window)
            for start in range(0, len(window), self._size):
                chunk = window[start:start + self._size]
                ids = np.fromiter((i for i, _ in chunk), dtype=np.int64, count=len(chunk))
                yield Workunit(next(index), ids, [record for _, record in chunk])

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
