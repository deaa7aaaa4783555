"""How a worker reads a table's records by row itself (``writes="workers"``): Rows' opener for
Parquet files and Arrow IPC files, the formats whose metadata says where each row is.

A workunit names only its rows; the worker finds their pieces (a Parquet row group, an Arrow
file's record batch) from the files' footers, read once per process, and decodes only the text
column. An Arrow file is memory-mapped: any rows at once. A Parquet row group is decoded from its
start, so each worker keeps a cursor per row group it reads, which the next workunit of that row
group continues (workunits come in row order): a row group is decoded about once per worker that
reads from it, a batch of ROWS_BATCH rows held at a time.

The driver names the input by its absolute path and a digest of its files (names, sizes, times):
a worker that finds other files (another node's copy, a file changed since) refuses to read.
"""
from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.protocol import null_texts
from helpers.engine.table_files import column_texts, layout, open_arrow, row_name, table_files

ROWS_BATCH = 8192  # rows a Parquet cursor decodes at a time
CURSORS = 4  # Parquet row groups a worker keeps a cursor in


def digest(files: list[str]) -> str:
    """What the driver and each worker must agree on: the files, their sizes and times."""
    stats = [(os.path.abspath(f), *_size_and_time(f)) for f in files]
    return hashlib.sha1(repr(stats).encode()).hexdigest()


def _size_and_time(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def random_access(files: list[str], fmt: str) -> bool:
    """Whether a worker can read any rows of these files (Parquet, Arrow IPC files; not an
    Arrow stream, a CSV)."""
    return fmt == "parquet" or (fmt == "arrow" and all(
        hasattr(open_arrow(f), "num_record_batches") for f in files))


@dataclass(frozen=True)
class TableRows:
    """Rows' opener of a table source (the module docstring): ``read(ids)`` gives the texts at
    those positions, a BadRecord for a null or broken one."""

    path: str  # the source as the user named it (a file, a folder, a glob), absolute
    format: str
    text_column: str
    identity: str  # ``digest`` of its files, as the driver found them

    def read(self, ids: np.ndarray) -> list:
        table = _opened(self.path, self.format, self.identity)
        records: list = []
        for run in np.split(ids, np.flatnonzero(np.diff(ids) != 1) + 1) if len(ids) else []:
            start, stop = int(run[0]), int(run[-1]) + 1
            while start < stop:
                piece = int(np.searchsorted(table.offsets, start, side="right")) - 1
                end = min(stop, int(table.offsets[piece + 1]))
                first = int(table.offsets[piece])
                column = table.texts(piece, self.text_column, start - first, end - first)
                rows = np.arange(start, end, dtype=np.int64)
                texts = column_texts(column, rows)
                file = table.file_of(piece)
                null_texts(texts, lambda k: row_name(file, int(rows[k])))
                records += texts
                start = end
        return records


class _Table:
    """A table's pieces as one worker sees them: each piece's file and index, the rows before
    it (``offsets``), and the open files and cursors that read them."""

    def __init__(self, files: list[str], fmt: str) -> None:
        self.files, self.format = files, fmt
        self.pieces: list[tuple[int, int]] = []  # (file, row group or record batch)
        counts, self._handles, self._cursors = [], {}, OrderedDict()
        self._lock = threading.Lock()
        for n, file in enumerate(files):
            sizes = [rows for _, rows, _ in layout(file, fmt)[1]]  # (the driver's look, again)
            if fmt == "arrow":
                self._handles[n] = open_arrow(file)
            self.pieces += [(n, i) for i in range(len(sizes))]
            counts += sizes
        self.offsets = np.cumsum([0] + counts)
        self._file_first = {}
        for (n, _), first in zip(self.pieces, self.offsets[:-1].tolist()):
            self._file_first.setdefault(n, first)

    def file_of(self, piece: int) -> tuple[str, int]:
        """The piece's file's name and its first row in the input (for messages)."""
        n = self.pieces[piece][0]
        return Path(self.files[n]).name, self._file_first[n]

    def texts(self, piece: int, column: str, start: int, stop: int) -> Any:
        """Rows ``start:stop`` of ``piece``'s ``column``, an Arrow array."""
        n, index = self.pieces[piece]
        if self.format == "arrow":
            return self._handles[n].get_batch(index).column(column).slice(start, stop - start)
        with self._lock:  # (thread workers share this process's cursors)
            return self._parquet(piece, column, start, stop)

    def _parquet(self, piece: int, column: str, start: int, stop: int) -> Any:
        n, index = self.pieces[piece]
        key = (piece, column)
        cursor = self._cursors.pop(key, None)
        if cursor is None or start < cursor.start:
            cursor = _Cursor(self.files[n], index, column)
        self._cursors[key] = cursor  # the most recent last
        while len(self._cursors) > CURSORS:
            self._cursors.popitem(last=False)[1].close()
        return cursor.take(start, stop)


class _Cursor:
    """Reads one Parquet row group's column forward, ROWS_BATCH rows at a time, holding only the
    batch it is in."""

    def __init__(self, path: str, group: int, column: str) -> None:
        import pyarrow.parquet as pq

        self._file = pq.ParquetFile(path)
        self._batches = self._file.iter_batches(batch_size=ROWS_BATCH, row_groups=[group],
                                                columns=[column], use_threads=False)
        self.start = self.end = 0  # rows of the batch held
        self._batch: Any = None

    def take(self, start: int, stop: int) -> Any:
        import pyarrow as pa

        pieces = []
        while start < stop:
            while self.end <= start:
                self._batch = next(self._batches).column(0)
                self.start, self.end = self.end, self.end + len(self._batch)
            upto = min(stop, self.end)
            pieces.append(self._batch.slice(start - self.start, upto - start))
            start = upto
        return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)

    def close(self) -> None:
        self._file.close()


@functools.lru_cache(maxsize=2)
def _opened(path: str, fmt: str, identity: str) -> _Table:
    """The table at ``path`` as this process reads it, once its files are the driver's (checked
    before any footer is read)."""
    files = table_files(path)[0]
    if digest(files) != identity:
        raise OSError(f"{path}: the files differ from those the driver found (another copy, or "
                      f"changed since the run started): every worker must read the same input")
    return _Table(files, fmt)
