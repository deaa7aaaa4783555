"""The pool: persistent workers on devices, started once, then running jobs (helpers.engine.job)
queue-fed or statically split; the data flow is drawn in helpers.engine.pipeline.

A pool owns its backend, its scheduler (helpers.engine.dispatch.scheduler) and what carries from
one job to the next: the workers' measured rates (Sizing), the taker that sizes each workunit
(helpers.engine.dispatch.taker) and growth's worker counts. A job opens here (its settings, its
source, its output claimed) and runs in a Job; a job that fails half-way leaves the pool broken.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from helpers.engine.contract.devices import check_available
from helpers.engine.contract.fingerprint import as_attrs, input_paths, sampled_only
from helpers.engine.contract.messages import Ready, Workunit
from helpers.engine.contract.protocol import Workload
from helpers.engine.contract.renamed import older_name
from helpers.engine.contract.settings import (AUTO, JOB_SETTINGS, POOL_SETTINGS, JobSettings,
                                              PoolSettings, split_options)
from helpers.engine.contract.versions import created, package_versions
from helpers.engine.dispatch.growth import Growth, fit
from helpers.engine.dispatch.probe import check_workers
from helpers.engine.dispatch.reader import Reader
from helpers.engine.dispatch.scheduler import PipelineError, Scheduler
from helpers.engine.dispatch.slots import loaded_reports
from helpers.engine.dispatch.taker import Taker
from helpers.engine.inputs.sources import (accounted, carried, key_of, open_source, peek,
                                           read_slices, reads_by_position, records_left,
                                           source_length)
from helpers.engine.job import DEALT, Job, check_accounted, finished
from helpers.engine.measure.sizing import Sizing
from helpers.engine.measure.stats import PipelineStats
from helpers.engine.outputs.hdf5_sink import HDF5Sink
from helpers.engine.outputs.ownership import Claim, OutputError
from helpers.engine.workers.backends import make_backend, pool_settings, refuse_in_a_starting_worker

__all__ = ["OpenJob", "WorkerPool", "static_split", "who_writes"]

log = logging.getLogger("gpufeed")


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
        self._taker = Taker()  # what a workunit holds, the scheduler's workunits to come
        self._growth = Growth(self.workers, settings.max_workers_per_device,
                              settings.worker) if settings.growing else None

    def __enter__(self) -> WorkerPool:
        started = time.monotonic()
        self._backend = make_backend(self.settings, self.workload)
        self._scheduler = Scheduler(self._backend, [] if self.settings.filling else self.workers,
                                    self.settings, self._taker)
        try:
            if self.settings.filling:
                self.workers = fit(self._scheduler, self.settings)
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
        variant, the guard's figures, how it tokenizes), by device."""
        return loaded_reports(self._scheduler.slots.values())

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
            scheduler, taker = self._scheduler, self._taker
            per_message = self.settings.per_message(settings.auto_size)
            taker.new_job(self._sizing if settings.auto_size else None,
                          None if settings.auto_size else settings.workunit_size)
            self._sizing.start_job(settings.workunit_seconds)
            job = Job(scheduler, taker, settings, sink, started, self._growth, opened.carried,
                      key_of(records))
            scheduler.new_job(per_message, self.settings.growing_messages,
                              job.stamp if settings.writes == "workers" else None)
            cost = getattr(self.workload, "record_cost", None) if settings.window else None
            total = records_left(source_length(records), settings.limit, sink.resumed_after)
            by_workers = settings.writes == "workers" and reads_by_position(records)
            slices = read_slices(records, sink.done, settings.limit, job.rejected.extend,
                                 sink.done_positions, job.carried.add, rows=by_workers)
            first, slices = peek(slices) if by_workers else (None, slices)  # (workers read too)
            window = 0 if by_workers else settings.window
            if settings.writes == "workers":
                check_workers(scheduler, job.target, first, job.admit)
            reader = Reader(slices, self.settings.depth(per_message), taker.first_size(),
                            scheduler.wake, window, cost, total, settings.stop_at,
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
        return finished(job, sink)

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
            self._taker.new_job()  # a slice a worker, whole: one workunit each, not cut to
            self._scheduler.new_job(per_message=1)  # the sizes an earlier "auto" job left
            job = Job(self._scheduler, self._taker, settings, sink, started,
                      carried=opened.carried, key=key_of(opened.records))
            job.start_clock()
            read = list(read_slices(opened.records, sink.done, settings.limit,
                                    job.rejected.extend, sink.done_positions, job.carried.add))
            ids = np.concatenate([ids for ids, _ in read]) if read else np.empty(0, np.int64)
            items = [item for _, chunk in read for item in chunk]
            read_s = time.monotonic() - job.clock
            bounds = static_split(len(ids), len(self.workers))
            self._taker.deal(Workunit(0, ids[start:end], items[start:end], pinned=info.index)
                             for info, start, end in zip(self.workers, bounds[:-1], bounds[1:]))
            job.drive(DEALT)
            check_accounted(opened.records, opened.expected, sink, settings.limit)
            job.stop_clock(read_s, 0.0)
            job.settings = replace(settings,
                                   workunit_size=max(1, int(np.diff(bounds).max(initial=0))))
            sink.record = job.take_stats = job.once(functools.partial(self._stats, job, output))
        return finished(job, sink)

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
        outputs = with_carried(self.outputs, own)
        expected = accounted(records, settings.limit)  # (as the input is when the job starts)
        with self._guard(), HDF5Sink(output, outputs, attrs, resume=settings.resume,
                                     overwrite=settings.overwrite,
                                     inputs=input_paths(attrs)) as sink:
            yield OpenJob(settings, records, sink, own, expected)

    def _job(self, source: Any, changes: dict[str, Any]) -> tuple[JobSettings, Any, dict[str, Any]]:
        """A job's settings, its records, and the output file's attrs."""
        fixed = sorted(set(changes) & set(POOL_SETTINGS))
        if fixed:
            raise ValueError(f"{', '.join(fixed)}: fixed when the pool starts; start another pool")
        unknown = sorted(set(changes) - set(JOB_SETTINGS))
        if unknown:
            raise TypeError(f"unknown job setting {', '.join(unknown)}; a job takes "
                            f"{', '.join(JOB_SETTINGS)}")
        job = replace(self.job, **changes)
        records = open_source(source)  # (a source already opened comes back as it is)
        with sampled_only(job.samples_only):
            attrs = {**self.workload.attrs(), **run_attrs(self.settings, job, records.describe(),
                                                          self.loaded),
                     **recorded(records, self.workload, self.outputs,
                                self._scheduler.slots.values())}
        return job, records, attrs

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

    def _stats(self, job: Job, output: Any) -> PipelineStats:
        """The job's stats with the pool's part in them; after growth, the workers the next job
        starts with."""
        if self._growth is not None:
            self.workers = [s.info for s in self._scheduler.live]
            self.stable_workers = dict(Counter(info.device for info in self.workers))
        return job.stats(self.settings, self.spinup_s, self._scheduler.take_recovery().as_dict(),
                         output)


def who_writes(job: JobSettings, backend: str, source: Any) -> str:
    """``job.writes``, "auto" decided: the workers on Ray when they can read the source too (the
    driver then handles no record), else the driver (faster on one machine: docs/cluster.md)."""
    if job.writes != AUTO:
        return job.writes
    return "workers" if backend == "ray" and reads_by_position(source) else "driver"


def static_split(records: int, workers: int) -> np.ndarray:
    """Bounds of ``workers`` even contiguous slices of ``records``: slice i is
    ``bounds[i]:bounds[i + 1]``; sizes differ by one at most, and every record is in one."""
    return np.linspace(0, records, workers + 1).round().astype(int)


def with_carried(outputs: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The output's datasets: the workload's ``outputs`` and the source's carried columns
    (``own``); ValueError where a name is both."""
    clash = sorted(set(own) & set(outputs))
    if clash:
        raise ValueError(f"the source carries {', '.join(clash)} and the workload writes "
                         f"it too: rename the workload's output")
    return {**outputs, **own}


def run_attrs(pool: PoolSettings, job: JobSettings, source: str,
              loaded: dict[str, dict]) -> dict[str, Any]:
    """What the output records of the run: its devices, sizes, backend, source, when, the
    packages' versions and what each device's workers loaded (the guard's figures, say)."""
    versions = {f"version_{k}": v for k, v in package_versions().items()}
    return {"devices": list(pool.devices), "workunit_size": job.workunit_size,
            "backend": pool.backend, "source": source, "created": created(), **versions,
            **({"loaded": json.dumps(loaded, sort_keys=True)} if loaded else {})}


def recorded(records: Any, workload: Workload, outputs: dict, slots: Iterable[Any]
             ) -> dict[str, str]:
    """What made the output (``as_attrs``), the model as the ready workers loaded it (their
    ``identity``: a hub model only they fetched); PipelineError, before anything is written,
    where one found other files than another or than the driver."""
    loaded = {str(s.info): s.ready.identity for s in slots
              if s.ready is not None and s.ready.identity}
    try:
        return as_attrs(records, workload, outputs, loaded)
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
