"""Record sources: each yields ``(id, record)`` pairs lazily, so memory stays flat at any size.

- ``HDF5BatchesSource``: a group ``batches/`` of 1-D UTF-8 string datasets ``0, 1, ...``; a
  record's id is its global position across the batches in numeric order.
- ``JSONLSource``: one JSON object per line with a text field; the id is the object's id field if it
  has one, else the 0-based line number.
- ``IterableSource``: any Python iterable of ``(id, record)`` pairs.
- ``ImageFolderSource``: the image files of a folder, as paths, in sorted relative-path order (ids
  0, 1, ... in that order, so a rerun over the same folder gives the same ids). The workload
  decodes them in its workers (``prepare``), so the reader stays cheap and a bad file only ever
  costs its own record.

A record that cannot be decoded (invalid UTF-8, a line that is not JSON) is yielded as a
``BadRecord`` under its id, so it is reported as failed without costing the records around it.
Problems with the source as a whole (missing file, wrong layout) raise at ``open_source``, before
any worker is started.
"""
from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.id_ranges import IdRanges
from helpers.engine.protocol import BadRecord

HDF5_SUFFIXES = (".h5", ".hdf5")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
READ_SLICE = 1024  # strings read from an HDF5 batch at a time: bounded memory for huge batches


class SourceError(ValueError):
    """The source as a whole cannot be read (missing, wrong layout)."""


class HDF5BatchesSource:
    """Records from ``<group>/0``, ``<group>/1``, ... of an HDF5 file."""

    def __init__(self, path: str | os.PathLike, group: str = "batches") -> None:
        import h5py

        self.path, self.group = Path(path), group
        if not self.path.is_file():
            raise SourceError(f"input {str(self.path)!r}: no such file")
        try:
            with h5py.File(self.path, "r") as f:
                self._names, self._length = _batch_layout(f, group, self.path)
        except OSError as exc:
            raise SourceError(f"input {str(self.path)!r}: not a readable HDF5 file ({exc})") from exc

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        for ids, records in self.slices(IdRanges(), None):
            yield from zip(ids.tolist(), records)

    def slices(self, skip: IdRanges, limit: int | None) -> Iterator[tuple[np.ndarray, list]]:
        """(ids, records) READ_SLICE at a time, the first ``limit`` ids only; a slice whose ids
        are all in ``skip`` is neither read nor decoded, and only the others of a slice are."""
        import h5py

        end = self._length if limit is None else min(limit, self._length)
        offset = 0
        with h5py.File(self.path, "r") as f:
            for name in self._names:
                dataset = f[self.group][name]
                for start in range(0, min(len(dataset), end - offset), READ_SLICE):
                    stop = min(start + READ_SLICE, len(dataset), end - offset)
                    ids = np.arange(offset + start, offset + stop, dtype=np.int64)
                    if skip.runs and skip.covers(offset + start, offset + stop):
                        continue
                    raw = dataset[start:stop]
                    if skip.runs:
                        keep = ~skip.contains(ids)
                        ids, raw = ids[keep], raw[keep]
                    yield ids, [_decode(value) for value in raw]
                offset += len(dataset)
                if offset >= end:
                    return

    def describe(self) -> str:
        return f"hdf5:{self.path}#{self.group}"


def _batch_layout(f: Any, group: str, path: Path) -> tuple[list[str], int]:
    import h5py

    if group not in f or not isinstance(f[group], h5py.Group):
        raise SourceError(f"input {str(path)!r}: no group {group!r} (expected {group}/0, "
                          f"{group}/1, ... of 1-D strings)")
    names = list(f[group])
    bad = [n for n in names if not n.isdigit()]
    if bad:
        raise SourceError(f"input {str(path)!r}: {group}/{bad[0]} is not a numbered batch")
    names.sort(key=int)
    for name in names:
        dataset = f[group][name]
        if not isinstance(dataset, h5py.Dataset) or dataset.ndim != 1 \
                or h5py.check_string_dtype(dataset.dtype) is None:
            raise SourceError(f"input {str(path)!r}: {group}/{name} is not a 1-D string dataset")
    return names, sum(len(f[group][n]) for n in names)


def _decode(raw: bytes | str) -> str | BadRecord:
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRecord("UnicodeDecodeError", f"record is not valid UTF-8: {exc}")


class JSONLSource:
    """Records from the ``text_field`` of each line of a JSON-lines file."""

    def __init__(self, path: str | os.PathLike, text_field: str = "text",
                 id_field: str = "id") -> None:
        self.path, self.text_field, self.id_field = Path(path), text_field, id_field
        if not self.path.is_file():
            raise SourceError(f"input {str(self.path)!r}: no such file")

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        with open(self.path, "rb") as lines:
            for number, line in enumerate(lines):
                if line.strip():
                    yield self._parse(number, line)

    def _parse(self, number: int, line: bytes) -> tuple[int, Any]:
        where = f"{self.path.name} line {number + 1}"
        try:
            obj = json.loads(line)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
            return number, BadRecord(type(exc).__name__, f"{where}: not JSON ({exc})")
        if not isinstance(obj, dict):
            return number, BadRecord("ValueError", f"{where}: expected a JSON object")
        record_id = obj.get(self.id_field, number)
        if isinstance(record_id, bool) or not isinstance(record_id, int):
            return number, BadRecord("ValueError", f"{where}: {self.id_field!r} is not an integer")
        if self.text_field not in obj:
            return record_id, BadRecord("KeyError", f"{where}: no field {self.text_field!r}")
        return record_id, obj[self.text_field]

    def describe(self) -> str:
        return f"jsonl:{self.path}#{self.text_field}"


class IterableSource:
    """Records from an iterable of ``(id, record)`` pairs, checked as they stream."""

    def __init__(self, pairs: Iterable[tuple[int, Any]]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)  # TypeError for generators: the progress bar then has no total

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        for position, pair in enumerate(self.pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise SourceError(f"source item {position} is not an (id, record) pair: "
                                  f"{_short(pair)}")
            record_id = pair[0]
            if isinstance(record_id, bool) or not isinstance(record_id, (int, np.integer)):
                raise SourceError(f"source item {position}: id {_short(record_id)} is not an integer")
            yield int(record_id), pair[1]

    def describe(self) -> str:
        return f"iterable:{type(self.pairs).__name__}"


class ImageFolderSource:
    """Every image file under ``folder`` (recursively), by sorted relative path."""

    def __init__(self, folder: str | os.PathLike, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> None:
        self.folder, self.suffixes = Path(folder), tuple(s.lower() for s in suffixes)
        if not self.folder.is_dir():
            raise SourceError(f"input {str(self.folder)!r}: not a folder of images")
        self._paths = sorted(p for p in self.folder.rglob("*")
                             if p.is_file() and p.suffix.lower() in self.suffixes
                             and not p.name.startswith("."))
        if not self._paths:
            raise SourceError(f"input {str(self.folder)!r}: no image files "
                              f"({', '.join(self.suffixes)})")

    def __len__(self) -> int:
        return len(self._paths)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for record_id, path in enumerate(self._paths):
            yield record_id, str(path)

    def describe(self) -> str:
        return f"images:{self.folder}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def open_source(source: Any, *, text_field: str = "text", id_field: str = "id"):
    """The right source for a path (``.h5``/``.hdf5``, ``.jsonl``, a folder of images) or pairs."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return ImageFolderSource(path)
        if path.suffix.lower() in HDF5_SUFFIXES:
            return HDF5BatchesSource(path)
        if path.suffix.lower() in JSONL_SUFFIXES:
            return JSONLSource(path, text_field, id_field)
        raise SourceError(f"input {str(path)!r}: unknown format; expected one of "
                          f"{HDF5_SUFFIXES + JSONL_SUFFIXES} or an iterable of (id, record) pairs")
    if hasattr(source, "describe"):  # already a source: ours, ImageFolderSource, or a user's
        return source
    if isinstance(source, Iterable):
        return IterableSource(source)
    raise SourceError(f"source: expected a file path or an iterable of (id, record) pairs, "
                      f"got {type(source).__name__}")


def source_length(source: Any) -> int | None:
    """Number of records if the source knows it cheaply, else None."""
    try:
        return len(source)
    except TypeError:
        return None


def read_slices(source: Any, skip: IdRanges, limit: int | None = None
                ) -> Iterator[tuple[np.ndarray, list]]:
    """The first ``limit`` records of ``source`` as ``(ids, records)`` slices, less the ids in
    ``skip`` (what a resumed run has done). A source with a ``slices(skip, limit)`` method (HDF5
    batches, whose ids are positions) skips what is done before reading it; any other is read
    READ_SLICE pairs at a time and filtered with one vectorised look-up per slice."""
    own = getattr(source, "slices", None)
    if own is not None:
        yield from own(skip, limit)
        return
    pairs = iter(source) if limit is None else itertools.islice(source, limit)
    while chunk := list(itertools.islice(pairs, READ_SLICE)):
        ids_, records = zip(*chunk)
        ids, records = np.array(ids_, dtype=np.int64), list(records)
        if skip.runs:
            keep = ~skip.contains(ids)
            if not keep.all():
                ids, records = ids[keep], list(itertools.compress(records, keep))
        if len(ids):
            yield ids, records


def records_left(total: int | None, limit: int | None, skip: IdRanges | None = None
                 ) -> int | None:
    """Records a (resumed) run has to do, if the source's length is known."""
    if total is None:
        return None
    total = total if limit is None else min(total, limit)
    return max(0, total - (len(skip) if skip is not None else 0))
