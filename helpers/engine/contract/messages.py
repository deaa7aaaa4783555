"""What travels between the driver and its workers, in both directions.

Parent to worker: ``Workunit`` s (ids and records), one or several a message
(``units_per_message``), then END_OF_WORK when the pool closes. Worker to driver: ``Ready`` once
its model is loaded, then a ``Result`` or ``Failed`` per workunit, in the order it ran them (a Ray
actor answers a message's workunits together, when its call returns).
A workunit with a ``target`` (``writes="workers"``) is written by its worker as a part file of
the output, with the source's ``carried`` columns; its Result then names the part instead of
holding the rows, and the driver commits it (helpers.engine.outputs.checkpoint).
Ids that run one by one (a source read by position: most workunits, and their Results) travel
as their first id and count, 16 bytes instead of 8 a record (``_PackedIds``; the positions a
worker reads, protocol.Rows, too): a Ray call of four workunits of 4,096 records then fits in
the call itself rather than Ray's object store.
From the backend itself: ``Died``, when a worker ends without a word. ``WorkerInfo`` names a
worker: its slot, device, CPU threads and which model copy it is on that device.

Words used for what goes wrong, each for one thing only:

- *rejected*: records the workload refused (``check_record``/``prepare`` raised, or the reader
  could not decode them); they come back in ``Result.rejected`` and are written to ``errors/``;
- *Failed*: a worker's report that a whole workunit (or its model load) raised;
- *given up*: records the scheduler stopped retrying after every split (``errors/`` too);
- *died*: a worker that ended, or was killed, without reporting.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from helpers.engine.contract.id_ranges import packed, unpacked
from helpers.engine.contract.protocol import OutputSpec

END_OF_WORK = "END_OF_WORK"  # sent once to each worker when the pool closes
POLL_SECONDS = 0.5  # longest a waiting loop blocks before it checks on the world: a worker
# that its parent lives, the scheduler its timeouts, the reader that its job is not stopped
OOM_ERRORS = ("OutOfMemoryError", "MemoryError")  # torch.cuda's, and Python's own
UNWRITABLE = "OutputUnwritable"  # a worker could not write its part: the run stops, naming it
UNREADABLE = "InputUnreadable"  # a worker could not open the input it reads itself: the same


class OutputUnwritable(OSError):
    """A worker could not write its part of the output (a full disk, storage it cannot reach):
    no retry or split can help, so the run stops with the worker, its machine and the folder."""


class InputUnreadable(OSError):
    """A worker could not open or read the input it reads itself (``writes="workers"``): no
    record is at fault, so the run stops with the worker, its machine and the error."""


class _PackedIds:
    """Pickles its ``ids`` as ``(first, count)`` when they run one by one (id_ranges.packed).

    Over a pipe that is one out-of-band buffer (a write and a read) less per message; on Ray,
    where a call's arguments or answers over 100 KB go through the object store (Ray's
    ``max_direct_call_object_size``), it keeps a call of four 4,096-record workunits in the call:
    0.37 against 0.65 ms of the driver's CPU per workunit in bare actor calls, 0.31 against 0.45
    CPU s per million rows in whole runs (``bench scale --writes workers --backend ray``)."""

    def __getstate__(self) -> dict[str, Any]:
        ids = packed(self.ids)
        return self.__dict__ if ids is self.ids else {**self.__dict__, "ids": ids}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, ids=unpacked(state["ids"]))  # (frozen: no __setattr__)


@dataclass(frozen=True)
class WorkerInfo:
    index: int  # the worker's slot in the pool; a replacement keeps its slot
    device: str
    threads: int  # CPU threads for this worker: its model's on the CPU; beside a card (whose
    # compute is the card's), its share of this machine's cores, to tokenize and collate on
    copy: int = 0  # the n-th model copy on this device, from 0

    @classmethod
    def on(cls, index: int, device: str, cpu_threads: int, copy: int = 0,
           card_cores: int = 1) -> WorkerInfo:
        """Worker ``index`` on ``device``: ``cpu_threads`` threads for a model on the CPU,
        ``card_cores`` for a model on any other device."""
        return cls(index, device, cpu_threads if device == "cpu" else card_cores, copy)

    def __str__(self) -> str:
        return f"worker {self.index} on {self.device}"


@dataclass(frozen=True)
class Workunit(_PackedIds):
    index: int
    ids: np.ndarray  # int64, one per record
    records: list
    attempts: int = 0  # times this workunit has failed already (driver side)
    pinned: int | None = None  # only this worker may take it: a static split's slice
    target: Any = None  # a PartTarget: the worker writes the rows (set as it is sent)
    carried: dict[str, np.ndarray] | None = None  # the source's columns for them, row-aligned
    # the start's check (helpers.engine.dispatch.probe): read, write an empty part
    probe: bool = False
    alone: bool = False  # sent in a message of its own: its worker died (or hung) in a message
    # whose answers come back together, or while it overlapped workunits, so which of its
    # workunits did it is not known

    def __len__(self) -> int:
        return len(self.ids)

    def describe(self) -> str:
        """Its number, records and ids: first..last where they run in order, else the smallest
        and largest (a workunit sorted by the records' costs: "ids 3934..3820" read as a range)."""
        if not len(self.ids):
            return f"workunit {self.index} (0 records, no ids)"
        first, last = int(self.ids[0]), int(self.ids[-1])
        which = f"ids {first}..{last}" if last - first + 1 == len(self.ids) else \
            f"ids between {int(self.ids.min())} and {int(self.ids.max())}"
        return f"workunit {self.index} ({len(self.ids)} records, {which})"


@dataclass(frozen=True)
class Ready:
    worker: int
    pid: int
    load_s: float
    outputs: dict[str, OutputSpec]
    free_mib: float | None = None  # memory left on the device once this model copy is loaded
    model_mib: float | None = None  # what this copy takes on the device
    host: str = ""  # the machine the worker runs on (socket.gethostname())
    node: str = ""  # its Ray node ("" off Ray: the driver's machine)
    report: dict[str, Any] = field(default_factory=dict)  # workload.report(model): how it runs
    identity: dict[str, Any] = field(default_factory=dict)  # workload.identity(model): the
    # fingerprint's fields as this worker's load decided them (a hub model's files fetched here)
    overlaps: bool = False  # it starts its next workunit before it answers the last
    # (helpers.engine.workers.worker.serve): a death while it holds two may be either's


@dataclass(frozen=True)
class Result(_PackedIds):
    worker: int
    workunit: int
    ids: np.ndarray
    arrays: dict[str, np.ndarray]
    rejected: list[tuple]  # (record id, error type, message, unix time[, position in the source])
    started: float  # time.monotonic() (system-wide on Linux, macOS, Windows): a shared timeline
    ended: float
    peak_rss_mib: float = 0.0  # this worker's process, high-water mark
    peak_gpu_mib: float | None = None  # torch's peak allocation on the worker's CUDA device
    phases: dict[str, float] | None = None  # seconds per phase of process (workload.phases)
    counts: dict[str, int] | None = None  # what process counted (workload.counts: tokens, say)
    part: Any = None  # the WorkerPart holding the rows (``arrays`` then empty), or None
    cpu_s: float | None = None  # CPU its worker's process spent answering it (reading,
    # checking, the workload's threads, writing its part); None where threads share a process

    @property
    def compute_s(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class Failed:
    worker: int
    device: str
    workunit: int | None  # the workunit's index; None when loading the model failed
    where: str  # Workunit.describe(), or "loading the model"
    error_type: str
    message: str
    traceback: str

    @property
    def out_of_memory(self) -> bool:
        return self.error_type in OOM_ERRORS


@dataclass(frozen=True)
class Died:
    """Posted by the backend, not the worker: the worker's process ended without a word."""

    worker: int
    exitcode: int | None  # negative: killed by that signal; None: a thread abandoned by the pool,
    # or an actor Ray reports dead (``cause`` says why)
    cause: str = ""  # the backend's words when there is no exit code (Ray's: "node lost", ...)
    lost: bool = False  # its machine went away (a Ray node lost): what it held is not suspect

    def how(self) -> str:
        if self.cause:
            return self.cause
        if self.exitcode is None:
            return "abandoned"
        return f"killed by signal {-self.exitcode}" if self.exitcode < 0 else \
            f"exit code {self.exitcode}"
