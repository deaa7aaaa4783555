"""The driver's one pass over a CSV or TSV file (``row_index``): where its rows are, parsing
nothing, for workers that read their rows themselves (helpers.engine.inputs.csv_rows).

NumPy finds the file's quotes, line breaks and delimiters, and pyarrow's own rules, as
``table_files.csv_parse`` sets them, say which line breaks end rows and how many fields each row
has:

- a quote opens a quoted value only at the start of a field (after a delimiter or a line break),
  ``""`` inside one is a quote, and a quote anywhere else is a character like any other;
- a line break (``\\n``, ``\\r`` or both) outside quotes ends a row, and an empty line is none;
- the first row is the header; a row with another number of fields is no row (the driver files
  it as its own reading does), so ids count only the rows of the header's width;
- a quote left open (the file ends inside a quoted value) would swallow every row after it, as
  pandas and Python's ``csv`` report ("EOF inside string"): the row it opened in, up to the end of
  the line where it opened, is filed like a row of another width, and the pass goes on at the
  next line, so that it costs its row alone.

Which quotes open or close a value is found for a chunk's quotes at once (``_toggling``: a
stray ``5" tall`` outside quotes included). 0.6-0.7 GB/s here on the scale bench's corpus (a
quoted text a row), 0.1-0.35 GB/s on shorter rows, 35 MB/s where every other byte is a quote
(pyarrow's full parse: 100 MB/s there). ``head`` gives a file's first rows, whole, for pyarrow to
read its columns from without reading ahead.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

ROW_STEP = 128  # a row start kept every ROW_STEP rows
SCAN_BYTES = 8 << 20  # the driver's pass reads this much at a time
QUOTE, LF, CR = ord('"'), ord("\n"), ord("\r")
BOM = b"\xef\xbb\xbf"  # (pyarrow skips it)


@dataclass(frozen=True)
class RowIndex:
    """What the driver's pass over one file found."""

    fields: int  # the header's
    rows: int  # rows of the header's width
    starts: np.ndarray  # int64: the byte where row k * ROW_STEP starts
    bad: np.ndarray  # int64 [n, 2]: (start, stop) of each row of another width
    unclosed: np.ndarray  # int64: the starts of those of them filed for a quote left open
    bad_rows: np.ndarray  # int64: each of them, its row in the file counting every row (the
    # header not: as pandas and an editor less one count), for messages


def row_index(path: str, delimiter: str) -> RowIndex:
    """One pass over the CSV file at ``path``, SCAN_BYTES at a time (module docstring)."""
    with open(path, "rb") as f:
        return _scanned(f, delimiter)


def _scanned(f: Any, delimiter: str) -> RowIndex:
    """``row_index`` of the open file ``f``: read to its end, then again from the line after a
    quote left open (module docstring) as often as there is one."""
    scan = _Scan(ord(delimiter))
    offset = len(BOM) if f.read(len(BOM)) == BOM else 0
    while True:
        f.seek(offset)
        while chunk := f.read(SCAN_BYTES):
            chunk += _rest_of_run(f) if chunk[-1] == QUOTE else b""  # a run of quotes whole
            scan.chunk(np.frombuffer(chunk, np.uint8), offset, b"\r" in chunk)
            offset += len(chunk)
        if not scan.quoted:
            return scan.end(offset)
        stop = _line_end(f, scan.opened)
        if stop is None:  # (the quote opened on the file's last line: that line is the row)
            scan.quoted = 0
            return scan.end(offset)
        scan.left_open(stop)
        offset = stop + 1


def _line_end(f: Any, start: int) -> int | None:
    """Where the first line break at or after byte ``start`` of ``f`` is (None: none)."""
    f.seek(start)
    at = start
    while chunk := f.read(1 << 16):
        found = [k for k in (chunk.find(b"\n"), chunk.find(b"\r")) if k >= 0]
        if found:
            return at + min(found)
        at += len(chunk)
    return None


def _rest_of_run(f: Any) -> bytes:
    """The quotes that follow in ``f`` (the run of quotes a chunk ended in, continued), and no
    more: ``f`` is left at the first byte that is not one."""
    rest = b""
    while more := f.read(1 << 16):
        quotes = len(more) - len(more.lstrip(b'"'))
        rest += more[:quotes]
        if quotes < len(more):
            f.seek(quotes - len(more), 1)
            break
    return rest


def head(path: str, delimiter: str, size: int) -> bytes | None:
    """The file's first ``size`` bytes up to the end of their last whole row (all of them where
    the file is no longer), less its rows of another width than the header's; None where they
    hold no row of the header's width (whose values pyarrow would read the columns' types
    from)."""
    with open(path, "rb") as f:
        data = f.read(size + 1)
    if len(data) <= size:  # the whole file
        return without(data, _scanned(io.BytesIO(data), delimiter).bad)
    start = len(BOM) if data.startswith(BOM) else 0
    scan = _Scan(ord(delimiter))
    scan.chunk(np.frombuffer(data, np.uint8)[start:size], start, b"\r" in data)
    if not scan.rows:
        return None
    return without(data[:scan.row], scan.filed())


def without(data: bytes, rows: np.ndarray) -> bytes:
    """``data`` less the rows at ``rows`` (their ``(start, stop)`` in it), each left an empty
    line (no row): rows of another width than the header's, which pyarrow would hand a handler
    (and fail on one that is not UTF-8)."""
    if not len(rows):
        return data
    keep = np.r_[0, rows.ravel(), len(data)].reshape(-1, 2).tolist()
    return b"".join(data[a:b] for a, b in keep)


class _Scan:
    """``row_index``'s state from one chunk to the next."""

    def __init__(self, delimiter: int) -> None:
        self.delimiter = delimiter
        self.quoted, self.before = 0, LF  # inside a quoted value; the byte before the chunk
        self.opened = -1  # where the quoted value it is inside opened
        self.row, self.delimiters = -1, 0  # where the row being read starts; its delimiters
        self.fields = self.rows = 0  # (fields 0: no header yet)
        self.every = 0  # rows of any width so far, the header not
        self.bad_rows: list[np.ndarray] = []
        self.starts: list[np.ndarray] = []
        self.bad: list[np.ndarray] = []
        self.unclosed: list[int] = []

    def chunk(self, data: np.ndarray, offset: int, returns: bool) -> None:
        """The next chunk of the file, ``data``, from byte ``offset`` (``returns``: whether it
        holds a carriage return, a line break too)."""
        if self.row < 0:
            self.row = offset
        toggles = _toggling(data, self.quoted, self.before, self.delimiter)
        breaks = np.flatnonzero((data == LF) | (data == CR) if returns else data == LF)
        delimiters = np.flatnonzero(data == self.delimiter)
        if len(toggles) > len(data) >> 6:  # many: which bytes are inside, at once
            mark = np.zeros(len(data), np.uint8)
            mark[toggles] = 1
            inside = np.bitwise_xor.accumulate(mark) ^ self.quoted
            breaks, delimiters = breaks[inside[breaks] == 0], delimiters[inside[delimiters] == 0]
        elif len(toggles):
            breaks = breaks[(self.quoted + np.searchsorted(toggles, breaks)) % 2 == 0]
            delimiters = delimiters[(self.quoted + np.searchsorted(toggles, delimiters)) % 2 == 0]
        elif self.quoted:
            breaks = delimiters = breaks[:0]
        if len(toggles) and (self.quoted + len(toggles)) % 2:  # (the last one opened a value)
            self.opened = offset + int(toggles[-1])
        self.quoted = (self.quoted + len(toggles)) % 2
        self.before = int(data[-1])
        if not len(breaks):
            self.delimiters += len(delimiters)
            return
        before = np.searchsorted(delimiters, breaks)
        counts = np.diff(before, prepend=0)
        counts[0] += self.delimiters
        self.rows_ended(np.r_[self.row, breaks[:-1] + 1 + offset], breaks + offset, counts + 1)
        self.row, self.delimiters = int(breaks[-1]) + 1 + offset, len(delimiters) - int(before[-1])

    def rows_ended(self, starts: np.ndarray, stops: np.ndarray, fields: np.ndarray) -> None:
        """Lines ``starts[k]:stops[k]`` ended, of ``fields[k]`` fields each (an empty one is
        none)."""
        some = stops > starts
        starts, stops, fields = starts[some], stops[some], fields[some]
        if not self.fields and len(fields):
            self.fields = int(fields[0])
            starts, stops, fields = starts[1:], stops[1:], fields[1:]
        good = fields == self.fields
        if not good.all():
            self.bad.append(np.c_[starts[~good], stops[~good]])
            self.bad_rows.append(self.every + np.flatnonzero(~good))
        self.every += len(fields)
        kept = starts[good]
        self.starts.append(kept[(-self.rows) % ROW_STEP::ROW_STEP])
        self.rows += len(kept)

    def left_open(self, stop: int) -> None:
        """The quoted value being read never closes: the row it is in, up to ``stop`` (the end
        of the line where it opened), is filed, and the pass goes on after it, outside quotes."""
        self.bad.append(np.array([[self.row, stop]], dtype=np.int64))
        self.bad_rows.append(np.array([self.every], dtype=np.int64))
        self.every += 1
        self.unclosed.append(self.row)
        self.quoted, self.before, self.row, self.delimiters = 0, LF, stop + 1, 0

    def end(self, size: int) -> RowIndex:
        if self.row >= 0:
            self.rows_ended(np.array([self.row]), np.array([size]),
                            np.array([self.delimiters + 1]))
        return RowIndex(self.fields, self.rows,
                        np.concatenate([np.zeros(0, np.int64)] + self.starts).astype(np.int64),
                        self.filed(), np.array(self.unclosed, dtype=np.int64),
                        np.concatenate([np.zeros(0, np.int64)] + self.bad_rows).astype(np.int64))

    def filed(self) -> np.ndarray:
        """The rows of another width so far, ``(start, stop)``."""
        return np.concatenate([np.zeros((0, 2), np.int64)] + self.bad)


def _toggling(data: np.ndarray, quoted: int, before: int, delimiter: int) -> np.ndarray:
    """Where the runs of quotes of ``data`` that open or close a quoted value start, the chunk
    begun inside one if ``quoted`` (``before``: the byte before it). A run of an even number of
    quotes never changes the state (``""`` is a quote inside a value, an empty value at a
    field's start, two characters elsewhere). An odd run at a field's start opens a value, or
    closes one it is inside: it toggles. Any other odd run closes a value, or outside one is
    characters: after it the state is outside. So the state after a run is the parity of the
    runs at a field's start since the last one that was not (and ``quoted`` if none was),
    found for every run at once."""
    quotes = np.flatnonzero(data == QUOTE)
    if not len(quotes):
        return quotes
    runs = quotes  # (each quote a run of one, but where quotes are side by side)
    first = np.r_[True, np.diff(quotes) != 1]  # which quotes begin a run
    if not first.all():
        lengths = np.diff(np.flatnonzero(np.r_[first, True]))
        runs = quotes[first][lengths % 2 == 1]  # (odd runs only: an even one changes nothing)
    if not len(runs):
        return runs
    previous = data[runs - 1]
    if runs[0] == 0:
        previous[0] = before
    at_start = (previous == delimiter) | (previous == LF) | (previous == CR)
    if at_start[quoted::2].all():  # (the usual file: every odd run toggles)
        return runs
    number = np.arange(1, len(runs) + 1, dtype=np.int64)  # (from 1: 0 is none yet)
    reset = np.maximum.accumulate(np.where(at_start, 0, number))  # the last not at a start
    toggles = np.r_[0, np.cumsum(at_start, dtype=np.int64)]  # (from 1 too)
    inside = ((toggles[1:] - toggles[reset] + quoted * (reset == 0)) & 1).astype(np.int8)
    return runs[inside != np.r_[np.int8(quoted), inside[:-1]]]
