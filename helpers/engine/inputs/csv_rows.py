"""How a worker reads a CSV or TSV file's rows itself (``writes="workers"``); the driver reads
every CSV the same way, its keys and kept columns too (helpers.engine.inputs.tables).

The driver reads each file once and parses nothing (helpers.engine.inputs.csv_scan: where every
ROW_STEP-th row starts, 8 bytes per ROW_STEP rows, and the byte ranges of the rows of another
width than the header's, which it files). A workunit's Rows carry, pickled, only the starts and
filed rows near the rows they name (``CSVRows.narrowed``); the worker reads the bytes from the
start before its first row to the start after its last, leaves out the rows the driver filed,
parses the rest with pyarrow as the driver's own reading would (helpers.engine.inputs.table_files),
and checks it found as many rows as the driver counted. Either check failing (that parse or count,
or the file's size and time: helpers.engine.inputs.table_rows) raises OSError: the run stops rather
than credit a text to another row's id.
"""
from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.fingerprint import FileStat, check_unchanged, checked_open
from helpers.engine.contract.protocol import null_texts
from helpers.engine.inputs.csv_scan import ROW_STEP, without
from helpers.engine.inputs.open_files import OpenFiles
from helpers.engine.inputs.table_files import column_texts, csv_parse, file_spanning, row_name

FILES = 4  # CSV files a worker process keeps open


@dataclass(frozen=True)
class CSVFile:
    """One file of a CSV input as its Rows' opener knows it."""

    path: str  # as the user named it, absolute (how messages name it)
    stat: FileStat  # as the driver found it
    columns: tuple[str, ...]  # its header
    first: int  # its first row's id in the input
    rows: int
    starts: np.ndarray = field(compare=False, repr=False)  # RowIndex.starts from ``step``
    bad: np.ndarray = field(compare=False, repr=False)  # RowIndex.bad (those among ``starts``)
    step: int = field(default=0, compare=False)  # the index of starts[0] in the file's
    unclosed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False,
                                 repr=False)  # RowIndex.unclosed (the driver's alone)
    bad_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False,
                                 repr=False)  # RowIndex.bad_rows (the driver's alone)

    def narrowed(self, low: int, high: int) -> CSVFile:
        """Itself with the starts and bad rows reading its rows ``low..high`` takes."""
        a, b = low // ROW_STEP, high // ROW_STEP + 2
        starts = self.starts[a - self.step:b - self.step].copy()
        stop = starts[-1] if len(starts) == b - a else self.stat[1]  # (the last row's: the end)
        bad = self.bad[(self.bad[:, 0] >= starts[0]) & (self.bad[:, 0] < stop)]
        return replace(self, starts=starts, bad=bad.copy(), step=a)

    def byte_range(self, low: int, high: int) -> tuple[int, int, int]:
        """``(first row, start byte, stop byte)`` of the rows read for rows ``low..high``."""
        a, b = low // ROW_STEP, high // ROW_STEP + 1
        if a < self.step or b - self.step > len(self.starts) or (
                b - self.step == len(self.starts) and b * ROW_STEP < self.rows):
            raise ValueError(f"{self.path}: rows {low}-{high} are not among this opener's row "
                             f"starts (rows {self.step * ROW_STEP} on)")
        stop = self.starts[b - self.step] if b - self.step < len(self.starts) else self.stat[1]
        return a * ROW_STEP, int(self.starts[a - self.step]), int(stop)


@dataclass(frozen=True)
class CSVRows:
    """Rows' opener of a CSV/TSV input whose ids are its rows (module docstring)."""

    format: str
    text_column: str
    files: tuple[CSVFile, ...]

    def narrowed(self, ids: np.ndarray) -> CSVRows:
        """Itself with only the files and starts reading ``ids`` takes (what a Rows pickles)."""
        kept = []
        for n, first, last in _by_file(self.files, ids):
            file = self.files[n]
            kept.append(file.narrowed(first - file.first, last - file.first))
        return replace(self, files=tuple(kept))

    def read(self, ids: np.ndarray) -> list:
        """The records at ``ids``: each stretch of them (ids fewer than ROW_STEP rows apart, the
        rows between read through) parsed from the start before it to the start after it."""
        records: list = []
        for n, first, last in _by_file(self.files, ids):
            file = self.files[n]
            mine = ids[(ids >= first) & (ids <= last)] - file.first
            for stretch in np.split(mine, np.flatnonzero(np.diff(mine) >= ROW_STEP) + 1):
                records += self._stretch(file, stretch)
        return records

    def _stretch(self, file: CSVFile, rows: np.ndarray) -> list:
        row, batch = read_rows(file, self.format, [self.text_column], int(rows.min()),
                               int(rows.max()))
        at = rows - row
        column = batch.column(0).take(at)
        ids = at + row + file.first
        name = (Path(file.path).name, file.first)
        def where(k: int) -> str:
            return row_name(name, int(ids[k]))

        texts = column_texts(column, ids, where)
        null_texts(texts, where)
        file_spanning(texts, column, ids, where)
        return texts


def read_rows(file: CSVFile, fmt: str, columns: list[str], low: int, high: int
              ) -> tuple[int, Any]:
    """``(first, batch)``: the rows of ``file`` from the row start before row ``low`` to the one
    after row ``high`` (``first`` the first of them), ``columns`` of them as bytes, parsed as
    the module docstring says and checked: OSError where they are not the driver's."""
    row, start, stop = file.byte_range(low, high)
    expected = min(file.rows, (high // ROW_STEP + 1) * ROW_STEP) - row
    data = read_bytes(file.stat, start, stop)
    try:
        batch = _parsed(file, fmt, columns, without(
            data, file.bad[(file.bad[:, 0] >= start) & (file.bad[:, 1] <= stop)] - start))
    except ValueError as exc:  # (pyarrow's ArrowInvalid)
        raise OSError(f"{file.stat[0]}: bytes {start}-{stop} are not the rows the driver "
                      f"found: {exc}") from exc
    if batch.num_rows != expected:
        raise OSError(f"{file.stat[0]}: bytes {start}-{stop} hold {batch.num_rows} rows, the "
                      f"driver counted {expected}: it would credit a text to another row")
    return row, batch


def _by_file(files: tuple[CSVFile, ...], ids: np.ndarray) -> list[tuple[int, int, int]]:
    """``(file, its first id, its last id)`` of each file ``ids`` fall in."""
    if not len(ids):
        return []
    firsts = np.array([f.first for f in files])
    which = np.searchsorted(firsts, ids, side="right") - 1
    found = []
    for n in np.unique(which).tolist():
        mine = ids[which == n]
        if n < 0 or mine.max() >= files[n].first + files[n].rows:
            raise ValueError(f"rows {mine.min()}-{mine.max()}: not in this opener's files")
        found.append((n, int(mine.min()), int(mine.max())))
    return found


def _parsed(file: CSVFile, fmt: str, columns: list[str], data: bytes) -> Any:
    """``columns`` of the rows in ``data`` as one RecordBatch, parsed as the table's own
    reading parses a CSV (helpers.engine.inputs.table_files: values as bytes, converted later, each
    bad one its row's error; a missing one null)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    read = pacsv.ReadOptions(column_names=list(file.columns), use_threads=False,
                             block_size=max(len(data) + 1, 1 << 16))
    convert = pacsv.ConvertOptions(include_columns=columns,
                                   column_types={c: pa.binary() for c in columns},
                                   strings_can_be_null=True, quoted_strings_can_be_null=False)
    table = pacsv.read_csv(io.BytesIO(data), read_options=read, convert_options=convert,
                           parse_options=csv_parse(fmt))
    return pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns],
                                      names=table.column_names)


_OPEN: OpenFiles[tuple[Any, threading.Lock]] = OpenFiles(FILES, lambda held: held[0].close())


def read_bytes(stat: FileStat, start: int, stop: int) -> bytes:
    """Bytes ``start:stop`` of the file ``stat`` names, checked to be the driver's before and
    after (the FILES latest kept open in this process)."""
    opened = _OPEN.get(stat, lambda: (checked_open(stat), threading.Lock()))
    file, lock = opened
    with lock:  # (thread workers share this process's file)
        file.seek(start)
        data = file.read(stop - start)
        check_unchanged(file, stat)
    return data


def row_text(stat: FileStat, start: int, stop: int) -> str:
    """A row's text as pyarrow hands a row of another width to a handler: no line break at the
    end (bytes ``start:stop`` of the file ``stat`` names, checked as ``read_bytes`` checks)."""
    text = read_bytes(stat, start, stop).decode("utf-8", "replace")
    return text.removesuffix("\n").removesuffix("\r")


def close_all() -> None:
    """Close the CSV files this process holds open."""
    _OPEN.close_all()
