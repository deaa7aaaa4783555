"""How a worker reads a table's records by row itself (``writes="workers"``): Rows' opener for
Parquet files and Arrow IPC files, the formats whose metadata says where each row is.

A workunit names only its rows; the worker finds their pieces (a Parquet row group, an Arrow
file's record batch) from the files' footers, read once per process, and decodes only the text
column. An Arrow file is memory-mapped: any rows at once. A Parquet row group is decoded from its
start, so each worker keeps a cursor per row group it reads, which the next workunit of that row
group continues (workunits come in row order): a row group is decoded about once per worker that
reads from it, a batch of ROWS_BATCH rows held at a time.

The driver names the input by its absolute path and a digest of its files (names, sizes, times):
a worker that finds other files (another node's copy, a file changed since) refuses to read, and
so does one whose file changes while it reads (each file is checked on its open descriptor when
opened, and again after each read): the run stops (InputUnreadable) rather than write another
file's rows or file good records as errors. A worker keeps at most OPEN_FILES Arrow files mapped
and CURSORS Parquet row groups open (a folder of thousands of files), and a thread pool's end
closes them (``protocol.close_inputs``).
"""
from __future__ import annotations

import hashlib
import mmap
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.fingerprint import (FileStat, InputChanged, check_unchanged,
                                                 checked_open, file_stats, known_contents,
                                                 same_contents)
from helpers.engine.contract.protocol import null_texts
from helpers.engine.inputs.open_files import OpenFiles
from helpers.engine.inputs.table_files import (column_texts, layout, open_arrow, row_name,
                                               table_files)

ROWS_BATCH = 8192  # rows a Parquet cursor decodes at a time
CURSORS = 4  # Parquet row groups a worker keeps a cursor in
OPEN_FILES = 32  # Arrow files a worker keeps mapped (of a folder of thousands: the latest read)
TABLES = 2  # inputs a worker process keeps open (a pool that runs one input after another)


def digest(stats: list[FileStat]) -> str:
    """What the driver and each worker must agree on: the files, their sizes, times and inodes
    (not their owners: another machine may map them otherwise)."""
    return hashlib.sha1(repr([stat[:5] for stat in stats]).encode()).hexdigest()


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
    contents: bytes = b""  # the digests of their bytes the driver took (``contents_of``)

    def read(self, ids: np.ndarray) -> list:
        table = _opened(self.path, self.format, self.identity, self.contents)
        records: list = []
        for run in np.split(ids, np.flatnonzero(np.diff(ids) != 1) + 1) if len(ids) else []:
            start, stop = int(run[0]), int(run[-1]) + 1
            while start < stop:
                piece = int(np.searchsorted(table.offsets, start, side="right")) - 1
                end = min(stop, int(table.offsets[piece + 1]))
                first = int(table.offsets[piece])
                column = table.texts(piece, self.text_column, start - first, end - first)
                rows = np.arange(start, end, dtype=np.int64)
                file = table.file_of(piece)
                texts = column_texts(column, rows, lambda k: row_name(file, int(rows[k])))
                table.check(piece)  # (the texts are read: they were the driver's file's)
                null_texts(texts, lambda k: row_name(file, int(rows[k])))
                records += texts
                start = end
        return records


class _Table:
    """A table's pieces as one worker sees them: each piece's file and index, the rows before
    it (``offsets``), and the open files and cursors that read them: every file opened is
    checked to be the one the driver found (its size and time, on the open file), and checked
    again after each read (a file rewritten in place)."""

    def __init__(self, stats: list[FileStat], fmt: str) -> None:
        self.files = [stat.path for stat in stats]
        self.format, self._stats = fmt, stats
        self.pieces: list[tuple[int, int]] = []  # (file, row group or record batch)
        counts: list[int] = []
        self._maps: OpenFiles[tuple[Any, Any]] = OpenFiles(  # Arrow: (file, reader); its map
            OPEN_FILES, lambda held: held[0].close(), with_inputs=False)  # goes with its reader
        self._cursors: OpenFiles[_Cursor] = OpenFiles(CURSORS, lambda cursor: cursor.close(),
                                                      with_inputs=False)
        self._lock = threading.Lock()
        for n, file in enumerate(self.files):
            sizes = [rows for _, rows, _ in layout(file, fmt)[1]]  # (the driver's look, again)
            self.pieces += [(n, i) for i in range(len(sizes))]
            counts += sizes
        self.offsets = np.cumsum([0] + counts)
        self._file_first: dict[int, int] = {}
        for (n, _), first in zip(self.pieces, self.offsets[:-1].tolist()):
            self._file_first.setdefault(n, first)

    def file_of(self, piece: int) -> tuple[str, int]:
        """The piece's file's name and its first row in the input (for messages)."""
        n = self.pieces[piece][0]
        return Path(self.files[n]).name, self._file_first[n]

    def texts(self, piece: int, column: str, start: int, stop: int) -> Any:
        """Rows ``start:stop`` of ``piece``'s ``column``, an Arrow array."""
        with self._lock:  # (thread workers share this process's files and cursors)
            if self.format == "arrow":
                return self._arrow(piece, column, start, stop)
            return self._parquet(piece, column, start, stop)

    def _arrow(self, piece: int, column: str, start: int, stop: int) -> Any:
        import pyarrow as pa

        n, index = self.pieces[piece]

        def mapped() -> tuple[Any, Any]:
            file = checked_open(self._stats[n])
            view = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            return file, pa.ipc.open_file(pa.BufferReader(pa.py_buffer(view)))

        held = self._maps.get(n, mapped)
        check_unchanged(held[0], self._stats[n])  # (a file cut short since: its map must not
        # be read)
        return held[1].get_batch(index).column(column).slice(start, stop - start)

    def check(self, piece: int) -> None:
        """OSError if ``piece``'s file, read from its map since ``texts``, is no longer the
        driver's (a Parquet cursor checks each batch it decodes itself)."""
        n = self.pieces[piece][0]
        with self._lock:
            held = self._maps.peek(n)
            if held is not None:
                check_unchanged(held[0], self._stats[n])

    def _parquet(self, piece: int, column: str, start: int, stop: int) -> Any:
        n, index = self.pieces[piece]
        cursor = self._cursors.get((piece, column), lambda: _Cursor(self._stats[n], index, column),
                                   usable=lambda cursor: start >= cursor.start)  # (forward only)
        return cursor.take(start, stop)

    def close(self) -> None:
        """Close its maps and cursors (a file read again later is opened again)."""
        self._maps.close_all()
        self._cursors.close_all()


class _Cursor:
    """Reads one Parquet row group's column forward, ROWS_BATCH rows at a time, holding only the
    batch it is in."""

    def __init__(self, stat: FileStat, group: int, column: str) -> None:
        import pyarrow.parquet as pq

        self._stat = stat
        self._raw = checked_open(stat)
        self._file = pq.ParquetFile(self._raw)
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
                check_unchanged(self._raw, self._stat)
                self.start, self.end = self.end, self.end + len(self._batch)
            upto = min(stop, self.end)
            pieces.append(self._batch.slice(start - self.start, upto - start))
            start = upto
        return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)

    def close(self) -> None:
        self._file.close()
        self._raw.close()


_OPEN: OpenFiles[_Table] = OpenFiles(TABLES, lambda table: table.close())


def _opened(path: str, fmt: str, identity: str, contents: bytes) -> _Table:
    """The table at ``path`` as this process reads it, once its files are the driver's (checked
    before any footer is read; files whose stats moved since, a chmod or a new link, are the
    driver's if their bytes are: ``same_contents``; the digests the driver took known here
    too); the TABLES latest kept open."""
    def table() -> _Table:
        stats = file_stats(table_files(path)[0])
        if digest(stats) != identity and not same_contents(stats, contents):
            raise InputChanged(f"{path}: the files differ from those the driver found "
                               f"(another copy, or changed since the run started): every "
                               f"worker must read the same input")
        known_contents(stats, contents)
        return _Table(stats, fmt)

    return _OPEN.get((path, fmt, identity), table)


def close_all() -> None:
    """Close every table this process holds open."""
    _OPEN.close_all()
