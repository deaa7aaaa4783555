"""JSONLSource: one JSON object per line with a text field, parsed a block at a time by pyarrow.

A record's id is decided for the whole file by its first lines (ID_LINES of them): if one has the
id field, every record's id is its id field (integers: the ids; strings: the ids are line numbers
and the strings the output's ``keys``), and a line without one goes to ``errors/``; if none has
it, every id is the 0-based line number, and a line that has one goes to ``errors/``. (A file that
mixed the two would give a line number that another line names as its id: two records, one id.)

A file is cut into blocks of whole lines (BLOCK_BYTES); pyarrow parses a block's text and id fields
into columns at C speed, other fields ignored. A block pyarrow cannot take whole, or takes in a
way that loses a line's meaning (a line that is blank or not an object, an object spread over
lines, a missing or null text, an id of another type, invalid UTF-8 even in a field it ignores),
is left to the caller's line-at-a-time parser, which says what is wrong with each line: one bad
line costs its block's speed, never a record.
"""
from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.fingerprint import (FileStat, check_unchanged, file_identity,
                                                 listing_identity, unchanged)
from helpers.engine.contract.id_ranges import IdRanges, SeenIds, SeenValues
from helpers.engine.contract.protocol import (NO_ID, TEXT, BadRecord, OutputSpec, Rows,
                                              SourceError, key_column, null_texts,
                                              positions as row_slices)
from helpers.engine.inputs.id_checks import checked_ids, id_record, key_problems, screen
from helpers.engine.inputs.jsonl_rows import JSONLRows, LineIndex, file_stat, line_index
from helpers.engine.inputs.table_files import check_kept_names, count_lines
from helpers.engine.inputs.tables import as_text, kept_number, kept_values

BLOCK_BYTES = 4 << 20
BLANK = re.compile(rb"(?:^|\n)[ \t\r]*\n|\n[ \t\r]+\Z")  # a line of nothing but white space
ID_LINES = 1000  # lines that decide what the file's ids are


class JSONLSource:
    """Records from the ``text_column`` of each line of a JSON-lines file; ids: module docstring."""

    def __init__(self, path: str | os.PathLike, text_column: str = "text",
                 id_column: str = "id", keep_columns: Sequence[str] = ()) -> None:
        self.path, self.text_column, self.id_column = Path(path), text_column, id_column
        self.keep_columns = tuple(keep_columns)
        self.first = 0  # its first line's position in the input (a folder of files: JSONLFiles)
        if not self.path.is_file():
            raise SourceError(f"input {str(self.path)!r}: no such file")
        self._stat = file_stat(str(self.path.resolve()))  # every read checks the file against
        # it (helpers.engine.contract.fingerprint)
        if not self._stat[1]:  # (as an empty Parquet or CSV file is refused)
            raise SourceError(f"input {str(self.path)!r}: an empty file (0 bytes), no lines")
        heads = self._first_objects()
        self.ids = self._id_kind(heads)
        self.keyed = self.ids == "keys"
        self.key_column = key_column(id_column) if self.keyed else None  # (its dataset)
        self.kept = kept_kinds(heads, self.keep_columns, {text_column, id_column}, self.path)
        self._index: tuple[FileStat, LineIndex] | None = None  # (``_scanned``)

    def _first_objects(self) -> list[dict]:
        """The objects of the file's first ID_LINES lines (what decides its ids and the kinds of
        its kept fields)."""
        found = []
        with open(self.path, "rb") as lines:
            for line in islice(lines, ID_LINES):
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if type(obj) is dict:
                    found.append(obj)
        return found

    def _id_kind(self, heads: list[dict]) -> str:
        """"keys", "given" (integers) or "lines", from the first ID_LINES lines."""
        for obj in heads:
            if obj.get(self.id_column) is not None:
                return "keys" if isinstance(obj[self.id_column], str) else "given"
        return "lines"

    def __len__(self) -> int:
        """Lines (a blank one counts): the progress bar's total."""
        if not self.positional:
            return count_lines([str(self.path)], header=False)
        return self._scanned()[1].lines

    def _scanned(self) -> tuple[FileStat, LineIndex]:
        """The file as it was opened (``file_stat``) and its lines (``line_index``): one pass,
        parsing nothing, which ``rows`` and ``__len__`` share; SourceError if the file has
        changed since it was opened."""
        if self._index is None:
            path = self._stat[0]
            index = line_index(path) if file_stat(path) == self._stat else None
            if index is None or file_stat(path) != self._stat:
                raise SourceError(f"input {str(self.path)!r}: written to since it was opened; "
                                  f"open it again")
            self._index = self._stat, index
        return self._index

    def accounted(self, limit: int | None) -> int:
        """Rows a whole run over the first ``limit`` lines leaves in the output or errors/:
        every line but the blank ones (no record)."""
        index = self._scanned()[1]
        end = index.lines if limit is None else min(limit, index.lines)
        return end - int(np.count_nonzero(index.blank < end))

    def carried(self) -> dict[str, OutputSpec]:
        specs = {self.key_column: OutputSpec((), TEXT)} if self.keyed else {}
        return specs | {name: OutputSpec((), dtype) for name, dtype in self.kept.items()}

    def slices(self, skip: IdRanges, limit: int | None, seen: Any = None) -> Iterator[tuple]:
        """A block of lines at a time (pyarrow, or line by line where a block has a bad line),
        ids as the module docstring says, the first ``limit`` lines (of the input: the file's
        first is ``first``) only, done ids dropped; ``seen``: the ids or keys of the files
        before it (JSONLFiles)."""
        seen = seen if seen is not None else SeenValues() if self.keyed else SeenIds()
        local = None if limit is None else limit - self.first
        for first, block in blocks(self.path, local, self._stat):
            positions, raw, records, kept = self._block(first + self.first, block)
            if limit is not None and len(positions) and positions[-1] >= limit:
                n = int(np.searchsorted(positions, limit))
                positions, records, raw = positions[:n], records[:n], raw[:n]
                kept = {name: values[:n] for name, values in kept.items()}
            if not len(positions):
                continue
            null_texts(records, lambda k: self.line(int(positions[k])) + (
                f" ({self.id_column} {raw[k]!r})" if self.ids == "keys" else ""), positions)
            columns: dict[str, np.ndarray] = {
                name: kept_column(kept[name], dtype) for name, dtype in self.kept.items()}
            if self.ids == "keys":
                columns[self.key_column] = as_text(raw)
                done = skip.contains(positions) if skip.runs else np.zeros(len(raw), dtype=bool)
                self._file(records, positions, [(k, p) for k, p in key_problems(list(raw), seen)
                                                if not done[k]])  # (judged when written)
                screened = screen(positions, records, positions, None, skip)
            elif self.ids == "lines":
                self._numbered(records, positions, raw)
                screened = screen(positions, records, positions, None, skip)
            else:
                if not isinstance(raw, np.ndarray):
                    self._file(records, positions, [(k, "is missing: other lines have ids")
                                                    for k, v in enumerate(raw) if v is None])
                if isinstance(raw, np.ndarray) and not (raw == NO_ID).any():
                    ids = raw.astype(np.int64)  # (writable: Arrow's arrays are read-only)
                else:
                    values = raw.tolist() if isinstance(raw, np.ndarray) else raw
                    ids = checked_ids(tuple(NO_ID if v is None else v for v in values), records,
                                      tuple(positions.tolist()), self.where)
                screened = screen(ids, records, positions, seen, skip)
            if screened is not None:
                ids, records, keep = screened
                yield ids, records, {c: v[keep] for c, v in columns.items()}

    def _block(self, first: int, block: bytes) -> tuple[np.ndarray, Any, list, dict]:
        """``(positions, ids, records, kept)`` of a block's lines, blank ones left out (``kept``:
        each kept field's values, None where missing): pyarrow's columns, or a line at a time
        where it cannot take the block (module docstring)."""
        parsed = parse(block, self.text_column, self.id_column, "str" if self.keyed else "int",
                       self.kept)
        if parsed is None:
            return self._lines(first, block)
        records, raw, kept = parsed
        return np.arange(first, first + len(records), dtype=np.int64), raw, records, kept

    def _numbered(self, records: list, positions: np.ndarray, raw: Any) -> None:
        """Ids that are line numbers: a line with an id of its own is filed (module docstring)."""
        given = [k for k, value in enumerate(raw) if value is not None]
        self._file(records, positions, [(k, "is there, but the first lines have no ids: ids "
                                            "are the line numbers") for k in given])

    def numbered(self, first: int, block: bytes) -> tuple[np.ndarray, list]:
        """``(positions, records)`` of ``block``'s lines, the first of them line ``first``, as
        ``slices`` gives them where ids are line numbers (a worker reading its own lines:
        helpers.engine.inputs.jsonl_rows); a blank line gives none."""
        positions, raw, records, _ = self._block(first, block)
        null_texts(records, lambda k: self.line(int(positions[k])), positions)
        self._numbered(records, positions, raw)
        return positions, records

    @property
    def positional(self) -> bool:
        """Whether workers can read this file's records themselves (``rows``): where ids are
        its line numbers and no field is kept (given ids, keys and kept fields are read by the
        driver)."""
        return self.ids == "lines" and not self.kept

    def rows(self, skip: IdRanges, limit: int | None) -> Iterator[tuple[np.ndarray, Rows]]:
        """The lines as Rows for the workers to read (Source protocol; only where
        ``positional``), from one pass that parses nothing (helpers.engine.inputs.jsonl_rows), done
        ids and blank lines left out."""
        if not self.positional:
            raise ValueError(f"{self.describe()}: workers read a file by line only where its "
                             f"ids are line numbers (these are its {self.id_column!r} field)")
        stat, index = self._scanned()
        opener = JSONLRows(os.path.abspath(self.path), self.text_column, self.id_column, stat,
                           JSONLSource, index.starts)
        end = index.lines if limit is None else min(limit, index.lines)
        return row_slices(opener, end, skip.union(IdRanges.from_ids(index.blank)))

    def _file(self, records: list, positions: np.ndarray, problems: list[tuple[int, str]]
              ) -> None:
        """Each ``(k, problem)``'s record made a BadRecord (a bad line stays as it is)."""
        for k, problem in problems:
            if not isinstance(records[k], BadRecord):
                records[k] = id_record(problem, self.where(int(positions[k])), int(positions[k]))

    def _lines(self, first: int, block: bytes) -> tuple[np.ndarray, list, list, dict]:
        """A block parsed a line at a time: ``(positions, ids, records, kept)`` of its lines
        that are not blank; an id or a kept value is None where the line has none."""
        positions, raw, records = [], [], []
        kept: dict[str, list] = {name: [] for name in self.kept}
        text, key, loads = self.text_column, self.id_column, json.loads
        for number, line in enumerate(lines_of(block), first):
            try:
                obj = loads(line)
            except RecursionError:  # nested past json's limit: as pyarrow reads it in a block
                parsed = parse(line, text, key, "str" if self.keyed else "int")
                positions.append(number)
                raw.append(list(parsed[1])[0] if parsed else NO_ID)
                records.append(parsed[0][0] if parsed else self._bad(number, line))
                for values in kept.values():
                    values.append(None)
                continue
            except ValueError:  # a blank line, or not JSON
                if line.strip():
                    positions.append(number), raw.append(NO_ID)
                    records.append(self._bad(number, line))
                    for values in kept.values():
                        values.append(None)
                continue
            positions.append(number)
            raw.append(obj.get(key) if type(obj) is dict else NO_ID)
            records.append(obj[text] if type(obj) is dict and text in obj
                           else self._bad(number, line))
            for name, values in kept.items():
                values.append(obj.get(name) if type(obj) is dict else None)
        return np.array(positions, dtype=np.int64), raw, records, kept

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        for ids, records, _ in self.slices(IdRanges(), None):  # ids checked, bad records kept
            yield from zip(ids.tolist(), records)

    def _bad(self, number: int, line: bytes) -> BadRecord:
        """Why line ``number`` (of the input) gives no record."""
        where = self.line(number)
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            return BadRecord(type(exc).__name__, f"{where}: not JSON ({exc})", number)
        if not isinstance(obj, dict):
            return BadRecord("ValueError", f"{where}: expected a JSON object", number)
        return BadRecord("KeyError", f"{where}: no field {self.text_column!r}", number)

    def describe(self) -> str:
        return f"jsonl:{self.path}#{self.text_column}"

    def line(self, position: int) -> str:
        """How a message names a record: its line, as an editor counts (and in the input, of a
        folder of files)."""
        return f"{self.path.name} line {position - self.first + 1}" + (
            f" (input line {position + 1})" if self.first else "")

    def where(self, position: int) -> str:
        """How a message names a record's id: its line and the field."""
        return f"{self.line(position)}: {self.id_column!r}"

    def fingerprint(self) -> dict[str, Any]:
        return {"format": "jsonl", "text_column": self.text_column, "id_column": self.id_column,
                "ids": self.ids, **({"keep_columns": list(self.keep_columns)}
                                   if self.keep_columns else {}),
                **file_identity(self.path)}


class JSONLFiles:
    """The JSON-lines files of a folder or a glob (sharded dumps), in sorted order, as one
    input: a record's position is its line across the files, ids are decided as for one file
    (every file must agree: line numbers, integer ids or keys), and an id or key repeated in any
    later file goes to ``errors/``. Read by the driver."""

    positional = False

    def __init__(self, path: str | os.PathLike, files: Sequence[str], text_column: str = "text",
                 id_column: str = "id", keep_columns: Sequence[str] = ()) -> None:
        self.path, self.text_column, self.id_column = str(path), text_column, id_column
        self.keep_columns = tuple(keep_columns)
        self.files = [JSONLSource(f, text_column, id_column, keep_columns) for f in files]
        kinds: dict[str, Path] = {}
        for f in self.files:  # (each kind named by its first file)
            kinds.setdefault(f.ids, f.path)
        if len(kinds) > 1:
            raise SourceError(f"input {self.path!r}: its files disagree on what a record's id "
                              f"is: " + "; ".join(f"{_IDS[k]} in {str(p)!r}"
                                                  for k, p in kinds.items()))
        kept = {name: _common_kind({f.kept[name] for f in self.files})
                for name in self.keep_columns}  # (as one file's first lines would say it)
        for f in self.files:
            f.kept = kept
        self.ids, self.keyed, self.kept = self.files[0].ids, self.files[0].keyed, kept
        self.key_column = self.files[0].key_column
        first = 0
        for f in self.files:
            f.first = first
            first += len(f)

    def __len__(self) -> int:
        return sum(len(f) for f in self.files)

    def accounted(self, limit: int | None) -> int:
        total = 0
        for f in self.files:
            if limit is not None and f.first >= limit:
                break
            total += f.accounted(None if limit is None else limit - f.first)
        return total

    def carried(self) -> dict[str, OutputSpec]:
        return self.files[0].carried()

    def slices(self, skip: IdRanges, limit: int | None) -> Iterator[tuple]:
        seen = SeenValues() if self.keyed else SeenIds()  # (across the files)
        for f in self.files:
            if limit is not None and f.first >= limit:
                return
            yield from f.slices(skip, limit, seen)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        for ids, records, _ in self.slices(IdRanges(), None):
            yield from zip(ids.tolist(), records)

    def describe(self) -> str:
        return f"jsonl:{self.path}#{self.text_column}"

    def fingerprint(self) -> dict[str, Any]:
        files = [Path(os.path.abspath(f.path)) for f in self.files]
        return {"format": "jsonl", "text_column": self.text_column, "id_column": self.id_column,
                "ids": self.ids, "keep_columns": list(self.keep_columns),
                **listing_identity(Path(os.path.commonpath(files)) if len(files) > 1
                                   else files[0].parent, files)}


_IDS = {"lines": "line numbers", "given": "integer ids", "keys": "string keys"}


def _common_kind(kinds: set[str]) -> str:
    """The kind of a kept field whose files' first lines say ``kinds``: theirs where they agree,
    floats for integers and floats, else text (as ``kept_kinds`` decides within one file)."""
    if len(kinds) == 1:
        return kinds.pop()
    return "float64" if kinds <= {"int64", "float64"} else TEXT


def jsonl_files(path: str | os.PathLike) -> list[str]:
    """The JSON-lines files a folder (recursively, hidden ones aside) or a glob names, sorted;
    none where it names none (or a single file)."""
    text = str(path)
    if any(c in text for c in "*?["):
        found = glob.glob(text, recursive=True)
    elif os.path.isdir(text):
        found = [str(p) for p in Path(text).rglob("*")
                 if not any(part.startswith(".") for part in p.relative_to(text).parts)]
    else:
        return []
    return sorted(f for f in found if os.path.isfile(f)
                  and Path(f).suffix.lower() in (".jsonl", ".ndjson"))


def kept_kinds(heads: list[dict], names: Sequence[str], taken: set[str], path: Any
               ) -> dict[str, str]:
    """``{field: OutputSpec dtype}`` of the fields to carry to the output, from the values the
    first lines' objects hold (integers, floats, booleans, strings; a field none of them has is
    text): SourceError for a name the output cannot hold, or a field that holds objects or
    lists."""
    check_kept_names(names, taken)
    kinds = {}
    for name in names:
        if heads and not any(name in obj for obj in heads):
            fields = sorted({field for obj in heads for field in obj})
            raise SourceError(f"input {str(path)!r}: no field {name!r} (a field to keep) in its "
                              f"first {len(heads):,} objects; their fields: {', '.join(fields)}")
        seen = {type(obj[name]) for obj in heads if obj.get(name) is not None}
        if seen - {int, float, bool, str}:
            raise SourceError(f"input {str(path)!r}: kept field {name!r} holds "
                              f"{sorted(t.__name__ for t in seen)[0]} values; only numbers, "
                              f"booleans and strings are carried to the output")
        kinds[name] = ("int8" if seen == {bool} else "int64" if seen == {int}
                       else "float64" if seen and seen <= {int, float} else TEXT)
    return kinds


def kept_column(values: Any, dtype: str) -> np.ndarray:
    """A kept field's values (a list, None where missing, or pyarrow's column) as its output
    dtype: a null is NULLS[dtype]; a value of another type is a null, or as text its JSON."""
    import pyarrow as pa

    if not isinstance(values, list):
        if dtype != TEXT:
            return kept_values(values, dtype)
        values = values.to_pylist()
    if dtype == TEXT:
        return as_text([v if isinstance(v, str) or v is None else json.dumps(v) for v in values])
    wanted = {"int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(),
              "int8": pa.bool_()}[dtype]
    return kept_values(pa.array([kept_number(v, dtype) for v in values], wanted), dtype)



def blocks(path: Any, limit_lines: int | None = None,
           stat: FileStat | None = None) -> Iterator[tuple[int, bytes]]:
    """``(first line number, bytes of whole lines)`` through the file; the last line may lack
    its newline. The file is checked against ``stat`` (as the run found it; by default as it is
    now) when opened and after each read: one changed stops the reading (OSError)."""
    first, rest = 0, b""
    stat = stat or file_stat(os.path.abspath(path))
    with unchanged(stat) as f:
        while True:
            data = f.read(BLOCK_BYTES)
            check_unchanged(f, stat)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a block: read on
                rest = data
                continue
            block, rest = data[:cut], data[cut:]
            yield first, block
            first += block.count(b"\n")
            if limit_lines is not None and first >= limit_lines:
                return
    if rest:
        yield first, rest


def parse(block: bytes, text: str, key: str, key_type: str, kept: dict[str, str] | None = None
          ) -> tuple[list, Any, dict] | None:
    """``(texts, ids, kept)`` of every line of ``block``, or None where the caller must parse it
    a line at a time (module docstring). ``key_type`` "int": ``ids`` is a list with None where a
    line has no id (an int64 array when every line has one); "str": a list of keys, None where
    missing. ``kept``: fields to read too, ``{name: OutputSpec dtype}`` (their columns)."""
    import pyarrow as pa
    import pyarrow.json as pajson

    if _blank_line(block) or not _utf8(block) or not _objects(block):  # pyarrow skips a blank
        return None  # line (line numbers would shift), reads invalid UTF-8 in a field it ignores,
    lines = block.count(b"\n") + (not block.endswith(b"\n"))  # an object across lines
    arrow = {"int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(),
             "int8": pa.bool_(), TEXT: pa.string()}
    schema = pa.schema([(text, pa.string()), (key, pa.int64() if key_type == "int"
                                              else pa.string())] +
                       [(name, arrow[dtype]) for name, dtype in (kept or {}).items()])
    try:
        table = pajson.read_json(
            pa.py_buffer(block),
            read_options=pajson.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=pajson.ParseOptions(explicit_schema=schema,
                                              unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != lines or table.column(text).null_count:
        return None  # two objects on a line, a missing or null text
    texts = table.column(text).to_pylist()
    ids = table.column(key)
    columns = {name: table.column(name).combine_chunks() for name in (kept or {})}
    if key_type == "str":
        return texts, ids.to_pylist(), columns
    if not ids.null_count:
        return texts, ids.to_numpy(), columns
    return texts, ids.to_pylist(), columns


def _objects(block: bytes) -> bool:
    """Whether each line of ``block`` starts with ``{`` and ends with ``}`` (before a ``\r``),
    as a line holding one object does: an object spread over lines does not, so pyarrow, which
    reads it whole, cannot count one line's text as another's (its count of rows would not see
    that two objects on a line made up for it)."""
    data = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(data == 10)
    heads = np.r_[0, ends + 1]
    tails = np.r_[ends, len(data)] - 1
    if heads[-1] == len(data):  # (the block ends with its newline)
        heads, tails = heads[:-1], tails[:-1]
    if not len(heads) or (tails < heads).any():
        return False
    tails = tails - ((data[tails] == 13) & (tails > heads))
    return bool((data[heads] == 123).all() and (data[tails] == 125).all())


def _utf8(block: bytes) -> bool:
    """Whether ``block`` is valid UTF-8 (ASCII checked first, at memory speed)."""
    if block.isascii():
        return True
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _blank_line(block: bytes) -> bool:
    """Whether ``block`` has a line of nothing but white space (byte searches in C first: the
    pattern only where a line starts with a space or a tab)."""
    if block[:1] in (b"\n", b"\r") or b"\n\n" in block or b"\n\r\n" in block:
        return True
    if block[:1] in (b" ", b"\t") or b"\n " in block or b"\n\t" in block:
        return BLANK.search(block) is not None
    return False


def lines_of(block: bytes) -> list[bytes]:
    """The block's lines, as the line-at-a-time parser takes them."""
    return block.split(b"\n")[:block.count(b"\n") + (not block.endswith(b"\n"))]
