"""A source's own columns on their way to the output (Source protocol: ``carried``).

The reader meets a record's key (a string id column, say) long before its workunit comes back
from a worker, and the worker never needs it: the key waits here, by id, in the driver, and joins
its row when the row is written (or leaves with the record when it fails). Only the records in
flight are held: memory is bounded by the queue, not the input.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from helpers.engine.contract.protocol import TEXT, OutputSpec


class Carried:
    """``{column: {id: value}}`` for the records in flight; the reader adds, the writer takes.
    ``key``: the column holding the records' keys (the source's ``key_column``), if any."""

    def __init__(self, columns: Mapping[str, OutputSpec] | None = None,
                 key: str | None = None) -> None:
        self.key = key
        self._dtypes = {name: object if spec.dtype == TEXT else np.dtype(spec.dtype)
                        for name, spec in (columns or {}).items()}
        self._values: dict[str, dict[int, object]] = {name: {} for name in self._dtypes}
        self._lock = threading.Lock()  # the reader's thread adds, the main thread takes

    def __bool__(self) -> bool:
        return bool(self._values)

    def __len__(self) -> int:
        """Records held now."""
        return max((len(held) for held in self._values.values()), default=0)

    def add(self, ids: np.ndarray, columns: dict[str, np.ndarray]) -> None:
        keys = ids.tolist()
        with self._lock:
            for name, values in columns.items():
                self._values[name].update(zip(keys, values.tolist()))

    def peek(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The columns' values for ``ids``, in their order; still held (a workunit's, as sent to
        a worker that writes them: it may fail and be sent again)."""
        keys = ids.tolist()
        with self._lock:
            return {name: np.array([held[k] for k in keys], dtype=self._dtypes[name])
                    for name, held in self._values.items()}

    def take(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The columns' values for ``ids``, in their order; they are held no more."""
        keys = ids.tolist()
        with self._lock:
            return {name: np.array([held.pop(k) for k in keys], dtype=self._dtypes[name])
                    for name, held in self._values.items()}

    def drop(self, rows: list[tuple]) -> list[tuple]:
        """Forget the values of the records of error ``rows`` (``(id, type, message, time[,
        position])``: they will not be written); returns the rows, where the source has keys
        each with its record's key (the user's name for it: the id is a row number) after its
        position and in its message."""
        with self._lock:
            for name, held in self._values.items():
                values = [held.pop(row[0], None) for row in rows]
                if name == self.key:
                    rows = [with_key(row, key) for row, key in zip(rows, values)]
        return rows


def with_key(row: tuple, key: str | None) -> tuple:
    """An error row ``(id, type, message, time[, position])`` with its record's ``key``: named
    in its message and its sixth field (errors/key)."""
    record_id, kind, message, when, *rest = row
    if not key:
        return row
    return (record_id, kind, f"{message} (key {key!r})", when, rest[0] if rest else -1, key)
