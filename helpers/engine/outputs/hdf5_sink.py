"""The single writer: appends results to one HDF5 file as they arrive, in any order.

Layout::

    ids                 int64   [n]            record ids, in arrival order
    <output>            <dtype> [n, *shape]    one dataset per workload output, row i is ids[i]
    errors/ids          int64   [m]            records that failed, with why and when
    errors/type         str     [m]
    errors/message      str     [m]
    errors/time         float64 [m]            unix time of the failure
    errors/position     int64   [m]            where a record the reader rejected is in its source
                                               (a JSONL file's 0-based line), else -1; its id is
                                               NO_ID (-2**63) if it had no usable one
    errors/key          str     [m]            its key, where the input's ids are strings ("" if
                                               none, or not known)

Rows are buffered in the caller's thread and handed, a part at a time (PART_ROWS rows, PART_BYTES
bytes, or a buffer FLUSH_SECONDS old, whichever comes first), to a writer thread behind a queue of
at most WRITE_AHEAD_BYTES. The caller (the scheduler's thread) never waits for the disk unless the
disk falls that far behind; HDF5 writes and fsync release the GIL, so writing overlaps the rest.

Each part is written as a file and the output is kept an index over the parts
(helpers.engine.outputs.checkpoint): whatever kills the run, the output opens and holds the rows
written before, and ``resume=True`` carries on from there. A finished run's parts are merged into
one file when they are small enough (MERGE_AT_END_BYTES); a bigger output stays the index over
them (``compact`` makes it one file).

A sink holds the output's lock from its opening to its close (the caller's, when it is given the
output's Claim: run_pipeline's), and opens only an output it may write
(helpers.engine.outputs.ownership: not the input, resumed or overwritten only when asked, never a
file gpufeed did not write, resumed only by the job that made it).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from helpers.engine.contract.fingerprint import INPUT_ATTR, WORKLOAD_ATTR, decode
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import NO_ID, TEXT, OutputSpec
from helpers.engine.outputs.atomic import temporary, uninterrupted
from helpers.engine.outputs.checkpoint import (FORMAT, OUTPUT_MARK, PART_BYTES, PART_ROWS, Parts,
                                               PartTarget, WorkerPart, is_index)
from helpers.engine.outputs.ownership import Claim, check_output, claimed, output_path

FLUSH_SECONDS = 2.0  # a buffer older than this is written even if not full: at most this is lost
WRITE_AHEAD_BYTES = 128 << 20  # rows handed to the writer and not yet on disk, at most
IDLE_SECONDS = 0.5  # an idle writer thread looks this often whether the index is due
STR_OVERHEAD = 49  # bytes of a Python str beside its characters (sys.getsizeof("") == 49)

log = logging.getLogger("gpufeed")
READ_TRIES = 10  # reads of a run's index that a merge of its parts may race (read_output)


class HDF5Sink:
    """Append-only writer of ids, workload outputs and per-record errors."""

    def __init__(self, path: str | os.PathLike | Claim, outputs: Mapping[str, OutputSpec],
                 attrs: Mapping[str, Any] | None = None, *, resume: bool = False,
                 overwrite: bool = False, inputs: tuple[str, ...] = ()) -> None:
        reserved = {"ids", "errors", "resume"} & set(outputs)
        if reserved:
            raise ValueError(f"outputs: {sorted(reserved)} are reserved dataset names")
        self.outputs = dict(outputs)
        self.path = output_path(path)  # a link is written through
        self.attrs = {**(attrs or {}), OUTPUT_MARK: FORMAT}
        self._blocks: list[dict[str, np.ndarray]] = []
        self._rows = self._bytes = 0
        self._since = time.monotonic()
        self.records_written = self.errors_written = 0  # on disk (counted by the writer thread)
        self.write_s = 0.0  # the writer thread's time writing
        self.done = IdRanges()  # resume: ids a previous run wrote or gave up on
        self.done_positions = IdRanges()  # ... and positions of records its reader rejected
        self.resumed_after = 0  # records a previous run handled: both of those
        self.failed_before = 0  # of those, the records in its errors table
        self.record: Callable[[], Any] | None = None  # the run's stats once every row is
        # written, recorded in the output as it is finished (helpers.engine.outputs.run_log)
        self._closed = True
        with ExitStack() as held:
            # the caller's claim (run_pipeline's), else one taken here: released at close (or now,
            # if refused)
            held.enter_context(claimed(path))
            fingerprints = {k: decode(self.attrs[k]) for k in (INPUT_ATTR, WORKLOAD_ATTR)
                            if k in self.attrs}
            mode = check_output(self.path, resume=resume, overwrite=overwrite, inputs=inputs,
                                fingerprints=fingerprints)
            with uninterrupted():
                self._parts = self._open_parts(mode, fingerprints)
            self._lock = held.pop_all()
        self._closed = False
        self._writer = _WriterThread(self._write, self._idle)

    def _open_parts(self, mode: str, fingerprints: Mapping[str, Any]) -> Parts:
        parts = Parts(self.path, self.outputs, {k: self.attrs[k] for k in fingerprints})
        temporary(self.path).unlink(missing_ok=True)  # an index a crash left half-written
        if mode == "overwrite":
            parts.remove()
        if mode == "resume" and self.path.exists() and not is_index(self.path):
            # a finished file (or one an older gpufeed wrote in place): build on it. Parts beside
            # it were merged into it by a run killed before it removed them: counted again, they
            # would be duplicates
            parts.adopt(self.path, discard_parts=True)
        parts.scan()
        if mode == "resume" and self.path.exists():  # (an index: its runs, held till the end)
            parts.hold_runs(self.path)
        self.done, self.done_positions = parts.done(), parts.done_positions()
        if mode == "resume":
            self.resumed_after = len(self.done) + len(self.done_positions)
            self.failed_before = sum(part.errors for part in parts.parts)
            self.attrs["resumed_after"] = self.resumed_after
            log.info("resume: %s holds %d ids (written or failed, in %d ranges) and %d records "
                     "the reader rejected; they are skipped", self.path, len(self.done),
                     self.done.runs, len(self.done_positions))
        self.attrs["complete"] = False
        parts.write_index(self.attrs)  # from now on the output is this run's, even if it dies
        return parts

    @property
    def rows_held(self) -> int:
        """The rows the output holds now, written or in ``errors/``, an earlier run's too (what
        the writer thread has written: ``flush`` first)."""
        return sum(p.rows + p.errors for p in self._parts.parts)

    @property
    def bytes_written(self) -> int:
        return self._parts.bytes_written

    @property
    def output_bytes(self) -> int:
        return self._parts.output_bytes

    @property
    def blocked_s(self) -> float:
        """Time the caller waited for room in the write-ahead queue (the disk fell behind)."""
        return self._writer.blocked_s

    def append(self, ids: np.ndarray, arrays: Mapping[str, np.ndarray]) -> None:
        """Queue rows for writing; ValueError if they do not match the declared outputs."""
        ids = np.asarray(ids, dtype=np.int64)
        if set(arrays) != set(self.outputs):
            raise ValueError(f"outputs: got {sorted(arrays)}, declared {sorted(self.outputs)}")
        for name, spec in self.outputs.items():
            spec.check(name, arrays[name], len(ids))
        block = {"ids": ids, **{n: (a.astype(object) if self.outputs[n].dtype == TEXT else a)
                                for n, a in arrays.items()}}
        self._add(block, len(ids))

    def append_errors(self, records: list[tuple]) -> None:
        """Queue ``(record id, error type, message, unix time[, position[, key]])`` rows for
        ``errors/`` (position: the reader's rejects only; -1 when not given; key: the record's
        string id, "" when not given)."""
        if not records:
            return
        ids, types, messages, times = zip(*(r[:4] for r in records))
        positions = [r[4] if len(r) > 4 else -1 for r in records]
        keys = [_storable(r[5]) if len(r) > 5 else "" for r in records]
        self._add({"errors/ids": np.asarray(ids, dtype=np.int64),
                   "errors/type": np.asarray(types, dtype=object),
                   "errors/message": np.asarray(messages, dtype=object),
                   "errors/time": np.asarray(times, dtype=np.float64),
                   "errors/position": np.asarray(positions, dtype=np.int64),
                   "errors/key": np.asarray(keys, dtype=object)}, len(records))

    def _add(self, block: dict[str, np.ndarray], rows: int) -> None:
        self._writer.check()
        if not self._blocks:
            self._since = time.monotonic()
        self._blocks.append(block)
        self._rows += rows
        self._bytes += sum(_memory(a) for a in block.values())
        if self._rows >= PART_ROWS or self._bytes >= PART_BYTES:
            self._hand_off()
        else:
            self.poll()

    def poll(self) -> None:
        """Hand a buffer older than FLUSH_SECONDS to the writer; raise what the writer raised.
        The scheduler calls this as it loops, so a slow run's rows reach the disk too."""
        self._writer.check()
        if self._blocks and time.monotonic() - self._since > FLUSH_SECONDS:
            self._hand_off()

    def _hand_off(self) -> None:
        if self._blocks:
            # emptied first: an interrupt inside put() may lose these rows (a resumed run redoes
            # them), never write them twice
            blocks, nbytes = self._blocks, self._bytes
            self._blocks, self._rows, self._bytes = [], 0, 0
            self._writer.put(blocks, nbytes)

    def flush(self) -> None:
        """Write everything appended so far, and wait until it is on disk."""
        self._hand_off()
        self._writer.drain()

    def target(self, name: str) -> PartTarget:
        """Where a worker writes rows of this output itself (``writes="workers"``), as ``name``."""
        return self._parts.target(name)

    def commit(self, part: WorkerPart) -> None:
        """Queue a part a worker wrote for the output: the writer thread commits it in order
        with the rows appended here (a part queued when the run dies is not the output's)."""
        self._writer.check()
        if not self._blocks:
            self._since = time.monotonic()
        self._blocks.append(part)
        self.poll()

    def _write(self, blocks: list) -> None:
        """The writer thread's work: workers' parts committed, then one part of the rest."""
        started = time.monotonic()
        committed = [b for b in blocks if isinstance(b, WorkerPart)]
        if committed:
            self._parts.commit(committed)
            self.records_written += sum(p.rows for p in committed)
            blocks = [b for b in blocks if not isinstance(b, WorkerPart)]
        rows = errors = 0
        if blocks:
            part = self._parts.write(blocks)
            rows, errors = part.rows, part.errors
        self.records_written += rows
        self.errors_written += errors
        self.write_s += time.monotonic() - started

    def _idle(self) -> None:
        self._parts.refresh_index()

    def close(self, complete: bool = True) -> None:
        """Write what is left; a complete run is finished (one file, or the index over big
        parts), an incomplete one keeps its index and parts for ``resume``. The output's lock is
        released last.

        Ctrl-C and SIGTERM wait until the output is whole (a signal inside HDF5's clean-up is
        lost, and a writer thread left inside HDF5 hangs the interpreter's exit); closing an
        incomplete run (interrupted already), another one drops the parts not yet begun (a
        resumed run redoes their rows) so that the run ends at once."""
        if self._closed:
            return
        self._closed = True
        with self._lock, uninterrupted(None if complete else self._writer.abandon) as signals:
            if not signals:
                self._hand_off()
            self._writer.close()
            if complete:
                self._parts.finish(self.attrs, self._recorded())
            else:
                self._parts.refresh_index(force=True)

    def _recorded(self) -> Any:
        """The run's stats for its record (``record``), now that every row is written; None
        if there is none, or taking it failed (logged: a record is never worth the rows)."""
        if self.record is None:
            return None
        try:
            return self.record()
        except Exception as exc:  # noqa: BLE001
            log.warning("%s: the run's record could not be taken (%s: %s)", self.path,
                        type(exc).__name__, exc)
            return None

    def __enter__(self) -> "HDF5Sink":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(complete=exc_type is None)


class _WriterThread(threading.Thread):
    """Runs ``write(blocks)`` for each handed-off part, in order, behind a queue of at most
    WRITE_AHEAD_BYTES; calls ``idle()`` every IDLE_SECONDS when there is nothing to write. An
    exception stops it; the next ``put``, ``check``, ``drain`` or ``close`` raises it.

    Not a daemon: the interpreter waits for the part it is writing before it exits (a daemon
    thread stopped inside HDF5 holds h5py's lock, and the exit then hangs on it); once the main
    thread has ended, it drops what is still queued and ends."""

    def __init__(self, write: Callable[[list], None], idle: Callable[[], None]) -> None:
        super().__init__(name="gpufeed-writer", daemon=False)
        self._write, self._idle = write, idle
        self._queue: deque[tuple[list, int]] = deque()
        self._queued_bytes, self._busy, self._closing = 0, False, False
        self._lock = threading.Condition()
        self.error: BaseException | None = None
        self.blocked_s = 0.0
        self.start()

    def put(self, blocks: list, nbytes: int) -> None:
        started = time.monotonic()
        with self._lock:
            while self._queue and self._queued_bytes + nbytes > WRITE_AHEAD_BYTES:
                self._raise()
                self._lock.wait(IDLE_SECONDS)
            self._raise()
            self._queue.append((blocks, nbytes))
            self._queued_bytes += nbytes
            self._lock.notify_all()
        self.blocked_s += time.monotonic() - started

    def drain(self) -> None:
        with self._lock:
            while self._queue or self._busy:
                self._raise()
                self._lock.wait(IDLE_SECONDS)
            self._raise()

    def check(self) -> None:
        if self.error is not None:
            self._raise()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self.join()
        self._raise()

    def abandon(self) -> None:
        """Drop what is queued: the thread ends after the part it is writing."""
        with self._lock:
            self._queue.clear()
            self._queued_bytes, self._closing = 0, True
            self._lock.notify_all()

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the writer thread failed: {type(self.error).__name__}: "
                               f"{self.error}") from self.error

    def run(self) -> None:
        while True:
            if not threading.main_thread().is_alive():
                self.abandon()  # nobody will close us: the process is ending
            with self._lock:
                if not self._queue and not self._closing:
                    self._lock.wait(IDLE_SECONDS)
                if not self._queue:
                    if self._closing:
                        return
                    item = None
                else:
                    item, self._busy = self._queue[0], True
            try:
                if item is None:
                    self._idle()
                    continue
                self._write(item[0])
            except BaseException as exc:  # disk full, a bad path: the caller's next call raises
                self.error = exc
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()
                return
            with self._lock:
                if self._queue and self._queue[0] is item:  # (abandon() may have emptied it)
                    self._queue.popleft()
                    self._queued_bytes -= item[1]
                self._busy = False
                self._lock.notify_all()


def _memory(array: np.ndarray) -> int:
    """The bytes ``array`` holds: its strings too, not only their pointers (8 bytes each), so
    that the write-ahead bound holds for a run that carries keys."""
    if array.dtype != object:
        return array.nbytes
    return array.nbytes + sum(map(len, array.tolist())) + STR_OVERHEAD * len(array)


def _storable(key: Any) -> str:
    """An error row's key as errors/key holds it: "" where an HDF5 string cannot hold it (a NUL
    in it, bytes that are not UTF-8: what made it an error; its message names it, escaped)."""
    if not isinstance(key, str) or "\0" in key:
        return ""
    try:
        key.encode()
    except UnicodeEncodeError:  # (a lone surrogate)
        return ""
    return key


def read_output(path: str | os.PathLike) -> dict[str, Any]:
    """Load an output file sorted by id: ``{"ids", <outputs>..., "errors", "attrs"}`` (outputs:
    the workload's, and the input's string id column and kept columns under their own names);
    each error is ``{"id", "type", "message", "time", "position", "key"}`` (id None: the record
    had no usable id; position None: not a record the reader rejected; key None: the input has
    no string ids, or the record had none).

    Reads a finished file and the index of a run still writing alike: the parts the index names
    are checked to be there after the read too, and a read that a merge of small parts raced
    (its old parts deleted while they were read: HDF5 reads them as zeros) is read again from the
    new index (``consistent``). For inspection and tests; a 20-million-row file is better read in
    slices with h5py: stored in arrival order, they come in id order through the sorted ids
    (docs/data.md shows how), or export it (``export``: in id order).
    """
    return consistent(Path(path), _read_all)


def _read_all(f: h5py.File) -> dict[str, Any]:
    order = np.argsort(f["ids"][...], kind="stable")
    data = {name: _values(f[name])[order] for name in f if isinstance(f[name], h5py.Dataset)}
    errors = f["errors"]
    positions = errors["position"][...] if "position" in errors else \
        np.full(len(errors["ids"]), -1, np.int64)
    keys = errors["key"].asstr()[...] if "key" in errors else [""] * len(positions)
    data["errors"] = [
        {"id": None if i == NO_ID else int(i), "type": t, "message": m, "time": float(s),
         "position": None if p < 0 else int(p), "key": k or None}
        for i, t, m, s, p, k in zip(errors["ids"][...], errors["type"].asstr()[...],
                                    errors["message"].asstr()[...], errors["time"][...],
                                    positions, keys)]
    data["attrs"] = {k: plain(v) for k, v in f.attrs.items()}
    return data


def consistent(path: Path, read: Callable[[h5py.File], Any], tries: int = READ_TRIES) -> Any:
    """``read(f)`` of the output at ``path``, from parts that were all there from before the
    read began until after it ended: a run still writing merges small parts (a new index, then
    the old parts deleted), and a read of the old index meanwhile gets zeros for their rows;
    such a read is done again, ``tries`` times at most (then OSError: a run merging faster than
    the output can be read; read it once the run has ended)."""
    for attempt in range(tries):
        with h5py.File(path, "r") as f:
            parts = check_parts(f, path)
            value = read(f)
        if all(part.is_file() for part in parts):
            return value
        time.sleep(0.05 * (attempt + 1))
    raise OSError(f"{path}: the run writing it merged its parts under every one of {tries} "
                  f"reads; read it once the run has ended")


def check_parts(f: h5py.File, path: Path) -> list[Path]:
    """The parts an index names (none: a finished file); OSError if one is not there: HDF5
    would read its rows as zeros."""
    named = []
    for name in ("ids", "errors/ids"):
        if name in f and f[name].is_virtual:
            for source in f[name].virtual_sources():
                part = path.parent / source.file_name.replace("%%", "%")
                if not part.is_file():
                    raise OSError(f"{path}: its part {part.name} is missing (its rows would read "
                                  f"as zeros); `--resume` redoes them")
                named.append(part)
    return named


def rows_written(path: str | os.PathLike) -> int:
    """The rows the output at ``path`` holds now: a finished file, or the index of a run in
    progress (0 before its first part is indexed, or with no file yet)."""
    try:
        with h5py.File(path, "r") as f:
            return len(f["ids"])
    except (OSError, KeyError):  # not there yet, or no index yet
        return 0


def _values(dataset: h5py.Dataset) -> np.ndarray:
    """A dataset's rows; strings as ``str`` objects, not bytes."""
    if h5py.check_string_dtype(dataset.dtype) is not None:
        return dataset.asstr()[...]
    return dataset[...]


def plain(value: Any) -> Any:
    """An attribute's value as Python's (arrays as lists, NumPy scalars as numbers)."""
    if isinstance(value, np.ndarray):
        return [v.decode() if isinstance(v, bytes) else v for v in value.tolist()]
    return value.item() if isinstance(value, np.generic) else value
