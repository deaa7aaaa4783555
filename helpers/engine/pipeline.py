"""The queue-fed pipeline: one reader, persistent workers on devices, one writer.

Data flow::

    source ──► Reader thread ──► work queue ──► scheduler ──► inbox 0 ─► worker 0 (cpu)    ─► outbox 0 ─┐
    (HDF5,     slices, or        (records,      (main         inbox 1 ─► worker 1 (cuda:0) ─► outbox 1 ─┤
     JSONL,    windows sorted    bounded)        thread:      inbox 2 ─► worker 2 (cuda:0) ─► outbox 2 ─┤
     images,   by cost                           takes                                                  │
     pairs)                                      workunits                                              │
                                                 of its sizes)                                          │
                                                   ▲                                                    │
                                                   └──── events (Ready, Result, Failed, Died) ◄─────────┘
                                                   │
                                                   └──► HDF5Sink buffer ──► write-ahead ──► writer thread
                                                        (main thread)       (bounded)       (parts, index)

Reader (helpers.engine.dispatch.reader): a thread of the driver process. It pulls ``(ids, records)``
slices lazily from the source (helpers.engine.inputs.sources.read_slices) and queues them, a
bounded number of records that follows what the scheduler takes, so memory stays flat whatever the
input size; the scheduler takes workunits of the sizes it decides, and the reader wakes it when
records come that it looked for. Records it cannot use (not JSON, an unusable or duplicate id) go
straight to the writer's ``errors/``, never to a worker.

Scheduler (helpers.engine.dispatch.scheduler): the driver's main thread. It keeps every ready worker
supplied with up to two workunits (one running, one waiting), retried ones first; it is the only
owner of a workunit between the reader and the writer, so each is written once. It replaces workers
that die or hang and retries, splits or gives up on workunits that fail, until only the bad records
are left.

Workers: one per entry of ``devices`` (or as many per device as fit: ``workers_per_device=
"fit"``), started by a WorkerPool through a backend (helpers.engine.workers.backends: a process,
forked by a fork server, with its own pipes per worker, or a thread sharing its device's model;
helpers.engine.workers.ray_backend: a Ray actor anywhere on a cluster, its messages through Ray's
object store). Each loads the workload's model once on its device, says Ready, then runs workunits
until the pool closes, answering each with a Result or a Failed message. Workers outlive a job,
so one pool runs many jobs on models loaded once.

Writer (helpers.engine.outputs.hdf5_sink): the output is claimed first
(helpers.engine.outputs.ownership: its lock held for the job, and refused unless it is this job's to
write, resume or overwrite), then the main thread buffers each Result's rows (and the records the
workload rejected, or that the scheduler gave up on, for ``errors/``) and hands them a part at a
time to the writer thread, which writes them while the scheduler goes on dispatching. The output
survives any crash (helpers.engine.outputs.checkpoint) and ``resume`` finishes an interrupted run,
skipping what is written before reading it.

Workers write (``writes="workers"``; "auto" chooses it on Ray when the workers can read the
source too)::

    source.rows() ──► Reader ──► scheduler ──► worker: reads its ids' records (Rows), runs the
    (ids + a way     (ids only)   (stamps each       model, writes a part file ──► Result names it
     to open it)                  workunit: where                                     │
                                  its part goes)  ◄───────────────────────────────────┘
                                       └──► HDF5Sink: commit = rename into the output's index

Before the first record each worker reads the input's first rows and writes an empty part that
the driver must see (helpers.engine.dispatch.probe): storage a worker cannot reach is named then.
The driver then handles no record and no row: its work per workunit is a few hundred bytes each
way and a rename. A part whose workunit was taken back is removed, never committed; one nobody
committed is swept (helpers.engine.outputs.checkpoint). A source without ``rows`` is read by the
driver as above and only the rows are written by the workers.

At any scale the driver holds nothing per record once it is written: a worker's figures are
running totals, the timeline is bounded (helpers.engine.measure.stats), and a resumed run's done ids
are ranges.

Self-tuning, each optional: ``workunit_size="auto"`` sizes each worker's workunits from its measured
rate (helpers.engine.measure.sizing: the scheduler takes each worker's size from the reader, and
finer at the end); ``workers_per_device="auto"`` adds workers to a device while they raise its
rate (helpers.engine.dispatch.growth, called from the main loop); a
telemetry thread samples each device's use twice a second (helpers.engine.measure.telemetry). The
sizes' loop, all of it in the main thread::

    Result (records, seconds) ──► Sizing.observe ──► each worker's target
         ▲                                              │
         │                                              │
         └── worker ◄── dispatch: feed.take(n) ◄────────┘ n = Sizing.size(worker)
                                                          (Sizing.explore: shorter while growth decides)

Static split (``WorkerPool.run_static``): the layout queue-fed workers replace. Every record is
read first; worker i gets the i-th of even contiguous slices (``static_split``), pinned to it, as
one workunit; the job lasts as long as its slowest worker.

Timing, the same for both layouts: spin-up (starting workers, imports, model loads; the first
process pool of a Python process also starts the fork server, which imports the workload's
libraries once for every later pool) runs until every worker is Ready and is reported apart
(``spinup_s``); a job's ``wall_s`` runs from its first
read to its output closed, every record written. Opening the output (a resume's scan) is in
neither: ``first_dispatch_s`` reports it.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import socket
import functools
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from helpers.engine.contract.devices import check_available
from helpers.engine.contract.fingerprint import as_attrs, input_paths
from helpers.engine.contract.messages import (POLL_SECONDS, Died, Failed, Ready, Result, WorkerInfo,
                                              Workunit)
from helpers.engine.contract.protocol import Workload
from helpers.engine.contract.renamed import older_name
from helpers.engine.contract.settings import (AUTO, JOB_SETTINGS, POOL_SETTINGS, JobSettings,
                                              PoolSettings, split_options)
from helpers.engine.contract.versions import created, package_versions
from helpers.engine.dispatch.growth import EXPLORE_SECONDS, MEMORY_HEADROOM, Growth, short_of_memory
from helpers.engine.dispatch.probe import check_workers
from helpers.engine.dispatch.reader import Reader
from helpers.engine.dispatch.scheduler import (Dispatches, Feed, PipelineError, Recovery,
                                               RemoteTraceback, Scheduler)
from helpers.engine.dispatch.slots import Slot, State
from helpers.engine.inputs.carried import Carried
from helpers.engine.inputs.sources import (accounted, carried, key_of, open_source, peek,
                                           read_slices, reads_by_position, records_left,
                                           source_length)
from helpers.engine.measure.sizing import Sizing
from helpers.engine.measure.stats import (PipelineStats, Tally, Timeline, WorkerStats, WorkunitSpan,
                                          add_phases)
from helpers.engine.measure.telemetry import Telemetry
from helpers.engine.outputs.checkpoint import PartTarget
from helpers.engine.outputs.hdf5_sink import HDF5Sink
from helpers.engine.outputs.ownership import Claim, OutputError, check_output, claimed
from helpers.engine.workers.backends import make_backend, pool_settings, refuse_in_a_starting_worker
from helpers.engine.workers.worker import peak_memory

__all__ = ["MIN_STATIC_SLICE", "STRATEGIES", "PipelineError", "RemoteTraceback", "WorkerPool",
           "run_pipeline", "static_split"]

log = logging.getLogger("gpufeed")

STRATEGIES = ("queue", "static")
MIN_STATIC_SLICE = 4  # records per worker below which a static split runs on one worker
SETTLED = 0.5  # growth measures a worker on workunits of at least this share of its target size
HOST = socket.gethostname()  # telemetry samples the workers on this machine
FIT_HEADROOM = MEMORY_HEADROOM  # "fit": another copy only if free memory exceeds this ×
# one copy


@dataclass(frozen=True)
class OpenJob:
    """A job as ``WorkerPool.open_job`` opened it: its settings, its source opened, its writer,
    the source's columns carried to the output, and the rows the input holds as the job starts
    (None: not known)."""
    settings: JobSettings
    records: Any
    sink: HDF5Sink
    carried: dict[str, Any]
    expected: int | None


class WorkerPool:
    """Persistent workers on ``devices``: spin up once, then run jobs queue-fed or statically split.

    ``with WorkerPool(workload, ["cuda:0", "cuda:1"]) as pool:`` starts every worker and waits until
    each has loaded its model; ``pool.run(source, output)`` is one queue-fed job,
    ``pool.run_static(source, output)`` one statically split job. Leaving the block stops every
    worker. ``options``: PoolSettings' other fields, and JobSettings' fields as the defaults of
    every job (a job may change those, never the pool's). With ``workers_per_device="fit"`` (or
    ``adaptive=True``) each distinct device of ``devices`` gets workers one at a time while it
    has memory for another model copy (``stable_workers`` reports how many stayed); with
    ``workers_per_device="auto"`` each starts with one and gets more during the jobs while they
    raise its measured rate (helpers.engine.dispatch.growth). With ``workunit_size="auto"`` each
    worker's workunits are sized from its measured rate (helpers.engine.measure.sizing).
    """

    def __init__(self, workload: Workload, devices: Iterable[str] | str = PoolSettings.devices,
                 backend: str = "process", **options: Any) -> None:
        pool, job = split_options(options)
        self._configure(workload, pool_settings(devices, backend, **pool), JobSettings(**job))

    @classmethod
    def from_settings(cls, workload: Workload, settings: PoolSettings,
                      job: JobSettings = JobSettings()) -> WorkerPool:
        """A pool started with ``settings``, its jobs defaulting to ``job``."""
        pool = cls.__new__(cls)
        pool._configure(workload, settings, job)
        return pool

    def _configure(self, workload: Workload, settings: PoolSettings, job: JobSettings) -> None:
        refuse_in_a_starting_worker()
        if not isinstance(workload, Workload):
            raise TypeError(f"workload: {type(workload).__name__} does not follow the Workload "
                            f"protocol")
        if workload.requires_hardware:
            check_available(settings.devices)
        check = getattr(workload, "check_devices", None)  # (optional: protocol.Workload)
        if check is not None:
            check(tuple(dict.fromkeys(settings.devices)))
        self.workload, self.settings, self.job = workload, settings, job
        self.workers = settings.workers()
        self.spinup_s = 0.0
        self.stable_workers: dict[str, int] = {}
        self._broken = False
        self._sizing = Sizing(job.workunit_seconds)  # kept from job to job: rates carry over
        self._growth = Growth(self.workers, settings.max_workers_per_device,
                              settings.threads_per_worker or 1) if settings.growing else None

    def __enter__(self) -> WorkerPool:
        started = time.monotonic()
        self._backend = make_backend(self.settings, self.workload)
        self._scheduler = Scheduler(self._backend, [] if self.settings.filling else self.workers,
                                    self.settings)
        try:
            if self.settings.filling:
                self._fit()
            else:
                self._scheduler.start()
        except BaseException:  # Ctrl-C during spin-up included: stop what started
            self._backend.shutdown(clean=False)
            raise
        self.stable_workers = dict(Counter(info.device for info in self.workers))
        if self.settings.filling:
            log.info("fit: stable workers per device: %s", self.stable_workers)
        self.spinup_s = time.monotonic() - started
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._backend.shutdown(clean=exc_type is None and not self._broken)

    def _fit(self) -> None:
        """workers_per_device="fit" (or adaptive=True): per device, add one worker at a time
        until one fails to load or the device lacks memory for another copy
        (FIT_HEADROOM), or max_workers_per_device."""
        workers: list[WorkerInfo] = []
        threads = self.settings.threads_per_worker or 1
        for device in dict.fromkeys(self.settings.devices):
            for copy in range(self.settings.max_workers_per_device):
                info = WorkerInfo.on(len(workers), device, threads, copy)
                self._scheduler.spawn(info)
                try:
                    ready = self._scheduler.await_ready([info.index])
                except PipelineError as exc:
                    if copy == 0:
                        raise
                    self._scheduler.discard(info.index)
                    log.warning("fit: worker %d on %s failed to start (%s); keeping %d",
                                copy + 1, device, exc, copy)
                    break
                workers.append(info)
                if short_of_memory(ready[info.index], FIT_HEADROOM):
                    log.info("fit: %s has %.0f MiB free after %d copies of %.0f MiB; "
                             "stopping there", device, ready[info.index].free_mib, copy + 1,
                             ready[info.index].model_mib)
                    break
        self.workers = workers

    @property
    def settled(self) -> bool:
        """True once growth has set every device's worker count (at once without
        workers_per_device="auto")."""
        return self._growth is None or self._growth.settled

    def hold_workers(self) -> None:
        """Stop growing (workers_per_device="auto"): the next jobs keep today's workers."""
        if self._growth is not None:
            self._growth.hold(0.0)

    @property
    def sizing(self) -> Sizing:
        """The workers' measured rates and workunit sizes (workunit_size="auto")."""
        return self._sizing

    def __getattr__(self, name: str) -> Any:
        return older_name(self, name)  # (spinup_seconds: spinup_s until 2026-11-28)

    @property
    def pids(self) -> dict[int, int]:
        """The process id of each worker, by slot (the driver's for threads)."""
        return {i: s.ready.pid for i, s in self._scheduler.slots.items() if s.ready}

    @property
    def ready(self) -> dict[int, Ready]:
        """What each worker said once its model was loaded (its pid, load time, the device's
        free memory and this copy's size), by slot."""
        return {i: s.ready for i, s in self._scheduler.slots.items() if s.ready}

    @property
    def loaded(self) -> dict[str, dict]:
        """What each device's workers said of the model they loaded (``workload.report``: its
        variant, the guard's figures), by device."""
        return {s.info.device: s.ready.report for s in self._scheduler.slots.values()
                if s.ready is not None and s.ready.report}

    @property
    def outputs(self) -> dict:
        return next(s.ready for s in self._scheduler.slots.values() if s.ready).outputs

    def run(self, source: Any, output: str | os.PathLike | Claim, **changes: Any) -> PipelineStats:
        """One queue-fed job: every record of ``source`` through the workers into ``output`` (a
        path, or the Claim of an output the caller holds: helpers.engine.outputs.ownership).

        ``changes``: JobSettings fields for this job (default: the pool's ``job``).
        """
        started = time.monotonic()
        with self.open_job(source, output, changes) as opened:
            settings, records, sink = opened.settings, opened.records, opened.sink
            scheduler = self._scheduler
            fixed = None if settings.auto_size else settings.workunit_size
            scheduler.new_job(self.settings.per_message(settings.auto_size),
                              self.settings.growing_messages,
                              self._sizing if settings.auto_size else None, fixed)
            self._sizing.start_job(settings.workunit_seconds)
            job = _Job(scheduler, settings, sink, started, self._growth, opened.carried,
                       key_of(records))
            cost = getattr(self.workload, "record_cost", None) if settings.window else None
            total = records_left(source_length(records), settings.limit, sink.resumed_after)
            by_workers = settings.writes == "workers" and reads_by_position(records)
            slices = read_slices(records, sink.done, settings.limit, job.rejected.extend,
                                 sink.done_positions, job.carried.add, rows=by_workers)
            first, slices = peek(slices) if by_workers else (None, slices)  # (workers read too)
            window = 0 if by_workers else settings.window
            if settings.writes == "workers":
                check_workers(scheduler, job.target, first)
            reader = Reader(slices, self.settings.depth(scheduler.per_message),
                            fixed or self._sizing.largest(),
                            scheduler.wakeup.wake, window, cost, total, settings.stop_at,
                            self.settings.ahead_s)
            job.start_clock()
            reader.start()
            try:
                job.drive(reader, total)
            finally:
                reader.stop()
            if not reader.cut:  # (a time-boxed job holds fewer rows by design)
                check_accounted(records, opened.expected, sink, settings.limit)
            job.stop_clock(reader.read_s, reader.blocked_s)
            sink.record = job.take_stats = job.once(functools.partial(self._stats, job, output))
        return _finished(job, sink)

    def run_static(self, source: Any, output: str | os.PathLike | Claim,
                   **changes: Any) -> PipelineStats:
        """The data-parallel layout as one job: read every record, give worker i the i-th of
        even contiguous slices (``static_split``), write the results into ``output``; as slow as
        the slowest slice.

        ``changes``: limit, resume, overwrite (the other job settings do not apply: a
        slice is one workunit, and it is not sorted).
        """
        started = time.monotonic()
        with self.open_job(source, output, changes, writes="driver") as opened:
            settings, sink = opened.settings, opened.sink
            scheduler = self._scheduler
            scheduler.new_job(per_message=1)  # a slice a worker, whole: one workunit each, not
            # cut to the sizes an earlier workunit_size="auto" job left
            job = _Job(scheduler, settings, sink, started, carried=opened.carried,
                       key=key_of(opened.records))
            job.start_clock()
            read = list(read_slices(opened.records, sink.done, settings.limit,
                                    job.rejected.extend, sink.done_positions, job.carried.add))
            ids = np.concatenate([ids for ids, _ in read]) if read else np.empty(0, np.int64)
            items = [item for _, chunk in read for item in chunk]
            read_s = time.monotonic() - job.clock
            bounds = static_split(len(ids), len(self.workers))
            for info, start, end in zip(self.workers, bounds[:-1], bounds[1:]):
                unit = Workunit(0, ids[start:end], items[start:end], pinned=info.index)
                scheduler.pending.append(scheduler.number(unit))
            job.drive(_DEALT)
            check_accounted(opened.records, opened.expected, sink, settings.limit)
            job.stop_clock(read_s, 0.0)
            job.settings = replace(settings,
                                   workunit_size=max(1, int(np.diff(bounds).max(initial=0))))
            sink.record = job.take_stats = job.once(functools.partial(self._stats, job, output))
        return _finished(job, sink)

    @contextmanager
    def open_job(self, source: Any, output: str | os.PathLike | Claim, changes: dict[str, Any],
                 writes: str | None = None) -> Iterator[OpenJob]:
        """A job's settings (the pool's ``job`` with ``changes``; who writes decided: ``writes``
        if given and the settings leave it to "auto", else ``who_writes``), its source opened and
        its writer, once the output is this job's to write; the pool marked broken if the job
        fails half-way. Refused before the pool is at risk: settings it does not know or fixes
        at its start, a column both the source and the workload write, an output not this job's
        (OutputError)."""
        settings, records, attrs = self._job(source, changes)
        chosen = writes if writes is not None and settings.writes == AUTO else \
            who_writes(settings, self.settings.backend, records)
        settings = replace(settings, writes=chosen)
        own = carried(records)
        outputs = self._outputs(own)
        expected = accounted(records, settings.limit)  # (as the input is when the job starts)
        with self._guard(), self._sink(output, settings, attrs, outputs) as sink:
            yield OpenJob(settings, records, sink, own, expected)

    def _job(self, source: Any, changes: dict[str, Any]) -> tuple[JobSettings, Any, dict[str, Any]]:
        """A job's settings, its records, and the output file's attrs (the dispatches' record
        started anew)."""
        fixed = sorted(set(changes) & set(POOL_SETTINGS))
        if fixed:
            raise ValueError(f"{', '.join(fixed)}: fixed when the pool starts; start another pool")
        unknown = sorted(set(changes) - set(JOB_SETTINGS))
        if unknown:
            raise TypeError(f"unknown job setting {', '.join(unknown)}; a job takes "
                            f"{', '.join(JOB_SETTINGS)}")
        job = replace(self.job, **changes)
        records = open_source(source)  # (a source already opened comes back as it is)
        attrs = {**self.workload.attrs(), **self._run_attrs(job, records.describe()),
                 **as_attrs(records, self.workload, self.outputs)}
        self._scheduler.dispatches = Dispatches()
        return job, records, attrs

    def _outputs(self, own: dict[str, Any]) -> dict[str, Any]:
        """The output's datasets: the workload's and the source's carried columns (``own``)."""
        clash = sorted(set(own) & set(self.outputs))
        if clash:
            raise ValueError(f"the source carries {', '.join(clash)} and the workload writes "
                             f"it too: rename the workload's output")
        return {**self.outputs, **own}

    def _sink(self, output: str | os.PathLike | Claim, job: JobSettings, attrs: dict[str, Any],
              outputs: dict[str, Any]) -> HDF5Sink:
        """The job's writer, once the output is this job's to write (else OutputError)."""
        return HDF5Sink(output, outputs, attrs, resume=job.resume, overwrite=job.overwrite,
                        inputs=input_paths(attrs))

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Marks the pool broken if a job fails half-way (its workunits may still be in flight)."""
        if self._broken:
            raise PipelineError("this pool stopped after a failed job; start another pool")
        try:
            yield
        except OutputError:  # refused before the job began: nothing is in flight
            raise
        except BaseException:
            self._broken = True
            raise

    def _run_attrs(self, job: JobSettings, source: str) -> dict[str, Any]:
        versions = {f"version_{k}": v for k, v in package_versions().items()}
        loaded = self.loaded  # (the guard's figures, say)
        return {"devices": list(self.settings.devices), "workunit_size": job.workunit_size,
                "backend": self.settings.backend, "source": source,
                "created": created(), **versions,
                **({"loaded": json.dumps(loaded, sort_keys=True)} if loaded else {})}

    def _stats(self, job: _Job, output: Any) -> PipelineStats:
        """The job's stats with the pool's part in them; after growth, the workers the next job
        starts with."""
        if self._growth is not None:
            self.workers = [s.info for s in self._scheduler.live]
            self.stable_workers = dict(Counter(info.device for info in self.workers))
        return job.stats(self.settings, self.spinup_s, self._recovery(), output)

    def _recovery(self) -> dict[str, Any]:
        """What the scheduler recovered from since the last report (the first includes spin-up)."""
        recovery, self._scheduler.recovery = self._scheduler.recovery, Recovery()
        return recovery.as_dict()


def who_writes(job: JobSettings, backend: str, source: Any) -> str:
    """``job.writes``, "auto" decided: the workers on Ray when they can read the source too (the
    driver then handles no record), else the driver (faster on one machine: docs/cluster.md)."""
    if job.writes != AUTO:
        return job.writes
    return "workers" if backend == "ray" and reads_by_position(source) else "driver"


class _Job:
    """One job on a pool's workers: its settings, its output, its clock, and what the workers did
    (running totals per worker and a bounded timeline: nothing per record)."""

    def __init__(self, scheduler: Scheduler, settings: JobSettings, sink: HDF5Sink,
                 started: float, growth: Growth | None = None,
                 carried: dict[str, Any] | None = None, key: str | None = None) -> None:
        self.scheduler, self.settings, self.sink, self.started = scheduler, settings, sink, started
        self.growth = growth
        self._taken: PipelineStats | None = None
        self._decided = len(growth.decisions) if growth is not None else 0
        if growth is not None:
            growth.new_job()
        self.tallies = {index: Tally() for index in scheduler.slots
                        if scheduler.slots[index].state is not State.RETIRED}
        self.timeline = Timeline()
        self.longest_idle = 0.0  # the longest a worker waited between two of its workunits
        self._ended: dict[int, tuple[Any, float]] = {}  # per slot: its worker, its last one's end
        self.rejected: deque[tuple] = deque()  # the reader's rejects, for errors/ (thread-safe)
        self.carried = Carried(carried or {}, key)  # the source's columns of the records in
        # flight, ``key`` the one of its keys (errors/key)
        self.clock = self.wall = self.read_s = self.reader_blocked_s = 0.0
        self._token, self._sends = secrets.token_hex(4), itertools.count()
        scheduler.stamp = self._stamp if settings.writes == "workers" else None

    def _stamp(self, unit: Workunit) -> Workunit:
        """``unit`` as sent when workers write: where its worker writes its part (a name of its
        own each time it is sent: a retry never takes a late first attempt's file), and the
        source's columns for its records."""
        return replace(unit, target=self.target(),
                       carried=self.carried.peek(unit.ids) if self.carried else None)

    def target(self) -> PartTarget:
        """Where a worker writes its next part: a name no other part of any run has."""
        return self.sink.target(f"{self._token}-{next(self._sends)}")

    def once(self, take: Callable[[], PipelineStats]) -> Callable[[], PipelineStats]:
        """``take`` called once however often asked: the output's record of the job and the
        stats the job returns are one set (taking them reads the recovery since the last)."""
        def taken() -> PipelineStats:
            if self._taken is None:
                self._taken = take()
            return self._taken
        return taken

    def start_clock(self) -> None:
        self.clock = time.monotonic()
        self.telemetry = Telemetry(self._at_work, self.clock)
        self.telemetry.start()

    def stop_clock(self, read_s: float, reader_blocked_s: float) -> None:
        self.wall = time.monotonic() - self.clock
        self.read_s, self.reader_blocked_s = read_s, reader_blocked_s
        self.telemetry.stop()

    def _at_work(self) -> dict[int, tuple[str, int]]:
        """``{slot: (device, pid)}`` of the workers taking workunits on this machine (the
        telemetry thread's: a Ray actor on another node has a pid only there)."""
        return {s.info.index: (s.info.device, s.ready.pid)
                for s in list(self.scheduler.slots.values())
                if s.ready is not None and s.state in (State.READY, State.DRAINING)
                and s.ready.host in ("", HOST)}

    def drive(self, feed: Feed, total: int | None = None) -> None:
        """The main loop: feed the workers, hand what comes back to the writer, until ``feed``
        is exhausted and no workunit is left anywhere."""
        from tqdm.auto import tqdm

        scheduler, sink = self.scheduler, self.sink
        with tqdm(total=total, unit="rec", desc="records written",
                  disable=not self.settings.progress, dynamic_ncols=True) as bar, \
                _stopping(self.telemetry):
            while True:
                scheduler.dispatch(feed)
                bar.update(self._file_rejects())
                if feed.exhausted() and scheduler.idle:
                    bar.update(self._file_rejects())
                    return
                for slot, message in scheduler.next_messages(POLL_SECONDS):
                    written, given_up = scheduler.handle(slot, message)
                    if isinstance(message, (Failed, Died)):
                        self._ended.pop(slot, None)  # (the time to its next result was not idle)
                    for result in written:
                        bar.update(self._write(result))
                    sink.append_errors(self.carried.drop(given_up))
                    bar.update(len(given_up))
                sink.poll()
                scheduler.check_timeouts()
                if self.growth is not None and not self.growth.settled:
                    self.growth.step(scheduler, time.monotonic(), self.clock)
                    if scheduler.sizing is not None:  # short workunits while a count is decided
                        scheduler.sizing.explore(self.growth.deciding(), EXPLORE_SECONDS)

    def _file_rejects(self) -> int:
        """Hand the records the reader rejected so far to the writer's errors/; how many."""
        rows = []
        while self.rejected:
            rows.append(self.rejected.popleft())
        for record_id, error_type, message, _, position, *_ in rows:
            log.warning("record %s failed: %s: %s", f"at position {position}" if position >= 0
                        else record_id, error_type, message)
        self.sink.append_errors(rows)
        return len(rows)

    def _write(self, result: Result) -> int:
        """Hand a result to the writer and add it to the totals; returns its records."""
        if result.part is not None:  # written by its worker: committed by the writer thread
            if self.carried:
                self.carried.take(result.ids)
            self.sink.commit(result.part)
        elif len(result.ids):
            arrays = {**result.arrays, **self.carried.take(result.ids)} if self.carried \
                else result.arrays
            self.sink.append(result.ids, arrays)
        rejected = self.carried.drop(result.rejected)
        for record_id, error_type, message, *_ in rejected:
            log.warning("record %d failed: %s: %s", record_id, error_type, message)
        self.sink.append_errors(rejected)
        slot = self.scheduler.slots[result.worker]
        device = slot.info.device
        span = WorkunitSpan(result.worker, device, result.workunit,
                            len(result.ids) + len(result.rejected), result.started - self.clock,
                            result.ended - self.clock, node=slot.ready.node if slot.ready else "",
                            phases=result.phases, counts=result.counts)
        self.tallies.setdefault(result.worker, Tally()).add(
            span.records, result.compute_s, result.peak_rss_mib, result.peak_gpu_mib,
            result.phases, result.counts, result.cpu_s)
        self.timeline.add(span)
        self._idle(slot, result)
        if self.growth is not None and self._settled(result.worker, span.records):
            self.growth.observe(result.worker, device, span.records, result.started,
                                result.ended)
        return span.records

    def _idle(self, slot: Slot, result: Result) -> None:
        """The time ``result``'s worker waited since its previous workunit ended: nothing to run
        (both times from its own clock; not across a replacement, which may be on another
        machine)."""
        worker, ended = self._ended.get(result.worker, (None, 0.0))
        if worker is not None and worker is slot.ready:
            self.longest_idle = max(self.longest_idle, result.started - ended)
        self._ended[result.worker] = (slot.ready, result.ended)

    def _settled(self, slot: int, records: int) -> bool:
        """Whether a workunit was of its worker's settled size (auto sizes grow at first)."""
        sizing = self.scheduler.sizing
        return sizing is None or records >= SETTLED * sizing.targets.get(slot, 0)

    def decisions(self) -> tuple[dict[str, Any], ...]:
        """The growth decisions made during this job."""
        if self.growth is None:
            return ()
        return tuple(d.as_dict() for d in self.growth.decisions[self._decided:])

    def phases(self) -> dict[str, float]:
        """Compute's seconds by the workload's phases, summed over the workers."""
        total: dict[str, float] = {}
        for tally in self.tallies.values():
            add_phases(total, tally.phases)
        return total

    def counts(self) -> dict[str, int]:
        """What the workload counted (tokens, say), summed over the workers."""
        total: dict[str, int] = {}
        for tally in self.tallies.values():
            add_phases(total, tally.counts)
        return total

    def stats(self, pool: PoolSettings, spinup_s: float, recovery: dict[str, Any],
              output: Any) -> PipelineStats:
        """What this job did, as PipelineStats: its workers' totals, its stages, its timeline and
        decisions; the pool gives its settings, its spin-up and what it recovered from since the
        last job."""
        slots = self.scheduler.slots.values()
        workers = [self.worker_stats(slot) for slot in slots
                   if slot.state is not State.RETIRED or slot.info.index in self.tallies]
        stages = {"read": self.read_s, "reader_blocked": self.reader_blocked_s,
                  "wait": sum(w.wait_s for w in workers),
                  "compute": sum(w.busy_s for w in workers),
                  "write": self.sink.write_s, "write_blocked": self.sink.blocked_s}
        config = {k: v for k, v in (asdict(pool) | asdict(self.settings)).items()
                  if k not in ("devices", "workunit_size", "backend")}
        dispatches, sink = self.scheduler.dispatches, self.sink
        return PipelineStats(
            records=sink.records_written, failed_records=sink.errors_written,
            wall_s=self.wall, spinup_s=spinup_s, workers=tuple(workers),
            stages=stages, devices=tuple(w.device for w in workers),
            workunit_size=self.settings.workunit_size, backend=pool.backend,
            output=str(output), config=config, timeline=self.timeline.spans,
            peak_rss_mib=_peak_rss(workers), recovery=recovery,
            resumed_after=sink.resumed_after, failed_before=sink.failed_before,
            parent_rss_mib=peak_memory("cpu")[0],
            first_dispatch_s=(dispatches.first - self.started)
            if dispatches.first is not None else 0.0,
            longest_dispatch_gap_s=dispatches.longest_gap,
            longest_idle_s=self.longest_idle,
            bytes_written=sink.bytes_written, output_bytes=sink.output_bytes,
            decisions=self.decisions(), telemetry=self.telemetry.samples, phases=self.phases(),
            counts=self.counts())

    def worker_stats(self, slot: Slot) -> WorkerStats:
        tally, ready = self.tallies.get(slot.info.index, Tally()), slot.ready
        return WorkerStats(slot.info.index, slot.info.device, ready.pid if ready else 0,
                           ready.load_s if ready else 0.0, tally.records, tally.workunits,
                           tally.busy_s, max(0.0, self.wall - tally.busy_s),
                           tally.peak_rss_mib, tally.peak_gpu_mib, slot.restarts,
                           tally.cpu_s)


@contextmanager
def _stopping(telemetry: Telemetry) -> Iterator[None]:
    """Stop the telemetry thread however the job ends."""
    try:
        yield
    finally:
        telemetry.stop()


class _Dealt:
    """A static split's feed: every workunit was dealt to its worker before the job started."""

    def take(self, n: int) -> None:
        return None

    def backlog(self, n: int) -> int:
        return 0

    def remaining(self) -> int:
        return 0

    def exhausted(self) -> bool:
        return True


_DEALT = _Dealt()


def static_split(records: int, workers: int) -> np.ndarray:
    """Bounds of ``workers`` even contiguous slices of ``records``: slice i is
    ``bounds[i]:bounds[i + 1]``; sizes differ by one at most, and every record is in one."""
    return np.linspace(0, records, workers + 1).round().astype(int)


def check_accounted(source: Any, expected: int | None, sink: HDF5Sink,
                    limit: int | None) -> None:
    """PipelineError, before the output is marked complete, unless every row the input holds
    (``expected``: sources.accounted; None, not known) is in the output, written or in
    ``errors/``: a row lost or read twice is never a finished run. With ``limit``, an output
    holding more (an earlier run's larger limit) is not one."""
    if expected is None:
        return
    sink.flush()
    held = sink.rows_held
    if held == expected or (limit is not None and held > expected):
        return
    raise PipelineError(f"{source.describe()}: the input holds {expected:,} rows and the output "
                        f"{held:,} (written or in errors/): {abs(expected - held):,} rows "
                        f"{'unaccounted for' if held < expected else 'too many'}; the output "
                        f"is left unfinished (a bug: please report it with the input's shape)")


def run_pipeline(source: Any, workload: Workload,
                 devices: Iterable[str] | str = PoolSettings.devices,
                 workunit_size: int = JobSettings.workunit_size,
                 output: str | os.PathLike | Claim = "out.h5",
                 backend: str = PoolSettings.backend,
                 strategy: str = "queue", text_column: str = "text", id_column: str | None = None,
                 keep_columns: Sequence[str] = (), **options: Any) -> PipelineStats:
    """Run ``workload`` over every record of ``source`` and write the results to ``output``.

    ``source``: an ``.h5`` file (``batches/0, 1, ...``), a ``.jsonl`` file, Parquet, CSV or Arrow
    files (a file, a folder, a glob: helpers.engine.inputs.tables), an ImageFolderSource, any
    Source, or an iterable of ``(id, record)`` pairs. ``text_column``/``id_column``: a table's or a
    JSONL file's columns (an id column of strings is kept as the output's ``keys``);
    ``keep_columns``: a table's other columns to carry to the output, row-aligned with ``ids``.
    ``devices``: one entry per worker. ``strategy``: "queue" (workers pull workunits) or "static"
    (one even slice per worker; with fewer than MIN_STATIC_SLICE records per worker it falls back to
    one worker). ``options``: the other fields of PoolSettings (threads_per_worker, queue_depth,
    adaptive, max_workers_per_device, retries, max_restarts, workunit_timeout, load_timeout,
    ray_address) and of JobSettings (limit, sort_window, progress, resume, overwrite). An
    existing ``output`` is refused unless ``resume`` (carry on the job that made it) or
    ``overwrite`` (replace it); OutputError, before any worker starts. Workers that die or hang are
    replaced and bad records end up in the output's ``errors`` table (``stats.partial``);
    PipelineError if the run cannot go on. The output is claimed once, here (its lock held for the
    run: a second run on it is refused at once), unless ``output`` is the Claim of one the caller
    holds already (helpers.engine.outputs.ownership.owning, as the command line does).
    """
    refuse_in_a_starting_worker()
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
    pool_options, job_options = split_options(options)
    settings = pool_settings(devices, backend, **pool_options)  # validated before any spawn
    job = JobSettings(workunit_size, **job_options)
    records = open_source(source, text_column=text_column, id_column=id_column,
                          keep_columns=keep_columns)
    if strategy == "static":
        known = records_left(source_length(records), job.limit)
        if known is not None and known < MIN_STATIC_SLICE * len(settings.worker_devices):
            # slices this small cost more in model loads than they save
            settings = replace(settings, devices=settings.devices[:1], workers_per_device=1)
    with claimed(output) as output:  # a second run on it is refused now, not after spin-up
        attrs = as_attrs(records, workload)  # the outputs' shapes come with the workers
        check_output(output, resume=job.resume, overwrite=job.overwrite, inputs=input_paths(attrs),
                     fingerprints={k: json.loads(v) for k, v in attrs.items()})
        with WorkerPool.from_settings(workload, settings, job) as pool:
            if strategy == "static":
                return pool.run_static(records, output)
            return pool.run(records, output)


def _finished(job: "_Job", sink: HDF5Sink) -> PipelineStats:
    """The job's stats (taken as the output was finished, once every row was written, and
    recorded in it) with what finishing the output added: the wall time to the output whole,
    the writer's time and bytes."""
    stats = job.take_stats()
    wall = time.monotonic() - job.clock
    workers = tuple(replace(w, wait_s=max(0.0, wall - w.busy_s))
                    for w in stats.workers)
    return replace(stats, wall_s=wall, workers=workers,
                   stages={**stats.stages, "write": sink.write_s,
                           "write_blocked": sink.blocked_s,
                           "wait": sum(w.wait_s for w in workers)},
                   bytes_written=sink.bytes_written, output_bytes=sink.output_bytes,
                   parent_rss_mib=peak_memory("cpu")[0], peak_rss_mib=_peak_rss(list(workers)))


def _peak_rss(workers: list[WorkerStats]) -> float:
    """The driver's peak plus each worker process's (threads live in the driver)."""
    driver = os.getpid()
    by_pid = {w.pid: w.peak_rss_mib for w in workers if w.pid != driver}
    return peak_memory("cpu")[0] + sum(by_pid.values())
