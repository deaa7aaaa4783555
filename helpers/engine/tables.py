"""Tabular sources read with pyarrow: Parquet, CSV/TSV and Arrow files (a Hugging Face dataset
saved with ``save_to_disk`` is a folder of Arrow files), as one file, a folder or a glob.

A table is read a *piece* at a time (a Parquet row group, an Arrow record batch, a CSV block),
only its text and id columns, so memory stays flat at any size. Records are numbered by their row
across the files in sorted order, and the id column decides what a record's id is:

- no id column: the row number;
- an integer column: its values (checked like any source's: a null, a value outside int64 or one
  seen earlier goes to ``errors/``, costing only its record);
- any other (strings, say ``doc-000123``): the row number, and the column is carried to the output
  as ``keys``, row-aligned with ``ids``, so the user can join the results back. A null key goes to
  ``errors/``; a key seen earlier in the run too (found by a 64-bit hash: a collision, about one
  in 10^7 for 20 M keys, would file a good record as a duplicate).

Where ids are row numbers, a piece whose rows a resumed run has all done is not read at all
(Parquet row groups and Arrow batches know their rows from metadata; a CSV block is read and
dropped). What is wrong with the table as a whole (no such column, a text column that is not
text, files that disagree on a column's type, a file that is not what its suffix says) raises
SourceError when the source is opened, before any worker starts.
"""
from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.fingerprint import file_identity, listing_identity
from helpers.engine.id_ranges import IdRanges, SeenIds
from helpers.engine.protocol import NO_ID, TEXT, BadRecord, OutputSpec, SourceError, id_problem

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv",
           ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow"}
SLICE_ROWS = 8192  # rows handed on at a time (a piece may hold millions)
CSV_BLOCK_BYTES = 4 << 20
KEYS = "keys"  # the output dataset of a string id column
NULLS = {"int64": np.iinfo(np.int64).min, "float64": np.nan, "int8": -1, TEXT: ""}  # a null kept
# value as written: integers the smallest int64, numbers NaN, booleans (as 0/1) -1, strings ""


class TableSource:
    """The ``text_column`` of every row of a table (module docstring); ``id_column``: None (ids
    are row numbers), an integer column (ids) or any other (keys)."""

    def __init__(self, path: str | os.PathLike, text_column: str = "text",
                 id_column: str | None = None, keep_columns: Sequence[str] = ()) -> None:
        self.path, self.text_column, self.id_column = str(path), text_column, id_column
        self.keep_columns = tuple(keep_columns)
        self.files, self.format = table_files(path)
        try:
            schemas = [_schema(f, self.format) for f in self.files]
        except Exception as exc:  # pyarrow's ArrowInvalid and OSError alike
            raise SourceError(f"input {self.path!r}: not a readable {self.format} file "
                              f"({type(exc).__name__}: {exc})") from exc
        self._text_type, self._id_type = _columns(schemas, self.files, text_column, id_column,
                                                  self.path)
        self.keyed = id_column is not None and not _is_integer(self._id_type)
        self._kept = _kept(schemas, self.files, self.keep_columns,
                           {text_column, id_column, KEYS} - {None}, self.path)
        self._pieces = [piece for f in self.files for piece in _pieces(f, self.format)]
        self._length = (sum(rows for _, rows, _ in self._pieces)
                        if all(rows is not None for _, rows, _ in self._pieces) else None)
        self.reads = 0  # pieces read so far (what a resume skipped is never read)

    def __len__(self) -> int:
        if self._length is None:
            self._length = count_lines(self.files, header=True)
        return self._length

    def carried(self) -> dict[str, OutputSpec]:
        """The columns this source carries to the output beside the workload's."""
        specs = {KEYS: OutputSpec((), TEXT)} if self.keyed else {}
        return specs | {name: OutputSpec((), dtype) for name, dtype in self._kept.items()}

    def slices(self, skip: IdRanges, limit: int | None
               ) -> Iterator[tuple[np.ndarray, list, dict[str, np.ndarray]]]:
        """``(ids, records, carried)`` SLICE_ROWS at a time, the first ``limit`` rows only; rows
        whose ids are in ``skip`` dropped, a piece of them all not read (module docstring)."""
        by_row = self.id_column is None or self.keyed
        seen, offset = SeenIds(), 0
        columns = [self.text_column] + ([self.id_column] if self.id_column else []) + \
            list(self.keep_columns)
        for path, rows, read in self._pieces:
            if limit is not None and offset >= limit:
                return
            if by_row and rows is not None and skip.runs and skip.covers(offset, offset + rows):
                offset += rows
                continue
            self.reads += 1
            for batch in read(columns, self._types()):
                n = batch.num_rows if limit is None else min(batch.num_rows, limit - offset)
                for start in range(0, n, SLICE_ROWS):
                    piece = batch.slice(start, min(SLICE_ROWS, n - start))
                    sliced = self._slice(piece, offset + start, seen, skip, Path(path).name)
                    if sliced is not None:
                        yield sliced
                offset += n
                if limit is not None and offset >= limit:
                    return

    def _types(self) -> dict[str, Any]:
        import pyarrow as pa

        types = {self.text_column: self._text_type}
        if self.id_column is not None:
            types[self.id_column] = pa.int64() if _is_integer(self._id_type) else pa.string()
        return types

    def _slice(self, batch: Any, first: int, seen: SeenIds, skip: IdRanges, name: str
               ) -> tuple[np.ndarray, list, dict[str, np.ndarray]] | None:
        """One slice of rows ``first, first + 1, ...`` as ``(ids, records, carried)``."""
        import pyarrow as pa

        rows = np.arange(first, first + batch.num_rows, dtype=np.int64)
        ids = rows if self.id_column is None or self.keyed else None
        if ids is not None and skip.runs:
            keep = ~skip.contains(ids)
            if not keep.any():
                return None
        column = batch.column(self.text_column)
        records: list[Any] = column.to_pylist()
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            records = [_decode_text(t, r) if t is not None else t
                       for t, r in zip(records, rows.tolist())]
        carried: dict[str, np.ndarray] = {}
        if self.id_column is not None:
            values = batch.column(self.id_column)
            if self.keyed:
                keys = values.to_pylist()
                carried[KEYS] = np.array([k if k is not None else "" for k in keys], dtype=object)
                problems = key_problems(keys, seen)
            else:
                ids, problems = _integer_ids(values, seen)
            for k, problem in problems:  # (a row without a usable id)
                records[k] = BadRecord("DuplicateId" if "earlier" in problem else "ValueError",
                                       f"{name} row {rows[k]}: {self.id_column!r} {problem}",
                                       int(rows[k]))
        for name, dtype in self._kept.items():
            carried[name] = _kept_values(batch.column(name), dtype)
        if skip.runs:
            keep = ~skip.contains(ids)
            keep[[k for k, r in enumerate(records) if isinstance(r, BadRecord)]] = True
            if not keep.all():
                ids, rows = ids[keep], rows[keep]
                records = [r for r, k in zip(records, keep) if k]
                carried = {c: v[keep] for c, v in carried.items()}
        return ids, records, carried

    def describe(self) -> str:
        return f"{self.format}:{self.path}#{self.text_column}"

    def where(self, position: int) -> str:
        return f"row {position}: {self.id_column!r}"

    def fingerprint(self) -> dict[str, Any]:
        files = [Path(os.path.abspath(f)) for f in self.files]
        where = file_identity(files[0]) if len(files) == 1 else \
            listing_identity(Path(os.path.commonpath(files)), files)
        return {"format": self.format, "text_column": self.text_column,
                "id_column": self.id_column, **where}


def table_files(path: str | os.PathLike) -> tuple[list[str], str]:
    """The files a table path names (a file, a folder, a glob), sorted, and their one format."""
    text = str(path)
    if any(c in text for c in "*?["):
        files = sorted(f for f in glob.glob(text, recursive=True) if os.path.isfile(f))
    elif os.path.isdir(text):
        if (Path(text) / "dataset_dict.json").is_file():  # datasets' DatasetDict.save_to_disk
            splits = sorted(p.name for p in Path(text).iterdir() if p.is_dir())
            raise SourceError(f"input {text!r}: a dataset with splits ({', '.join(splits)}); "
                              f"name one split's folder, e.g. {os.path.join(text, splits[0])!r}"
                              if splits else f"input {text!r}: a dataset with no splits")
        files = sorted(str(p) for p in Path(text).rglob("*")
                       if p.is_file() and p.suffix.lower() in FORMATS
                       and not any(part.startswith(".") for part in p.relative_to(text).parts))
    elif os.path.isfile(text):
        files = [text]
    else:
        raise SourceError(f"input {text!r}: no such file, folder or glob match")
    if not files:
        raise SourceError(f"input {text!r}: no table files ({', '.join(sorted(FORMATS))})")
    kinds = {FORMATS.get(Path(f).suffix.lower()) for f in files}
    if None in kinds:
        odd = next(f for f in files if Path(f).suffix.lower() not in FORMATS)
        raise SourceError(f"input {text!r}: {odd!r} is not a table file "
                          f"({', '.join(sorted(FORMATS))})")
    if len(kinds) > 1:
        raise SourceError(f"input {text!r}: files of several formats ({', '.join(sorted(kinds))})"
                          f"; give one format at a time")
    return files, kinds.pop()


def _schema(path: str, fmt: str) -> Any:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt == "parquet":
        return pq.read_schema(path)
    if fmt == "arrow":
        return _open_arrow(path).schema
    with pacsv.open_csv(path, parse_options=_csv_parse(fmt),
                        read_options=pacsv.ReadOptions(block_size=1 << 20)) as reader:
        return reader.schema


def _open_arrow(path: str) -> Any:
    """An Arrow IPC file, or a stream (what ``datasets``' save_to_disk writes)."""
    import pyarrow as pa

    try:
        return pa.ipc.open_file(pa.memory_map(path))
    except pa.ArrowInvalid:
        return pa.ipc.open_stream(pa.memory_map(path))


def _csv_parse(fmt: str) -> Any:
    import pyarrow.csv as pacsv

    return pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", newlines_in_values=True)


def _columns(schemas: list, files: list[str], text: str, key: str | None, path: str
             ) -> tuple[Any, Any]:
    """The text and id columns' types, the same in every file (else SourceError)."""
    import pyarrow as pa

    found = []
    for column in [text] + ([key] if key else []):
        types = {}
        for schema, f in zip(schemas, files):
            if column not in schema.names:
                raise SourceError(f"input {path!r}: no column {column!r} in {f!r}; its columns: "
                                  f"{', '.join(schema.names)}")
            types.setdefault(str(schema.field(column).type), f)
        if len(types) > 1:
            raise SourceError(f"input {path!r}: files disagree on column {column!r}: " +
                              "; ".join(f"{t} in {f!r}" for t, f in types.items()))
        found.append(schemas[0].field(column).type)
    text_type, key_type = found[0], (found[1] if key else None)
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type) or
            pa.types.is_binary(text_type) or pa.types.is_large_binary(text_type) or
            pa.types.is_null(text_type)):
        raise SourceError(f"input {path!r}: column {text!r} holds {text_type}, not text")
    if pa.types.is_null(text_type):
        text_type = pa.string()
    if key_type is not None and not (_is_integer(key_type) or pa.types.is_string(key_type) or
                                     pa.types.is_large_string(key_type)):
        raise SourceError(f"input {path!r}: id column {key!r} holds {key_type}; ids are "
                          f"integers or strings")
    return text_type, key_type


def _kept(schemas: list, files: list[str], names: tuple[str, ...], taken: set[str], path: str
          ) -> dict[str, str]:
    """``{column: OutputSpec dtype}`` of the columns to carry to the output (``keep_columns``):
    scalars only, the same type in every file (else SourceError)."""
    import pyarrow as pa

    reserved = sorted(set(names) & (taken | {"ids", "errors", "resume"}))
    if reserved:
        raise SourceError(f"keep_columns: {', '.join(reserved)} cannot be kept under its own "
                          f"name (the text, the ids or the keys, or a name the output uses)")
    kept = {}
    for name in names:
        types = {}
        for schema, f in zip(schemas, files):
            if name not in schema.names:
                raise SourceError(f"input {path!r}: no column {name!r} to keep in {f!r}; its "
                                  f"columns: {', '.join(schema.names)}")
            types.setdefault(str(schema.field(name).type), schema.field(name).type)
        if len(types) > 1:
            raise SourceError(f"input {path!r}: files disagree on column {name!r} "
                              f"({', '.join(types)})")
        kind = next(iter(types.values()))
        if pa.types.is_integer(kind):
            kept[name] = "int64"
        elif pa.types.is_floating(kind):
            kept[name] = "float64"
        elif pa.types.is_boolean(kind):
            kept[name] = "int8"
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            kept[name] = TEXT
        else:
            raise SourceError(f"keep_columns: {name!r} holds {kind}; only numbers, booleans "
                              f"and strings are carried to the output")
    return kept


def _kept_values(array: Any, dtype: str) -> np.ndarray:
    """A kept column's slice as its output dtype; a null is NULLS[dtype]."""
    import pyarrow as pa

    if dtype == TEXT:
        return np.array(array.cast(pa.string()).fill_null("").to_pylist(), dtype=object)
    wanted = {"int64": pa.int64(), "float64": pa.float64(), "int8": pa.bool_()}[dtype]
    try:
        array = array.cast(wanted)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # CSV text that is not a number
        array = pa.array([_number(v, dtype) for v in array.to_pylist()], wanted)
    if dtype == "int8":
        array = array.cast(pa.int8())
    return array.fill_null(NULLS[dtype]).to_numpy(zero_copy_only=False).astype(dtype)


def _number(value: Any, dtype: str) -> Any:
    """One CSV value as a kept column's type, None (a null) where it is not one."""
    try:
        if dtype == "int8":
            return {"true": True, "false": False}.get(str(value).strip().lower())
        return int(value) if dtype == "int64" else float(value)
    except (TypeError, ValueError):
        return None


def _is_integer(arrow_type: Any) -> bool:
    import pyarrow as pa

    return arrow_type is not None and pa.types.is_integer(arrow_type)


def _pieces(path: str, fmt: str) -> list[tuple[str, int | None, Callable]]:
    """``(file, rows or None, read(columns, types) -> batches)`` of each piece of a file."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path).metadata
        return [(path, meta.row_group(i).num_rows, _parquet_reader(path, i))
                for i in range(meta.num_row_groups)]
    if fmt == "arrow":
        reader = _open_arrow(path)
        if hasattr(reader, "num_record_batches"):
            return [(path, reader.get_batch(i).num_rows, _arrow_reader(path, i))
                    for i in range(reader.num_record_batches)]
        return [(path, b.num_rows, _stream_reader(path, i)) for i, b in enumerate(reader)]
    return [(path, None, _csv_reader(path, fmt))]


def _parquet_reader(path: str, group: int) -> Callable:
    def read(columns: list[str], types: dict) -> Iterator[Any]:
        import pyarrow.parquet as pq

        with pq.ParquetFile(path) as f:
            for batch in f.iter_batches(batch_size=SLICE_ROWS * 8, row_groups=[group],
                                        columns=columns):
                yield _cast(batch, types)
    return read


def _arrow_reader(path: str, index: int) -> Callable:
    def read(columns: list[str], types: dict) -> Iterator[Any]:
        yield _cast(_open_arrow(path).get_batch(index).select(columns), types)
    return read


def _stream_reader(path: str, index: int) -> Callable:
    def read(columns: list[str], types: dict) -> Iterator[Any]:
        import itertools

        for batch in itertools.islice(_open_arrow(path), index, index + 1):
            yield _cast(batch.select(columns), types)
    return read


def _csv_reader(path: str, fmt: str) -> Callable:
    def read(columns: list[str], types: dict) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        as_text = {c: pa.string() for c in columns}  # converted here, a bad value its row's
        convert = pacsv.ConvertOptions(include_columns=columns, column_types=as_text,
                                       strings_can_be_null=True, quoted_strings_can_be_null=False)
        with pacsv.open_csv(path, parse_options=_csv_parse(fmt), convert_options=convert,
                            read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES)) as reader:
            for batch in reader:
                yield _cast(batch, types)
    return read


def _cast(batch: Any, types: dict[str, Any]) -> Any:
    """``batch`` with each column of ``types`` in that type; an integer id column that does not
    convert keeps its strings (``_integer_ids`` files each bad one)."""
    import pyarrow as pa

    arrays = []
    for name in batch.schema.names:
        array, wanted = batch.column(name), types.get(name)
        if wanted is not None and array.type != wanted:
            try:
                array = array.cast(wanted)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _decode_text(raw: bytes, row: int) -> str | BadRecord:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRecord("UnicodeDecodeError", f"row {row}: text is not valid UTF-8: {exc}", row)


def _integer_ids(values: Any, seen: SeenIds) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """A slice's ids from an integer column, and ``(row in slice, problem)`` for each unusable
    one (null, outside int64, not an integer, seen earlier): that row's id becomes NO_ID."""
    import pyarrow as pa

    problems = []
    if pa.types.is_integer(values.type) and values.null_count == 0 and \
            values.type != pa.uint64():
        ids = values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    else:
        ids = np.empty(len(values), dtype=np.int64)
        for k, value in enumerate(values.to_pylist()):
            if isinstance(value, str):
                try:
                    value = int(value)
                except ValueError:
                    pass
            problem = "is null" if value is None else id_problem(value)
            if problem:
                ids[k] = NO_ID
                problems.append((k, problem))
            else:
                ids[k] = value
    if (ids == NO_ID).any() and not problems:
        for k in np.flatnonzero(ids == NO_ID).tolist():
            problems.append((k, f"{NO_ID} is outside the ids gpufeed takes"))
    usable = ids != NO_ID
    again = np.zeros(len(ids), dtype=bool)
    again[usable] = seen.add(ids[usable])
    for k in np.flatnonzero(again).tolist():
        problems.append((k, f"{ids[k]} appeared earlier in the input; this record is not processed"))
        ids[k] = NO_ID
    return ids, problems


def key_problems(keys: list, seen: SeenIds) -> list[tuple[int, str]]:
    """``(row in slice, problem)`` for each null (or not a string) key and each key seen earlier
    in the run (by a 64-bit hash of it: module docstring)."""
    if all(map(str.__instancecheck__, keys)):  # the usual case: one pass in C
        usable, problems = np.ones(len(keys), dtype=bool), []
        hashes = np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys))
    else:
        usable = np.array([type(key) is str for key in keys], dtype=bool)
        problems = [(k, "is null" if keys[k] is None else f"is not a string: {keys[k]!r:.60}")
                    for k in np.flatnonzero(~usable).tolist()]
        hashes = np.array([hash(key) if type(key) is str else 0 for key in keys], dtype=np.int64)
    again = np.zeros(len(keys), dtype=bool)
    again[usable] = seen.add(hashes[usable])
    problems += [(k, f"{keys[k]!r} appeared earlier in the input; this record is not processed")
                 for k in np.flatnonzero(again).tolist()]
    return problems


def count_lines(files: list[str], header: bool) -> int:
    """Rows of CSV files by counting newlines (a quoted value with a newline in it counts
    twice: a total for progress, not for ids)."""
    total = 0
    for f in files:
        lines, last = 0, b"\n"
        with open(f, "rb") as data:
            while chunk := data.read(8 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        total += lines + (last != b"\n") - (1 if header and lines else 0)
    return total
