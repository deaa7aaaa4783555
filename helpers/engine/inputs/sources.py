"""Record sources: each yields ``(id, record)`` pairs lazily, so memory stays flat at any size.

- ``HDF5BatchesSource``: a group ``batches/`` of 1-D UTF-8 string datasets ``0, 1, ...``; a
  record's id is its global position across the batches in numeric order.
- ``JSONLSource`` (helpers.engine.inputs.jsonl): one JSON object per line with a text field; the ids
  are the id field or the 0-based line numbers, for the whole file; ``JSONLFiles``, a folder or a
  glob of them (sharded dumps) as one input.
- ``TableSource`` (helpers.engine.inputs.tables): Parquet, CSV/TSV and Arrow files.
- ``IterableSource``: any Python iterable of ``(id, record)`` pairs.
- ``ImageFolderSource``: the image files of a folder, as paths, in sorted relative-path order (ids
  0, 1, ... in that order, so a rerun over the same folder gives the same ids). The workload
  decodes them in its workers (``prepare``), so the reader stays cheap and a bad file only ever
  costs its own record. Symbolic links are skipped unless ``follow_symlinks``: a link can lead
  anywhere the run may read.

A record that cannot be decoded (invalid UTF-8, a line that is not JSON), whose id is unusable
(not an integer, outside int64) or taken (an id seen earlier in the input) is yielded as a
``BadRecord`` carrying its position in the source; ``read_slices`` hands it to ``reject`` (the
output's ``errors/``) instead of a worker, and it costs no other record. Problems with the source
as a whole (missing file, wrong layout, data stored outside the file) raise at ``open_source``,
before any worker is started.

Each source's ``fingerprint()`` says what it is (helpers.engine.contract.fingerprint): a resumed run
must read the same one.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.fingerprint import (FileStat, check_path, file_identity, file_stats,
                                                 listing_identity)
from helpers.engine.contract.id_ranges import IdRanges, SeenIds
from helpers.engine.contract.protocol import (BadRecord, OutputSpec, Rows, Source, SourceError,
                                              decoded, positions)
from helpers.engine.inputs.carried import with_key
from helpers.engine.inputs.id_checks import checked_ids, screen
from helpers.engine.inputs.jsonl import JSONLFiles, JSONLSource, jsonl_files
from helpers.engine.inputs.open_files import OpenFiles
from helpers.engine.inputs.table_files import FORMATS
from helpers.engine.inputs.tables import TableSource

__all__ = ["HDF5BatchesSource", "ImageFolderSource", "IterableSource", "JSONLSource",
           "SourceError", "TableSource", "accounted", "carried", "open_source", "read_slices",
           "records_left", "source_length"]

log = logging.getLogger("gpufeed")

HDF5_SUFFIXES = (".h5", ".hdf5")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
IMAGE_SAMPLE_BYTES = 4096  # of each image, three times, in a folder's fingerprint (a million
# images: ~3 million small reads, not the whole folder)
READ_SLICE = 1024  # strings read from an HDF5 batch at a time: bounded memory for huge batches


class HDF5BatchesSource:
    """Records from ``<group>/0``, ``<group>/1``, ... of an HDF5 file."""

    def __init__(self, path: str | os.PathLike, group: str = "batches",
                 allow_external: bool = False) -> None:
        import h5py

        self.path, self.group = Path(path), group
        if not self.path.is_file():
            raise SourceError(f"input {str(self.path)!r}: no such file")
        self._stat = file_stats([str(self.path.resolve())])[0]  # every read checks it
        try:
            with h5py.File(self.path, "r") as f:
                self._names, self._length = _batch_layout(f, group, self.path)
                if not allow_external:
                    _refuse_external(f, group, self._names, self.path)
        except OSError as exc:
            raise SourceError(f"input {str(self.path)!r}: not a readable HDF5 file "
                              f"({exc})") from exc

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
                    check_path(self._stat)  # (read: the run's file)
                    if skip.runs:
                        keep = ~skip.contains(ids)
                        ids, raw = ids[keep], raw[keep]
                    yield ids, [decoded(value, i) for value, i in zip(raw, ids.tolist())]
                offset += len(dataset)
                if offset >= end:
                    return

    def rows(self, skip: IdRanges, limit: int | None) -> Iterator[tuple[np.ndarray, Rows]]:
        """The records as Rows for the workers to read (Source protocol), from the batches'
        lengths alone, done ids left out."""
        end = self._length if limit is None else min(limit, self._length)
        return positions(HDF5Rows(self.group, self._stat), end, skip)

    def accounted(self, limit: int | None) -> int:
        """Rows a whole run over the first ``limit`` records leaves in the output or errors/."""
        return records_left(self._length, limit)

    def describe(self) -> str:
        return f"hdf5:{self.path}#{self.group}"

    def fingerprint(self) -> dict[str, Any]:
        return {"format": "hdf5", "group": self.group, "records": self._length,
                **file_identity(self.path)}


@dataclass(frozen=True)
class HDF5Rows:
    """How a worker reads an HDF5 batches input's records by position (Rows' opener): the file
    is opened once per process, if it is the one the driver found (``stat``: its path, size and
    time, as every reader checks its file: helpers.engine.contract.fingerprint), and checked
    again after each read (a file rewritten since: the run stops)."""

    group: str
    stat: FileStat

    @property
    def path(self) -> str:
        return self.stat[0]

    def read(self, ids: np.ndarray) -> list:
        f, names, offsets = _opened(self.group, self.stat)
        records: list = []
        for run in np.split(ids, np.flatnonzero(np.diff(ids) != 1) + 1) if len(ids) else []:
            start, stop = int(run[0]), int(run[-1]) + 1
            while start < stop:
                batch = int(np.searchsorted(offsets, start, side="right")) - 1
                end = min(stop, int(offsets[batch + 1]))
                raw = f[self.group][names[batch]][start - offsets[batch]:end - offsets[batch]]
                records += [decoded(value, i) for value, i in zip(raw, range(start, end))]
                start = end
        check_path(self.stat)
        return records


_OPEN: OpenFiles[tuple[Any, list[str], np.ndarray]] = OpenFiles(4, lambda held: None)  # (an
# h5py file closes with its last reference: a thread still reading an evicted one keeps it)


def close_opened() -> None:
    """Close the HDF5 inputs this process holds open."""
    _OPEN.close_all()


def _opened(group: str, stat: FileStat) -> tuple[Any, list[str], np.ndarray]:
    """An input opened for reading by position, if it is still the driver's (``stat``: its path,
    size and time)."""
    def opened() -> tuple[Any, list[str], np.ndarray]:
        import h5py

        path = stat[0]
        check_path(stat)
        f = h5py.File(path, "r")
        names, _ = _batch_layout(f, group, Path(path))
        offsets = np.cumsum([0] + [len(f[group][n]) for n in names])
        return f, names, offsets

    return _OPEN.get((group, stat), opened)


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


def _refuse_external(f: Any, group: str, names: list[str], path: Path) -> None:
    """SourceError if a batch lives outside the file (an external link, external storage or a
    virtual dataset): such an input reads whatever file it names, /etc/passwd included."""
    import h5py

    links = [(group, f.get(group, getlink=True))] + \
        [(f"{group}/{n}", f[group].get(n, getlink=True)) for n in names]
    for name, link in links:
        if isinstance(link, h5py.ExternalLink):
            raise SourceError(f"input {str(path)!r}: {name} is a link to another file "
                              f"({link.filename}); HDF5BatchesSource(path, allow_external=True) "
                              f"reads it")
    for name in names:
        dataset = f[group][name]
        if dataset.external or dataset.is_virtual:
            where = "external storage" if dataset.external else "a virtual dataset"
            raise SourceError(f"input {str(path)!r}: {group}/{name} keeps its data outside the "
                              f"file ({where}); HDF5BatchesSource(path, allow_external=True) "
                              f"reads it")


class IterableSource:
    """Records from an iterable of ``(id, record)`` pairs, checked as they stream: an item that is
    not a pair stops the run (a programming error); an unusable id costs its record alone."""

    def __init__(self, pairs: Iterable[tuple[int, Any]]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)  # TypeError for generators: the progress bar then has no total

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        for ids, records in read_slices(self, IdRanges()):  # ids checked, bad records kept
            yield from zip(ids.tolist(), records)

    def items(self) -> Iterator[tuple[int, Any, Any]]:
        """``(position, id, record)`` of every pair; ids are checked a slice at a time."""
        for position, pair in enumerate(self.pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise SourceError(f"source item {position} is not an (id, record) pair: "
                                  f"{_short(pair)}")
            yield position, pair[0], pair[1]

    def describe(self) -> str:
        return f"iterable:{type(self.pairs).__name__}"

    def where(self, position: int) -> str:
        return f"item {position}: id"

    def fingerprint(self) -> dict[str, Any]:
        """Only the kind of iterable: its records cannot be checked cheaply."""
        return {"format": "iterable", "type": type(self.pairs).__name__}


class ImageFolderSource:
    """Every image file under ``folder`` (recursively), by sorted relative path; symbolic links
    (to files or folders) only with ``follow_symlinks``."""

    def __init__(self, folder: str | os.PathLike, suffixes: tuple[str, ...] = IMAGE_SUFFIXES,
                 follow_symlinks: bool = False) -> None:
        self.folder, self.suffixes = Path(folder), tuple(s.lower() for s in suffixes)
        self.follow_symlinks = follow_symlinks
        if not self.folder.is_dir():
            raise SourceError(f"input {str(self.folder)!r}: not a folder of images")
        self._paths, links = _image_files(self.folder, self.suffixes, follow_symlinks)
        if links:
            log.warning("input %s: %d symbolic link(s) skipped (follow_symlinks=True reads "
                        "them)", self.folder, links)
        if not self._paths:
            raise SourceError(f"input {str(self.folder)!r}: no image files "
                              f"({', '.join(self.suffixes)})")

    def __len__(self) -> int:
        return len(self._paths)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for record_id, path in enumerate(self._paths):
            yield record_id, str(path)

    def accounted(self, limit: int | None) -> int:
        """Rows a whole run over the first ``limit`` images leaves in the output or errors/."""
        return records_left(len(self._paths), limit)

    def describe(self) -> str:
        return f"images:{self.folder}"

    def fingerprint(self) -> dict[str, Any]:
        return {"format": "images", "follow_symlinks": self.follow_symlinks,
                **listing_identity(self.folder, self._paths, IMAGE_SAMPLE_BYTES,
                                   content=False)}


def _image_files(folder: Path, suffixes: tuple[str, ...], follow: bool) -> tuple[list[Path], int]:
    """The image files under ``folder`` (hidden ones aside), sorted, and how many links were
    skipped. Followed links are walked once each, so a link to a parent cannot loop."""
    found, links, visited = [], 0, set()
    for root, dirs, files in os.walk(folder, followlinks=follow):
        here = os.stat(root)
        if (here.st_dev, here.st_ino) in visited:
            dirs[:] = []
            continue
        visited.add((here.st_dev, here.st_ino))
        if not follow:
            links += sum(os.path.islink(os.path.join(root, d)) for d in dirs)
        for name in files:
            path = Path(root) / name
            if name.startswith(".") or path.suffix.lower() not in suffixes:
                continue
            if path.is_symlink() and not follow:
                links += 1
            elif path.is_file():
                found.append(path)
    return sorted(found), links


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def open_source(source: Any, *, text_column: str = "text", id_column: str | None = None,
                keep_columns: Sequence[str] = (), text_field: str | None = None,
                id_field: str | None = None) -> Source:
    """The right source for ``source``: a path (``.h5``/``.hdf5``; ``.jsonl``/``.ndjson``;
    Parquet, CSV/TSV or Arrow files, a folder or a glob of them; a folder of images), pairs, or a
    Source as it is. ``keep_columns``: a table's columns to carry to the output (TableSource).
    ``text_field``/``id_field``: the older names of the two column options."""
    text_column = text_field if text_field is not None else text_column
    id_column = id_field if id_field is not None else id_column
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        named = text_column != "text" or id_column is not None or bool(keep_columns)
        if path.suffix.lower() in JSONL_SUFFIXES and path.is_file():
            return JSONLSource(path, text_column, id_column or "id", keep_columns)
        shards = jsonl_files(path)
        if shards and not _table_files_in(path):  # a folder or glob of JSON-lines files
            return JSONLFiles(path, shards, text_column, id_column or "id", keep_columns)
        table = _is_table(path, named)  # (a folder is listed once)
        if keep_columns and not table:
            raise SourceError(f"keep_columns: only a table (Parquet, CSV/TSV, Arrow) or "
                              f"JSON-lines input keeps columns ({str(path)!r} is not one)")
        if path.suffix.lower() in HDF5_SUFFIXES and path.is_file():
            return HDF5BatchesSource(path)
        if path.suffix.lower() in JSONL_SUFFIXES:
            return JSONLSource(path, text_column, id_column or "id", keep_columns)
        if table:
            return TableSource(path, text_column, id_column, keep_columns)
        if path.is_dir():
            return ImageFolderSource(path)
        if not path.exists():
            raise SourceError(f"input {str(path)!r}: no such file")
        raise SourceError(f"input {str(path)!r}: unknown format; expected one of "
                          f"{HDF5_SUFFIXES + JSONL_SUFFIXES + tuple(FORMATS)}, a folder or glob "
                          f"of tables, a folder of images, or an iterable of (id, record) pairs")
    if keep_columns:
        raise SourceError("keep_columns: give the input as a path (a table), or keep_columns "
                          "to the TableSource itself")
    if isinstance(source, Source):  # already a source: ours, or a user's
        return source
    if isinstance(source, Iterable):
        return IterableSource(source)
    raise SourceError(f"source: expected a file path or an iterable of (id, record) pairs, "
                      f"got {type(source).__name__}")


def _table_files_in(path: Path) -> bool:
    """Whether a folder or glob names any table file (beside JSON-lines ones, it is a table
    input, whose check then names the odd files)."""
    import glob

    text = str(path)
    found = glob.glob(text, recursive=True) if any(c in text for c in "*?[") else \
        [str(p) for p in path.rglob("*")] if path.is_dir() else []
    return any(Path(f).suffix.lower() in FORMATS for f in found)


def _is_table(path: Path, columns_named: bool = False) -> bool:
    """Whether ``path`` names a table: a file with a table suffix, a glob, or a folder of table
    files. A folder of both: the tables if one is Parquet or Arrow (a logo beside the data) or
    if columns were named; else the images (a manifest.csv beside them)."""
    if not path.is_dir():
        return any(c in str(path) for c in "*?[") or path.suffix.lower() in FORMATS
    if (path / "dataset_dict.json").is_file():
        return True
    suffixes = {p.suffix.lower() for p in path.rglob("*") if p.is_file()}
    tables, images = suffixes & set(FORMATS), suffixes & set(IMAGE_SUFFIXES)
    if tables and images:
        table = columns_named or bool(tables - {".csv", ".tsv"})
        log.warning("input %s holds both tables (%s) and images (%s): read as %s (%s)", path,
                    ", ".join(sorted(tables)), ", ".join(sorted(images)),
                    "tables" if table else "images", "a glob such as " +
                    str(path / ("*" + sorted(tables)[0])) + " names the tables" if not table
                    else "an ImageFolderSource reads the images")
        return table
    return bool(tables)


def carried(source: Any) -> dict[str, OutputSpec]:
    """The columns ``source`` carries to the output (Source protocol), none by default."""
    own = getattr(source, "carried", None)
    return own() if own is not None else {}


def key_of(source: Any) -> str | None:
    """The carried column holding ``source``'s keys (Source protocol: ``key_column``), if any."""
    return getattr(source, "key_column", None)


def reads_by_position(source: Any) -> bool:
    """Whether workers can read ``source``'s records themselves (its ``rows``: Source protocol;
    ``positional`` False where this source's options need the driver to read it)."""
    return hasattr(source, "rows") and getattr(source, "positional", True)


def peek(pieces: Iterator[Any]) -> tuple[Any, Iterator[Any]]:
    """The first of ``pieces`` (None if there is none), and all of them, that one included."""
    first = next(pieces, None)
    return first, itertools.chain([first] if first is not None else [], pieces)


def accounted(source: Any, limit: int | None = None) -> int | None:
    """The rows a whole run over ``source`` (its first ``limit`` records) must leave in the
    output, written or in ``errors/``, where the source knows it (its ``accounted``: HDF5
    batches, JSON lines, tables, images); None for any other."""
    own = getattr(source, "accounted", None)
    return own(limit) if own is not None else None


def source_length(source: Any) -> int | None:
    """Number of records if the source knows it cheaply, else None."""
    try:
        return len(source)
    except TypeError:
        return None


def read_slices(source: Any, skip: IdRanges, limit: int | None = None,
                reject: Callable[[list[tuple]], None] | None = None,
                skip_positions: IdRanges | None = None,
                carry: Callable[[np.ndarray, dict[str, np.ndarray]], None] | None = None,
                rows: bool = False) -> Iterator[tuple[np.ndarray, list]]:
    """The first ``limit`` records of ``source`` as ``(ids, records)`` slices, less the ids in
    ``skip`` (what a resumed run has done). A source with a ``slices(skip, limit)`` method (HDF5
    batches, whose ids are positions) skips what is done before reading it; any other is read
    READ_SLICE records at a time, its ids checked, an id seen before made a BadRecord, and the
    done ones dropped with one vectorised look-up per slice.

    With ``reject``, bad records leave the slices: ``reject`` gets them as ``(id, error type,
    message, unix time, position[, key])`` rows (key: where the source has keys, the record's,
    if it has one), but for those whose position is in ``skip_positions``
    (a resumed run filed them already). Without it they stay in the slices, as BadRecords.

    A source's carried columns (Source protocol) leave the slices too: ``carry(ids, columns)``
    gets those of the records yielded (without ``carry`` they are dropped).

    With ``rows``, the source's ``rows`` (Source protocol: the workers read the records), checked
    and carried alike: the records of a slice are then Rows, or BadRecords the source found;
    the ids are positions, so those in ``skip_positions`` are skipped with the done ones."""
    skip_positions = skip_positions if skip_positions is not None else IdRanges()
    if rows:  # ids are positions: a record a run filed by its position is not read again
        pieces = source.rows(skip.union(skip_positions), limit)
    else:
        own = getattr(source, "slices", None)
        pieces = own(skip, limit) if own is not None else _checked(source, skip, limit)
    declared = set(carried(source))
    key = key_of(source)
    for ids, records, *more in pieces:
        columns = more[0] if more else {}
        if set(columns) != declared:
            raise SourceError(f"source {source.describe()}: its slices carry "
                              f"{sorted(columns) or 'nothing'}, its carried() declares "
                              f"{sorted(declared) or 'nothing'}")
        bad = [k for k, record in enumerate(records) if isinstance(record, BadRecord)] \
            if reject is not None and isinstance(records, list) else []
        if bad:
            now = time.time()
            rows = [(int(ids[k]), records[k].error_type, records[k].message, now,
                     records[k].position) for k in bad]
            if key is not None:  # (the record's key: errors/key)
                rows = [with_key(row, columns[key][k]) for row, k in zip(rows, bad)]
            positions = np.array([row[4] for row in rows], dtype=np.int64)
            fresh = ~(skip_positions.contains(positions) & (positions >= 0))
            if fresh.any():
                reject([row for row, new in zip(rows, fresh) if new])
            keep = np.ones(len(records), dtype=bool)
            keep[bad] = False
            ids, records = ids[keep], list(itertools.compress(records, keep))
            columns = {name: values[keep] for name, values in columns.items()}
        if reject is not None and not len(ids):
            continue
        if carry is not None and columns:
            carry(ids, columns)
        yield ids, records


def _checked(source: Any, skip: IdRanges, limit: int | None) -> Iterator[tuple[np.ndarray, list]]:
    """Any source's records READ_SLICE at a time: unusable ids and ids seen earlier (done or
    not) made BadRecords, done ids dropped, bad records kept for ``read_slices`` to file."""
    if getattr(source, "items", None) is None:
        source = IterableSource(source)  # pairs, checked alike
    where = getattr(source, "where", None) or (lambda position: f"record {position}: id")
    items = source.items()
    if limit is not None:
        items = itertools.islice(items, limit)
    seen = SeenIds()
    while chunk := list(itertools.islice(items, READ_SLICE)):
        positions, raw, records = zip(*chunk)
        records = list(records)
        ids = checked_ids(raw, records, positions, where)
        screened = screen(ids, records, np.array(positions, dtype=np.int64), seen, skip)
        if screened is not None:
            yield screened[:2]


def records_left(total: int | None, limit: int | None, handled: int = 0) -> int | None:
    """Records a (resumed) run has to do, if the source's length is known (``handled``: by an
    earlier run)."""
    if total is None:
        return None
    total = total if limit is None else min(total, limit)
    return max(0, total - handled)
