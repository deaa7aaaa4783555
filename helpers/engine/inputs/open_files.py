"""What a worker keeps open between workunits: the latest few files (or tables, maps, cursors) a
Rows opener read, by key, so that the next workunit from the same file does not open it again,
and no more than a set number however many files an input has (a folder of thousands).

One cache serves every worker-side reader: CSV files (csv_rows), JSON-lines files (jsonl_rows),
tables and, inside a table, Arrow maps and Parquet cursors (table_rows), HDF5 inputs (sources).
Whether a file is still the driver's is asked elsewhere, one way for all of them
(helpers.engine.contract.fingerprint: ``checked_open`` on opening, ``check_unchanged`` after each
read; ``check_path`` for the HDF5 file h5py opens).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from helpers.engine.contract.protocol import holds_inputs

T = TypeVar("T")


class OpenFiles(Generic[T]):
    """The ``limit`` latest things opened, by key, the oldest closed (``close``) when one more
    is opened; thread-safe (thread workers share their process's). ``with_inputs``: closed with
    every input this process holds (``helpers.engine.contract.protocol.close_inputs``: a thread
    pool's end); a cache inside another thing closes with it instead."""

    def __init__(self, limit: int, close: Callable[[T], None],
                 with_inputs: bool = True) -> None:
        self.limit, self._close = limit, close
        self._held: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()
        if with_inputs:
            holds_inputs(self.close_all)

    def get(self, key: Hashable, open: Callable[[], T],
            usable: Callable[[T], bool] | None = None) -> T:
        """The thing held for ``key``, or ``open()``'s (also in place of one that is not
        ``usable``: a cursor past the rows asked for), now the latest."""
        with self._lock:
            held = self._held.pop(key, None)
            if held is not None and usable is not None and not usable(held):
                self._close(held)
                held = None
            if held is None:
                held = open()
            self._held[key] = held
            while len(self._held) > self.limit:
                self._close(self._held.popitem(last=False)[1])
            return held

    def peek(self, key: Hashable) -> T | None:
        """The thing held for ``key``, if any (not made the latest)."""
        with self._lock:
            return self._held.get(key)

    def values(self) -> list[T]:
        """What is held, the oldest first."""
        with self._lock:
            return list(self._held.values())

    def __len__(self) -> int:
        return len(self._held)

    def close_all(self) -> None:
        """Close everything held (a file read again later is opened again)."""
        with self._lock:
            while self._held:
                self._close(self._held.popitem()[1])
