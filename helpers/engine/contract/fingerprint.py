"""What an output was made from, so that ``resume`` carries on only the same job.

An output records two fingerprints in its attributes (and in every part, so that a run killed
before its first index still has them): its input's (a file's path, size, modification time, a
digest of its first, middle and last MiB and ``content``, the SHA-256 of all its bytes; a folder's
listing, a digest of each listed file's size, time and first, middle and last bytes,
FOLDER_SAMPLE_BYTES of each, and ``content`` over every file's bytes; the source's options that
decide what a record is) and its workload's (name, model, the options that change the values, and
each output's shape and dtype). ``content`` reads the whole input once as a run starts, at about
1.8 GB/s of one core here (sha256 on the CPU's SHA extensions; 100 GB: about a minute, where
embedding it takes hours), so that a resume knows the input is the same bytes, however it was
rewritten (an output made before it recorded ``content`` is checked on the samples alone). A
new run with a ``limit`` reads its first records only, and leaves ``content`` out
(``sampled_only``: a try of 1,000 records on a 100 GB corpus starts at once, not after a minute
of digesting); a resume of its output is checked on the samples, as an older output is, and says
so (a resume, limited or not, takes ``content`` again, and compares it where the output holds
it). A resumed run
computes both again; any field that differs is named, and the resume refused, before anything is
written or moved.

While a run reads its input, every reader (the driver's, each worker's) checks each file against
what the run found when it opened it (``file_stats``: its path, size, modification time, inode and
change time): on the open file when it opens it, and again after each read (``checked_open``,
``check_unchanged``, ``unchanged``; by its path where h5py opens it: ``check_path``). A file
replaced, rewritten, cut short or appended to stops the run (OSError naming the file) rather than
mix two inputs' rows in one output; one rewritten in place at the same size with its modification
time put back (``touch -d``, ``os.utime``, what ``cp -p`` and ``rsync -a`` leave) is caught by its
change time, which the kernel sets on every write and no user can put back, and one replaced by a
rename by its inode.

A change time moved with the file's mode, owner or links (a ``chmod``, ``chown``, a backup's
new hard link: ``cp -al``, rsnapshot) needs its bytes to tell it from a rewrite: where the run
took the file's ``content`` as it started, the file is digested again (once per change, at
about 1.8 GB/s) and, the same bytes, the run goes on and says so; else (a ``--limit`` run,
which took none; the same bytes written again with nothing else changed) it stops as for a
rewrite. A FileStat sent to a worker process carries the digest the driver took with it; a
table's opener, which sends its files' ``digest`` and not their stats (a folder of a thousand
files in every message), sends the digests of their bytes as one bytes object
(``contents_of``, ``known_contents``).
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from helpers.engine.contract.protocol import UNRECORDED
from helpers.engine.contract.renamed import renamed

INPUT_ATTR = "input_fingerprint"  # attribute names in an output file and its parts (JSON text)
WORKLOAD_ATTR = "workload_fingerprint"
NO_ID_COLUMN = "(row numbers)"  # a table's id_column in its fingerprint where it has none
SAMPLE_BYTES = 1 << 20  # a file's digest reads this much at its start, middle and end: cheap at
# any size, and any rewrite that changes the size, the time or those bytes is caught
FOLDER_SAMPLE_BYTES = 64 << 10  # of each file of a folder (a thousand Parquet files: 192 MB read)
MOVABLE = ("path", "model_path")  # fields that may differ on resume when every other one is
# equal: a moved input, a model's folder moved (its files' digest the same)
NAMES_OF_A_MODEL = ("model", "model_revision")  # fields that may differ where both record
# model_digest and it is the same: a folder given by another path, a hub commit that touched
# no file the model loads
WHERE = (*MOVABLE, "model_revision")  # fields of a worker's identity that may differ from
# another machine's: where its files are (another cache), a snapshot's name for the same files
TIMES = ("modified", "digest")  # fields that may differ where both record ``content`` and it is
# the same: the same bytes, copied without their times (a folder's digest holds its files' times)


_WHOLE = contextvars.ContextVar("gpufeed_whole_content", default=True)  # see sampled_only


@contextlib.contextmanager
def sampled_only(sampled: bool = True) -> Iterator[None]:
    """Inside it, the identities taken leave ``content`` out (a run with a limit: it reads the
    first records only, and digesting every byte of the input would cost more than the run);
    ``sampled=False`` changes nothing."""
    token = _WHOLE.set(not sampled and _WHOLE.get())
    try:
        yield
    finally:
        _WHOLE.reset(token)


def file_identity(path: str | os.PathLike) -> dict[str, Any]:
    """A file's path, size, modification time, a digest of three samples of its bytes and
    ``content``, the digest of them all (left out inside ``sampled_only``)."""
    path = Path(path)
    stat = path.stat()
    digest = hashlib.sha256(str(stat.st_size).encode())
    _sample(path, stat.st_size, SAMPLE_BYTES, digest)
    return {"path": str(path.resolve()), "size": stat.st_size,
            "modified": _when(stat.st_mtime_ns), "digest": digest.hexdigest()[:16],
            **({"content": _content(path)} if _WHOLE.get() else {})}


def listing_identity(folder: str | os.PathLike, files: list[Path],
                     sample: int = FOLDER_SAMPLE_BYTES, content: bool = True) -> dict[str, Any]:
    """A folder's path and a digest of its listed files' relative paths, sizes, times and
    contents (``sample`` bytes at each file's start, middle and end), and ``content``: every
    file's name and bytes. A file replaced by another of the same size, its time put back (``cp
    -p``, ``rsync -a``), changes both; bytes changed between the samples, ``content`` (left out
    inside ``sampled_only``)."""
    folder = Path(folder)
    content = content and _WHOLE.get()
    digest, whole = hashlib.sha256(), hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        _sample(file, stat.st_size, sample, digest)
        if content:
            whole.update(f"{file.relative_to(folder)}\0{_content(file)}\n".encode())
    return {"path": str(folder.resolve()), "files": len(files), "digest": digest.hexdigest()[:16],
            **({"content": whole.hexdigest()[:32]} if content else {})}


WHOLE_READ = 8 << 20  # bytes a read while digesting a whole file (hashlib lets go of the GIL)


_CONTENTS: dict[FileStat, str] = {}  # a file's content digest, while it stays as it was: a
# process that opens one input many times (the tuner's trials, a pool's jobs) reads it once


def _content(path: Path) -> str:
    """The SHA-256 of every byte of the file at ``path`` (32 hex digits)."""
    stat, = file_stats([str(path)])
    if stat not in _CONTENTS:
        digest = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(WHOLE_READ):
                digest.update(chunk)
        _CONTENTS[stat] = digest.hexdigest()[:32]
    return _CONTENTS[stat]


def _sample(path: Path, size: int, sample: int, digest: Any) -> None:
    """``sample`` bytes at the start, middle and end of a file of ``size`` bytes, into
    ``digest``."""
    with open(path, "rb") as f:
        for offset in sorted({0, max(0, size // 2 - sample // 2), max(0, size - sample)}):
            f.seek(offset)
            digest.update(f.read(sample))


class InputChanged(OSError):
    """A file of the input is not the one the run found when it opened it (exit 1)."""


class FileStat(NamedTuple):
    """A file as a run checks it while reading (the driver's, sent to each worker that reads it:
    an input is on storage they share, where a file keeps its inode and times)."""

    path: str  # absolute
    size: int
    modified_ns: int  # st_mtime_ns: what a user can put back
    inode: int  # st_ino: another file renamed over this one has another
    changed_ns: int  # st_ctime_ns: moved by every write, rename or chmod; nobody can put it back
    owned: tuple[int, ...] = ()  # (mode, links, uid, gid): what moves the change time besides
    # a write; never compared for itself (another machine may map owners otherwise)

    def __reduce__(self) -> tuple:  # (to a worker process: with the content digest taken here)
        return _arrived, (tuple(self), _start_content(self))


def _arrived(fields: tuple, content: str | None) -> FileStat:
    stat = FileStat(*fields)
    if content is not None:
        _CONTENTS.setdefault(stat, content)
    return stat


def file_stats(files: list[str]) -> list[FileStat]:
    """Each file as a run checks it while reading."""
    return [_file_stat(os.path.abspath(f), os.stat(f)) for f in files]


def _file_stat(path: str, stat: os.stat_result) -> FileStat:
    return FileStat(path, stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns,
                    (stat.st_mode, stat.st_nlink, stat.st_uid, stat.st_gid))


def checked_open(stat: FileStat) -> Any:
    """The file ``stat`` names, open, if it is still the one the run found."""
    file = open(stat[0], "rb")
    try:
        check_unchanged(file, stat)
    except OSError:
        file.close()
        raise
    return file


def check_unchanged(file: Any, stat: FileStat) -> None:
    """OSError naming the file if the open ``file`` is no longer the one ``stat`` describes."""
    _compare(stat, os.fstat(file.fileno()))


def check_path(stat: FileStat) -> None:
    """OSError naming the file if the file at ``stat``'s path is no longer the one it describes
    (a reader that opens a file by its path: h5py)."""
    _compare(stat, os.stat(stat[0]))


def _compare(stat: FileStat, now: os.stat_result) -> None:
    found = _file_stat(stat.path, now)
    if found[:5] == stat[:5]:
        return  # (``owned`` is only what tells a chmod from a write: a machine that maps owners
        # otherwise, NFSv4's "nobody", reads the same file)
    if now.st_nlink == 0 and found[:4] == stat[:4]:
        return  # an open file another was renamed over: unlinking moved its change time, and
        # it reads on as it was (a reader by its path meets the other file's inode)
    if found[:4] == stat[:4] and found.owned != stat.owned and _same_bytes(stat):
        return  # a chmod, chown or new link moved the change time: the bytes are the same
    if found.inode != stat.inode:
        how = f"another file now (inode {stat.inode} then, {found.inode} now: replaced)"
    elif (found.size, found.modified_ns) != (stat.size, stat.modified_ns):
        how = (f"{stat.size:,} bytes then, {found.size:,} now; modified {_when(stat.modified_ns)} "
               f"then, {_when(found.modified_ns)} now")
    else:
        why = "written to, its time put back (or its extended attributes changed)"
        if found.owned != stat.owned:
            why = ("its permissions, owner or links changed, and its bytes are not those the "
                   "run started with" if _start_content(stat) else
                   "its permissions, owner or links changed, and a run that took no digest of "
                   "its bytes (--limit) cannot tell that from a rewrite")
        how = (f"same size and modification time, but its change time moved from "
               f"{_when(stat.changed_ns)} to {_when(found.changed_ns)}: {why}")
    raise InputChanged(f"{stat.path}: changed since the run started ({how}): a run reads one "
                       f"input from start to end, never a mix of two; run it again on a file "
                       f"that stays as it is")


CONTENTS_FILES = 1024  # files of a table whose digests its opener carries (16 KB with every
# message): a folder of more is refused after a chmod, as before, rather than grow each message


def contents_of(stats: list[FileStat]) -> bytes:
    """The digests of the files' bytes as the run started, 16 bytes each (zeros where the run
    took none), for an opener sent with every message; none for more than CONTENTS_FILES."""
    if len(stats) > CONTENTS_FILES:
        return b""
    return b"".join(bytes.fromhex(_start_content(stat) or "00" * 16) for stat in stats)


def _said(contents: bytes) -> list[str | None]:
    """``contents_of``'s digests, each as ``_content`` gives it (None: the run took none)."""
    return [digest.hex() if digest.strip(b"\0") else None
            for digest in (contents[n:n + 16] for n in range(0, len(contents), 16))]


def known_contents(stats: list[FileStat], contents: bytes) -> None:
    """What ``contents_of`` said of ``stats`` (the driver's, as this process found them too),
    known here from now on."""
    for stat, digest in zip(stats, _said(contents)):
        if digest is not None:
            _CONTENTS.setdefault(stat, digest)


def same_contents(stats: list[FileStat], contents: bytes) -> bool:
    """Whether the files ``stats`` name hold the bytes ``contents_of`` said of the run's (every
    one digested again: a worker that first opens them after a chmod, its stats the driver's no
    longer); False where the run took no digest of one, or the files are not as many."""
    said = _said(contents)
    return len(said) == len(stats) and all(
        digest is not None and _content(Path(stat.path)) == digest
        for stat, digest in zip(stats, said))


def _start_content(stat: FileStat) -> str | None:
    """The digest of the file's bytes as the run started, if it took one (the driver's, or
    sent with ``stat``); by the file's identity, whatever path named it then."""
    return _CONTENTS.get(stat) or next((digest for known, digest in list(_CONTENTS.items())
                                        if known[1:5] == stat[1:5]), None)  # (a snapshot:
    # thread workers add to it meanwhile)


_SAID: set[tuple[str, int]] = set()  # (path, change time) the run went on after, said once


def _same_bytes(stat: FileStat) -> bool:
    """Whether the file at ``stat``'s path holds the bytes the run started with (False where
    the run took no digest of them); a change it goes on after is said once, in the log."""
    start = _start_content(stat)
    there = os.stat(stat.path)
    if start is None or there.st_ino != stat.inode or \
            _content(Path(stat.path)) != start:  # (by its path: the same file, or none)
        return False
    now = there.st_ctime_ns
    if (stat.path, now) not in _SAID:
        _SAID.add((stat.path, now))
        logging.getLogger("gpufeed").warning(
            "%s: its permissions, owner or links changed during the run (change time %s); its "
            "bytes are those the run started with: going on", stat.path, _when(now))
    return True


@contextlib.contextmanager
def unchanged(stat: FileStat) -> Iterator[Any]:
    """The file ``stat`` names, open (``checked_open``); whatever reading it raises is checked
    against a change first (a file cut short reads as a broken one: the change is what to say)."""
    file = checked_open(stat)
    try:
        yield file
    except Exception:
        check_unchanged(file, stat)
        raise
    finally:
        file.close()


def source_fingerprint(source: Any) -> dict[str, Any]:
    """The source's own ``fingerprint()``, or what its ``describe()`` says; taken once per
    source object and kind (whole or ``sampled_only``: a run asks twice, before its pool starts
    and as its job opens, and a folder's reads every file's samples), kept on it where it takes
    an attribute."""
    whole = _WHOLE.get()
    known = getattr(source, "_gpufeed_fingerprint", None) or {}
    if whole in known:
        return known[whole]
    own = getattr(source, "fingerprint", None)
    if own is None:
        return {"source": source.describe() if hasattr(source, "describe")
                else type(source).__name__}
    found = own()
    try:
        source._gpufeed_fingerprint = {**known, whole: found}
    except AttributeError:  # (slots, a frozen dataclass: taken again next time)
        pass
    return found


def workload_fingerprint(workload: Any, outputs: Mapping[str, Any] | None = None,
                         loaded: Mapping[str, Mapping[str, Any]] | None = None
                         ) -> dict[str, Any]:
    """The workload's ``fingerprint()`` (else its ``attrs()``), and its outputs' shapes and dtypes
    once its workers have declared them; a field the driver could not tell (None: a hub model
    it never fetched) as its workers ``loaded`` it (worker -> its ``identity``; ValueError where
    they differ: ``same_everywhere``)."""
    own = getattr(workload, "fingerprint", None)
    values = dict(own() if own is not None else workload.attrs())
    merged = same_everywhere(values, loaded or {})
    values.update({k: v for k, v in merged.items() if values.get(k) is None})
    values.setdefault("workload", workload.name)
    if outputs is not None:
        values["outputs"] = {name: f"{list(spec.shape)} {spec.dtype}"
                             for name, spec in sorted(outputs.items())}
    return values


def as_attrs(source: Any, workload: Any, outputs: Mapping[str, Any] | None = None,
             loaded: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, str]:
    """An output's record of what made it, as its attributes (JSON text)."""
    return {INPUT_ATTR: encode(source_fingerprint(source)),
            WORKLOAD_ATTR: encode(workload_fingerprint(workload, outputs, loaded))}


def same_everywhere(here: Mapping[str, Any], loaded: Mapping[str, Mapping[str, Any]]
                    ) -> dict[str, Any]:
    """The fields every worker's load decided (``loaded``: worker -> its ``identity``), as one;
    ValueError naming the workers, or the driver (``here``: its own fingerprint), whose values
    differ (a field of WHERE aside: the same files in another place)."""
    merged: dict[str, Any] = {}
    for worker, identity in loaded.items():
        for key, value in identity.items():
            if value is None:
                continue
            merged.setdefault(key, (worker, value))
            first, seen = merged[key]
            if key in WHERE:
                continue
            if seen != value:
                raise ValueError(f"{first} and {worker} loaded different models ({key} "
                                 f"{_show(seen)} and {_show(value)}): every worker must run the "
                                 f"same files (a hub name whose revision moved between machines? "
                                 f"name a revision, or a folder every machine shares)")
            if here.get(key) is not None and here[key] != value:
                raise ValueError(f"{worker} loaded another model than the driver found ({key} "
                                 f"{_show(here[key])} here, {_show(value)} there): every worker "
                                 f"must run the files the output records (a hub name whose "
                                 f"revision moved? name a revision, or a folder every machine "
                                 f"shares)")
    return {key: value for key, (_, value) in merged.items()}


def input_paths(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """The file or folder the input fingerprint in ``attrs`` names, if any (an output may not be
    it)."""
    path = (decode(attrs.get(INPUT_ATTR, "{}")) or {}).get("path")
    return (path,) if path else ()


def encode(fingerprint: Mapping[str, Any]) -> str:
    return json.dumps(fingerprint, sort_keys=True, default=str)


def decode(text: Any) -> dict[str, Any] | None:
    if isinstance(text, bytes):
        text = text.decode()
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def differences(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, tuple]:
    """``{field: (recorded, now)}`` for every field both know that differs (one that either
    cannot tell is not compared: the outputs before the workers declared them, a field an older
    gpufeed did not record). A field ``now`` names in its UNRECORDED is known to both: an
    output that lacks it was made with the value given there. A field recorded under an older
    name (helpers.engine.contract.renamed) is compared under its name now, as ``now``'s is."""
    now = json.loads(encode(now))  # compared as recorded: tuples as lists, anything else as text
    recorded, now = renamed(recorded), renamed(now)
    before = now.get(UNRECORDED) or {}
    recorded = {**{k: v for k, v in before.items() if k not in recorded}, **recorded}
    return {key: (recorded[key], value) for key, value in now.items()
            if value is not None and recorded.get(key) is not None and recorded[key] != value}


def describe(changes: Mapping[str, tuple]) -> str:
    """``size 1,024 -> 2,048, digest 3fa2... -> 91bc...``."""
    return ", ".join(f"{key} {_show(old)} -> {_show(new)}" for key, (old, new) in changes.items())


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "(none)" if value is None else repr(value) if isinstance(value, str) else str(value)


def _when(ns: int) -> str:
    """A modification time to the nanosecond, readable (and usable with ``touch -d``)."""
    seconds, fraction = divmod(ns, 10**9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds)) + f".{fraction:09d}" + \
        time.strftime("%z", time.localtime(seconds))
