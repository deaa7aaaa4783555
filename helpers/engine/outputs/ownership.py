"""Whose output is it: one run at a time, and only with the user's say-so, checked before anything
is touched.

- **A lock** (``OUT.h5.lock`` beside the output, held with ``flock`` for the run's life): a second
  run on the same output is refused at once, naming the holder (pid, host, start time, command).
  The kernel drops the lock when its process dies, however it dies, so a SIGKILLed run's lock is
  taken over by the next one; a finished run removes its lock file. The driver holds it on Ray too
  (workers never write the output).
- **The output's state** (``check_output``): the output is not the input; an existing output is
  resumed only with ``resume`` and replaced only with ``overwrite``; a file gpufeed did not write,
  or a parts folder holding files gpufeed did not write, is never moved, replaced or deleted; and
  a resume carries on only the job that made the output: the same input and the same workload
  (helpers.engine.contract.fingerprint), or it is refused naming what differs.

Every refusal is an ``OutputError`` (a ValueError: the command line exits 2) raised before the
output, its parts or anything beside them has changed.

On a filesystem whose ``flock`` fails (some network mounts say ENOLCK), the lock falls back to a
file created exclusively, holding its owner; a leftover one from a run on this machine whose
process is gone is taken over, one from another machine must be removed by hand. A filesystem
that grants ``flock`` on each machine without telling the others (NFS mounted with
``local_lock=all``, object-store mounts) cannot stop two machines writing one output: give each
run its own output there.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py

from helpers.engine.contract.fingerprint import (INPUT_ATTR, MOVABLE, NAMES_OF_A_MODEL, TIMES,
                                                 WORKLOAD_ATTR, decode, describe, differences)
from helpers.engine.outputs.atomic import TEMPORARY_SUFFIX
from helpers.engine.outputs.checkpoint import OUTPUT_MARK, foreign_files, parts_folder

OUTPUT_SUFFIXES = (".h5", ".hdf5")  # what a run's output may be named (it is HDF5)
LOCK_SUFFIX = ".lock"
LOCK_MARK = "gpufeed_lock"  # a field of every lock's text: a file without it is not ours
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # flock not supported
MODES = ("new", "resume", "overwrite")
VOUCHED_BY = (  # a field that, recorded and the same, vouches for others that differ on resume
    ("content", TIMES, "the %s's times differ (%s), its bytes are those the output was made "
                       "from"),
    ("model_digest", NAMES_OF_A_MODEL, "the %s's model is named otherwise (%s), its files are "
                                       "those the output was made with"))

log = logging.getLogger("gpufeed")


class OutputError(ValueError):
    """This run may not write its output as asked; nothing was touched."""


class OutputLocked(OutputError):
    """Another run holds the output."""


def output_path(output: str | os.PathLike) -> Path:
    """Where an output really is: every link followed (a link to a file on a bigger disk is
    written through, and locked as its target), whatever the spelling (``./out.h5``, a linked
    folder). OutputError if the names gpufeed puts beside it would be too long."""
    path = Path(os.path.realpath(output))
    folder = path.parent if path.parent.exists() else Path(os.path.realpath("."))
    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    if len(os.fsencode(path.name)) + len(TEMPORARY_SUFFIX) + 1 > longest:
        raise OutputError(f"output name {path.name!r} is too long: gpufeed writes "
                          f"'.{path.name}{TEMPORARY_SUFFIX}' beside it, and names here may have "
                          f"{longest} bytes")
    return path


def lock_path(output: str | os.PathLike) -> Path:
    output = Path(output)
    return output.with_name(output.name + LOCK_SUFFIX)


class Claim(os.PathLike):
    """An output this run holds (``owning`` gives it): the driver hands it down in place of the
    output's path, so that what writes the output below it (``run_pipeline``, ``WorkerPool.run``,
    ``HDF5Sink``) uses the lock held, never claiming the output a second time. Path-like: it
    reads as the output as it was given (``path``: where it really is, its lock beside it)."""

    def __init__(self, output: str | os.PathLike, path: Path) -> None:
        self.output, self.path = os.fspath(output), path

    def __fspath__(self) -> str:
        return self.output

    def __str__(self) -> str:
        return self.output

    def __repr__(self) -> str:
        return f"Claim({self.output!r})"


@contextmanager
def owning(output: str | os.PathLike) -> Iterator[Claim]:
    """Hold ``output``'s lock for the block, once: OutputLocked naming the holder if another run,
    another thread of this process, or this very block's caller has it (an output is claimed
    once, and its Claim handed down: ``claimed``). Folders created for the lock are removed
    again if they are left empty (a refused run leaves none)."""
    path = output_path(output)
    lock = lock_path(path)
    made = _make_folders(lock.parent)
    try:
        release = _acquire(lock)
    except BaseException:
        _remove_empty(made)
        raise
    try:
        yield Claim(output, path)
    finally:
        release()
        _remove_empty(made)


@contextmanager
def claimed(output: str | os.PathLike | Claim) -> Iterator[Claim]:
    """``output``'s Claim for the block: the one given (its holder keeps and releases it), else
    the lock taken here (``owning``)."""
    if isinstance(output, Claim):
        yield output
        return
    with owning(output) as claim:
        yield claim


def holder() -> dict[str, Any]:
    """Who holds a lock: this process."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "command": " ".join(sys.argv)[:300], LOCK_MARK: True}


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the ones created, deepest first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    try:
        for made in reversed(missing):
            made.mkdir()
    except OSError as exc:
        _remove_empty(missing)
        raise OutputError(f"cannot create the folder {str(made)!r}: {exc.strerror}") from None
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:  # not empty (the output is in it), or gone
            return


def _acquire(lock: Path) -> Any:
    """Take ``lock``; returns the function that releases it."""
    while True:
        fd, created = _open(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read(fd)
            os.close(fd)
            raise OutputLocked(f"{str(lock.with_suffix(''))!r} is being written by another run "
                               f"({_who(owner)}); wait for it to finish, or give this run "
                               f"another output") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in NO_LOCKS:
                raise
            if created:
                lock.unlink(missing_ok=True)
            return _acquire_without_flock(lock, exc)
        try:
            same = os.fstat(fd).st_ino == os.stat(lock, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its last holder removed it between our open and our lock: try again
    stale = _read(fd)
    if stale is None:  # not a lock gpufeed wrote: someone's file with our name
        os.close(fd)
        raise OutputError(f"{str(lock)!r} exists and is not a gpufeed lock; gpufeed will not "
                          f"replace it: move it, or name another output")
    if stale:
        log.warning("%s: took over the lock of a run that is gone (%s)", lock, _who(stale))
    _write(fd, holder())

    def release() -> None:
        try:
            os.unlink(lock)  # while still held: nobody can lock the name we remove
        except FileNotFoundError:
            pass
        os.close(fd)

    return release


def _open(lock: Path) -> tuple[int, bool]:
    """The lock file's descriptor, and whether this call created it; a link or anything but a
    regular file in its place is refused (opening it would write wherever it leads)."""
    try:
        while True:
            try:
                return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                               0o644), True
            except FileExistsError:
                pass
            try:
                fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
                break
            except FileNotFoundError:  # gone between the two opens (released, or a dead
                continue  # run's lock broken by another run): create it, or open the new one
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise IsADirectoryError(errno.EISDIR, "not a file")
        return fd, False
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) or \
                (lock.is_symlink() or (lock.exists() and not lock.is_file())):
            raise OutputError(f"{str(lock)!r} exists and is not a gpufeed lock (a link, or not a "
                              f"file); gpufeed will not write through it: move it, or name "
                              f"another output") from None
        raise OutputError(f"cannot write beside the output: {str(lock)!r}: "
                          f"{exc.strerror}") from None


def _acquire_without_flock(lock: Path, why: OSError) -> Any:
    """The lock as a file created exclusively (a filesystem without flock): refused while it
    exists, unless its owner was a process of this machine that is gone (``_break``)."""
    log.warning("%s: this filesystem has no working locks (%s); the lock is a file created "
                "exclusively instead", lock, why.strerror)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            owner = _read_path(lock)
            if owner and owner.get("host") == socket.gethostname() and not _alive(owner) \
                    and _break(lock, owner):
                continue
            raise OutputLocked(f"{str(lock.with_suffix(''))!r} is held by another run "
                               f"({_who(owner or {})}); if that run is gone, remove "
                               f"{str(lock)!r}") from None
        mine = holder()
        _write(fd, mine)
        os.close(fd)

        def release(mine: dict = mine) -> None:
            if _read_path(lock) == json.loads(json.dumps(mine)):  # still ours
                lock.unlink(missing_ok=True)

        return release
    raise OutputLocked(f"{str(lock)!r}: could not take the lock")


def _break(lock: Path, stale: Mapping[str, Any]) -> bool:
    """Remove the lock a dead run left, only if it is still that one: moved aside under a name
    of our own first, then read (two runs breaking it at once: the second moves the first's
    new lock aside, sees it is not the stale one, and puts it back)."""
    aside = lock.with_name(f"{lock.name}.{os.getpid()}.{threading.get_ident()}.stale")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return True  # someone else broke it: try to create ours
    if _read_path(aside) == stale:
        log.warning("%s: took over the lock of a run that is gone (%s)", lock, _who(stale))
        aside.unlink(missing_ok=True)
        return True
    try:
        os.link(aside, lock)  # not the stale one: give it back, unless yet another run took it
    except FileExistsError:
        pass
    aside.unlink(missing_ok=True)
    return False


def _alive(owner: Mapping[str, Any]) -> bool:
    import psutil

    try:
        process = psutil.Process(int(owner.get("pid", -1)))
        return process.create_time() <= float(owner.get("started", 0)) + 1
    except (psutil.Error, ValueError, TypeError):
        return False


def _write(fd: int, owner: Mapping[str, Any]) -> None:
    """Who holds the lock, for whoever is refused (no fsync: after a crash the kernel's lock is
    gone anyway, and this text only informs)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(owner).encode(), 0)


def _parse(text: bytes) -> dict[str, Any] | None:
    """A lock's holder; {} for an empty lock (its run died between creating and writing it);
    None if the text is not a gpufeed lock at all."""
    if not text.strip():
        return {}
    try:
        owner = json.loads(text)
    except ValueError:
        return None
    return owner if isinstance(owner, dict) and owner.get(LOCK_MARK) is True else None


def _read(fd: int) -> dict[str, Any] | None:
    return _parse(os.pread(fd, 4096, 0))


def _read_path(lock: Path) -> dict[str, Any] | None:
    try:
        return _parse(lock.read_bytes())
    except OSError:
        return {}


def _who(owner: Mapping[str, Any] | None) -> str:
    if not owner:
        return "it has not said who it is"
    try:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(owner["started"])))
    except (KeyError, TypeError, ValueError, OverflowError):
        when = "?"
    return f"pid {owner.get('pid')} on {owner.get('host')}, started {when}: " \
           f"{owner.get('command', '')}".rstrip(": ")


def check_output(output: str | os.PathLike, *, resume: bool, overwrite: bool,
                 inputs: tuple[str, ...] = (), fingerprints: Mapping[str, Mapping] | None = None
                 ) -> str:
    """Whether this run may write ``output``, touching nothing: "new", "resume" or "overwrite";
    OutputError saying why not.

    ``inputs``: the paths the run reads (an output may not be one of them). ``fingerprints``:
    this run's ``{INPUT_ATTR: ..., WORKLOAD_ATTR: ...}``, compared on resume with the output's.
    """
    path = output_path(output)
    if resume and overwrite:
        raise OutputError("resume and overwrite: choose one (resume keeps what the output holds, "
                          "overwrite replaces it)")
    if path.is_dir():
        raise OutputError(f"output {str(path)!r} is a folder; name a file in it, such as "
                          f"{str(path / 'out.h5')!r}")
    for source in inputs:
        if _same(path, Path(source)):
            raise OutputError(f"output {str(path)!r} is the input {source!r}: writing it would "
                              f"destroy the input; name another output")
    if Path(output).suffix.lower() not in OUTPUT_SUFFIXES:
        name = Path(output).with_suffix(".h5").name
        raise OutputError(f"output {str(output)!r}: a run writes HDF5, named .h5 or .hdf5; name "
                          f"it {name!r}, then `python -m helpers export {name} --to parquet "
                          f"--output ...` (or --to npy) writes the other formats")
    folder = parts_folder(path)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{str(folder)!r} is in the way of the output's parts folder and is not "
                          f"gpufeed's; move it or name another output")
    foreign = foreign_files(folder)
    if foreign:
        shown = ", ".join(repr(p.name) for p in foreign[:3])
        raise OutputError(f"{str(folder)!r} holds {len(foreign)} file(s) gpufeed did not write "
                          f"({shown}); gpufeed will not write there: move them or name another "
                          f"output")
    has_file = path.exists()
    if has_file and not is_gpufeed_output(path):
        raise OutputError(f"{str(path)!r} exists and is not a gpufeed output; gpufeed will not "
                          f"replace, move or resume it: name another output, or remove it "
                          f"yourself")
    has_parts = folder.is_dir() and any(folder.iterdir())
    if not (has_file or has_parts):
        if resume:
            log.info("resume: %s does not exist yet: starting from the beginning", path)
        return "new"
    what = "an unfinished run's index and parts" if has_parts else "a finished output"
    if not resume and not overwrite:
        raise OutputError(f"{str(path)!r} already holds {what}; resume it (--resume, "
                          f"resume=True) or replace it (--overwrite, overwrite=True)")
    if overwrite:
        log.info("overwrite: %s (%s) is replaced", path, what)
        return "overwrite"
    _check_same_job(path, folder, fingerprints or {})
    return "resume"


def _same(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def is_gpufeed_output(path: Path) -> bool:
    """True for a file gpufeed wrote: a finished output, an index, or an in-place output."""
    try:
        if not h5py.is_hdf5(path):
            return False
        with h5py.File(path, "r") as f:
            return OUTPUT_MARK in f.attrs or ("ids" in f and "errors" in f and "source" in f.attrs)
    except OSError:
        return False


def recorded_fingerprints(path: Path) -> dict[str, dict] | None:
    """The fingerprints an output (else its first part) records; None if it records none (made
    by an earlier gpufeed)."""
    folder = parts_folder(path)
    candidates = [path] if path.exists() else []
    candidates += sorted(folder.glob("part-*.h5")) if folder.is_dir() else []
    for candidate in candidates:
        with h5py.File(candidate, "r") as f:
            if INPUT_ATTR in f.attrs and WORKLOAD_ATTR in f.attrs:
                return {key: decode(f.attrs[key]) or {} for key in (INPUT_ATTR, WORKLOAD_ATTR)}
    return None


def _check_same_job(path: Path, folder: Path, now: Mapping[str, Mapping]) -> None:
    recorded = recorded_fingerprints(path)
    if recorded is None:
        log.warning("resume: %s records no fingerprint of its input and workload (an earlier "
                    "gpufeed made it): resuming without checking that they are the same", path)
        return
    read = recorded[INPUT_ATTR]
    if "digest" in read and not read.get("content") and "content" in now.get(INPUT_ATTR, {}):
        log.warning("resume: %s records no digest of every byte of its input (the run that made "
                    "it read with a limit, or an earlier gpufeed): the input is checked on its "
                    "size, time and sampled bytes only", path)
    for key, what in ((INPUT_ATTR, "input"), (WORKLOAD_ATTR, "workload")):
        if key not in now:
            continue
        changes = differences(recorded[key], now[key])
        if not changes:
            continue
        if set(changes) <= set(MOVABLE):
            log.warning("resume: the %s moved (%s); everything else about it is the same",
                        what, describe(changes))
            continue
        vouched = [(field, said) for field, fields, said in VOUCHED_BY
                   if recorded[key].get(field) and set(changes) <= {*fields, *MOVABLE}]
        if vouched:  # (the voucher is not among the changes: the same there and here)
            field, said = vouched[0]
            log.warning("resume: " + said + " (%s %s)", what, describe(changes), field,
                        recorded[key][field])
            continue
        hint = ""
        if key == INPUT_ATTR and set(changes) <= {"modified", *MOVABLE}:
            hint = (f" (its size and sampled bytes are the same, its time not: if it is a "
                    f"byte-for-byte copy of the file that run read, and only then, `touch -d "
                    f"'{changes['modified'][0]}' FILE` gives it back its time; any other file "
                    f"would mix two inputs in one output)")
        raise OutputError(f"resume: {str(path)!r} was made from another {what}: "
                          f"{describe(changes)}{hint}; resume it with the {what} that made it, "
                          f"or start anew with --overwrite")
