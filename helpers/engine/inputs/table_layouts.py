"""A table's schema and its layout, per format: what helpers.engine.inputs.tables reads a piece at
a time, told apart once when the source opens rather than at every step of its reading.

- ``TableSchema``: the columns asked for, checked against every file's schema: the text column's
  kind, the id column's (none: row numbers; integers: the ids; anything else: keys), and the
  columns kept with their output dtypes.
- ``PieceLayout`` (Parquet, Arrow): the pieces the files' footers name, their rows known before
  any is read; workers read by row where the files allow it (helpers.engine.inputs.table_rows).
- ``CSVLayout`` (CSV, TSV): one pass over each file finds its rows (helpers.engine.inputs.csv_scan),
  read a slice of SLICE_ROWS rows at a time as the workers read them
  (helpers.engine.inputs.csv_rows); a row of another width than the header's, or whose quote never
  closes, is a BadRecord of the layout's own, after the input's rows.

A layout answers ``len``, ``accounted(limit)``, ``pieces()``, ``by_row``, ``opener(text_column)``
(what a worker reads its rows with), ``unparsed(skip, limit, carried)`` (its rows that are no
record) and ``check_texts`` (what it files of a slice's texts).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.fingerprint import FileStat, contents_of, file_stats
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import NO_ID, TEXT, BadRecord, OutputSpec, SourceError
from helpers.engine.inputs.csv_rows import CSVFile, CSVRows, read_rows, row_text
from helpers.engine.inputs.csv_scan import row_index
from helpers.engine.inputs.table_files import (canonical_integers, column_kind, delimiter,
                                               file_spanning, kept_dtypes)
from helpers.engine.inputs.table_rows import TableRows, digest, random_access

CSV = ("csv", "tsv")
SLICE_ROWS = 8192  # rows handed on at a time (a piece may hold millions)
NULLS = {"int64": np.iinfo(np.int64).min, "uint64": np.iinfo(np.uint64).max, "float64": np.nan,
         "int8": -1, TEXT: ""}  # a null kept value as written (booleans as 0/1)

Piece = tuple[str, "int | None", Callable]  # (file, rows, read(columns) -> batches)


@dataclass(frozen=True)
class TableSchema:
    """The columns a table source reads, as every file agrees on them."""

    text_column: str
    id_column: str | None
    keep_columns: tuple[str, ...]
    keyed: bool  # the id column holds keys (strings): ids are row numbers, keys carried
    kept: dict[str, str]  # {kept column: its OutputSpec dtype}

    @classmethod
    def check(cls, schemas: list, files: list[str], fmt: str, path: str, text_column: str,
              id_column: str | None, keep_columns: Sequence[str]) -> TableSchema:
        """The schema of ``files`` (``schemas``: each one's), or SourceError naming what is
        wrong: a column missing or of kinds that disagree, a text that is not text, ids that
        are neither integers nor strings, a kept column that cannot be carried."""
        if id_column is not None and id_column == text_column:
            raise SourceError(f"id_column: {id_column!r} is the text column too")
        text = column_kind(schemas, files, text_column, path, "the text column")
        if text not in ("text", "binary", "null"):
            raise SourceError(f"input {path!r}: column {text_column!r} holds {text}, not text")
        key = column_kind(schemas, files, id_column, path, "the id column") \
            if id_column is not None else None
        if key not in (None, "integer", "unsigned", "text", "null"):
            raise SourceError(f"input {path!r}: id column {id_column!r} holds {key}; ids "
                              f"are integers or strings")
        if key == "integer" and fmt in CSV and not all(
                canonical_integers(f, fmt, id_column) for f in files):
            key = "text"  # zero-padded or signed: keys, kept as written
        kept = kept_dtypes(schemas, files, keep_columns, {text_column, id_column} - {None}, path)
        return cls(text_column, id_column, tuple(keep_columns), key in ("text", "null"), kept)

    @property
    def by_row(self) -> bool:
        """Whether a record's id is its row number (no id column, or keys)."""
        return self.id_column is None or self.keyed


class PieceLayout:
    """Parquet and Arrow files: the pieces their footers name."""

    def __init__(self, path: str, fmt: str, files: list[str], stats: list[FileStat],
                 pieces: list[Piece]) -> None:
        self.path, self.format, self.files, self._pieces = path, fmt, files, pieces
        self._stats = stats  # as the source found them when it opened them: what workers check

    def __len__(self) -> int:
        return sum(rows for _, rows, _ in self._pieces)

    def accounted(self, limit: int | None) -> int:
        """Rows a whole run over the first ``limit`` rows leaves in the output or errors/."""
        return len(self) if limit is None else min(limit, len(self))

    def pieces(self) -> list[Piece]:
        return self._pieces

    @functools.cached_property
    def by_row(self) -> bool:
        """Whether a worker can read a row where it is (Parquet, Arrow IPC files; not a
        stream, which is read in order)."""
        return random_access(self.files, self.format)

    def opener(self, text_column: str) -> TableRows:
        return TableRows(os.path.abspath(self.path), self.format, text_column,
                         digest(self._stats), contents_of(self._stats))

    def unparsed(self, skip: IdRanges, limit: int | None,
                 carried: dict[str, OutputSpec]) -> Iterator[tuple]:
        return iter(())  # every row of these is a record

    def check_texts(self, records: list, column: Any, rows: np.ndarray,
                    where: Callable[[int], str]) -> None:
        pass  # a value is one value, whatever its line breaks


class CSVLayout:
    """CSV and TSV files: rows from one pass over each (module docstring), shared by ``len``,
    the driver's reading and the workers'."""

    by_row = True

    def __init__(self, path: str, fmt: str, files: list[str], stats: list[FileStat],
                 columns: list[tuple[str, ...]]) -> None:
        self.path, self.format, self.files = path, fmt, files
        self._stats, self.columns = stats, columns  # as the files were when opened
        self._found: list[CSVFile] | None = None

    def __len__(self) -> int:
        return sum(file.rows for file in self.found())

    def accounted(self, limit: int | None) -> int:
        """Rows a whole run over the first ``limit`` rows leaves in the output or errors/: the
        rows of another width (or a quote left open) of the files begun under ``limit`` too (as
        ``unparsed`` files them)."""
        rows = len(self) if limit is None else min(limit, len(self))
        return rows + sum(len(f.bad) for f in self.found() if limit is None or f.first < limit)

    def found(self) -> list[CSVFile]:
        """Each file as its Rows' opener knows it, from one pass over it that parses nothing
        (helpers.engine.inputs.csv_scan); the files must be as they were when their columns were
        read."""
        if self._found is None:
            indexes = [row_index(f, delimiter(self.format)) for f in self.files]
            if file_stats(self.files) != self._stats:
                raise SourceError(f"input {self.path!r}: written to since it was opened; open "
                                  f"it again")
            files, first = [], 0
            for path, stat, columns, index in zip(self.files, self._stats, self.columns,
                                                  indexes):
                if index.fields != len(columns):  # (never seen: the pass and pyarrow disagree)
                    raise SourceError(f"input {self.path!r}: {path!r}'s header has "
                                      f"{index.fields} fields by quotes and delimiters, "
                                      f"{len(columns)} by pyarrow")
                files.append(CSVFile(os.path.abspath(path), stat, columns, first, index.rows,
                                     index.starts, index.bad, unclosed=index.unclosed,
                                     bad_rows=index.bad_rows))
                first += index.rows
            self._found = files
        return self._found

    def pieces(self) -> list[Piece]:
        """Each file's rows, a slice of SLICE_ROWS rows at a time as the workers read them
        (pyarrow's streaming reader splits a row in rare files where its reading of the whole
        file does not: apache/arrow#50481, #51368)."""
        def slices(file: CSVFile, columns: list[str]) -> Iterator[Any]:
            for low in range(0, file.rows, SLICE_ROWS):  # (SLICE_ROWS: whole ROW_STEPs)
                high = min(low + SLICE_ROWS, file.rows) - 1
                first, batch = read_rows(file, self.format, columns, low, high)
                yield batch.slice(low - first, high - low + 1)
        return [(path, file.rows, functools.partial(slices, file))
                for path, file in zip(self.files, self.found())]

    def opener(self, text_column: str) -> CSVRows:
        return CSVRows(self.format, text_column, tuple(self.found()))

    def unparsed(self, skip: IdRanges, limit: int | None,
                 carried: dict[str, OutputSpec]) -> Iterator[tuple]:
        """The rows of another width than their header's, as ``unparsed_slice``s (with
        ``limit``, those of files that begin under it). Each is known by a position after the
        input's rows (its rows, then its place among these), so that a resumed run, which skips
        the positions filed, files it once."""
        files = self.found()
        position = sum(file.rows for file in files)
        for file in files:
            at = np.arange(position, position + len(file.bad), dtype=np.int64)
            position += len(file.bad)
            fresh = ~skip.contains(at) if skip.runs else np.ones(len(at), dtype=bool)
            if fresh.any() and (limit is None or file.first < limit):
                rows = file.bad[fresh]
                yield unparsed_slice([row_text(file.stat, start, stop) for start, stop in rows],
                                     Path(file.path).name, carried, at[fresh],
                                     np.isin(rows[:, 0], file.unclosed).tolist(),
                                     file.bad_rows[fresh].tolist() if len(file.bad_rows)
                                     else None)

    def check_texts(self, records: list, column: Any, rows: np.ndarray,
                    where: Callable[[int], str]) -> None:
        """A text over MAX_LINES_IN_VALUE lines filed: a quote left open (as a worker's
        reading files it: helpers.engine.inputs.csv_rows)."""
        file_spanning(records, column, rows, where)


def unparsed_slice(lines: list[str], name: str, carried: dict[str, OutputSpec],
                   positions: np.ndarray | None = None, unclosed: list[bool] | None = None,
                   rows: list[int] | None = None) -> tuple:
    """A slice of the CSV rows the parser could not split into the header's fields, or whose
    quote never closes (``unclosed``: helpers.engine.inputs.csv_scan), with no id (their
    ``positions`` where known, else -1; ``rows``: each one's row in its file, every row
    counted), so that each goes to ``errors/``. Such a row has no id: the ids of a CSV are the
    rows of its header's width."""
    at = positions.tolist() if positions is not None else [-1] * len(lines)
    unclosed = unclosed or [False] * len(lines)
    names = [f"{name} row {row} (every row counted)" for row in rows] if rows else \
        [name] * len(lines)
    records = [BadRecord("ValueError", f"{where}: " + (
        "a quote opened in this row never closes (it would swallow every row after it; the "
        "rows after it are read from its next line on)" if left_open else
        "a row with the wrong number of fields") + f": {line[:80]!r}", position)
        for line, position, left_open, where in zip(lines, at, unclosed, names)]
    columns = {c: np.full(len(lines), NULLS[s.dtype] if s.dtype != TEXT else "",
                          dtype=object if s.dtype == TEXT else s.dtype)
               for c, s in carried.items()}
    return np.full(len(lines), NO_ID, dtype=np.int64), records, columns
