"""The worker side: load the model once, say Ready, run workunits until the END_OF_WORK sentinel.

A worker reads workunits from its own inbox and answers each with a Result or a Failed message on
its own outbox (see helpers.engine.workers.backends: per-worker channels, so that a killed worker
can corrupt or block nothing but its own). A workunit that raises does not end the worker: the
Failed message carries the workunit's index, the exception's type, message and traceback, and
whether it was an out-of-memory error, and the worker takes the next one. Only END_OF_WORK, the
parent's death, or a failed model load end a worker.

A worker process never outlives its parent, even mid-workunit (a hung one included), so that a
killed run leaves no process holding a GPU's memory beside the run that resumes it: on Linux the
kernel kills it the moment its parent dies (PR_SET_PDEATHSIG: a worker forked by the fork server,
helpers.engine.workers.backends, dies with the server, which ends with the pool's process once no
worker holds its pipe: ``release_fork_server``), and everywhere a watchdog thread sees the parent
gone (its sentinel, not its pid: the fork server is our parent in the kernel's eyes) and ends the
process, as torch's DataLoader workers do.

Every backend's worker answers a workunit with the same two steps (``begin``, then what it returns);
the process and thread backends run them in the same ``serve`` loop (which overlaps workunits
where the workload launches its work on a card), and differ only in how a worker starts (a
process with its own model, or a thread sharing its device's model) and in how messages travel.
A Ray actor (helpers.engine.workers.ray_backend) calls ``load``, ``ready`` and ``answer`` (both
steps at once) from its methods instead.
"""
from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from helpers.engine.contract.messages import (END_OF_WORK, POLL_SECONDS, Failed, InputUnreadable,
                                              OutputUnwritable, Ready, Result, WorkerInfo, Workunit)
from helpers.engine.contract.protocol import (CUDA_GRAPHS_LOCK, MODEL_COPY_ENV, BadRecord,
                                              OutputSpec, Rows)
from helpers.engine.workers import transfer

JOIN_SECONDS = 5.0  # at the pool's shutdown, a terminated worker gets this long before it is
# killed (a killed Ray actor, to be reported gone)
EXIT_ORPHANED = 70  # its exit status then (nobody is left to read it; for the tests and logs)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
NEXT_SECONDS = 0.05  # a worker that overlaps workunits waits this long for the next message
# (the driver sends it as it reads the last answer) before it finishes the last workunit


def launches(workload: Any, model: Any) -> bool:
    """Whether ``workload`` hands ``model``'s work to a card without waiting for it (its
    optional ``launch``: see helpers.engine.contract.protocol)."""
    says = getattr(workload, "launches", None)
    return says is not None and bool(says(model))


def start_workunit(workload: Any, model: Any, specs: dict[str, OutputSpec], unit: Workunit,
                   worker: int) -> Callable[[], Result]:
    """Start one workunit: its records read and checked, then processed (or, where the
    workload ``launches``, handed to its card); returns what finishes it: the wait for its
    arrays, their checks, its part written, its Result. Records the workload rejects come back
    in the Result's ``rejected``, not as exceptions."""
    started = time.monotonic()
    records = _records(unit, worker)
    # the start's check (helpers.engine.dispatch.probe): an empty part where it will go
    if unit.probe:
        part = _write_part(unit, worker, unit.ids[:0], {})
        probed = Result(worker, unit.index, unit.ids[:0], {}, [], started, time.monotonic(),
                        part=part)
        return lambda: probed
    prepare = getattr(workload, "prepare", None)
    keep, ready, rejected = [], [], []
    for position, (record_id, record) in enumerate(zip(unit.ids.tolist(), records)):
        if isinstance(record, BadRecord):
            rejected.append((record_id, record.error_type, record.message, time.time(),
                             record.position))
            continue
        try:
            workload.check_record(record)
            if prepare is not None:
                record = prepare(record)
        except Exception as exc:  # this record's fault alone: check_record or decoding said so
            rejected.append((record_id, type(exc).__name__, str(exc), time.time()))
            continue
        keep.append(position)
        ready.append(record)
    if not keep:
        return lambda: Result(worker, unit.index, unit.ids[:0], {}, rejected, started,
                              time.monotonic())
    if launches(workload, model):
        arrived = workload.launch(model, ready)
    else:
        arrays = workload.process(model, ready)
        arrived = lambda: arrays  # noqa: E731

    def finish() -> Result:
        ids, arrays, part = unit.ids[keep], arrived(), None
        for name, spec in specs.items():
            if name not in arrays:
                raise ValueError(f"workload {workload.name!r} returned no output {name!r}")
            spec.check(name, arrays[name], len(keep))
        split, count = getattr(workload, "phases", None), getattr(workload, "counts", None)
        phases = split(model) if split is not None else None
        counts = count(model) if count is not None else None
        if unit.target is not None:  # the rows go to a part file, not back to the driver
            carried = {name: values[keep] for name, values in (unit.carried or {}).items()}
            part, arrays = _write_part(unit, worker, ids, {**arrays, **carried}), {}
        return Result(worker, unit.index, ids, arrays, rejected, started, time.monotonic(),
                      phases=phases, part=part, counts=counts)
    return finish


def _records(unit: Workunit, worker: int) -> list:
    """The workunit's records: as sent, or read here (Rows); InputUnreadable if the input
    cannot be read. A record the reader cannot decode is a BadRecord of its own, so whatever
    the reading raises is the input's fault (gone, cut short, changed), not the records': it
    stops the run, rather than filing good records as errors or reading other data."""
    if not isinstance(unit.records, Rows):
        return unit.records
    try:
        return unit.records.read()
    except Exception as exc:
        raise InputUnreadable(f"worker {worker} on {socket.gethostname()} cannot read the "
                              f"input: {type(exc).__name__}: {exc}") from exc


def _write_part(unit: Workunit, worker: int, ids: np.ndarray,
                arrays: dict[str, np.ndarray]) -> Any:
    """The rows written as a part of their own where ``unit.target`` says (a WorkerPart);
    OutputUnwritable if they cannot be."""
    from helpers.engine.outputs.checkpoint import write_worker_part  # (h5py: only if asked)

    who = f"worker {worker} on {socket.gethostname()}"
    try:
        return write_worker_part(unit.target, ids, arrays, who)
    except OSError as exc:
        raise OutputUnwritable(f"{who} cannot write its part in {unit.target.folder}: "
                               f"{exc}") from exc


def serve(info: WorkerInfo, workload: Any, model: Any, specs: dict[str, OutputSpec],
          receive: Callable[[], Any], send: Callable[[Any], bool],
          waiting: Callable[[float], bool] | None = None) -> None:
    """Run each workunit ``receive`` returns (one, or a list: a message of several) and ``send``
    its Result or Failed message as it ends, until END_OF_WORK (or None: the parent is gone, or
    has abandoned this worker).

    Where the workload ``launches`` (its work runs on a card while the worker goes on) and
    ``waiting(seconds)`` says whether a message arrives within that time, the worker overlaps
    workunits, as torch's DataLoader prefetches: it starts the next one it holds (reads it,
    tokenizes it, hands it to the card) before it finishes the last (waits for its arrays,
    writes them, answers), so the card has work while the worker collects; with no message
    within NEXT_SECONDS (the driver sends the next as it reads an answer), it finishes the last
    before it waits for one. A workunit sent ``alone`` overlaps with nothing."""
    overlap = waiting is not None and launches(workload, model)
    last: Callable[[], Result | Failed] | None = None  # started, not yet finished
    while True:
        if last is not None and not waiting(NEXT_SECONDS):
            if not send(last()):
                return
            last = None
        message = receive()
        if message is None or message == END_OF_WORK:
            if last is not None and message is not None:
                send(last())
            return
        for unit in message if isinstance(message, list) else [message]:
            if last is not None and unit.alone:  # (overlaps nothing: finished first)
                if not send(last()):
                    return
                last = None
            this = begin(info, workload, model, specs, unit)
            if last is not None and not send(last()):
                return
            last = this if overlap and not unit.alone else None
            if last is None and not send(this()):
                return


def answer(info: WorkerInfo, workload: Any, model: Any, specs: dict[str, OutputSpec],
           unit: Workunit) -> Result | Failed:
    """One workunit's Result, or the Failed message that says why it raised: ``begin`` and its
    end at once (a Ray actor's answer; ``serve`` may overlap the two steps)."""
    return begin(info, workload, model, specs, unit)()


def begin(info: WorkerInfo, workload: Any, model: Any, specs: dict[str, OutputSpec],
          unit: Workunit) -> Callable[[], Result | Failed]:
    """``answer`` in two steps: the workunit started (``start_workunit``), and what finishes it
    and gives its Result, or the Failed message that says why either step raised. Its CPU
    seconds, and its time (``ended - started``), are those of the two steps: a worker that
    overlaps workunits starts the next between them, and that time is the next one's."""
    cpu, wall = time.process_time(), time.monotonic()
    try:
        finish = start_workunit(workload, model, specs, unit, info.index)
    except Exception as exc:  # the workunit's fault or the model's: the driver decides
        message = _failure(info, unit, exc)
        del exc  # its traceback pins the failed batch's tensors
        return lambda: message
    spent, took = time.process_time() - cpu, time.monotonic() - wall

    def end() -> Result | Failed:
        cpu, wall = time.process_time(), time.monotonic()
        try:
            result = finish()
        except Exception as exc:
            message = _failure(info, unit, exc)
            del exc
            return message
        rss, gpu = peak_memory(info.device, getattr(workload, "requires_hardware", True))
        return replace(result, started=wall - took, peak_rss_mib=rss, peak_gpu_mib=gpu,
                       cpu_s=spent + time.process_time() - cpu)
    return end


def _failure(info: WorkerInfo, unit: Workunit, exc: BaseException) -> Failed:
    message = failed(info, unit, exc)
    if message.out_of_memory:
        release_memory(info.device)
    return message


def release_memory(device: str) -> None:
    """After an out-of-memory error: drop the failed batch and give cached blocks back (not
    while another thread captures a CUDA graph: CUDA_GRAPHS_LOCK)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_available():
        with CUDA_GRAPHS_LOCK:
            torch.cuda.empty_cache()


def peak_memory(device: str, hardware: bool = True) -> tuple[float, float | None]:
    """This process's peak resident memory in MiB, and torch's peak allocation on ``device``
    (``hardware`` False: the device is a label, a simulated card's, say: no torch asked).

    On Linux the peak of this program alone (VmHWM): ``ru_maxrss`` also counts the process it was
    forked from, as big as it was when it forked (a worker spawned by a parent of 500 MiB would
    report at least 500 MiB)."""
    rss_mib = _own_peak_mib()
    if rss_mib is None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rss_mib = rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS
    torch = sys.modules.get("torch")
    gpu = None
    if hardware and device.startswith("cuda") and torch is not None \
            and torch.cuda.is_available():
        gpu = torch.cuda.max_memory_allocated(device) / 2**20
    return rss_mib, gpu


def _own_peak_mib() -> float | None:
    """VmHWM from /proc/self/status in MiB (None where there is no such file)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def device_memory(workload: Any, model: Any, device: str) -> tuple[float | None, float | None]:
    """(free MiB on ``device``, MiB this model copy takes there), for workers_per_device="fit".

    A workload may answer itself (``device_memory(model, device)``); otherwise CUDA devices ask
    torch, and ``cpu`` reads the machine's available memory and this process's resident size.
    """
    ask = getattr(workload, "device_memory", None)
    if ask is not None:
        return ask(model, device)
    if not getattr(workload, "requires_hardware", True) and device != "cpu":  # a label (a
        return None, None  # simulated card's): no card to ask
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return free / 2**20, torch.cuda.memory_allocated(device) / 2**20
    if device == "cpu":
        import psutil

        return psutil.virtual_memory().available / 2**20, psutil.Process().memory_info().rss / 2**20
    return None, None


def failed(info: WorkerInfo, unit: Workunit | None, exc: BaseException) -> Failed:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Failed(info.index, info.device, None if unit is None else unit.index,
                  "loading the model" if unit is None else unit.describe(),
                  type(exc).__name__, str(exc), tb)


def load(info: WorkerInfo, workload: Any) -> tuple[Any, dict[str, OutputSpec], float]:
    started = time.perf_counter()
    model = workload.load(info.device, info.threads)
    return model, workload.outputs(model), time.perf_counter() - started


def ready(info: WorkerInfo, workload: Any, model: Any, specs: dict[str, OutputSpec],
          seconds: float, node: str = "", overlaps: bool = False) -> Ready:
    free, used = device_memory(workload, model, info.device)
    report, identity = getattr(workload, "report", None), getattr(workload, "identity", None)
    return Ready(info.index, os.getpid(), seconds, specs, free, used, socket.gethostname(), node,
                 report(model) if report is not None else {},
                 identity(model) if identity is not None else {}, overlaps)


def watch_parent(parent: Any, kernel_signal: bool) -> None:
    """End this process when ``parent`` (multiprocessing's parent process) is gone (module
    docstring). ``kernel_signal``: also ask Linux for SIGKILL at the death of the process that
    forked us (the fork server, or a spawning parent's thread: only for a worker spawned by its
    parent's main thread, since the kernel acts when the thread that started us ends)."""
    if kernel_signal and sys.platform == "linux":
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the watchdog below still holds
            pass

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])  # readable once the parent is gone
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="gpufeed-orphan-watchdog", daemon=True).start()


def release_fork_server() -> None:
    """Close, in a worker the fork server forked, its copy of the server's "alive" pipe.

    multiprocessing hands every forked process that pipe's write end (so that it could start
    processes through the server in turn), and the server ends only once every copy is closed:
    kept, the server would outlive the pool's process as long as a worker lives, and the kernel's
    signal at the server's death (``watch_parent``) would never come, leaving a worker that holds
    the GIL (a hung C call: its watchdog thread cannot run) alive after its parent."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        server._forkserver_alive_fd = None


def process_main(info: WorkerInfo, workload: Any, inbox: Any, outbox: Any,
                 kernel_signal: bool = False, environ: dict[str, str] | None = None) -> None:
    """Entry point of a worker process (forked by the fork server, or spawned): one model,
    loaded once.

    ``inbox``/``outbox``: this worker's own ends of two pipes (multiprocessing Connections);
    ``kernel_signal``: see ``watch_parent``; ``environ``: the parent's environment.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle: it stops us
    if environ is not None:  # the parent's, as a spawned process inherits it (a forked one has
        os.environ.clear()  # the fork server's, from when the server started)
        os.environ.update(environ)
    os.environ[MODEL_COPY_ENV] = str(info.copy)  # like torchrun's LOCAL_RANK, for the workload
    release_fork_server()
    parent = multiprocessing.parent_process()
    if parent is not None:
        watch_parent(parent, kernel_signal)

    def receive() -> Any:
        while not inbox.poll(POLL_SECONDS):
            if parent is not None and not parent.is_alive():
                return None
        try:
            return inbox.recv()
        except (EOFError, OSError):  # the driver closed our inbox: the pool is gone
            return None

    def send(message: Any) -> bool:
        try:
            transfer.send(outbox, message)  # arrays as raw bytes after a small pickle
            return True
        except OSError:  # BrokenPipeError: nobody reads our outbox any more
            return False

    try:
        model, specs, seconds = load(info, workload)
        message = ready(info, workload, model, specs, seconds,
                        overlaps=launches(workload, model))
    except Exception as exc:
        send(failed(info, None, exc))
        return
    if send(message):
        serve(info, workload, model, specs, receive, send, waiting=inbox.poll)


def thread_main(info: WorkerInfo, workload: Any, models: "SharedModels", inbox: Any,
                post: Callable[[Any], None], abandoned: threading.Event) -> None:
    """Entry point of a worker thread: shares one model per device with its sibling threads.

    ``inbox``: a queue.Queue; ``post``: hands a message to the driver; ``abandoned``: set when
    the pool has given up on this thread (it hung), so that nothing it says later counts.
    """
    import queue

    def receive() -> Any:
        while not abandoned.is_set():
            try:
                return inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                pass
        return None

    def send(message: Any) -> bool:
        if abandoned.is_set():
            return False
        if isinstance(message, Result):  # the process's CPU is every thread's: not this one's
            message = replace(message, cpu_s=None)
        post(message)
        return True

    try:
        model, specs, seconds = models.get(info, workload)
        if info.device == "cpu" and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(info.threads)  # per thread under OpenMP
        message = ready(info, workload, model, specs, seconds,
                        overlaps=launches(workload, model))
    except BaseException as exc:  # a thread has no exit code: everything must become a message
        send(failed(info, None, exc))
        return
    if send(message):
        serve(info, workload, model, specs, receive, send, waiting=lambda seconds: _arrives(
            inbox, seconds))


def _arrives(inbox: Any, seconds: float) -> bool:
    """Whether a message is in the queue.Queue ``inbox`` within ``seconds`` (left there)."""
    end = time.monotonic() + seconds
    while inbox.empty():
        if time.monotonic() >= end:
            return False
        time.sleep(0.001)
    return True


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

    def close(self, workload: Any) -> None:
        """Each model's ``workload.close(model)``, where the workload has one (the protocol):
        once, when the pool's threads are done with them."""
        close = getattr(workload, "close", None)
        with self._lock:
            loaded, self._loaded = list(self._loaded.values()), {}
        for model, _, _ in loaded:
            if close is not None:
                close(model)
