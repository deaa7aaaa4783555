"""The worker side: load the model once, say ready, pull workunits until the end-of-work sentinel.

Workers outlive a job: a pool runs several jobs (queue-fed runs, static-split rounds) on the same
loaded models, and only END_OF_WORK ends a worker. A workunit with ``hold`` set belongs to a static
round: after it, the worker waits until the parent releases that round, so that each worker of the
round takes exactly one workunit (its slice) however fast it is.

Both backends run the same ``serve`` loop; they differ only in how a worker starts (a spawned process
with its own model, or a thread sharing its device's model) and in what "should I give up?" means
(the parent process has died, or the run's stop event is set). Every exception goes back to the
parent as a ``Failed`` message with its traceback; a worker never dies silently and never blocks
forever on a queue.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from helpers.workloads.base import BadRecord, OutputSpec

END_OF_WORK = "END_OF_WORK"  # put once per worker when the pool closes
POLL_SECONDS = 0.5  # how often a blocked worker checks that it still has a reason to wait
HOLD_POLL_SECONDS = 0.005  # a held worker's check for its round's release: short, rounds are timed


@dataclass(frozen=True)
class WorkerInfo:
    index: int
    device: str
    threads: int  # CPU threads for this worker's model

    def __str__(self) -> str:
        return f"worker {self.index} on {self.device}"


@dataclass(frozen=True)
class Workunit:
    index: int
    ids: np.ndarray  # int64, one per record
    records: list
    hold: int = 0  # a static round's number: take no other workunit until it is released

    def describe(self) -> str:
        span = f"ids {self.ids[0]}..{self.ids[-1]}" if len(self.ids) else "no ids"
        return f"workunit {self.index} ({len(self.ids)} records, {span})"


@dataclass(frozen=True)
class Ready:
    worker: int
    pid: int
    load_seconds: float
    outputs: dict[str, OutputSpec]


@dataclass(frozen=True)
class Result:
    worker: int
    workunit: int
    ids: np.ndarray
    arrays: dict[str, np.ndarray]
    failures: list[tuple[int, str, str, float]]  # (record id, error type, message, unix time)
    started: float  # time.monotonic() (system-wide on Linux, macOS, Windows): a shared timeline
    ended: float
    peak_rss_mb: float = 0.0  # this worker's process, high-water mark
    peak_gpu_mb: float | None = None  # torch's peak allocation on the worker's CUDA device

    @property
    def compute_seconds(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class Failed:
    worker: int
    device: str
    workunit: str | None  # Workunit.describe(), None when loading failed
    error_type: str
    message: str
    traceback: str


def run_workunit(workload: Any, model: Any, specs: dict[str, OutputSpec], unit: Workunit,
                 worker: int) -> Result:
    """Process one workunit; records the workload rejects become failures, not exceptions."""
    started = time.monotonic()
    prepare = getattr(workload, "prepare", None)
    keep, ready, failures = [], [], []
    for position, (record_id, record) in enumerate(zip(unit.ids.tolist(), unit.records)):
        if isinstance(record, BadRecord):
            failures.append((record_id, record.error_type, record.message, time.time()))
            continue
        try:
            workload.check_record(record)
            if prepare is not None:
                record = prepare(record)
        except Exception as exc:  # this record's fault alone: check_record or decoding said so
            failures.append((record_id, type(exc).__name__, str(exc), time.time()))
            continue
        keep.append(position)
        ready.append(record)
    ids = unit.ids[keep]
    arrays = {}
    if keep:
        arrays = workload.process(model, ready)
        for name, spec in specs.items():
            if name not in arrays:
                raise ValueError(f"workload {workload.name!r} returned no output {name!r}")
            spec.check(name, arrays[name], len(keep))
    return Result(worker, unit.index, ids, arrays, failures, started, time.monotonic())


def serve(info: WorkerInfo, workload: Any, model: Any, specs: dict[str, OutputSpec],
          work: Any, results: Any, alive: Callable[[], bool], released: Any) -> None:
    """Pull workunits from ``work`` and put a message on ``results`` for each, until END_OF_WORK.

    ``released.value`` is the last static round the parent has released (see ``hold``).
    """
    while True:
        unit = _get(work, alive)
        if unit is None or unit == END_OF_WORK:
            return
        try:
            result = run_workunit(workload, model, specs, unit, info.index)
        except Exception as exc:
            _put(results, failed(info, unit.describe(), exc), alive)
            return
        rss, gpu = peak_memory(info.device)
        if not _put(results, replace(result, peak_rss_mb=rss, peak_gpu_mb=gpu), alive):
            return
        while unit.hold and released.value < unit.hold:
            if not alive():
                return
            time.sleep(HOLD_POLL_SECONDS)


def peak_memory(device: str) -> tuple[float, float | None]:
    """This process's peak resident memory in MiB, and torch's peak allocation on ``device``."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_mb = rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux
    torch = sys.modules.get("torch")
    gpu = None
    if device.startswith("cuda") and torch is not None and torch.cuda.is_available():
        gpu = torch.cuda.max_memory_allocated(device) / 2**20
    return rss_mb, gpu


def failed(info: WorkerInfo, workunit: str | None, exc: BaseException) -> Failed:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Failed(info.index, info.device, workunit, type(exc).__name__, str(exc), tb)


def load(info: WorkerInfo, workload: Any) -> tuple[Any, dict[str, OutputSpec], float]:
    started = time.perf_counter()
    model = workload.load(info.device, info.threads)
    return model, workload.outputs(model), time.perf_counter() - started


def process_main(info: WorkerInfo, workload: Any, work: Any, results: Any, released: Any) -> None:
    """Entry point of a spawned worker process: one model, loaded once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    parent = multiprocessing.parent_process()
    alive = parent.is_alive if parent is not None else (lambda: True)
    try:
        model, specs, seconds = load(info, workload)
    except Exception as exc:
        _put(results, failed(info, None, exc), alive)
        return
    _put(results, Ready(info.index, os.getpid(), seconds, specs), alive)
    serve(info, workload, model, specs, work, results, alive, released)


def thread_main(info: WorkerInfo, workload: Any, models: "SharedModels", work: Any, results: Any,
                released: Any, stop: threading.Event) -> None:
    """Entry point of a worker thread: shares one model per device with its sibling threads."""
    alive = lambda: not stop.is_set()  # noqa: E731
    try:
        model, specs, seconds = models.get(info, workload)
        if info.device == "cpu" and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(info.threads)  # per thread under OpenMP
        _put(results, Ready(info.index, os.getpid(), seconds, specs), alive)
        serve(info, workload, model, specs, work, results, alive, released)
    except BaseException as exc:  # a thread has no exit code: everything must become a message
        _put(results, failed(info, None, exc), alive)


class SharedModels:
    """One model per device for the thread backend, loaded by the first thread that asks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._device_locks: dict[str, threading.Lock] = {}
        self._loaded: dict[str, tuple[Any, dict[str, OutputSpec], float]] = {}

    def get(self, info: WorkerInfo, workload: Any) -> tuple[Any, dict[str, OutputSpec], float]:
        with self._lock:
            device_lock = self._device_locks.setdefault(info.device, threading.Lock())
        with device_lock:
            if info.device not in self._loaded:
                self._loaded[info.device] = load(info, workload)
            return self._loaded[info.device]


def _get(work: Any, alive: Callable[[], bool]) -> Any:
    while True:
        try:
            return work.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if not alive():
                return None


def _put(results: Any, message: Any, alive: Callable[[], bool]) -> bool:
    while True:
        try:
            results.put(message, timeout=POLL_SECONDS)
            return True
        except queue.Full:
            if not alive():
                return False
