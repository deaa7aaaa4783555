"""Crash-safe output: immutable part files, an index that is always whole, no copy of the whole.

An HDF5 file whose writer is killed mid-write is often left unreadable (its metadata is cached in
the writer and written back in no safe order). So the file being written is never one people read::

    out.h5.parts/part-L0-00000007-00000007.h5   one part: >= PART_ROWS rows (or PART_BYTES, or
                                                FLUSH_SECONDS' worth), written under a temporary
                                                name, fsync'd, renamed; its ids in resume/
    out.h5.parts/part-L1-00000000-00000031.h5   COMPACT_PARTS small parts (a slow run's timed
                                                flushes) merged into one
    out.h5                                      an index of virtual datasets over every part,
                                                rewritten (temporary name, then renamed) once
                                                the last is INDEX_EVERY times its own cost old

A rename is atomic, so at any instant every part and the index are whole files: a run killed with
SIGKILL loses only the rows it had not yet written to a part; the index may lag the parts (by
the last few; when workers write, by up to about as many as it holds, since it is rewritten
1/INDEX_EVERY_COMMITS of the time), and a resumed run finds those too (``Parts.scan`` reads the
folder, not the index).
Each part records the ids it holds as closed ranges (``resume/id_spans``) and carries the run's
fingerprints (helpers.engine.contract.fingerprint). Records the reader rejected (not JSON, an
unusable or duplicate id) are known by their position in the source instead (``errors/position``):
their id may be missing or another record's.

Full-size parts are never copied again, so a fast run writes each byte once. At the end an output
of up to MERGE_AT_END_BYTES becomes one self-contained file; a larger one stays the index over its
parts (h5py reads it like any file; keep the folder beside it), and ``compact`` (``python -m
helpers compact out.h5``) copies it into one file when someone wants that. A merge writes the new
file and the index that points to it before it deletes what it merged; a crash in between leaves
parts whose range another part covers, and they are dropped the next time (``Parts.scan``).
If the final merge finds no room on the disk, the finished output stays the index over its parts,
as a big one does. Only the files gpufeed wrote are ever removed: a parts folder holding anything
else is refused at the start and kept at the end (and a folder that is a link to another disk
keeps its target). The index names its parts relative to itself, '%' escaped as HDF5 wants.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import TEXT, OutputSpec
from helpers.engine.outputs import run_log
from helpers.engine.outputs.atomic import (STR, WriteBack, fsync, hdf5_replacing, is_temporary,
                                           set_attrs)

PART_ROWS = 65536  # rows that make a full part: parts this big are never merged again
PART_BYTES = 64 << 20  # ... or this many bytes of rows, whichever comes first
CHUNK_RECORDS = 1024  # rows per HDF5 chunk in a merged file
COPY_ROWS = 65536  # rows copied at a time when merging: bounded memory for any part size
COPY_BYTES = 16 << 20  # small parts' rows gathered up to this much per write when merging
GATHER_BYTES = 1 << 20  # small blocks of a part gathered up to this much per write
COMPACT_PARTS = 32  # small parts in a row at the end that are merged into one
MERGE_AT_END_BYTES = 256 << 20  # a finished output up to this size becomes one file
INDEX_EVERY = 10.0  # the index is rewritten once its last rewrite is this many times its cost old
INDEX_EVERY_COMMITS = 200.0  # ... as workers' parts come (writes="workers": the index is then
# most of the driver's work, and only a reader mid-run needs it: a resume scans the parts). At 50
# it took 0.07 of the driver's 0.31 CPU s per million rows on Ray; at 200 an index over 5,000
# parts (20 M rows at 4,096 a workunit, ~0.25 s a rewrite here) lags the parts by under a minute
INDEX_BYTES_PER_SOURCE = 256  # what the index takes per part and column, about (for its room)
BASE_LEVEL = 9  # a finished file taken over by a resumed run: never merged until the end
WORKER_LEVEL = 8  # a part a worker wrote (writes="workers"): never merged while the run goes on
INDEX_MARK = "index_of_parts"  # attribute of an index: the folder of the parts it reads
OUTPUT_MARK = "gpufeed_output"  # attribute of every file gpufeed writes: its format's version
FORMAT = 2  # 2: errors/position, resume/id_spans, fingerprints
BOUNDS = "resume/id_spans"  # a part's [n, 2] closed (first, last) of its ids' ranges: rows and
# workers' errors (the dataset's name as outputs store it)
RANGES = "resume/id_ranges"  # the same as half-open (start, stop), in outputs of FORMAT 1
ERRORS = {"ids": ((), "int64"), "type": ((), STR), "message": ((), STR), "time": ((), "float64"),
          "position": ((), "int64"), "key": ((), STR)}
LATER = ("errors/position", "errors/key")  # errors' columns an older output may lack (no errors)
_NAME = re.compile(r"part-L(\d)-(\d{8})-(\d{8})\.h5$")
_WORKER_NAME = re.compile(r"wpart-[0-9a-f]+-\d+\.h5$")  # a worker's, not (yet) committed

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
    # holds runs' records (helpers.engine.outputs.run_log): a finished file adopted
    runs: bool = False

    @property
    def small(self) -> bool:
        """A timed flush of a slow run: worth merging with its neighbours."""
        return self.level < WORKER_LEVEL and self.rows + self.errors < PART_ROWS // 2 \
            and self.size < PART_BYTES // 2


def parts_folder(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".parts")


def _ours(path: Path) -> bool:
    """A part, or a part being written (``.part-...h5.gpufeed-tmp``; ``part-...h5.tmp`` from
    gpufeed before FORMAT 2), or a worker's part not committed (``wpart-...h5``)."""
    name = is_temporary(path.name) or path.name.removesuffix(".tmp")
    return bool(_NAME.match(name) or _WORKER_NAME.match(name)) and path.is_file() \
        and not path.is_symlink()


@dataclass(frozen=True)
class PartTarget:
    """Where and how a worker writes its workunit's rows itself (``writes="workers"``): the
    parts folder, a name no other part of any run has, the output's columns, the part's attrs."""

    folder: str
    name: str
    columns: dict[str, tuple[tuple[int, ...], Any]]
    attrs: dict[str, Any]


@dataclass(frozen=True)
class WorkerPart:
    """A part a worker wrote, whole on disk and not yet in the output: the driver commits it
    (``Parts.commit``) if its workunit is still the worker's, else removes it."""

    path: str
    rows: int
    size: int
    writer: str = ""  # who wrote it, for a message: "worker 3 on node-2"

    def discard(self) -> None:
        Path(self.path).unlink(missing_ok=True)


def write_rows(path: Path, cols: Mapping[str, tuple], blocks: Sequence[Mapping[str, np.ndarray]],
               attrs: Mapping[str, Any]) -> None:
    """A part file at ``path`` holding ``blocks`` (each some of the columns), whole or not at
    all (atomic), with its ids' ranges and attrs. A big block is written as it is; small ones in a
    row are joined up to GATHER_BYTES per write (a write costs HDF5 ~0.1 ms whatever its size: a
    part of 4,000 workunits of 16 rows took 4,000 writes a column)."""
    with hdf5_replacing(path, _bytes(blocks)) as f, WriteBack(Path(f.filename)) as write_back:
        for name, (shape, dtype) in cols.items():
            pieces = [b[name] for b in blocks if name in b and len(b[name])]
            dataset = f.create_dataset(name, shape=(sum(map(len, pieces)), *shape), dtype=dtype)
            start = 0
            for run in _gathered(pieces):
                piece = run[0] if len(run) == 1 else np.concatenate(run)
                dataset[start:start + len(piece)] = piece
                start += len(piece)
                write_back()
        ids = [b["ids"] for b in blocks if "ids" in b]
        ids += [b["errors/ids"][b["errors/position"] < 0] for b in blocks if "errors/ids" in b]
        f.create_dataset(BOUNDS, data=IdRanges.from_ids(np.concatenate(ids) if ids else
                                                       np.empty(0, np.int64)).as_bounds())
        set_attrs(f, attrs)


def write_worker_part(target: PartTarget, ids: np.ndarray, arrays: Mapping[str, np.ndarray],
                      writer: str = "") -> WorkerPart:
    """A worker's rows written as a part of their own (``target``), not yet in the output."""
    path = Path(target.folder) / f"wpart-{target.name}.h5"
    write_rows(path, target.columns, [{"ids": ids, **arrays}], target.attrs)
    return WorkerPart(str(path), len(ids), path.stat().st_size, writer)


def foreign_files(folder: Path) -> list[Path]:
    """What ``folder`` holds that gpufeed did not write."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not _ours(p))


def remove_folder(folder: Path, files: list[Path]) -> None:
    """Remove ``files`` (gpufeed's), then ``folder`` if nothing else is in it (a link to a folder
    elsewhere: the link); what gpufeed did not write stays, and is said."""
    for path in files:
        path.unlink(missing_ok=True)
    if not folder.exists():
        return
    left = []
    for path in folder.iterdir():
        if _ours(path):
            path.unlink()  # a temporary file a crash left, say
        else:
            left.append(path)
    if left:
        log.warning("%s: kept, for the %d file(s) in it that gpufeed did not write (%s)",
                    folder, len(left), ", ".join(p.name for p in left[:3]))
    elif folder.is_symlink():
        folder.unlink()
    else:
        folder.rmdir()


def columns(outputs: Mapping[str, OutputSpec]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Every dataset of an output file: name -> (row shape, HDF5 dtype)."""
    data = {"ids": ((), "int64")}
    data.update({name: (spec.shape, STR if spec.dtype == TEXT else spec.dtype)
                 for name, spec in outputs.items()})
    data.update({f"errors/{name}": kind for name, kind in ERRORS.items()})
    return data


class Parts:
    """The parts folder beside ``path``: write a part, merge small parts, keep their ``index``
    (Index) current, finish.

    Used by one thread at a time (the sink's writer thread while a run goes on)."""

    def __init__(self, path: str | os.PathLike, outputs: Mapping[str, OutputSpec],
                 part_attrs: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.folder = parts_folder(self.path)
        self.columns = columns(outputs)
        self.parts: list[Part] = []
        self.index = Index(self.path, self.columns)
        self.part_attrs = {OUTPUT_MARK: FORMAT, **(part_attrs or {})}  # written to each part
        self.bytes_written = 0
        self._done = IdRanges()  # the ids of the parts found on disk (scan, adopt)
        self._positions = IdRanges()  # ... and the positions of the records the reader rejected

    def scan(self) -> None:
        """Load the parts on disk; drop unfinished (.tmp) files and parts another one covers.
        Every part is read (and refused, ValueError, if another workload wrote it) before any
        file is removed."""
        foreign = foreign_files(self.folder)
        if foreign:
            raise ValueError(f"{self.folder}: holds {foreign[0].name!r}, which gpufeed did not "
                             f"write; nothing there is touched")
        self.folder.mkdir(parents=True, exist_ok=True)
        found, drop = [], []
        for path in self.folder.iterdir():
            match = _NAME.match(path.name)
            if match is None:
                drop.append(path)  # a temporary file left by a crash mid-write
                continue
            level, first, last = map(int, match.groups())
            found.append((first, -last, level, path))
        done, positions = IdRanges(), IdRanges()
        kept, reach = [], -1
        for first, minus_last, level, path in sorted(found):  # widest first among equal starts
            if -minus_last <= reach:
                drop.append(path)  # merged into a bigger part before a crash stopped the clean-up
            else:
                part, ids, rejected = self._describe(path, level, first, -minus_last)
                kept.append(part)
                done, positions = done.union(ids), positions.union(rejected)
                reach = -minus_last
        for path in drop:
            path.unlink()
        self.parts, self._done, self._positions = kept, done, positions

    def _describe(self, path: Path, level: int, first: int, last: int
                  ) -> tuple[Part, IdRanges, IdRanges]:
        """A part, the ids it holds and the positions of the records it holds as rejected by
        the reader; ValueError if its columns are not this run's."""
        with h5py.File(path, "r") as f:
            found = check_columns(f, self.columns, path)
            rows, errors = found["ids"][0][0], found["errors/ids"][0][0]
            ids, rejected = done_in(f, errors)  # one open per part: resume at scale
            runs = run_log.GROUP in f
        return Part(path, level, first, last, rows, errors, path.stat().st_size, runs), ids, \
            rejected

    @property
    def next_number(self) -> int:
        return max((p.last for p in self.parts), default=-1) + 1

    def write(self, blocks: Sequence[Mapping[str, np.ndarray]]) -> Part:
        """One new level-0 part holding ``blocks`` (each some of the columns), written block by
        block with no concatenation; then small parts merged, and the index if it is due."""
        number = self.next_number
        path = self.folder / f"part-L0-{number:08d}-{number:08d}.h5"
        write_rows(path, self.columns, blocks, self.part_attrs)
        rows = sum(len(b["ids"]) for b in blocks if "ids" in b)
        errors = sum(len(b["errors/ids"]) for b in blocks if "errors/ids" in b)
        part = Part(path, 0, number, number, rows, errors, path.stat().st_size)
        self.bytes_written += part.size
        self.parts.append(part)
        self.index.stale = True
        if not self._compact():  # a merge writes the index itself
            self.refresh_index()
        return part

    def target(self, name: str) -> PartTarget:
        """Where a worker writes a part of this output itself, under ``name``."""
        return PartTarget(str(self.folder), name, self.columns, self.part_attrs)

    def commit(self, parts: Sequence[WorkerPart]) -> None:
        """Workers' parts taken into the output, in order: each renamed to the next number at
        WORKER_LEVEL (a part no index names is not the output's: never read, and removed at the
        end or by the next scan), the folder synced once, the index rewritten when due."""
        number = self.next_number
        for part in parts:
            path = self.folder / f"part-L{WORKER_LEVEL}-{number:08d}-{number:08d}.h5"
            try:
                os.replace(part.path, path)
            except FileNotFoundError:
                raise OSError(errno.ENOENT, f"{part.writer or 'a worker'} wrote a part this "
                              f"process cannot see in {self.folder}: with writes='workers' the "
                              f"output must be on storage every worker and the driver share "
                              f"(a network filesystem), not a disk of one machine",
                              part.path) from None
            self.parts.append(Part(path, WORKER_LEVEL, number, number, part.rows, 0, part.size))
            self.bytes_written += part.size
            number += 1
        fsync(self.folder)
        self.index.stale, self.index.every = True, INDEX_EVERY_COMMITS
        self.refresh_index()

    def sweep(self) -> None:
        """Remove the workers' parts that were never committed (their workunits were redone,
        or their workers killed before they said so)."""
        if self.folder.is_dir():
            for path in self.folder.iterdir():
                if _WORKER_NAME.match(path.name):
                    path.unlink(missing_ok=True)

    def hold_runs(self, index: Path) -> None:
        """A resumed index's runs, held in memory until the index or file that replaces it is
        written; the parts' own copies (a finished file taken over as a part, whose runs every
        index rewrite carried into the index) no longer count."""
        self.index.earlier_runs = run_log.held(index)
        self.parts = [replace(part, runs=False) for part in self.parts]

    def adopt(self, path: Path, discard_parts: bool = False) -> None:
        """Take a finished output file over as a part (a resumed run builds on it); with
        ``discard_parts``, the parts beside it go first (a run killed between merging them into
        it and removing them)."""
        with h5py.File(path, "r") as f:
            check_columns(f, self.columns, path)  # refused before it is moved
        if discard_parts:
            self.remove()
        self.scan()
        number = self.next_number
        target = self.folder / f"part-L{BASE_LEVEL}-{number:08d}-{number:08d}.h5"
        os.replace(path, target)
        fsync(self.folder)
        part, ids, rejected = self._describe(target, BASE_LEVEL, number, number)
        self.parts.append(part)
        self._done, self._positions = self._done.union(ids), self._positions.union(rejected)

    def remove(self) -> None:
        """Delete the parts folder (overwrite); ValueError, before anything goes, if it holds a
        file gpufeed did not write."""
        foreign = foreign_files(self.folder)
        if foreign:
            raise ValueError(f"{self.folder}: holds {foreign[0].name!r}, which gpufeed did not "
                             f"write; nothing there is touched")
        if self.folder.exists():
            remove_folder(self.folder, list(self.folder.iterdir()))

    def _compact(self) -> bool:
        """Merge the last COMPACT_PARTS parts while they are small and of one level; True if
        anything was merged. Full parts are never merged: each byte of a fast run is written
        once."""
        merged_any = False
        while len(self.parts) >= COMPACT_PARTS:
            group = self.parts[-COMPACT_PARTS:]
            if not all(p.small and p.level == group[0].level for p in group):
                break
            level = group[0].level + 1
            path = self.folder / f"part-L{level}-{group[0].first:08d}-{group[-1].last:08d}.h5"
            with hdf5_replacing(path, sum(p.size for p in group)) as out:
                merge_into(out, group, self.columns, self.part_attrs)
            merged = Part(path, level, group[0].first, group[-1].last,
                          sum(p.rows for p in group), sum(p.errors for p in group),
                          path.stat().st_size, any(p.runs for p in group))
            self.bytes_written += merged.size
            self.parts = self.parts[:-COMPACT_PARTS] + [merged]
            self.write_index({})  # the index must point at the merged part before ...
            for part in group:  # ... its sources go
                part.path.unlink()
            merged_any = True
        return merged_any

    def refresh_index(self, force: bool = False) -> None:
        """Rewrite the index if it is due (Index.due), or ``force``."""
        if force or self.index.due():
            self.write_index({})

    def write_index(self, attrs: Mapping[str, Any]) -> None:
        """Rewrite the index over every part now, ``attrs`` added to its attributes."""
        self.bytes_written += self.index.write(self.parts, attrs)

    def finish(self, attrs: Mapping[str, Any], record: Any = None) -> None:
        """The run is complete: one self-contained file if the output is small enough (and the
        disk has room for the copy), else the index over the parts, marked complete (``compact``
        makes it one file); either records the runs, ``record`` (this run's stats) last."""
        self.index.attrs.update(attrs, complete=True)
        self.index.new_run = record
        size = sum(p.size for p in self.parts)
        if size <= MERGE_AT_END_BYTES:
            try:
                with hdf5_replacing(self.path, size) as out:
                    merge_into(out, self.parts, self.columns,
                               {**self.index.attrs, OUTPUT_MARK: FORMAT}, runs=False)
                    self.index.runs_into(out, self.parts)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:  # a part gone, say: not a finished output
                    raise
                log.warning("%s: no room to merge the parts into one file (%s); the output stays "
                            "the index over them, complete (`python -m helpers compact %s` once "
                            "there is room)", self.path, exc.strerror, self.path)
            else:
                self.bytes_written += self.path.stat().st_size
                remove_folder(self.folder, [p.path for p in self.parts])
                self.parts = []  # the output is the one file now
                return
        self.sweep()
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

    def done_positions(self) -> IdRanges:
        """The positions in the source of the records the reader rejected, found on disk."""
        return self._positions


class Index:
    """The output file while a run goes on: virtual datasets over every part (h5py reads it like
    any file), rewritten whole (a temporary name, then renamed) when ``due``; and the runs the
    output records, carried into each rewrite and into the finished file."""

    def __init__(self, path: Path, columns: Mapping[str, tuple]) -> None:
        self.path, self.columns = path, columns
        self.folder = parts_folder(path).name  # (the parts' folder, beside it)
        self.attrs: dict[str, Any] = {}  # written to the index and the final file
        self.earlier_runs: Any = None  # a resumed index's runs (run_log.held), carried on
        self.new_run: Any = None  # this run's record (its PipelineStats), written as it finishes
        self.stale = False  # parts came since the last rewrite
        self.every = INDEX_EVERY  # (INDEX_EVERY_COMMITS once workers' parts come)
        self._at = self._cost = 0.0  # the last rewrite: when it ended, what it took

    def due(self) -> bool:
        """Whether parts came since the last rewrite and that one is ``every`` times its own
        cost old: the index costs at most that fraction of the writer's time."""
        return self.stale and time.monotonic() - self._at >= self.every * self._cost

    def write(self, parts: Sequence[Part], attrs: Mapping[str, Any]) -> int:
        """Rewrite the index over ``parts``, ``attrs`` added to its attributes; its bytes."""
        started = time.monotonic()
        self.attrs.update(attrs)
        room = INDEX_BYTES_PER_SOURCE * len(parts) * len(self.columns)
        # each part's name relative to the index, which sits beside the folder holding them all
        # (not os.path.relpath: 32 ms a rewrite over 5,000 parts, 2 this way); HDF5 reads '%' in
        # a source's name as a format code: '%%' is one '%'
        sources = [f"{self.folder}/{p.path.name}".replace("%", "%%").encode() for p in parts]
        with hdf5_replacing(self.path, room, libver="latest") as f:
            for name, (shape, dtype) in self.columns.items():
                errors = name.startswith("errors/")
                rows = [(source, p.errors if errors else p.rows)
                        for source, p in zip(sources, parts)]
                rows = [(source, n) for source, n in rows if n]
                if rows:
                    _virtual(f, name, shape, dtype, rows)
                else:
                    f.create_dataset(name, shape=(0, *shape), dtype=dtype)
            set_attrs(f, {**self.attrs, INDEX_MARK: self.folder, OUTPUT_MARK: FORMAT})
            self.runs_into(f, parts)
        self._at = time.monotonic()
        self._cost, self.stale = self._at - started, False
        return self.path.stat().st_size

    def runs_into(self, target: h5py.File, parts: Sequence[Part]) -> None:
        """The runs the output records, into ``target`` (an index or the final file being
        written): the marked parts', a resumed index's, then this run's once it finished."""
        for part in parts:
            if part.runs:
                with h5py.File(part.path, "r") as source:
                    run_log.carry(source, target)
        if self.earlier_runs is not None:
            run_log.carry(self.earlier_runs, target)
        if self.new_run is not None:
            run_log.write(target, self.new_run)


def _virtual(f: h5py.File, name: str, shape: tuple[int, ...], dtype: Any,
             sources: Sequence[tuple[bytes, int]]) -> None:
    """The virtual dataset ``name`` in ``f``: the column ``name`` of each source file, its rows in
    turn. h5py's VirtualLayout builds the same, at ~0.1 ms of Python a part and column (its
    selections): with workers' parts, the index over 1,000 of them cost 190 ms a rewrite, 50 ms
    with HDF5's calls made here directly."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.VIRTUAL)
    space = h5py.h5s.create_simple((sum(n for _, n in sources), *shape))
    column = name.replace("%", "%%").encode()  # (a format code in a dataset's name too)
    zeros, start = (0,) * len(shape), 0
    for source, n in sources:
        space.select_hyperslab((start, *zeros), (n, *shape))
        dcpl.set_virtual(space, source, column, h5py.h5s.create_simple((n, *shape)))
        start += n
    space.select_all()
    group, _, leaf = name.rpartition("/")
    parent = f.require_group(group) if group else f
    h5py.h5d.create(parent.id, leaf.encode(), h5py.h5t.py_create(np.dtype(dtype), logical=True),
                    space, dcpl=dcpl)


def _gathered(pieces: list[np.ndarray]) -> list[list[np.ndarray]]:
    """``pieces`` in order, in runs of at most GATHER_BYTES (a bigger piece: a run of its own)."""
    runs: list[list[np.ndarray]] = []
    held = GATHER_BYTES
    for piece in pieces:
        if held + piece.nbytes > GATHER_BYTES:
            runs.append([])
            held = 0
        runs[-1].append(piece)
        held += piece.nbytes
    return runs


def _bytes(blocks: Sequence[Mapping[str, np.ndarray]]) -> int:
    """About what ``blocks`` take on disk: their arrays, and their strings' characters estimated
    from the first ones of each array (a room check's estimate, not a count)."""
    total = 0
    for block in blocks:
        for array in block.values():
            total += array.nbytes
            if array.dtype == object and len(array):
                sample = [v for v in array.flat[:64] if isinstance(v, (str, bytes))]
                total += sum(map(len, sample)) * array.size // max(1, len(sample))
    return total


def check_columns(f: h5py.File, cols: Mapping[str, tuple], path: Path
                  ) -> dict[str, tuple | None]:
    """ValueError naming the first dataset of ``f`` that is not this run's (another workload or
    model wrote it). Files written before errors/position existed pass if they hold no errors.
    Returns each column's (shape, dtype), None where it is missing: read through h5py's
    low-level API, a resume's scan of thousands of parts opens no Dataset object."""
    found = {name: _shape_and_dtype(f, name) for name in cols}
    for name, (shape, dtype) in cols.items():
        there = found[name]
        if name in LATER and there is None and not found["errors/ids"][0][0]:
            continue
        if there is None or there[0][1:] != shape or \
                (dtype is not STR and there[1] != np.dtype(dtype)):
            held = f"{there[0][1:]} {there[1]}" if there is not None else "nothing"
            raise ValueError(f"{path}: {name!r} holds {held}, this run writes {shape} "
                             f"{dtype if dtype is not STR else 'str'}: a different workload, "
                             f"model or gpufeed version wrote it")
    return found


def _shape_and_dtype(f: h5py.File, name: str) -> tuple[tuple, np.dtype] | None:
    try:
        dataset = h5py.h5d.open(f.id, name.encode())
    except KeyError:
        return None
    return dataset.shape, dataset.dtype


def done_in(f: h5py.File, errors: int | None = None) -> tuple[IdRanges, IdRanges]:
    """A part's (or a finished output's) done ids, and the positions of its records that the
    reader rejected; read COPY_ROWS at a time where no ranges were stored (an in-place output).
    ``errors``: its errors' count where the caller knows it (0: none to read)."""
    positions = np.empty(0, np.int64)
    if errors != 0 and "errors/position" in f:
        positions = f["errors/position"][...]
    rejected = IdRanges.from_ids(positions[positions >= 0])
    try:
        stored = h5py.h5d.open(f.id, BOUNDS.encode())  # (low-level: thousands of parts)
    except KeyError:
        pass
    else:
        bounds = np.empty(stored.shape, stored.dtype)
        if bounds.size:
            stored.read(h5py.h5s.ALL, h5py.h5s.ALL, bounds)
        return IdRanges.from_bounds(bounds), rejected
    if RANGES in f:
        return IdRanges.from_half_open(f[RANGES][...]), rejected
    done = IdRanges()
    for start in range(0, len(f["ids"]), COPY_ROWS):
        done = done.union(IdRanges.from_ids(f["ids"][start:start + COPY_ROWS]))
    ids = f["errors/ids"][...]
    done = done.union(IdRanges.from_ids(ids[positions < 0] if len(positions) else ids))
    return done, rejected


def compact(path: str | os.PathLike) -> int:
    """Copy the index ``path`` of a finished run and the parts it points to into one
    self-contained file at ``path``, then remove those parts; returns the bytes written.
    ValueError if ``path`` is not an index (already one file), is not complete (``--resume``
    finishes it first), or names a part that is missing."""
    path = Path(path)
    if not path.is_file() or not is_index(path):
        raise ValueError(f"{str(path)!r}: not the index of a run (already one file, or missing)")
    with h5py.File(path, "r") as index:
        if not index.attrs.get("complete", False):
            raise ValueError(f"{str(path)!r}: its run did not finish; `--resume` finishes it "
                             f"(parts written after the index's last rewrite are not in it yet)")
        cols = {name: (index[name].shape[1:], index[name].dtype) for name in _datasets(index)}
        attrs = {k: v for k, v in index.attrs.items() if k != INDEX_MARK}
        parts = sorted({path.parent / s.file_name.replace("%%", "%") for name in cols
                        if index[name].is_virtual for s in index[name].virtual_sources()})
    missing = [p for p in parts if not p.is_file()]
    if missing:
        raise ValueError(f"{str(path)!r}: its part {missing[0].name!r} is missing "
                         f"({len(missing)} in all): its rows would read as zeros")
    with hdf5_replacing(path, sum(p.stat().st_size for p in parts)) as out:
        merge_into(out, [Part(path, 0, 0, 0, 0, 0, runs=True)], cols, attrs)
    remove_folder(parts_folder(path), parts)
    return path.stat().st_size


def _datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset)
                 and not name.startswith(f"{run_log.GROUP}/") else None)  # (rows, not runs)
    return names


def merge_into(out: h5py.File, parts: list[Part], cols: Mapping[str, tuple],
               attrs: Mapping | None = None, runs: bool = True) -> None:
    """Concatenate ``parts`` (in order) into the new file ``out``, with the union of their done
    ids: each part opened once (thousands of workers' parts: one file open at a time), read
    COPY_ROWS rows at a time, and small parts' rows gathered up to COPY_BYTES per write.
    ``runs``: the marked parts' runs too (helpers.engine.outputs.run_log)."""
    lengths = []  # each part's rows per column (None: the column is missing, FORMAT 1)
    for part in parts:
        with h5py.File(part.path, "r") as f:
            lengths.append({name: None if (found := _shape_and_dtype(f, name)) is None
                            else found[0][0] for name in cols})
    datasets = {}
    for name, (shape, dtype) in cols.items():
        total = sum(n or 0 for n in (rows[name] for rows in lengths))
        chunks = (min(max(total, 1), CHUNK_RECORDS), *shape)
        datasets[name] = out.create_dataset(name, shape=(total, *shape), dtype=dtype,
                                            maxshape=(None, *shape), chunks=chunks)
    gathered: dict[str, list] = {name: [] for name in cols}
    starts, held = dict.fromkeys(cols, 0), dict.fromkeys(cols, 0)  # rows written, bytes held

    def write(name: str) -> None:
        if gathered[name]:
            block = np.concatenate(gathered[name]) if len(gathered[name]) > 1 \
                else gathered[name][0]
            datasets[name][starts[name]:starts[name] + len(block)] = block
            starts[name] += len(block)
            gathered[name], held[name] = [], 0

    done = IdRanges()
    for part, rows in zip(parts, lengths):
        with h5py.File(part.path, "r") as f:
            for name, n in rows.items():
                for offset in range(0, n or 0, COPY_ROWS):
                    gathered[name].append(f[name][offset:offset + COPY_ROWS])
                    held[name] += gathered[name][-1].nbytes
                    if held[name] >= COPY_BYTES:
                        write(name)
            done = done.union(done_in(f, rows["errors/ids"])[0])
            if runs and part.runs:
                run_log.carry(f, out)
    for name in cols:
        write(name)
    out.create_dataset(BOUNDS, data=done.as_bounds())
    set_attrs(out, attrs or {})


def is_index(path: Path) -> bool:
    """True if ``path`` is an index over parts (an unfinished run, or a big finished one); an
    index over no parts yet has no virtual dataset, hence the mark."""
    with h5py.File(path, "r") as f:
        return INDEX_MARK in f.attrs or ("ids" in f and f["ids"].is_virtual)
