"""The queue-fed pipeline: one reader, persistent workers on devices, one writer.

Data flow::

    source ──► Reader thread ──► work queue (bounded) ──► worker 0 (cpu)    ──► result queue ──► writer
    (HDF5,     groups records    workunits of             worker 1 (cuda:0)     (bounded)        (main thread:
     JSONL,    into workunits    workunit_size records,   worker 2 (cuda:0)                      HDF5Sink,
     pairs)    of (ids, records) then END_OF_WORK ×n      ...                                    progress bar)

Reader: a thread of the parent process. It pulls ``(id, record)`` pairs lazily from the source, cuts
them into workunits and puts them on the bounded work queue, so memory stays flat whatever the input
size; when the source ends it puts one END_OF_WORK sentinel per worker.

Workers: one per entry of ``devices``. Each loads the workload's model once on its device (the
``process`` backend spawns a process per worker, each with its own model and an even share of the CPU
cores; the ``thread`` backend shares one model per device between threads), says Ready, then pulls
workunits until its sentinel. Records the workload rejects become failures in the result, not errors.

Writer: the parent's main thread. It takes Results in whatever order they come, appends ids and
outputs to the HDF5 file, writes failed records to ``errors/``, and watches the workers: a Failed
message or a worker process that died ends the run with a PipelineError naming the worker, its
device, the workunit and the remote traceback; then every worker is stopped.

Timing: spin-up (spawning, imports, model loads) runs until every worker is Ready; the clock for
throughput starts when the reader starts and stops when the writer has written the last record.
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from helpers.backends import BACKENDS, make_backend
from helpers.devices import check_available, cpu_threads_per_worker, parse_devices
from helpers.hdf5_sink import HDF5Sink
from helpers.provenance import package_versions
from helpers.sources import open_source, source_length
from helpers.stats import PipelineStats, WorkerStats
from helpers.worker import END_OF_WORK, POLL_SECONDS, Failed, Finished, Ready, Result, \
    WorkerInfo, Workunit
from helpers.workloads.base import Workload

QUEUE_DEPTH_PER_WORKER = 2  # workunits waiting per worker: enough to hide the reader's latency
SORT_WORKUNITS = 8  # default sort window, in workunits: most of a global sort's gain, bounded memory


class PipelineError(RuntimeError):
    """A worker failed or died; the message names it, its device and its workunit."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a PipelineError."""

    def __str__(self) -> str:
        return "\n\n" + self.args[0]


@dataclass(frozen=True)
class PipelineConfig:
    """A run's settings, validated on construction: a bad value raises ValueError naming it."""

    devices: tuple[str, ...] = ("cpu",)
    workunit_size: int = 100
    backend: str = "process"
    queue_depth: int | None = None  # workunits on the work queue; None = 2 per worker
    threads_per_worker: int | None = None  # CPU threads per cpu worker; None = an even share
    limit: int | None = None  # stop after this many records
    sort_window: int | None = None  # records ordered by cost before cutting; None = 8 workunits, 0 = off
    load_timeout: float = 600.0  # seconds for every worker to load its model
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", parse_devices(self.devices))
        _positive_int("workunit_size", self.workunit_size)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {self.backend!r}")
        for name in ("queue_depth", "threads_per_worker", "limit", "sort_window"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name), allow_zero=name in ("limit", "sort_window"))
        if not self.load_timeout > 0:
            raise ValueError(f"load_timeout: expected seconds > 0, got {self.load_timeout!r}")

    @property
    def window(self) -> int:
        return SORT_WORKUNITS * self.workunit_size if self.sort_window is None else self.sort_window

    @property
    def depth(self) -> int:
        return self.queue_depth or QUEUE_DEPTH_PER_WORKER * len(self.devices)

    def workers(self) -> list[WorkerInfo]:
        cpu_threads = self.threads_per_worker or cpu_threads_per_worker(self.devices)
        return [WorkerInfo(i, device, cpu_threads if device == "cpu" else 1)
                for i, device in enumerate(self.devices)]


def _positive_int(name: str, value: Any, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < (0 if allow_zero else 1):
        raise ValueError(f"{name}: expected an integer >= {0 if allow_zero else 1}, got {value!r}")


def _safe_cost(cost: Callable[[Any], float], record: Any) -> float:
    try:
        return float(cost(record))
    except Exception:  # a bad record sorts first; its worker reports it
        return 0.0


class Reader(threading.Thread):
    """Cuts the source into workunits and feeds the bounded work queue, then one sentinel each.

    With a ``cost`` function it reads ``window`` records ahead and orders them by cost before
    cutting, so a workunit holds records of similar size (texts of similar length pad less).
    """

    def __init__(self, records: Iterable[tuple[int, Any]], work: Any, workunit_size: int,
                 n_workers: int, stop: threading.Event, window: int = 0,
                 cost: Callable[[Any], float] | None = None) -> None:
        super().__init__(name="gpufeed-reader", daemon=True)
        self._records, self._work, self._size = records, work, workunit_size
        self._n_workers, self._halt = n_workers, stop
        self._window, self._cost = max(window, workunit_size), cost
        self.error: BaseException | None = None
        self.read_seconds = self.blocked_seconds = 0.0
        self.records_read = 0

    def run(self) -> None:
        try:
            for unit in self._workunits():
                if not self._put(unit):
                    return
            for _ in range(self._n_workers):
                if not self._put(END_OF_WORK):
                    return
        except BaseException as exc:  # the writer re-raises it in the main thread
            self.error = exc

    def _workunits(self) -> Iterator[Workunit]:
        records, index = iter(self._records), itertools.count()
        while True:
            started = time.perf_counter()
            window = list(itertools.islice(records, self._window))
            if self._cost is not None:  # similar records together: less padding in a batch
                window.sort(key=lambda pair: _safe_cost(self._cost, pair[1]))
            self.read_seconds += time.perf_counter() - started
            if not window:
                return
            self.records_read += len(window)
            for start in range(0, len(window), self._size):
                chunk = window[start:start + self._size]
                ids = np.fromiter((i for i, _ in chunk), dtype=np.int64, count=len(chunk))
                yield Workunit(next(index), ids, [record for _, record in chunk])

    def _put(self, item: Any) -> bool:
        started = time.perf_counter()
        try:
            while not self._halt.is_set():
                try:
                    self._work.put(item, timeout=POLL_SECONDS)
                    return True
                except queue.Full:  # both backends' queues raise queue.Full
                    pass
            return False
        finally:
            self.blocked_seconds += time.perf_counter() - started


def run_pipeline(source: Any, workload: Workload, devices: Iterable[str] | str = ("cpu",),
                 workunit_size: int = 100, output: str | os.PathLike = "out.h5",
                 backend: str = "process", **options: Any) -> PipelineStats:
    """Run ``workload`` over every record of ``source`` and write the results to ``output``.

    ``source``: an ``.h5`` file (``batches/0, 1, ...``), a ``.jsonl`` file, or an iterable of
    ``(id, record)`` pairs. ``devices``: one entry per worker. ``options``: the other fields of
    PipelineConfig (queue_depth, threads_per_worker, limit, sort_window, load_timeout, progress).
    Raises PipelineError if a worker fails; returns the run's PipelineStats.
    """
    config = PipelineConfig(parse_devices(devices), workunit_size, backend, **options)
    if not isinstance(workload, Workload):
        raise TypeError(f"workload: {type(workload).__name__} does not follow the Workload protocol")
    records = open_source(source)
    described = records.describe()
    if workload.requires_hardware:
        check_available(config.devices)
    total = source_length(records)
    if config.limit is not None:
        records = itertools.islice(records, config.limit)
        total = config.limit if total is None else min(total, config.limit)
    workers = config.workers()
    started = time.perf_counter()
    with make_backend(config.backend, workload, workers, config.depth) as pool:
        ready = _await_ready(pool, workers, config.load_timeout)
        spinup = time.perf_counter() - started
        attrs = {**workload.attrs(), **_run_attrs(config, described)}
        with HDF5Sink(output, next(iter(ready.values())).outputs, attrs) as sink:
            stop = threading.Event()
            cost = getattr(workload, "record_cost", None) if config.window else None
            reader = Reader(records, pool.work, config.workunit_size, len(workers), stop,
                            config.window, cost)
            clock = time.perf_counter()
            reader.start()
            try:
                finished, write_seconds = _write_all(pool, sink, reader, workers, total, config)
            finally:
                stop.set()
                reader.join()
            sink.flush()
            wall = time.perf_counter() - clock
    return _stats(config, output, ready, finished, reader, sink, wall, spinup, write_seconds)


def _await_ready(pool: Any, workers: list[WorkerInfo], timeout: float) -> dict[int, Ready]:
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


def _write_all(pool: Any, sink: HDF5Sink, reader: Reader, workers: list[WorkerInfo],
               total: int | None, config: PipelineConfig) -> tuple[dict[int, Finished], float]:
    from tqdm.auto import tqdm

    finished: dict[int, Finished] = {}
    write_seconds = 0.0
    with tqdm(total=total, unit="rec", desc="records written", disable=not config.progress,
              dynamic_ncols=True) as bar:
        while len(finished) < len(workers):
            message = pool.get(POLL_SECONDS)
            if isinstance(message, Result):
                started = time.perf_counter()
                if len(message.ids):
                    sink.append(message.ids, message.arrays)
                sink.append_errors(message.failures)
                write_seconds += time.perf_counter() - started
                bar.update(len(message.ids) + len(message.failures))
            elif isinstance(message, Finished):
                finished[message.worker] = message
            elif isinstance(message, Failed):
                raise _error(message)
            elif message is None:
                if reader.error is not None:
                    raise reader.error
                _check_alive(pool, "mid-run; its workunit was not written")
    return finished, write_seconds


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


def _stats(config: PipelineConfig, output: Any, ready: dict[int, Ready],
           finished: dict[int, Finished], reader: Reader, sink: HDF5Sink, wall: float,
           spinup: float, write_seconds: float) -> PipelineStats:
    workers = tuple(
        WorkerStats(i, config.devices[i], ready[i].pid, ready[i].load_seconds, f.records,
                    f.workunits, f.busy_seconds, f.wait_seconds)
        for i, f in sorted(finished.items()))
    stages = {"read": reader.read_seconds, "reader_blocked": reader.blocked_seconds,
              "wait": sum(w.wait_seconds for w in workers),
              "compute": sum(w.busy_seconds for w in workers), "write": write_seconds}
    settings = {k: v for k, v in asdict(config).items() if k not in ("devices", "workunit_size",
                                                                   "backend")}
    return PipelineStats(sink.records_written, sink.errors_written, wall, spinup, workers, stages,
                         config.devices, config.workunit_size, config.backend, str(output),
                         settings)
