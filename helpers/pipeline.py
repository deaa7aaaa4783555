"""The queue-fed pipeline: one reader, persistent workers on devices, one writer.

Data flow::

    source ──► Reader thread ──► work queue (bounded) ──► worker 0 (cpu)    ──► result queue ──► writer
    (HDF5,     groups records    workunits of             worker 1 (cuda:0)     (bounded)        (main thread:
     JSONL,    into workunits    workunit_size records,   worker 2 (cuda:0)                      HDF5Sink,
     pairs)    of (ids, records) then END_OF_WORK ×n      ...                                    progress bar)

Reader: a thread of the parent process. It pulls ``(id, record)`` pairs lazily from the source, cuts
them into workunits and puts them on the bounded work queue, so memory stays flat whatever the input
size; when the source ends it puts one END_OF_WORK sentinel per worker.

Workers: one per entry of ``devices``, started by a WorkerPool. Each loads the workload's model once
on its device (the ``process`` backend spawns a process per worker, each with its own model and an
even share of the CPU cores; the ``thread`` backend shares one model per device between threads),
says Ready, then pulls workunits until the pool closes. Workers outlive a job, so one pool can run
many jobs (different inputs, workunit sizes, static rounds) on models loaded once. Records the
workload rejects become failures in the result, not errors.

Writer: the parent's main thread. It takes Results in whatever order they come, appends ids and
outputs to the HDF5 file, writes failed records to ``errors/``, and watches the workers: a Failed
message or a worker process that died ends the run with a PipelineError naming the worker, its
device, the workunit and the remote traceback; then every worker is stopped. A job is done when the
reader has finished and every workunit it cut has come back.

Static split (``WorkerPool.static_round``, ``WorkerPool.run_static``): the layout queue-fed workers
replace. Each worker gets one slice, put on the same queue but held: a worker that finishes its
slice waits for the round's release instead of taking another's, and the round lasts as long as its
slowest worker.

Timing: spin-up (spawning, imports, model loads) runs until every worker is Ready; the clock for
throughput starts when the reader starts and stops when the writer has written the last record.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from helpers.backends import make_backend
from helpers.config import POOL_FIELDS, PipelineConfig
from helpers.devices import check_available, parse_devices
from helpers.hdf5_sink import HDF5Sink
from helpers.provenance import package_versions
from helpers.reader import Reader
from helpers.sources import open_source, source_length
from helpers.stats import PipelineStats, RoundStats, WorkerStats, WorkunitSpan
from helpers.worker import POLL_SECONDS, Failed, Ready, Result, Workunit, peak_memory
from helpers.workloads.base import Workload

STRATEGIES = ("queue", "static")
MIN_STATIC_SLICE = 4  # records per worker below which a static split runs on one worker


class PipelineError(RuntimeError):
    """A worker failed or died; the message names it, its device and its workunit."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a PipelineError."""

    def __str__(self) -> str:
        return "\n\n" + self.args[0]



class WorkerPool:
    """Persistent workers on ``devices``: spin up once, then run jobs queue-fed or in static rounds.

    ``with WorkerPool(workload, ["cuda:0", "cuda:1"]) as pool:`` starts every worker and waits until
    each has loaded its model; ``pool.run(source, output)`` is one queue-fed job;
    ``pool.static_round(slices)`` gives slice i to worker i. Leaving the block stops every worker.
    ``options``: the other fields of PipelineConfig; those outside POOL_FIELDS are defaults for jobs.
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
        self._ready: dict[int, Ready] = {}
        self._rounds, self._broken = 0, False

    def __enter__(self) -> "WorkerPool":
        started = time.monotonic()
        self._backend = make_backend(self.config.backend, self.workload, self.workers,
                                     self.config.depth)
        self._backend.__enter__()
        try:
            self._ready = _await_ready(self._backend, self.workers, self.config.load_timeout)
        except BaseException as exc:  # Ctrl-C during spin-up included: stop what started
            self._backend.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.spinup_seconds = time.monotonic() - started
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._backend.shutdown(clean=exc_type is None and not self._broken)

    @property
    def outputs(self) -> dict:
        return next(iter(self._ready.values())).outputs

    def run(self, source: Any, output: str | os.PathLike, **job: Any) -> PipelineStats:
        """One queue-fed job: every record of ``source`` through the workers into ``output``.

        ``job``: workunit_size, limit, sort_window, progress (default: the pool's).
        """
        config, records, total, attrs = self._job(source, job)
        with self._guard(), HDF5Sink(output, self.outputs, attrs) as sink:
            stop = threading.Event()
            cost = getattr(self.workload, "record_cost", None) if config.window else None
            reader = Reader(records, self._backend.work, config.workunit_size, stop,
                            config.window, cost)
            clock = time.monotonic()
            reader.start()
            try:
                results, write_seconds = self._collect(reader, sink, total, config.progress)
            finally:
                stop.set()
                reader.join()
            sink.flush()
            wall = time.monotonic() - clock
        return self._stats(config, output, results, clock, wall, sink,
                           (reader.read_seconds, reader.blocked_seconds, write_seconds))

    def run_static(self, source: Any, output: str | os.PathLike, **job: Any) -> PipelineStats:
        """The data-parallel layout as one job: read every record, give worker i the i-th of
        even contiguous slices, merge the results into ``output``; as slow as the slowest slice.

        ``job``: limit (the others do not apply: a worker's slice is its one workunit).
        """
        config, records, _, attrs = self._job(source, job)
        started = time.monotonic()
        pairs = list(records)
        read_seconds = time.monotonic() - started
        bounds = np.linspace(0, len(pairs), len(self.workers) + 1).round().astype(int)
        slices = [pairs[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        with HDF5Sink(output, self.outputs, attrs) as sink:
            results, clock, wall = self._round(slices, sink)
            sink.flush()
        config = replace(config, workunit_size=max(1, max(len(s) for s in slices)))
        return self._stats(config, output, results, clock, wall, sink, (read_seconds, 0.0, 0.0))

    def static_round(self, slices: Sequence[Sequence[tuple[int, Any]]],
                     sink: HDF5Sink | None = None) -> RoundStats:
        """Worker i processes ``slices[i]`` (``(id, record)`` pairs) as one workunit; the round
        ends when the last worker is done. Results go to ``sink`` if given, else are dropped."""
        results, clock, wall = self._round(slices, sink)
        return RoundStats(wall, tuple(self._span(r, clock) for r in results))

    def _round(self, slices: Sequence[Sequence[tuple[int, Any]]],
               sink: HDF5Sink | None) -> tuple[list[Result], float, float]:
        if len(slices) != len(self.workers):
            raise ValueError(f"slices: expected one per worker ({len(self.workers)}), "
                             f"got {len(slices)}")
        self._rounds += 1
        units = [Workunit(i, np.array([p[0] for p in s], dtype=np.int64), [p[1] for p in s],
                          hold=self._rounds) for i, s in enumerate(slices)]
        with self._guard():
            clock = time.monotonic()
            for unit in units:
                self._backend.work.put(unit)
            results = []
            while len(results) < len(units):
                message = self._next_message("in a static round")
                if isinstance(message, Result):
                    results.append(message)
                    if sink is not None:
                        _write(sink, message)
            wall = time.monotonic() - clock
            self._backend.release(self._rounds)
        return results, clock, wall

    def _job(self, source: Any, job: dict[str, Any]) -> tuple[PipelineConfig, Any, int | None,
                                                              dict[str, Any]]:
        """A job's config, its (limited) records, their number if known, and the file's attrs."""
        fixed = sorted(set(job) & set(POOL_FIELDS))
        if fixed:
            raise ValueError(f"{', '.join(fixed)}: fixed when the pool starts; start another pool")
        config = replace(self.config, **job)
        records = source if hasattr(source, "describe") else open_source(source)
        total = source_length(records)
        described = records.describe()
        if config.limit is not None:
            records = itertools.islice(records, config.limit)
            total = config.limit if total is None else min(total, config.limit)
        return config, records, total, {**self.workload.attrs(), **_run_attrs(config, described)}

    def _collect(self, reader: Reader, sink: HDF5Sink, total: int | None,
                 progress: bool) -> tuple[list[Result], float]:
        from tqdm.auto import tqdm

        results: list[Result] = []
        write_seconds = 0.0
        with tqdm(total=total, unit="rec", desc="records written", disable=not progress,
                  dynamic_ncols=True) as bar:
            while not (reader.done and len(results) == reader.units_put):
                if reader.error is not None:
                    raise reader.error
                message = self._next_message("mid-run; its workunit was not written")
                if isinstance(message, Result):
                    started = time.monotonic()
                    _write(sink, message)
                    write_seconds += time.monotonic() - started
                    results.append(message)
                    bar.update(len(message.ids) + len(message.failures))
        return results, write_seconds

    def _next_message(self, when: str) -> Result | None:
        message = self._backend.get(POLL_SECONDS)
        if isinstance(message, Failed):
            raise _error(message)
        if message is None:
            _check_alive(self._backend, when)
        return message

    def _guard(self) -> "_Guard":
        if self._broken:
            raise PipelineError("this pool stopped after a failed job; start another pool")
        return _Guard(self)

    def _span(self, result: Result, clock: float) -> WorkunitSpan:
        return WorkunitSpan(result.worker, self.config.devices[result.worker], result.workunit,
                            len(result.ids) + len(result.failures), result.started - clock,
                            result.ended - clock)

    def _stats(self, config: PipelineConfig, output: Any, results: list[Result], clock: float,
               wall: float, sink: HDF5Sink, io: tuple[float, float, float]) -> PipelineStats:
        read_seconds, blocked_seconds, write_seconds = io
        workers = []
        for info in self.workers:
            mine = [r for r in results if r.worker == info.index]
            busy = sum(r.compute_seconds for r in mine)
            gpu = [r.peak_gpu_mb for r in mine if r.peak_gpu_mb is not None]
            workers.append(WorkerStats(
                info.index, info.device, self._ready[info.index].pid,
                self._ready[info.index].load_seconds, sum(len(r.ids) + len(r.failures) for r in mine),
                len(mine), busy, max(0.0, wall - busy), max((r.peak_rss_mb for r in mine),
                                                            default=0.0), max(gpu, default=None)))
        stages = {"read": read_seconds, "reader_blocked": blocked_seconds,
                  "wait": sum(w.wait_seconds for w in workers),
                  "compute": sum(w.busy_seconds for w in workers), "write": write_seconds}
        settings = {k: v for k, v in asdict(config).items()
                    if k not in ("devices", "workunit_size", "backend")}
        return PipelineStats(sink.records_written, sink.errors_written, wall, self.spinup_seconds,
                             tuple(workers), stages, config.devices, config.workunit_size,
                             config.backend, str(output), settings,
                             tuple(self._span(r, clock) for r in results), _peak_rss(workers))


class _Guard:
    """Marks the pool broken if a job fails half-way (its queues may still hold that job's work)."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:
            self._pool._broken = True


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
    progress). Raises PipelineError if a worker fails; returns the run's PipelineStats.
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
        job = {k: v for k, v in job.items() if k == "limit"}
    with WorkerPool(workload, devices, backend, **pool_options) as pool:
        if strategy == "static":
            return pool.run_static(records, output, **job)
        return pool.run(records, output, workunit_size=workunit_size, **job)


def _write(sink: HDF5Sink, result: Result) -> None:
    if len(result.ids):
        sink.append(result.ids, result.arrays)
    sink.append_errors(result.failures)


def _await_ready(pool: Any, workers: list, timeout: float) -> dict[int, Ready]:
    ready: dict[int, Ready] = {}
    deadline = time.monotonic() + timeout
    while len(ready) < len(workers):
        message = pool.get(POLL_SECONDS)
        if isinstance(message, Ready):
            ready[message.worker] = message
        elif isinstance(message, Failed):
            raise _error(message)
        _check_alive(pool, "while starting or loading its model")
        if time.monotonic() > deadline:
            waiting = [str(w) for w in workers if w.index not in ready]
            raise PipelineError(f"{', '.join(waiting)} not ready after {timeout:.0f} s "
                                f"(load_timeout): model load hung or is too slow")
    return ready


def _check_alive(pool: Any, when: str) -> None:
    dead = pool.casualties()
    if dead:
        info, code = dead[0]
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        raise PipelineError(f"{info} died unexpectedly ({how}) {when}")


def _error(message: Failed) -> PipelineError:
    where = message.workunit or "loading the model"
    error = PipelineError(f"worker {message.worker} on {message.device} failed in {where}: "
                          f"{message.error_type}: {message.message}")
    error.__cause__ = RemoteTraceback(message.traceback)
    error.worker, error.device, error.workunit = message.worker, message.device, message.workunit
    return error


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
