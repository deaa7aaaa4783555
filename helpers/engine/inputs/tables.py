"""Tabular sources read with pyarrow: Parquet, CSV/TSV and Arrow files (a Hugging Face dataset
saved with ``save_to_disk`` is a folder of Arrow files), as one file, a folder or a glob.

A table is read a piece at a time (helpers.engine.inputs.table_files), only its text, id and kept
columns, so memory stays flat at any size; a CSV a slice of rows at a time, from one pass that
finds them (helpers.engine.inputs.csv_scan, csv_rows), as its workers read it. Records are numbered
by their row across the files in sorted order, and the id column decides what a record's id is:

- no id column: the row number;
- an integer column: its values (checked like any source's: a null, a value outside int64 or one
  seen earlier goes to ``errors/``, costing only its record);
- any other (strings, say ``doc-000123``): the row number, and the column is carried to the output
  as ``keys``, row-aligned with ``ids``, so the user can join the results back. A null key, one
  with a NUL character (HDF5 cannot hold it) or one seen earlier in the input goes to
  ``errors/``. Repeats are found by a 64-bit hash of each key, 8 bytes a key in the driver (160
  MB for 20 M keys): a collision, about one in 10^5 for 20 M keys, would file a good record as a
  repeat.

``keep_columns`` carries more columns to the output the same way (numbers, booleans, strings; a
null is NULLS' value). Where ids are row numbers, a piece whose rows a resumed run has all done
is not read (only its keys, for the repeat check). A CSV value spanning more than
MAX_LINES_IN_VALUE lines is filed as an error: a quote left open swallows the rows after it, and
this is where it shows. What is wrong with the table as a whole raises SourceError when the
source is opened, before any worker starts.
"""
from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.fingerprint import (NO_ID_COLUMN, file_identity, file_stats,
                                                 listing_identity)
from helpers.engine.contract.id_ranges import IdRanges, SeenIds, SeenValues
from helpers.engine.contract.protocol import (TEXT, BadRecord, OutputSpec, Rows, key_column,
                                              SourceError, decoded, null_texts, positions)
from helpers.engine.inputs.id_checks import id_record, integer_ids, key_problems
from helpers.engine.inputs.table_files import column_texts, layout, row_name, table_files
from helpers.engine.inputs.table_layouts import (CSV, NULLS, SLICE_ROWS, CSVLayout, PieceLayout,
                                                 TableSchema)
from helpers.engine.inputs.table_rows import TableRows


class TableSource:
    """The ``text_column`` of every row of a table (module docstring); ``id_column``: None (ids
    are row numbers), an integer column (ids) or any other (keys). Its ``schema``
    (helpers.engine.inputs.table_layouts.TableSchema) says what the columns are, its ``layout``
    (PieceLayout, CSVLayout) how the files are read; the source cuts what the layout reads into
    slices and applies the id rule."""

    def __init__(self, path: str | os.PathLike, text_column: str = "text",
                 id_column: str | None = None, keep_columns: Sequence[str] = ()) -> None:
        self.path, self.text_column, self.id_column = str(path), text_column, id_column
        self.keep_columns = tuple(keep_columns)
        self.files, self.format = table_files(path)
        stats = file_stats(self.files)  # as the files were when opened: every read checks
        # them (helpers.engine.contract.fingerprint; a CSV's rows are found later: csv_scan)
        layouts, columns = [], []
        for f, stat in zip(self.files, stats):
            try:
                layouts.append(layout(f, self.format, stat))
                columns.append(tuple(layouts[-1][0].names))  # (a name not UTF-8 raises here)
            except Exception as exc:  # pyarrow's ArrowInvalid, OSError, a name not UTF-8 alike
                which = f" ({f!r})" if os.path.abspath(f) != os.path.abspath(self.path) else ""
                raise SourceError(f"input {self.path!r}{which}: not a readable {self.format} "
                                  f"file ({type(exc).__name__}: {exc})") from exc
        schemas = [found for found, _ in layouts]
        self.schema = TableSchema.check(schemas, self.files, self.format, self.path, text_column,
                                        id_column, self.keep_columns)
        self.layout: PieceLayout | CSVLayout
        if self.format in CSV:
            self.layout = CSVLayout(self.path, self.format, self.files, stats, columns)
        else:
            self.layout = PieceLayout(self.path, self.format, self.files, stats,
                                      [piece for _, found in layouts for piece in found])
        self._length: int | None = None
        self.reads = 0  # pieces read so far (what a resume skipped is never read)

    @property
    def keyed(self) -> bool:
        return self.schema.keyed

    @property
    def key_column(self) -> str | None:
        """The output dataset of the keys (protocol.key_column), None without keys."""
        return key_column(self.id_column) if self.keyed else None

    def __len__(self) -> int:
        if self._length is None:  # (a CSV input's: its rows, as its one pass finds them)
            self._length = len(self.layout)
        return self._length

    def accounted(self, limit: int | None) -> int:
        """Rows a whole run over the first ``limit`` rows leaves in the output or errors/: a
        CSV's rows of another width (or a quote left open) too (the layout's)."""
        return self.layout.accounted(limit)

    def carried(self) -> dict[str, OutputSpec]:
        """The columns this source carries to the output beside the workload's."""
        specs = {self.key_column: OutputSpec((), TEXT)} if self.keyed else {}
        return specs | {name: OutputSpec((), dtype) for name, dtype in self.schema.kept.items()}

    def slices(self, skip: IdRanges, limit: int | None
               ) -> Iterator[tuple[np.ndarray, list, dict[str, np.ndarray]]]:
        """``(ids, records, carried)`` SLICE_ROWS at a time, the first ``limit`` rows only; rows
        whose ids are in ``skip`` dropped, a piece of them all not read (module docstring)."""
        return self._read(skip, limit)

    @functools.cached_property
    def positional(self) -> bool:
        """Whether workers can read this source's records themselves (``rows``): ids that are
        row numbers (none, or keys), files read by row (Parquet, Arrow IPC files, CSV/TSV files
        from their one pass: helpers.engine.inputs.csv_rows)."""
        return self.schema.by_row and self.layout.by_row

    def rows(self, skip: IdRanges, limit: int | None
             ) -> Iterator[tuple[np.ndarray, Rows | list, dict[str, np.ndarray]]]:
        """The rows as Rows for the workers to read (Source protocol), done ones left out; only
        where ``positional``. With nothing carried, from the footers alone; else the carried
        columns (keys, kept columns: not the texts) are read here, checked as ``slices`` checks
        them, and a row whose key is bad comes in a slice of BadRecords of its own."""
        if not self.positional:
            raise ValueError(f"{self.describe()}: workers cannot read it by row (an integer id "
                             f"column, or a {self.format} file read in order)")
        opener = self.layout.opener(self.text_column)
        if self.carried():
            return self._read(skip, limit, opener)
        rows = positions(opener, len(self) if limit is None else min(limit, len(self)), skip)
        return itertools.chain(rows, self.layout.unparsed(skip, limit, {}))

    def _read(self, skip: IdRanges, limit: int | None, opener: Any = None
              ) -> Iterator[tuple[np.ndarray, Any, dict[str, np.ndarray]]]:
        """``slices``, or with ``opener`` ``rows``: the pieces in order, those a resumed run
        finished not read (but for their keys: a later repeat is still one); the rows that are
        no record (a CSV's of another width) after them."""
        pieces = self._read_pieces(self.layout.pieces(), skip, limit, opener)
        done = skip if self.schema.by_row else IdRanges()  # (positions)
        return itertools.chain(pieces, self.layout.unparsed(done, limit, self.carried()))

    def _read_pieces(self, pieces: list, skip: IdRanges, limit: int | None, opener: Any
                     ) -> Iterator[tuple[np.ndarray, Any, dict[str, np.ndarray]]]:
        by_row = self.schema.by_row
        seen = SeenValues() if self.keyed else SeenIds()
        offset, file, file_first = 0, None, 0
        columns = ([self.text_column] if opener is None else []) + \
            ([self.id_column] if self.id_column else []) + list(self.keep_columns)
        for path, rows, read in pieces:
            if limit is not None and offset >= limit:
                return
            if path != file:
                file, file_first = path, offset
            if by_row and rows is not None and skip.runs and skip.covers(offset, offset + rows):
                if self.keyed:  # unread but for its keys: a later repeat is still one
                    for batch in read([self.id_column]):
                        n = _rows_within(batch.num_rows, offset, limit)
                        key_problems(_strings(batch.column(0).slice(0, n)), seen)
                        offset += n
                else:
                    offset += rows
                continue
            self.reads += 1
            for batch in read(columns):
                n = _rows_within(batch.num_rows, offset, limit)
                for start in range(0, n, SLICE_ROWS):
                    piece = batch.slice(start, min(SLICE_ROWS, n - start))
                    where = (Path(path).name, file_first)
                    if opener is None:
                        sliced = self._slice(piece, offset + start, seen, skip, where)
                        yield from [sliced] if sliced is not None else []
                    else:
                        yield from self._row_slices(piece, offset + start, seen, skip, where,
                                                    opener)
                offset += n
                if limit is not None and offset >= limit:
                    return

    def _carried(self, batch: Any, rows: np.ndarray, seen: Any, skip: IdRanges,
                 file: tuple[str, int]) -> tuple[np.ndarray, np.ndarray, dict, dict[int, Any]]:
        """Rows ``rows``' ids, which to keep (not done, or bad), their carried columns, and the
        BadRecords of those whose id, key or kept value is unusable (by index)."""
        ids, carried, problems = rows, {}, []
        if self.id_column is not None:
            values = batch.column(self.id_column)
            if self.keyed:
                keys = _strings(values)
                problems = key_problems(keys, seen)
                carried[self.key_column] = as_text(keys)
            else:
                ids, problems = integer_ids(values, seen)
        keep = ~skip.contains(ids) if skip.runs else np.ones(len(ids), dtype=bool)
        if self.keyed:  # a done row was judged by the run that wrote it (a hash collision
            problems = [(k, p) for k, p in problems if keep[k]]  # now must not file it again)
        keep[[k for k, _ in problems]] = True  # known by their position, not their id
        bad = {k: id_record(problem, f"{row_name(file, int(rows[k]))}: {self.id_column!r}",
                            int(rows[k])) for k, problem in problems}
        for name, dtype in self.schema.kept.items():
            if dtype == TEXT:
                values = _strings(batch.column(name))
                carried[name] = as_text(values)
                odd = _with_nul(carried[name]) + [k for k, v in enumerate(values)
                                                  if isinstance(v, bytes)]
                for k in odd:
                    bad[k] = BadRecord("ValueError", f"{row_name(file, int(rows[k]))}: kept "
                                       f"column {name!r} holds a NUL character or bytes that "
                                       f"are not UTF-8, which an HDF5 string cannot",
                                       int(rows[k]))
            else:
                carried[name] = kept_values(batch.column(name), dtype)
        return ids, keep, carried, bad

    def _slice(self, batch: Any, first: int, seen: Any, skip: IdRanges,
               file: tuple[str, int]) -> tuple[np.ndarray, list, dict[str, np.ndarray]] | None:
        """One slice of rows ``first, first + 1, ...`` as ``(ids, records, carried)``."""
        rows = np.arange(first, first + batch.num_rows, dtype=np.int64)
        ids, keep, carried, bad = self._carried(batch, rows, seen, skip, file)
        if not keep.any():
            return None
        def where(k: int) -> str:
            return row_name(file, int(rows[k]))

        records = column_texts(batch.column(self.text_column), rows, where)
        null_texts(records, where)
        self.layout.check_texts(records, batch.column(self.text_column), rows, where)
        for k, record in bad.items():  # (the driver files them, whoever reads the texts)
            records[k] = record
        if not keep.all():
            ids, records = ids[keep], [r for r, k in zip(records, keep) if k]
            carried = {c: v[keep] for c, v in carried.items()}
        return ids, records, carried

    def _row_slices(self, batch: Any, first: int, seen: Any, skip: IdRanges,
                    file: tuple[str, int], opener: TableRows
                    ) -> Iterator[tuple[np.ndarray, Any, dict[str, np.ndarray]]]:
        """Rows ``first, first + 1, ...`` for the workers: those with a bad key or kept value as
        ``(ids, BadRecords, carried)``, the others as ``(ids, Rows, carried)``."""
        rows = np.arange(first, first + batch.num_rows, dtype=np.int64)
        ids, keep, carried, bad = self._carried(batch, rows, seen, skip, file)
        if bad:
            at = np.array(sorted(bad), dtype=np.int64)
            yield ids[at], [bad[k] for k in at.tolist()], {c: v[at] for c, v in carried.items()}
            keep[at] = False
        if keep.any():
            yield ids[keep], Rows(opener, ids[keep]), {c: v[keep] for c, v in carried.items()}

    def describe(self) -> str:
        return f"{self.format}:{self.path}#{self.text_column}"

    def fingerprint(self) -> dict[str, Any]:
        files = [Path(os.path.abspath(f)) for f in self.files]
        where = file_identity(files[0]) if len(files) == 1 else \
            listing_identity(Path(os.path.commonpath(files)), files)
        return {"format": self.format, "text_column": self.text_column,
                "id_column": self.id_column or NO_ID_COLUMN,
                "keep_columns": list(self.keep_columns), **where}


def _rows_within(rows: int, offset: int, limit: int | None) -> int:
    return rows if limit is None else max(0, min(rows, limit - offset))


def _strings(values: Any) -> list:
    """A column's values as str (None for a null; bytes where they are not UTF-8), whatever
    its encoding."""
    import pyarrow as pa

    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        try:
            values = values.cast(pa.string())
        except pa.ArrowInvalid:  # bytes that are not UTF-8: kept as bytes, each one's problem
            return [v if v is None or isinstance(decoded(v, -1), BadRecord) else decoded(v, -1)
                    for v in values.to_pylist()]
    return values.to_pylist()


def as_text(values: list) -> np.ndarray:
    """Strings as an output's text column: "" where a value is not a string (its record is a
    BadRecord, never written)."""
    return np.array([v if type(v) is str else "" for v in values], dtype=object)


def _with_nul(values: np.ndarray) -> list[int]:
    """Which strings hold a NUL character (one join in C first: almost always none do)."""
    if "\0" not in "".join(values.tolist()):
        return []
    return [k for k, v in enumerate(values.tolist()) if "\0" in v]


def kept_values(array: Any, dtype: str) -> np.ndarray:
    """A kept column of numbers or booleans, a slice as its output dtype; a null is
    NULLS[dtype] (a text column: ``_strings`` and ``as_text``)."""
    import pyarrow as pa

    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_binary(array.type):  # a CSV's: numbers as text
        try:
            array = array.cast(pa.string())
        except pa.ArrowInvalid:
            pass
    wanted = {"int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(),
              "int8": pa.bool_()}[dtype]
    try:
        array = array.cast(wanted)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # CSV text that is not a number
        array = pa.array([kept_number(v, dtype) for v in array.to_pylist()], wanted)
    if dtype == "int8":
        array = array.cast(pa.int8())
    return array.fill_null(NULLS[dtype]).to_numpy(zero_copy_only=False).astype(dtype)


def kept_number(value: Any, dtype: str) -> Any:
    """One CSV value as a kept column's type, None (a null) where it is not one."""
    try:
        if dtype == "int8":
            return {"true": True, "false": False}.get(str(value).strip().lower())
        number = int(value) if dtype in ("int64", "uint64") else float(value)
        low, high = {"int64": (-2**63 + 1, 2**63 - 1), "uint64": (0, 2**64 - 2)}.get(
            dtype, (-np.inf, np.inf))
        return number if low <= number <= high else None
    except (TypeError, ValueError):
        return None

