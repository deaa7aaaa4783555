"""Files written whole or not at all, and closed cleanly even when the disk is full.

``hdf5_replacing(path, room)`` writes a new HDF5 file under a temporary name of gpufeed's own
(``.NAME.gpufeed-tmp``: never a name someone else's file may have), fsyncs it and renames it
over ``path`` (atomic): at any instant ``path`` is the old file or the new one, whole. HDF5 must not
meet a full disk: its clean-up swallows the write errors ("Exception ignored in
ObjectID.__dealloc__") and the process segfaults later. So the free space is checked first (``room``
bytes and ROOM_MARGIN more, else an OSError ENOSPC that names the folder, before HDF5 writes a
byte). If writing fails all the same (another process filled the disk meanwhile, Ctrl-C), the
temporary file is emptied before HDF5 closes it, which frees the space its flush needs, and removed.

``uninterrupted()`` holds Ctrl-C and SIGTERM back while a file that must not be left half-done is
written (a signal raised inside HDF5's own clean-up is printed as "Exception ignored" and lost,
and the run went on as if never interrupted); the signal is delivered as the block ends.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np

STR = h5py.string_dtype("utf-8")
TEMPORARY_SUFFIX = ".gpufeed-tmp"  # .NAME.gpufeed-tmp: a file being written, renamed when whole
ROOM_MARGIN = (4 << 20, 0.05)  # bytes, and a share of the file: HDF5's metadata, other writers


def ensure_room(folder: Path, nbytes: int) -> None:
    """OSError ENOSPC unless ``folder``'s filesystem has ``nbytes`` free and ROOM_MARGIN more."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    needed = int(nbytes * (1 + ROOM_MARGIN[1])) + ROOM_MARGIN[0]
    if free < needed:
        raise OSError(errno.ENOSPC, f"No space left on device: {folder} has {free / 2**20:,.0f} "
                                    f"MiB free, writing needs about {needed / 2**20:,.0f} MiB")


@contextmanager
def hdf5_replacing(path: Path, room: int = 0, **options: Any) -> Iterator[h5py.File]:
    """``with hdf5_replacing(path, room) as f``: write ``f`` (about ``room`` bytes); on success it
    replaces ``path`` (fsync'd, renamed); on any failure ``path`` is untouched and no temporary
    file is left."""
    ensure_room(path.parent, room)
    tmp = temporary(path)
    f = h5py.File(tmp, "w", **options)
    try:
        yield f
        f.close()  # flushes HDF5's metadata: may fail too, on a full disk
    except BaseException:
        _abandon(f, tmp)
        raise
    fsync(tmp)  # the data reaches the disk before the name does
    os.replace(tmp, path)
    fsync(path.parent)


def temporary(path: Path) -> Path:
    """The name ``path`` is written under until it is whole."""
    return path.with_name(f".{path.name}{TEMPORARY_SUFFIX}")


def is_temporary(name: str) -> str | None:
    """The name a temporary file is written for, if ``name`` is one."""
    if name.startswith(".") and name.endswith(TEMPORARY_SUFFIX):
        return name[1:-len(TEMPORARY_SUFFIX)]
    return None


def _abandon(f: h5py.File, tmp: Path) -> None:
    """Close a file whose writing failed, without a crash now or at exit (module docstring)."""
    try:
        os.truncate(tmp, 0)
    except OSError:
        pass
    try:
        if f.id.valid:
            f.close()
    except Exception:  # whatever HDF5 still could not write is gone with the file
        pass
    tmp.unlink(missing_ok=True)


class WriteBack:
    """``with WriteBack(path) as kick``: each ``kick()`` asks the kernel to start writing what is
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


def fsync(path: Path) -> None:
    """fsync a file, or a folder (so that a rename in it is on disk too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def uninterrupted(on_signal: Callable[[], None] | None = None) -> Iterator[list[int]]:
    """Hold SIGINT and SIGTERM back for the block, then deliver the first that came; the block
    sees the signals held so far (a list), and ``on_signal`` is called as each comes (only the
    main thread receives Python's signals; elsewhere this holds nothing back)."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)
        if on_signal is not None:
            on_signal()

    previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield pending
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if pending:
            signal.raise_signal(pending[0])


def set_attrs(f: h5py.File, attrs: Mapping[str, Any]) -> None:
    """File attributes from plain values, typed as they are: numbers and booleans as such, lists
    of strings or of numbers as arrays; None (HDF5 has no null) leaves the attribute out, and
    anything else (a mapping, a mixed list) is its JSON text."""
    for key, value in attrs.items():
        if value is None:
            f.attrs.pop(key, None)  # (an earlier value of the key must not stand)
        else:
            f.attrs[key] = _attr(value)


def _attr(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return np.asarray(value, dtype=STR)
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return np.asarray(value)
    if isinstance(value, (str, int, float, bool, np.generic, np.ndarray)):
        return value
    return json.dumps(value, sort_keys=True, default=str)
