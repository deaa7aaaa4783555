"""Crash-safe output: immutable part files, an index that is always whole, one file at the end.

An HDF5 file whose writer is killed mid-write is often left unreadable (its metadata is cached in
the writer and written back in no safe order). So the file being written is never one people read::

    out.h5.parts/part-L0-00000007-00000007.h5   one flush of rows: written as .tmp, fsync'd, renamed
    out.h5.parts/part-L1-00000000-00000031.h5   32 parts of one level merged into one of the next
    out.h5                                      while running: a small index of virtual datasets
                                                over every part, rewritten (as .tmp, then renamed)
                                                after each part; at the end: one self-contained
                                                file with every row, and the parts are removed

A rename is atomic, so at any instant every part and the index are whole files: a run killed with
SIGKILL loses only the rows it had not yet flushed. A merge (compaction, or the final one) writes
the new file and the index that points to it before it deletes what it merged; a crash in between
leaves parts whose range another part covers, and they are dropped the next time (``Parts.scan``).
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from helpers.workloads.base import TEXT, OutputSpec

CHUNK_RECORDS = 1024  # rows per HDF5 chunk in the final file
COPY_ROWS = 65536  # rows copied at a time when merging: bounded memory for any part size
COMPACT_PARTS = 32  # parts of one level that are merged into one of the next level
BASE_LEVEL = 9  # a finished file taken over by a resumed run: never merged until the end
STR = h5py.string_dtype("utf-8")
ERRORS = {"ids": ((), "int64"), "type": ((), STR), "message": ((), STR), "time": ((), "float64")}
_NAME = re.compile(r"part-L(\d)-(\d{8})-(\d{8})\.h5$")


@dataclass(frozen=True)
class Part:
    path: Path
    level: int
    first: int  # sequence numbers of the level-0 parts it holds
    last: int
    rows: int
    errors: int


def columns(outputs: Mapping[str, OutputSpec]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Every dataset of an output file: name -> (row shape, HDF5 dtype)."""
    data = {"ids": ((), "int64")}
    data.update({name: (spec.shape, STR if spec.dtype == TEXT else spec.dtype)
                 for name, spec in outputs.items()})
    data.update({f"errors/{name}": kind for name, kind in ERRORS.items()})
    return data


class Parts:
    """The parts folder beside ``path``: write a part, merge parts, index them, finish."""

    def __init__(self, path: str | os.PathLike, outputs: Mapping[str, OutputSpec]) -> None:
        self.path = Path(path)
        self.folder = self.path.with_name(self.path.name + ".parts")
        self.columns = columns(outputs)
        self.parts: list[Part] = []
        self.attrs: dict[str, Any] = {}  # written to the index and the final file

    def scan(self) -> None:
        """Load the parts on disk; drop unfinished (.tmp) files and parts another one covers."""
        self.folder.mkdir(parents=True, exist_ok=True)
        found = []
        for path in self.folder.iterdir():
            match = _NAME.match(path.name)
            if match is None:
                path.unlink()  # a .tmp left by a crash mid-write
                continue
            level, first, last = map(int, match.groups())
            found.append((path, level, first, last))
        kept = []
        for path, level, first, last in found:
            if any(f <= first and last <= l and (f, l) != (first, last) for _, _, f, l in found):
                path.unlink()  # merged into a bigger part before a crash stopped the clean-up
            else:
                kept.append(self._describe(path, level, first, last))
        self.parts = sorted(kept, key=lambda p: p.first)

    def _describe(self, path: Path, level: int, first: int, last: int) -> Part:
        with h5py.File(path, "r") as f:
            for name, (shape, dtype) in self.columns.items():
                if name not in f or f[name].shape[1:] != shape or \
                        (dtype is not STR and f[name].dtype != np.dtype(dtype)):
                    found = f"{f[name].shape[1:]} {f[name].dtype}" if name in f else "nothing"
                    raise ValueError(f"{path}: {name!r} holds {found}, this run writes {shape} "
                                     f"{dtype if dtype is not STR else 'str'}: a different "
                                     f"workload or model wrote it")
            return Part(path, level, first, last, len(f["ids"]), len(f["errors/ids"]))

    @property
    def next_number(self) -> int:
        return max((p.last for p in self.parts), default=-1) + 1

    def write(self, data: Mapping[str, np.ndarray]) -> Part:
        """One new level-0 part holding ``data`` (every column), then merges and a new index."""
        number = self.next_number
        part = self._write(data, 0, number, number)
        self.parts.append(part)
        if not self._compact():  # a merge writes the index itself
            self.write_index({})
        return part

    def adopt(self, path: Path) -> None:
        """Take a finished output file over as a part (a resumed run builds on it)."""
        self.scan()
        number = self.next_number
        target = self.folder / f"part-L{BASE_LEVEL}-{number:08d}-{number:08d}.h5"
        os.replace(path, target)
        _fsync(self.folder)
        self.parts.append(self._describe(target, BASE_LEVEL, number, number))

    def _write(self, data: Mapping[str, np.ndarray], level: int, first: int, last: int) -> Part:
        path = self.folder / f"part-L{level}-{first:08d}-{last:08d}.h5"
        with _Writing(path) as tmp, h5py.File(tmp, "w") as f:
            for name, (shape, dtype) in self.columns.items():
                dataset = f.create_dataset(name, shape=(len(data[name]), *shape), dtype=dtype)
                if len(data[name]):
                    dataset[...] = data[name]
        return Part(path, level, first, last, len(data["ids"]), len(data["errors/ids"]))

    def _compact(self) -> bool:
        """Merge every level that has COMPACT_PARTS parts; True if anything was merged."""
        merged_any = False
        while True:
            full = [level for level in range(BASE_LEVEL)
                    if sum(p.level == level for p in self.parts) >= COMPACT_PARTS]
            if not full:
                return merged_any
            merged_any = True
            group = [p for p in self.parts if p.level == full[0]]
            path = self.folder / f"part-L{full[0] + 1}-{group[0].first:08d}-{group[-1].last:08d}.h5"
            with _Writing(path) as tmp:
                merge(group, tmp, self.columns)
            merged = Part(path, full[0] + 1, group[0].first, group[-1].last,
                          sum(p.rows for p in group), sum(p.errors for p in group))
            self.parts = sorted([p for p in self.parts if p not in group] + [merged],
                                key=lambda p: p.first)
            self.write_index({})  # the index must point at the merged part before ...
            for part in group:  # ... its sources go
                part.path.unlink()

    def write_index(self, attrs: Mapping[str, Any]) -> None:
        """Rewrite ``path`` as virtual datasets over every part (h5py reads it like any file)."""
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
            set_attrs(f, self.attrs)

    def finish(self, attrs: Mapping[str, Any]) -> None:
        """Merge every part into ``path``, a self-contained file, and remove the parts."""
        self.attrs.update(attrs)
        with _Writing(self.path) as tmp:
            merge(self.parts, tmp, self.columns, self.attrs)
        shutil.rmtree(self.folder)

    def done_ids(self) -> np.ndarray:
        """Sorted ids already written or recorded as failed in any part."""
        chunks = [np.empty(0, np.int64)]
        for part in self.parts:
            with h5py.File(part.path, "r") as f:
                chunks += [f["ids"][...], f["errors/ids"][...]]
        return np.unique(np.concatenate(chunks))


def merge(parts: list[Part], target: Path, cols: Mapping[str, tuple], attrs: Mapping | None = None
          ) -> None:
    """Concatenate ``parts`` (in order) into a new file ``target``, COPY_ROWS rows at a time."""
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
            set_attrs(out, attrs or {})
    finally:
        for source in sources:
            source.close()


def is_index(path: Path) -> bool:
    """True if ``path`` is an index of virtual datasets (a run that has not finished)."""
    with h5py.File(path, "r") as f:
        return "ids" in f and f["ids"].is_virtual


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
