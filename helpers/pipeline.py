"""The queue-fed pipeline: one reader, persistent workers on devices, one writer.

Data flow::

    source ──► Reader thread ──► work queue ──► scheduler ──► inbox 0 ─► worker 0 (cpu)    ─► outbox 0 ─┐
    (HDF5,     slices of records (bounded)      (main         inbox 1 ─► worker 1 (cuda:0) ─► outbox 1 ─┤
     JSONL,    into workunits                    thread)      inbox 2 ─► worker 2 (cuda:0) ─► outbox 2 ─┤
     images,                                       ▲                                                    │
     pairs)                                        └──── events (Ready, Result, Failed, Died) ◄─────────┘
                                                   │
                                                   └──► HDF5Sink buffer ──► write-ahead ──► writer thread
                                                        (main thread)       (bounded)       (parts, index)

Reader: a thread of the parent process. It pulls ``(ids, records)`` slices lazily from the source
(helpers.sources.read_slices), cuts them into workunits and puts them on the bounded work queue, so
memory stays flat whatever the input size; it wakes the scheduler after each one.

Scheduler (helpers.scheduler): the parent's main thread. It keeps every ready worker supplied with
up to two workunits (one running, one waiting), retried ones first; it is the only owner of a
workunit between the reader and the writer, so each is written once. It replaces workers that die
or hang and retries, splits or gives up on workunits that fail, until only the bad records are left.

Workers: one per entry of ``devices`` (or as many per device as fit: ``adaptive``), started by a
WorkerPool through a backend (helpers.backends: a spawned process with its own pipes per worker, or
a thread sharing its device's model). Each loads the workload's model once on its device, says
Ready, then runs workunits until the pool closes, answering each with a Result or a Failed message.
Workers outlive a job, so one pool runs many jobs on models loaded once.

Writer (helpers.hdf5_sink): the main thread buffers each Result's rows (and the records the
workload rejected, or that the scheduler gave up on, for ``errors/``) and hands them a part at a
time to the writer thread, which writes them while the scheduler goes on dispatching. With
``durable`` (the default) the output survives any crash (helpers.checkpoint) and ``resume``
finishes an interrupted run, skipping what is written before reading it.

At any scale the parent holds nothing per record once it is written: a worker's figures are
running totals, the timeline is bounded (helpers.stats), and a resumed run's done ids are ranges.

Static split (``WorkerPool.static_round``, ``WorkerPool.run_static``): the layout queue-fed workers
replace. Worker i gets slice i, pinned to it, as one workunit; the round lasts as long as its
slowest worker.

Timing: spin-up (spawning, imports, model loads) runs until every worker is Ready; the clock for
throughput starts when the reader starts and stops when the writer has written the last record.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from helpers.backends import make_backend
from helpers.config import POOL_FIELDS, PipelineConfig
from helpers.devices import check_available, parse_devices
from helpers.hdf5_sink import HDF5Sink
from helpers.provenance import package_versions
from helpers.reader import Reader
from helpers.scheduler import (Dispatches, Events, PipelineError, RemoteTraceback, Recovery,
                               Scheduler)
from helpers.sources import open_source, read_slices, records_left, source_length
from helpers.stats import PipelineStats, RoundStats, Tally, Timeline, WorkerStats, WorkunitSpan
from helpers.worker import POLL_SECONDS, Result, WorkerInfo, Workunit, peak_memory
from helpers.workloads.base import Workload

__all__ = ["MIN_STATIC_SLICE", "STRATEGIES", "PipelineError", "RemoteTraceback", "WorkerPool",
           "run_pipeline"]

log = logging.getLogger("gpufeed")

STRATEGIES = ("queue", "static")
MIN_STATIC_SLICE = 4  # records per worker below which a static split runs on one worker
ADAPTIVE_HEADROOM = 1.2  # adaptive: another copy only if free memory exceeds this × one copy
WAKE = "WAKE"  # the reader's nudge to the scheduler: a workunit is waiting


class WorkerPool:
    """Persistent workers on ``devices``: spin up once, then run jobs queue-fed or in static rounds.

    ``with WorkerPool(workload, ["cuda:0", "cuda:1"]) as pool:`` starts every worker and waits until
    each has loaded its model; ``pool.run(source, output)`` is one queue-fed job;
    ``pool.static_round(slices)`` gives slice i to worker i. Leaving the block stops every worker.
    ``options``: the other fields of PipelineConfig; those outside POOL_FIELDS are defaults for jobs.
    With ``adaptive=True`` each distinct device of ``devices`` gets workers one at a time while it
    has memory for another model copy (``stable_workers`` reports how many stayed).
    """

    def __init__(self, workload: Workload, devices: Iterable[str] | str = ("cpu",),
                 backend: str = "process", **options: Any) -> None:
        if not isinstance(workload, Workload):
            raise TypeError(f"workload: {type(workload).__name__} does not follow the Workload "
                            f"protocol")
        self.config = PipelineConfig(parse_devices(devices), backend=backend, **options)
        if workload.requires_hardware:
            check_available(self.config.devices)
        self.workload, self.workers = workload, self.config.workers()
        self.spinup_seconds = 0.0
        self.stable_workers: dict[str, int] = {}
        self._broken = False

    def __enter__(self) -> "WorkerPool":
        started = time.monotonic()
        config = self.config
        self._backend = make_backend(config.backend, self.workload)
        recovery = Recovery(config.retries, config.max_restarts, config.workunit_timeout,
                            config.load_timeout)
        self._scheduler = Scheduler(self._backend, [] if config.adaptive else self.workers,
                                    recovery)
        try:
            if config.adaptive:
                self._grow()
            else:
                self._scheduler.start(config.load_timeout)
        except BaseException:  # Ctrl-C during spin-up included: stop what started
            self._backend.shutdown(clean=False)
            raise
        self.stable_workers = dict(Counter(info.device for info in self.workers))
        if config.adaptive:
            log.info("adaptive: stable workers per device: %s", self.stable_workers)
        self.spinup_seconds = time.monotonic() - started
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._backend.shutdown(clean=exc_type is None and not self._broken)

    def _grow(self) -> None:
        """Adaptive spawning: per device, add one worker at a time until one fails to load or
        the device lacks memory for another copy (ADAPTIVE_HEADROOM), or max_workers_per_device."""
        workers: list[WorkerInfo] = []
        threads = self.config.threads_per_worker or 1
        for device in dict.fromkeys(self.config.devices):
            for copy in range(self.config.max_workers_per_device):
                info = WorkerInfo(len(workers), device, threads if device == "cpu" else 1, copy)
                self._scheduler.spawn(info)
                try:
                    ready = self._scheduler.await_ready([info.index], self.config.load_timeout)
                except PipelineError as exc:
                    if copy == 0:
                        raise
                    self._scheduler.discard(info.index)
                    log.warning("adaptive: worker %d on %s failed to start (%s); keeping %d",
                                copy + 1, device, exc, copy)
                    break
                workers.append(info)
                free, used = ready[info.index].free_mb, ready[info.index].model_mb
                if free is not None and used is not None and free < ADAPTIVE_HEADROOM * used:
                    log.info("adaptive: %s has %.0f MiB free after %d copies of %.0f MiB; "
                             "stopping there", device, free, copy + 1, used)
                    break
        self.workers = workers

    @property
    def pids(self) -> dict[int, int]:
        """The process id of each worker, by slot (the parent's for threads)."""
        return {i: s.ready.pid for i, s in self._scheduler.slots.items() if s.ready}

    @property
    def outputs(self) -> dict:
        return next(s.ready for s in self._scheduler.slots.values() if s.ready).outputs

    def run(self, source: Any, output: str | os.PathLike, **job: Any) -> PipelineStats:
        """One queue-fed job: every record of ``source`` through the workers into ``output``.

        ``job``: workunit_size, limit, sort_window, progress, durable, resume (default: the pool's).
        """
        started = time.monotonic()
        config, records, total, attrs = self._job(source, job)
        self._scheduler.dispatches = Dispatches()
        with self._guard(), HDF5Sink(output, self.outputs, attrs, config.durable,
                                     config.resume) as sink:
            slices = read_slices(records, sink.done, config.limit)
            total = records_left(total, config.limit, sink.done)
            work: queue.Queue = queue.Queue(config.depth)
            stop = threading.Event()
            cost = getattr(self.workload, "record_cost", None) if config.window else None
            reader = Reader(slices, work, config.workunit_size, stop, config.window, cost,
                            notify=lambda: self._backend.events.put((None, WAKE)))
            clock = time.monotonic()
            reader.start()
            try:
                tallies, timeline = self._drive(
                    sink, _taker(work), lambda: reader.done and work.empty(), clock, reader,
                    total, config.progress, lambda: work.qsize() + (not reader.done))
            finally:
                stop.set()
                reader.join()
        wall = time.monotonic() - clock
        return self._stats(config, output, tallies, timeline, wall, sink, started,
                           (reader.read_seconds, reader.blocked_seconds))

    def run_static(self, source: Any, output: str | os.PathLike, **job: Any) -> PipelineStats:
        """The data-parallel layout as one job: read every record, give worker i the i-th of
        even contiguous slices, merge the results into ``output``; as slow as the slowest slice.

        ``job``: limit, durable, resume (the others do not apply: a slice is one workunit).
        """
        started = time.monotonic()
        config, records, total, attrs = self._job(source, job)
        self._scheduler.dispatches = Dispatches()
        with HDF5Sink(output, self.outputs, attrs, config.durable, config.resume) as sink:
            reading = time.monotonic()
            pairs = [pair for ids, chunk in read_slices(records, sink.done, config.limit)
                     for pair in zip(ids.tolist(), chunk)]
            read_seconds = time.monotonic() - reading
            bounds = np.linspace(0, len(pairs), len(self.workers) + 1).round().astype(int)
            slices = [pairs[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
            tallies, timeline, clock, _ = self._round(slices, sink)
        wall = time.monotonic() - clock
        config = replace(config, workunit_size=max(1, max(len(s) for s in slices)))
        return self._stats(config, output, tallies, timeline, wall, sink, started,
                           (read_seconds, 0.0))

    def static_round(self, slices: Sequence[Sequence[tuple[int, Any]]],
                     sink: HDF5Sink | None = None) -> RoundStats:
        """Worker i processes ``slices[i]`` (``(id, record)`` pairs) as one workunit; the round
        ends when the last worker is done. Results go to ``sink`` if given, else are dropped."""
        _, timeline, _, wall = self._round(slices, sink)
        return RoundStats(wall, timeline.spans)

    def _round(self, slices: Sequence[Sequence[tuple[int, Any]]], sink: HDF5Sink | None
               ) -> tuple[dict[int, Tally], Timeline, float, float]:
        if len(slices) != len(self.workers):
            raise ValueError(f"slices: expected one per worker ({len(self.workers)}), "
                             f"got {len(slices)}")
        scheduler = self._scheduler
        with self._guard():
            clock = time.monotonic()
            for info, pairs in zip(self.workers, slices):
                unit = Workunit(0, np.array([p[0] for p in pairs], dtype=np.int64),
                                [p[1] for p in pairs], pinned=info.index)
                scheduler.pending.append(scheduler.number(unit))
            tallies, timeline = self._drive(sink, lambda: None, lambda: True, clock)
            wall = time.monotonic() - clock
        return tallies, timeline, clock, wall

    def _drive(self, sink: HDF5Sink | None, take: Callable[[], Workunit | None],
               finished: Callable[[], bool], clock: float, reader: Reader | None = None,
               total: int | None = None, progress: bool = False,
               backlog: Callable[[], int] = lambda: 0) -> tuple[dict[int, Tally], Timeline]:
        """The main loop: feed the workers, hand what comes back to the writer, until
        ``finished()`` and no workunit is left anywhere. Keeps per worker running totals and a
        bounded timeline (times from ``clock``), nothing per record."""
        from tqdm.auto import tqdm

        scheduler = self._scheduler
        tallies = {index: Tally() for index in scheduler.slots}
        timeline = Timeline()
        with tqdm(total=total, unit="rec", desc="records written", disable=not progress,
                  dynamic_ncols=True) as bar:
            while True:
                if reader is not None and reader.error is not None:
                    raise reader.error
                scheduler.dispatch(take, backlog)
                if finished() and scheduler.idle:
                    return tallies, timeline
                for slot, message in scheduler.next_messages(POLL_SECONDS):
                    if slot is None:
                        continue  # WAKE: the next dispatch takes the new workunit
                    written, given_up = scheduler.handle(slot, message)
                    for result in written:
                        if sink is not None:
                            _write(sink, result)
                        records = len(result.ids) + len(result.failures)
                        tallies.setdefault(result.worker, Tally()).add(
                            records, result.compute_seconds, result.peak_rss_mb,
                            result.peak_gpu_mb)
                        timeline.add(self._span(result, clock))
                        bar.update(records)
                    if given_up and sink is not None:
                        sink.append_errors(given_up)
                    bar.update(len(given_up))
                if sink is not None:
                    sink.poll()
                scheduler.check_timeouts()

    def _job(self, source: Any, job: dict[str, Any]) -> tuple[PipelineConfig, Any, int | None,
                                                              dict[str, Any]]:
        """A job's config, its (limited) records, their number if known, and the file's attrs."""
        fixed = sorted(set(job) & set(POOL_FIELDS))
        if fixed:
            raise ValueError(f"{', '.join(fixed)}: fixed when the pool starts; start another pool")
        config = replace(self.config, **job)
        records = source if hasattr(source, "describe") else open_source(source)
        attrs = {**self.workload.attrs(), **_run_attrs(config, records.describe())}
        return config, records, source_length(records), attrs

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Marks the pool broken if a job fails half-way (its workunits may still be in flight)."""
        if self._broken:
            raise PipelineError("this pool stopped after a failed job; start another pool")
        try:
            yield
        except BaseException:
            self._broken = True
            raise

    def _span(self, result: Result, clock: float) -> WorkunitSpan:
        device = self._scheduler.slots[result.worker].info.device
        return WorkunitSpan(result.worker, device, result.workunit,
                            len(result.ids) + len(result.failures), result.started - clock,
                            result.ended - clock)

    def _stats(self, config: PipelineConfig, output: Any, tallies: dict[int, Tally],
               timeline: Timeline, wall: float, sink: HDF5Sink, started: float,
               reading: tuple[float, float]) -> PipelineStats:
        workers = []
        for slot in self._scheduler.slots.values():
            tally, ready = tallies.get(slot.info.index, Tally()), slot.ready
            workers.append(WorkerStats(
                slot.info.index, slot.info.device, ready.pid if ready else 0,
                ready.load_seconds if ready else 0.0, tally.records, tally.workunits,
                tally.busy_seconds, max(0.0, wall - tally.busy_seconds), tally.peak_rss_mb,
                tally.peak_gpu_mb, slot.restarts))
        stages = {"read": reading[0], "reader_blocked": reading[1],
                  "wait": sum(w.wait_seconds for w in workers),
                  "compute": sum(w.busy_seconds for w in workers), "write": sink.write_seconds,
                  "write_blocked": sink.blocked_seconds}
        settings = {k: v for k, v in asdict(config).items()
                    if k not in ("devices", "workunit_size", "backend")}
        dispatches = self._scheduler.dispatches
        return PipelineStats(
            sink.records_written, sink.errors_written, wall, self.spinup_seconds, tuple(workers),
            stages, config.devices, config.workunit_size, config.backend, str(output), settings,
            timeline.spans, _peak_rss(workers), self._incidents(), len(sink.done),
            peak_memory("cpu")[0],
            (dispatches.first - started) if dispatches.first is not None else 0.0,
            dispatches.longest_gap, sink.bytes_written, sink.output_bytes)

    def _incidents(self) -> dict[str, Any]:
        """What the scheduler recovered from since the last report (the first includes spin-up)."""
        events, self._scheduler.events = self._scheduler.events, Events()
        return events.as_dict()


def run_pipeline(source: Any, workload: Workload, devices: Iterable[str] | str = ("cpu",),
                 workunit_size: int = 100, output: str | os.PathLike = "out.h5",
                 backend: str = "process", strategy: str = "queue", **options: Any
                 ) -> PipelineStats:
    """Run ``workload`` over every record of ``source`` and write the results to ``output``.

    ``source``: an ``.h5`` file (``batches/0, 1, ...``), a ``.jsonl`` file, an ImageFolderSource or
    an iterable of ``(id, record)`` pairs. ``devices``: one entry per worker. ``strategy``:
    "queue" (workers pull workunits) or "static" (one even slice per worker; with fewer than
    MIN_STATIC_SLICE records per worker it falls back to one worker). ``options``: the other
    fields of PipelineConfig (queue_depth, threads_per_worker, limit, sort_window, load_timeout,
    progress, retries, max_restarts, workunit_timeout, durable, resume, adaptive,
    max_workers_per_device). Workers that die or hang are replaced and bad records end up in the
    output's ``errors`` table (``stats.partial``); PipelineError if the run cannot go on.
    """
    devices = parse_devices(devices)
    PipelineConfig(devices, workunit_size, backend, **options)  # fail before spawning
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
    records = open_source(source)
    pool_options = {k: v for k, v in options.items() if k in POOL_FIELDS}
    job = {k: v for k, v in options.items() if k not in POOL_FIELDS}
    if strategy == "static":
        known = source_length(records)
        if job.get("limit") is not None:
            known = job["limit"] if known is None else min(known, job["limit"])
        if known is not None and known < MIN_STATIC_SLICE * len(devices):
            devices = devices[:1]  # slices this small cost more in model loads than they save
        job = {k: v for k, v in job.items() if k in ("limit", "durable", "resume")}
    with WorkerPool(workload, devices, backend, **pool_options) as pool:
        if strategy == "static":
            return pool.run_static(records, output, **job)
        return pool.run(records, output, workunit_size=workunit_size, **job)


def _taker(work: queue.Queue) -> Callable[[], Workunit | None]:
    def take() -> Workunit | None:
        try:
            return work.get_nowait()
        except queue.Empty:
            return None
    return take


def _write(sink: HDF5Sink, result: Result) -> None:
    if len(result.ids):
        sink.append(result.ids, result.arrays)
    for record_id, error_type, message, _ in result.failures:
        log.warning("record %d failed: %s: %s", record_id, error_type, message)
    sink.append_errors(result.failures)


def _run_attrs(config: PipelineConfig, source: str) -> dict[str, Any]:
    versions = {f"version_{k}": v for k, v in package_versions().items()}
    return {"devices": list(config.devices), "workunit_size": config.workunit_size,
            "backend": config.backend, "source": source,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **versions}


def _peak_rss(workers: list[WorkerStats]) -> float:
    """The parent's peak plus each worker process's (threads live in the parent)."""
    parent = os.getpid()
    by_pid = {w.pid: w.peak_rss_mb for w in workers if w.pid != parent}
    return peak_memory("cpu")[0] + sum(by_pid.values())
