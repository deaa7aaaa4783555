"""How a worker reads a JSON-lines file's records by line itself (``writes="workers"``).

The driver reads the file once, without parsing it (``line_index``: newlines found by NumPy,
1.4-1.9 GB/s here, as fast as counting them), and keeps where every LINE_STEP-th line starts (8
bytes per LINE_STEP lines: 640 KB for 20 M lines) and which lines are blank (no record: the
driver's own reading skips them too, so they are no ids). A workunit's Rows carry, pickled, only
the starts of the lines it names (``JSONLRows.narrowed``), so its message stays small at any file
size; the worker seeks to the nearest start and reads on, at most LINE_STEP - 1 lines more than
its own, and parses them as the driver would (helpers.engine.inputs.jsonl: the same records, the
same BadRecords).

The file must be the one the driver scanned: a worker checks its size and time on the open file
when it opens it and again after each read, and refuses (OSError: the run stops, rather than
write another file's lines).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import numpy as np

from helpers.engine.contract.fingerprint import FileStat, check_unchanged, checked_open, file_stats
from helpers.engine.inputs.open_files import OpenFiles

LINE_STEP = 256  # a line start kept every LINE_STEP lines
FILES = 2  # JSON-lines files a worker process keeps open
SCAN_BYTES = 8 << 20  # the driver's pass over the file reads this much at a time
_WHITE = np.frombuffer(b"\n \t\r\x0b\x0c", np.uint8)  # how a blank line starts (bytes.strip()'s
# white space)


@dataclass(frozen=True)
class LineIndex:
    """What the driver's pass over the file found."""

    lines: int  # the file's lines (a last one without its newline counts)
    starts: np.ndarray  # int64: the byte where line k * LINE_STEP starts
    blank: np.ndarray  # int64: the lines of nothing but white space


def line_index(path: str) -> LineIndex:
    """One pass over the file at ``path``, SCAN_BYTES at a time: its lines, every LINE_STEP-th
    line's start, its blank lines."""
    starts, blank = [np.zeros(1, np.int64)], []
    line = offset = 0
    last = 10  # the byte before the chunk (a newline: a line starts at the chunk's first byte)
    with open(path, "rb") as f:
        while chunk := f.read(SCAN_BYTES):
            data = np.frombuffer(chunk, np.uint8)
            ends = np.flatnonzero(data == 10)
            after = ends[(-(line + 1)) % LINE_STEP::LINE_STEP]  # newlines before a kept start
            starts.append(after.astype(np.int64) + 1 + offset)
            heads = ends[ends + 1 < len(data)] + 1  # where the lines begun here begin
            numbers = line + 1 + np.arange(len(heads), dtype=np.int64)
            if last == 10:
                heads, numbers = np.r_[0, heads], np.r_[line, numbers]
            white = np.isin(data[heads], _WHITE)
            if white.any():
                blank.append(_blank(f, data, ends, heads[white], numbers[white], offset))
            line, offset, last = line + len(ends), offset + len(chunk), int(data[-1])
    return LineIndex(line + (last != 10), np.concatenate(starts),
                     np.concatenate(blank) if blank else np.zeros(0, np.int64))


def _blank(f: Any, data: np.ndarray, ends: np.ndarray, heads: np.ndarray, numbers: np.ndarray,
           offset: int) -> np.ndarray:
    """Which of the lines starting at ``heads`` of the chunk ``data`` (numbered ``numbers``;
    each starts with white space) hold nothing else: counted in the chunk where the line ends
    there, read again from the file (``f``, put back) where it goes on past the chunk."""
    solid = np.r_[0, np.cumsum(~np.isin(data, _WHITE))]  # bytes not white space before each
    at = np.searchsorted(ends, heads)
    inside = at < len(ends)
    stops = ends[np.minimum(at, len(ends) - 1)] if len(ends) else heads
    found = numbers[inside & (solid[stops] == solid[heads])].tolist()
    if not inside[-1]:  # the chunk's last line, which goes on: read it whole
        here = f.tell()
        f.seek(offset + int(heads[-1]))
        if not f.readline().strip():
            found.append(int(numbers[-1]))
        f.seek(here)
    return np.array(found, dtype=np.int64)


@dataclass(frozen=True)
class JSONLRows:
    """Rows' opener of a JSON-lines file whose ids are its lines (module docstring)."""

    path: str  # as the user named it, absolute (how messages name it)
    text_column: str
    id_column: str
    stat: FileStat  # as the driver found it
    parser: Callable  # (path, text_column, id_column) -> what parses lines as the driver does,
    # with ``numbered(first line, block)``: helpers.engine.inputs.jsonl's JSONLSource
    starts: np.ndarray = field(compare=False, repr=False)  # LineIndex.starts from ``step``
    step: int = field(default=0, compare=False)  # the index of starts[0] in the whole file's

    def narrowed(self, ids: np.ndarray) -> JSONLRows:
        """Itself with only the starts reading ``ids`` needs (what a Rows pickles)."""
        if not len(ids):
            return replace(self, starts=self.starts[:0])
        low, high = int(ids.min()) // LINE_STEP, int(ids.max()) // LINE_STEP
        return replace(self, starts=self.starts[low - self.step:high - self.step + 1].copy(),
                       step=low)

    def read(self, ids: np.ndarray) -> list:
        """The records at ``ids``: each stretch of them (ids fewer than LINE_STEP lines apart, the
        lines between read through rather than sought past) from the start before it."""
        opened = _opened(self.parser, self.path, self.text_column, self.id_column, self.stat)
        records: list = []
        for stretch in np.split(ids, np.flatnonzero(np.diff(ids) >= LINE_STEP) + 1) \
                if len(ids) else []:
            first, last = int(stretch.min()), int(stretch.max())
            step = first // LINE_STEP
            if not 0 <= step - self.step < len(self.starts):
                raise ValueError(f"lines {first + 1}-{last + 1}: not among this opener's line "
                                 f"starts (lines {self.step * LINE_STEP + 1} on)")
            positions, got = opened.lines(int(self.starts[step - self.step]),
                                          first - step * LINE_STEP, first, last + 1)
            at = np.minimum(np.searchsorted(positions, stretch), len(positions) - 1)
            if not len(positions) or (positions[at] != stretch).any():
                raise OSError(f"{self.stat[0]}: lines {first + 1}-{last + 1} are not the "
                              f"driver's (a line it found is not there)")
            records += [got[k] for k in at.tolist()]
        return records


class _Opened:
    """A JSON-lines file as one worker process reads it: open, checked, and parsed with the
    driver's own rules (``JSONLRows.parser``)."""

    def __init__(self, parser: Callable, path: str, text_column: str, id_column: str,
                 stat: FileStat) -> None:
        self.file = checked_open(stat)
        self.stat, self.lock = stat, threading.Lock()
        try:
            self.source = parser(path, text_column, id_column)
        except BaseException:
            self.file.close()
            raise

    def lines(self, at: int, skip: int, start: int, stop: int) -> tuple[np.ndarray, list]:
        """``(positions, records)`` of lines ``start:stop`` (a blank one gives none), the first
        of which is ``skip`` lines after the byte ``at``."""
        with self.lock:  # (thread workers share this process's file)
            self.file.seek(at)
            block = b"".join(islice(self.file, skip, skip + stop - start))
            check_unchanged(self.file, self.stat)
        return self.source.numbered(start, block)


_OPEN: OpenFiles[_Opened] = OpenFiles(FILES, lambda opened: opened.file.close())


def _opened(*key: Any) -> _Opened:
    """The file as this process reads it (``_Opened``'s arguments), the FILES latest kept
    open."""
    return _OPEN.get(key, lambda: _Opened(*key))


def close_all() -> None:
    """Close the JSON-lines files this process holds open."""
    _OPEN.close_all()


def file_stat(path: str) -> FileStat:
    """What a worker checks the file against (FileStat)."""
    return file_stats([path])[0]
