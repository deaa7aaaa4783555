"""Crash-safe output: immutable part files, an index that is always whole, no copy of the whole.

An HDF5 file whose writer is killed mid-write is often left unreadable (its metadata is cached in
the writer and written back in no safe order). So the file being written is never one people read::

    out.h5.parts/part-L0-00000007-00000007.h5   one part: >= PART_ROWS rows (or PART_BYTES, or
                                                FLUSH_SECONDS' worth), written as .tmp, fsync'd,
                                                renamed; its ids as ranges in resume/
    out.h5.parts/part-L1-00000000-00000031.h5   COMPACT_PARTS small parts (a slow run's timed
                                                flushes) merged into one
    out.h5                                      an index of virtual datasets over every part,
                                                rewritten (as .tmp, then renamed) once the last
                                                rewrite is INDEX_EVERY times its own cost old

A rename is atomic, so at any instant every part and the index are whole files: a run killed with
SIGKILL loses only the rows it had not yet written to a part; the index may lag the parts by the
last few, and a resumed run finds those too (``Parts.scan`` reads the folder, not the index).

Full-size parts are never copied again, so a fast run writes each byte once. At the end an output
of up to MERGE_AT_END_BYTES becomes one self-contained file; a larger one stays the index over its
parts (h5py reads it like any file; keep the folder beside it), and ``compact`` (``python -m
helpers compact out.h5``) copies it into one file when someone wants that. A merge writes the new
file and the index that points to it before it deletes what it merged; a crash in between leaves
parts whose range another part covers, and they are dropped the next time (``Parts.scan``).
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from helpers.engine.id_ranges import IdRanges
from helpers.engine.protocol import TEXT, OutputSpec

PART_ROWS = 65536  # rows that make a full part: parts this big are never merged again
PART_BYTES = 64 << 20  # ... or this many bytes of rows, whichever comes first
CHUNK_RECORDS = 1024  # rows per HDF5 chunk in a merged file
COPY_ROWS = 65536  # rows copied at a time when merging: bounded memory for any part size
COMPACT_PARTS = 32  # small parts in a row at the end that are merged into one
MERGE_AT_END_BYTES = 256 << 20  # a finished output up to this size becomes one file
INDEX_EVERY = 10.0  # the index is rewritten once its last rewrite is this many times its cost old
BASE_LEVEL = 9  # a finished file taken over by a resumed run: never merged until the end
INDEX_MARK = "index_of_parts"  # attribute of an index: the folder of the parts it reads
RANGES = "resume/id_ranges"  # a part's [n, 2] (start, stop) of its ids, rows and errors alike
STR = h5py.string_dtype("utf-8")
ERRORS = {"ids": ((), "int64"), "type": ((), STR), "message": ((), STR), "time": ((), "float64")}
_NAME = re.compile(r"part-L(\d)-(\d{8})-(\d{8})\.h5$")

log = logging.getLogger("gpufeed")


@dataclass(frozen=True)
class Part:
    path: Path
    level: int
    first: int  # sequence numbers of the level-0 parts it holds
    last: int
    rows: int
    errors: int
    size: int = 0  # bytes on disk

    @property
    def small(self) -> bool:
        """A timed flush of a slow run: worth merging with its neighbours."""
        return self.level < BASE_LEVEL and self.rows + self.errors < PART_ROWS // 2 \
            and self.size < PART_BYTES // 2


def columns(outputs: Mapping[str, OutputSpec]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Every dataset of an output file: name -> (row shape, HDF5 dtype)."""
    data = {"ids": ((), "int64")}
    data.update({name: (spec.shape, STR if spec.dtype == TEXT else spec.dtype)
                 for name, spec in outputs.items()})
    data.update({f"errors/{name}": kind for name, kind in ERRORS.items()})
    return data


class Parts:
    """The parts folder beside ``path``: write a part, merge small parts, index them, finish.

    Used by one thread at a time (the sink's writer thread while a run goes on)."""

    def __init__(self, path: str | os.PathLike, outputs: Mapping[str, OutputSpec]) -> None:
        self.path = Path(path)
        self.folder = self.path.with_name(self.path.name + ".parts")
        self.columns = columns(outputs)
        self.parts: list[Part] = []
        self.attrs: dict[str, Any] = {}  # written to the index and the final file
        self.bytes_written = 0
        self._done = IdRanges()  # the ids of the parts found on disk (scan, adopt)
        self._index_at, self._index_cost, self._index_stale = 0.0, 0.0, False

    def scan(self) -> None:
        """Load the parts on disk; drop unfinished (.tmp) files and parts another one covers."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._done, found = IdRanges(), []
        for path in self.folder.iterdir():
            match = _NAME.match(path.name)
            if match is None:
                path.unlink()  # a .tmp left by a crash mid-write
                continue
            level, first, last = map(int, match.groups())
            found.append((first, -last, level, path))
        kept, reach = [], -1
        for first, minus_last, level, path in sorted(found):  # widest first among equal starts
            if -minus_last <= reach:
                path.unlink()  # merged into a bigger part before a crash stopped the clean-up
            else:
                kept.append(self._describe(path, level, first, -minus_last))
                reach = -minus_last
        self.parts = kept

    def _describe(self, path: Path, level: int, first: int, last: int) -> Part:
        with h5py.File(path, "r") as f:
            for name, (shape, dtype) in self.columns.items():
                if name not in f or f[name].shape[1:] != shape or \
                        (dtype is not STR and f[name].dtype != np.dtype(dtype)):
                    found = f"{f[name].shape[1:]} {f[name].dtype}" if name in f else "nothing"
                    raise ValueError(f"{path}: {name!r} holds {found}, this run writes {shape} "
                                     f"{dtype if dtype is not STR else 'str'}: a different "
                                     f"workload or model wrote it")
            rows, errors = len(f["ids"]), len(f["errors/ids"])
            self._done = self._done.union(_ranges(f))  # one open per part: resume at scale
        return Part(path, level, first, last, rows, errors, path.stat().st_size)

    @property
    def next_number(self) -> int:
        return max((p.last for p in self.parts), default=-1) + 1

    def write(self, blocks: Sequence[Mapping[str, np.ndarray]]) -> Part:
        """One new level-0 part holding ``blocks`` (each some of the columns), written block by
        block with no concatenation; then small parts merged, and the index if it is due."""
        number = self.next_number
        path = self.folder / f"part-L0-{number:08d}-{number:08d}.h5"
        with _Writing(path) as tmp, h5py.File(tmp, "w") as f, _WriteBack(tmp) as write_back:
            for name, (shape, dtype) in self.columns.items():
                pieces = [b[name] for b in blocks if name in b and len(b[name])]
                dataset = f.create_dataset(name, shape=(sum(map(len, pieces)), *shape), dtype=dtype)
                start = 0
                for piece in pieces:
                    dataset[start:start + len(piece)] = piece
                    start += len(piece)
                    write_back()
            ids = [b[k] for b in blocks for k in ("ids", "errors/ids") if k in b]
            f.create_dataset(RANGES, data=IdRanges.from_ids(np.concatenate(ids)).as_pairs())
            rows, errors = len(f["ids"]), len(f["errors/ids"])
        part = Part(path, 0, number, number, rows, errors, path.stat().st_size)
        self.bytes_written += part.size
        self.parts.append(part)
        self._index_stale = True
        if not self._compact():  # a merge writes the index itself
            self.refresh_index()
        return part

    def adopt(self, path: Path) -> None:
        """Take a finished output file over as a part (a resumed run builds on it)."""
        self.scan()
        number = self.next_number
        target = self.folder / f"part-L{BASE_LEVEL}-{number:08d}-{number:08d}.h5"
        os.replace(path, target)
        _fsync(self.folder)
        self.parts.append(self._describe(target, BASE_LEVEL, number, number))

    def _compact(self) -> bool:
        """Merge the last COMPACT_PARTS parts while they are small and of one level; True if
        anything was merged. Full parts are never merged: each byte of a fast run is written once."""
        merged_any = False
        while len(self.parts) >= COMPACT_PARTS:
            group = self.parts[-COMPACT_PARTS:]
            if not all(p.small and p.level == group[0].level for p in group):
                break
            level = group[0].level + 1
            path = self.folder / f"part-L{level}-{group[0].first:08d}-{group[-1].last:08d}.h5"
            with _Writing(path) as tmp:
                merge(group, tmp, self.columns)
            merged = Part(path, level, group[0].first, group[-1].last,
                          sum(p.rows for p in group), sum(p.errors for p in group),
                          path.stat().st_size)
            self.bytes_written += merged.size
            self.parts = self.parts[:-COMPACT_PARTS] + [merged]
            self.write_index({})  # the index must point at the merged part before ...
            for part in group:  # ... its sources go
                part.path.unlink()
            merged_any = True
        return merged_any

    def refresh_index(self, force: bool = False) -> None:
        """Rewrite the index if parts came since the last rewrite and that one is INDEX_EVERY
        times its own cost old: the index costs at most ~1/INDEX_EVERY of the writer's time."""
        if force or self._index_stale and \
                time.monotonic() - self._index_at >= INDEX_EVERY * self._index_cost:
            self.write_index({})

    def write_index(self, attrs: Mapping[str, Any]) -> None:
        """Rewrite ``path`` as virtual datasets over every part (h5py reads it like any file)."""
        started = time.monotonic()
        self.attrs.update(attrs)
        with _Writing(self.path) as tmp, h5py.File(tmp, "w", libver="latest") as f:
            for name, (shape, dtype) in self.columns.items():
                sizes = [(p, p.errors if name.startswith("errors/") else p.rows) for p in self.parts]
                sizes = [(p, n) for p, n in sizes if n]
                total = sum(n for _, n in sizes)
                if not total:
                    f.create_dataset(name, shape=(0, *shape), dtype=dtype)
                    continue
                layout = h5py.VirtualLayout(shape=(total, *shape), dtype=dtype)
                start = 0
                for part, n in sizes:
                    source = os.path.relpath(part.path, self.path.parent)
                    layout[start:start + n] = h5py.VirtualSource(source, name, shape=(n, *shape))
                    start += n
                f.create_virtual_dataset(name, layout)
            set_attrs(f, {**self.attrs, INDEX_MARK: self.folder.name})
        self.bytes_written += self.path.stat().st_size
        self._index_at = time.monotonic()
        self._index_cost, self._index_stale = self._index_at - started, False

    def finish(self, attrs: Mapping[str, Any]) -> None:
        """The run is complete: one self-contained file if the output is small enough, else the
        index over the parts, marked complete (``compact`` makes it one file)."""
        self.attrs.update(attrs, complete=True)
        if sum(p.size for p in self.parts) <= MERGE_AT_END_BYTES:
            with _Writing(self.path) as tmp:
                merge(self.parts, tmp, self.columns, self.attrs)
            self.bytes_written += self.path.stat().st_size
            shutil.rmtree(self.folder)
            self.parts = []  # the output is the one file now
            return
        self.write_index({})
        log.info("%s: %d parts indexed (%.1f GB); `python -m helpers compact %s` makes it one "
                 "file", self.path, len(self.parts), self.output_bytes / 1e9, self.path)

    @property
    def output_bytes(self) -> int:
        index = self.path.stat().st_size if self.path.exists() else 0
        return index + sum(p.size for p in self.parts)

    def done(self) -> IdRanges:
        """The ids written or recorded as failed in the parts found on disk, as ranges."""
        return self._done


def read_ranges(path: Path) -> IdRanges:
    """The ids of a part (or of a finished output taken over) as ranges."""
    with h5py.File(path, "r") as f:
        return _ranges(f)


def _ranges(f: h5py.File) -> IdRanges:
    """A file's ``id_ranges`` if it has them, else its ids read COPY_ROWS at a time."""
    if RANGES in f:
        return IdRanges.from_pairs(f[RANGES][...])
    done = IdRanges()
    for name in ("ids", "errors/ids"):
        for start in range(0, len(f[name]), COPY_ROWS):
            done = done.union(IdRanges.from_ids(f[name][start:start + COPY_ROWS]))
    return done


def compact(path: str | os.PathLike) -> int:
    """Copy the index ``path`` and the parts it points to into one self-contained file at
    ``path``, then remove the parts; returns the bytes written. ValueError if ``path`` is not an
    index (already one file)."""
    path = Path(path)
    if not path.is_file() or not is_index(path):
        raise ValueError(f"{str(path)!r}: not the index of a run (already one file, or missing)")
    with h5py.File(path, "r") as index:
        cols = {name: (index[name].shape[1:], index[name].dtype) for name in _datasets(index)}
        attrs = {k: v for k, v in index.attrs.items() if k != INDEX_MARK}
    with _Writing(path) as tmp:
        merge([Part(path, 0, 0, 0, 0, 0)], tmp, cols, attrs)
    shutil.rmtree(path.with_name(path.name + ".parts"), ignore_errors=True)
    return path.stat().st_size


def _datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def merge(parts: list[Part], target: Path, cols: Mapping[str, tuple], attrs: Mapping | None = None
          ) -> None:
    """Concatenate ``parts`` (in order) into a new file ``target``, COPY_ROWS rows at a time,
    with the union of their ``id_ranges``."""
    sources = [h5py.File(p.path, "r") for p in parts]
    try:
        with h5py.File(target, "w") as out:
            for name, (shape, dtype) in cols.items():
                total = sum(len(s[name]) for s in sources)
                chunks = (min(max(total, 1), CHUNK_RECORDS), *shape)
                dataset = out.create_dataset(name, shape=(total, *shape), dtype=dtype,
                                             maxshape=(None, *shape), chunks=chunks)
                start = 0
                for source in sources:
                    for offset in range(0, len(source[name]), COPY_ROWS):
                        block = source[name][offset:offset + COPY_ROWS]
                        dataset[start:start + len(block)] = block
                        start += len(block)
            done = IdRanges()
            for part in parts:
                done = done.union(read_ranges(part.path))
            out.create_dataset(RANGES, data=done.as_pairs())
            set_attrs(out, attrs or {})
    finally:
        for source in sources:
            source.close()


def is_index(path: Path) -> bool:
    """True if ``path`` is an index over parts (an unfinished run, or a big finished one); an
    index over no parts yet has no virtual dataset, hence the mark."""
    with h5py.File(path, "r") as f:
        return INDEX_MARK in f.attrs or ("ids" in f and f["ids"].is_virtual)


class _Writing:
    """``with _Writing(path) as tmp``: write ``tmp``, then fsync it and rename it to ``path``
    (atomic); if the block fails, ``tmp`` is removed and ``path`` is untouched."""

    def __init__(self, path: Path) -> None:
        self.path, self.tmp = path, path.with_name(path.name + ".tmp")

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:
            self.tmp.unlink(missing_ok=True)
            return
        _fsync(self.tmp)  # the data reaches the disk before the name does
        os.replace(self.tmp, self.path)
        _fsync(self.path.parent)


class _WriteBack:
    """``with _WriteBack(path) as kick``: each ``kick()`` asks the kernel to start writing what is
    in the page cache for ``path`` now (Linux: fadvise DONTNEED starts write-back, and drops the
    pages once clean). The disk then works while the next rows are copied in, instead of all at
    the fsync: measured 1.3-1.8x the bytes per second here. Elsewhere a kick does nothing."""

    def __init__(self, path: Path) -> None:
        self.path, self.fd = path, None

    def __enter__(self) -> Any:
        if hasattr(os, "posix_fadvise") and sys.platform == "linux":
            self.fd = os.open(self.path, os.O_RDONLY)
        return self.kick

    def kick(self) -> None:
        if self.fd is not None:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _fsync(path: Path) -> None:
    """fsync a file, or a folder (so that a rename in it is on disk too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_attrs(f: h5py.File, attrs: Mapping[str, Any]) -> None:
    """File attributes from plain values (lists of strings as string arrays, None as "None")."""
    for key, value in attrs.items():
        f.attrs[key] = _attr(value)


def _attr(value: Any) -> Any:
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return np.asarray(value, dtype=STR)
    if isinstance(value, (str, int, float, bool, np.generic, np.ndarray)):
        return value
    return str(value)
