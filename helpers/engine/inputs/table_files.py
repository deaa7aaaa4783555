"""What a table path holds, checked before anything is read: its files, their one format, the
columns asked for (present once in every file, of kinds that agree), and each file's pieces.

A piece is what is read at once: a Parquet row group, an Arrow file's record batch, a whole Arrow
stream (all know their rows from metadata, so a resumed run can skip them unread). A file's
schema and pieces come from one look at it (``layout``). A CSV/TSV file's columns come from its
first block's rows; its rows from one pass over it (helpers.engine.inputs.csv_scan), which
helpers.engine.inputs.tables reads a slice of rows at a time (helpers.engine.inputs.csv_rows).
"""
from __future__ import annotations

import glob
import io
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.fingerprint import FileStat, check_unchanged, file_stats, unchanged
from helpers.engine.contract.protocol import TEXT, BadRecord, SourceError, decoded
from helpers.engine.inputs.csv_scan import head

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv",
           ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow"}
CSV_BLOCK_BYTES = 4 << 20  # a CSV is parsed this much at a time (a longer row: the block grows)
CSV_MAX_BLOCK_BYTES = 256 << 20
MAX_LINES_IN_VALUE = 1000  # a CSV value spanning more lines is filed (tables: a quote left open)
RESERVED = {"ids", "errors", "resume", "attrs", "keys"}  # names an output or read_output uses


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


def layout(path: str, fmt: str, stat: FileStat | None = None
           ) -> tuple[Any, list[tuple[str, int | None, Callable]]]:
    """A file's schema and its pieces, ``(file, rows, read(columns) -> batches)``, from one
    look at it: a Parquet footer, an Arrow file's batches; a CSV's first block (its types
    inferred; only its whole rows read: pyarrow's own reader would read several blocks ahead),
    and no pieces (its rows: module docstring). Each piece's ``read`` checks the file against
    ``stat`` (as the run found it: helpers.engine.contract.fingerprint; by default, as it is now)
    when it opens it and after each batch."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    stat = stat or file_stats([path])[0]
    if fmt == "parquet":
        with pq.ParquetFile(path) as f:
            meta = f.metadata
            return f.schema_arrow, [(path, meta.row_group(i).num_rows, _parquet_reader(stat, i))
                                    for i in range(meta.num_row_groups)]
    if fmt == "arrow":
        reader = open_arrow(path)
        if hasattr(reader, "num_record_batches"):
            return reader.schema, [(path, reader.get_batch(i).num_rows, _arrow_reader(stat, i))
                                   for i in range(reader.num_record_batches)]
        rows = sum(b.num_rows for b in reader)  # one piece: a stream is read in order
        return reader.schema, [(path, rows, _stream_reader(stat))]
    first, block = first_rows(path, fmt)
    with pacsv.open_csv(io.BytesIO(first), parse_options=csv_parse(fmt, lambda row: "skip"),
                        read_options=pacsv.ReadOptions(block_size=block)) as reader:
        return reader.schema, []


def first_rows(path: str, fmt: str) -> tuple[bytes, int]:
    """A CSV file's first block's whole rows (helpers.engine.inputs.csv_scan.head), the block grown
    until it holds one of the header's width (whose values say the columns' types); and its
    size."""
    block = CSV_BLOCK_BYTES  # (a ragged row is left out: the reading files it)
    while (first := head(path, delimiter(fmt), block)) is None:
        if block >= CSV_MAX_BLOCK_BYTES:
            raise ValueError(f"no row of its header's width in its first "
                             f"{CSV_MAX_BLOCK_BYTES >> 20} MiB")
        block *= 4
    return first, block


def column_texts(column: Any, rows: Any, where: Callable[[int], str]) -> list:
    """A text column's values as str (None for a null); one that is not UTF-8 a BadRecord of
    its own (``rows``: the records' positions; ``where(k)`` names the k-th)."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        try:
            column = column.cast(pa.string())  # checks UTF-8, in C
        except pa.ArrowInvalid:
            return [decoded(t, r, f"{where(k)}: the text") if t is not None else t
                    for k, (t, r) in enumerate(zip(column.to_pylist(), rows.tolist()))]
    return column.to_pylist()


def _spanning(column: Any) -> list[int]:
    """Which texts hold more than MAX_LINES_IN_VALUE line breaks (of a column of bytes or
    strings: the line breaks found in its data buffer at once, counted per value by its
    offsets)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kinds = {pa.binary(): np.int32, pa.string(): np.int32, pa.large_binary(): np.int64,
             pa.large_string(): np.int64}
    if column.type not in kinds:
        lines = pc.count_substring(column, "\n").to_numpy(zero_copy_only=False)
        return np.flatnonzero(np.nan_to_num(lines.astype(float)) > MAX_LINES_IN_VALUE).tolist()
    _, offsets, data = column.buffers()
    offsets = np.frombuffer(offsets, kinds[column.type])[column.offset:][:len(column) + 1]
    if data is None or offsets[-1] - offsets[0] <= MAX_LINES_IN_VALUE:
        return []
    breaks = np.flatnonzero(np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]] == 10)
    counts = np.diff(np.searchsorted(breaks + offsets[0], offsets))
    return np.flatnonzero(counts > MAX_LINES_IN_VALUE).tolist()


def file_spanning(records: list, column: Any, rows: np.ndarray,
                  where: Callable[[int], str]) -> None:
    """Each of ``records`` (a CSV's texts, ``column``; ``rows`` their positions, ``where(k)``
    naming the k-th) whose text holds more than MAX_LINES_IN_VALUE line breaks made a
    BadRecord: a quote left open swallows the rows after it, and this is where it shows."""
    for k in _spanning(column):
        records[k] = BadRecord("ValueError", f"{where(k)}: its text spans over "
                               f"{MAX_LINES_IN_VALUE} lines: a quote left open swallows the rows "
                               f"after it", int(rows[k]))


def row_name(file: tuple[str, int], row: int) -> str:
    """How a message names a row: in its file (``file``: its name, its first row in the input),
    and in the input when that has several files."""
    name, first = file
    return f"{name} row {row - first}" + (f" (input row {row})" if first else "")


def open_arrow(path: str) -> Any:
    """An Arrow IPC file, or a stream (what ``datasets``' save_to_disk writes)."""
    import pyarrow as pa

    try:
        return pa.ipc.open_file(pa.memory_map(path))
    except pa.ArrowInvalid:
        return pa.ipc.open_stream(pa.memory_map(path))


def delimiter(fmt: str) -> str:
    """A CSV or TSV file's delimiter."""
    return "\t" if fmt == "tsv" else ","


def csv_parse(fmt: str, bad_rows: Callable[[Any], str] | None = None) -> Any:
    import pyarrow.csv as pacsv

    return pacsv.ParseOptions(delimiter=delimiter(fmt), newlines_in_values=True,
                              invalid_row_handler=bad_rows)


def kind(arrow_type: Any) -> str:
    """What a column holds, whatever its width or encoding: text, binary, integer, float, bool,
    null (no values at all) or the type itself."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    for name, test in (("text", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
                       ("binary", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t)),
                       ("unsigned", pa.types.is_unsigned_integer), ("integer", pa.types.is_integer),
                       ("float", pa.types.is_floating), ("bool", pa.types.is_boolean),
                       ("null", pa.types.is_null)):
        if test(arrow_type):
            return name
    return str(arrow_type)


def column_kind(schemas: list, files: list[str], column: str, path: str, what: str) -> str:
    """``column``'s kind, the same in every file (a file where it holds no values at all agrees
    with any); SourceError naming the file if it is missing, twice there, or of another kind.
    A CSV column that pyarrow would read as a date, a time or a decimal is text here: it is
    read as text."""
    csv = Path(files[0]).suffix.lower() in (".csv", ".tsv")
    kinds: dict[str, str] = {}
    for schema_, f in zip(schemas, files):
        found = schema_.get_all_field_indices(column)
        if not found:
            raise SourceError(f"input {path!r}: no column {column!r} ({what}) in {f!r}; its "
                              f"columns: {', '.join(schema_.names)}")
        if len(found) > 1:
            raise SourceError(f"input {path!r}: column {column!r} appears {len(found)} times in "
                              f"{f!r}; name the columns apart")
        found_kind = kind(schema_.field(column).type)
        if csv and found_kind not in ("integer", "unsigned", "float", "bool", "null"):
            found_kind = "text"
        kinds.setdefault(found_kind, f)
    known = {k: f for k, f in kinds.items() if k != "null"}
    if len(known) > 1:
        raise SourceError(f"input {path!r}: files disagree on column {column!r}: " +
                          "; ".join(f"{k} in {f!r}" for k, f in known.items()))
    return next(iter(known), "null")


def check_kept_names(names: Sequence[str], taken: set[str]) -> None:
    """SourceError unless every name of ``names`` (columns or fields to keep) can be an output
    dataset's beside ``taken`` (the text and id columns) and the names an output uses."""
    clash = sorted(set(names) & (taken | RESERVED))
    if clash:
        raise SourceError(f"keep_columns: {', '.join(clash)} cannot be kept under its own name "
                          f"(the text, the ids or the keys, or a name the output uses)")
    odd = [n for n in names if "/" in n or n.startswith(".") or not n]
    if odd:
        raise SourceError(f"keep_columns: {odd!r}: an output dataset's name holds no '/' and does "
                          f"not start with '.'")


def kept_dtypes(schemas: list, files: list[str], names: Sequence[str], taken: set[str],
                path: str) -> dict[str, str]:
    """``{column: OutputSpec dtype}`` of the columns to carry to the output: scalars only, under
    a name the output can hold (else SourceError)."""
    check_kept_names(names, taken)
    dtypes = {"integer": "int64", "unsigned": "uint64", "float": "float64", "bool": "int8",
              "text": TEXT, "null": TEXT}
    kept = {}
    for name in names:
        found = column_kind(schemas, files, name, path, "a column to keep")
        if found not in dtypes:
            raise SourceError(f"keep_columns: {name!r} holds {found}; only numbers, booleans "
                              f"and strings are carried to the output")
        kept[name] = dtypes[found]
    return kept


def _parquet_reader(stat: FileStat, group: int) -> Callable:
    def read(columns: list[str]) -> Iterator[Any]:
        import pyarrow.parquet as pq

        with unchanged(stat) as raw, pq.ParquetFile(raw) as f:
            for batch in f.iter_batches(batch_size=65536, row_groups=[group], columns=columns):
                check_unchanged(raw, stat)
                yield batch
    return read


def _arrow_reader(stat: FileStat, index: int) -> Callable:
    def read(columns: list[str]) -> Iterator[Any]:
        import pyarrow as pa

        with unchanged(stat) as raw:
            batch = pa.ipc.open_file(mapped(raw)).get_batch(index).select(columns)
            check_unchanged(raw, stat)
        yield batch
    return read


def _stream_reader(stat: FileStat) -> Callable:
    def read(columns: list[str]) -> Iterator[Any]:
        import pyarrow as pa

        with unchanged(stat) as raw:
            for batch in pa.ipc.open_stream(mapped(raw)):
                check_unchanged(raw, stat)
                yield batch.select(columns)
    return read


def mapped(file: Any) -> Any:
    """An open file memory-mapped, as pyarrow reads it without a copy."""
    import mmap

    import pyarrow as pa

    return pa.BufferReader(pa.py_buffer(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)))


def canonical_integers(path: str, fmt: str, column: str) -> bool:
    """Whether a CSV column's first block, read as text, holds integers as integers are written
    (``000123`` is a key that looks like a number: read as 123 it would lose its zeros and meet
    ``123``). An empty cell is no id at all, as in any other column of integers: its row goes to
    ``errors/`` (it made every other row's id a key)."""
    import re

    import pyarrow as pa
    import pyarrow.csv as pacsv

    convert = pacsv.ConvertOptions(include_columns=[column], column_types={column: pa.string()})
    first, block = first_rows(path, fmt)
    with pacsv.open_csv(io.BytesIO(first), parse_options=csv_parse(fmt, lambda row: "skip"),
                        convert_options=convert,
                        read_options=pacsv.ReadOptions(block_size=block)) as reader:
        batch = next(iter(reader), None)
    if batch is None:
        return True
    integer = re.compile(r"-?(0|[1-9][0-9]*)\Z")
    return all(not v or integer.match(v) for v in batch.column(0).to_pylist())


def count_lines(files: list[str], header: bool) -> int:
    """Rows of CSV or JSONL files by counting newlines (a quoted value with a newline in it counts
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
