"""Where workers run: spawned processes (one model each) or threads (one model per device).

Both give the pipeline the same surface: ``work`` (the bounded queue of workunits), ``get`` (the next
message from any worker, or None after a timeout), ``casualties`` (workers that died without a word),
``release`` (let the workers of a static round go on) and ``shutdown``. A backend is a context manager: leaving it by an exception, Ctrl-C included, stops
every worker before the exception goes on, so no child process outlives a run.
"""
from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from typing import Any

from helpers.worker import END_OF_WORK, POLL_SECONDS, SharedModels, WorkerInfo, process_main, \
    thread_main

BACKENDS = ("process", "thread")
JOIN_SECONDS = 5.0  # a terminated worker gets this long before it is killed


class _Backend:
    """What both backends share: start the runners, read results, stop on leaving the block."""

    _runners: list  # processes or threads, one per worker
    _results: Any
    work: Any
    released: Any  # .value: the last static round the workers may leave

    def release(self, round_number: int) -> None:
        self.released.value = round_number

    def start(self) -> None:
        for runner in self._runners:
            runner.start()

    def get(self, timeout: float) -> Any:
        """The next message from any worker, or None after ``timeout`` seconds."""
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            return None

    def shutdown(self, clean: bool) -> None:
        raise NotImplementedError

    def _send_end_of_work(self) -> None:
        """One sentinel per live worker; gives up after JOIN_SECONDS (shutdown then terminates)."""
        deadline = time.monotonic() + JOIN_SECONDS
        for _ in self._runners:
            while time.monotonic() < deadline:
                try:
                    self.work.put(END_OF_WORK, timeout=POLL_SECONDS)
                    break
                except queue.Full:
                    pass

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.shutdown(clean=exc_type is None)


class ProcessBackend(_Backend):
    """One spawned process per worker; each loads its own copy of the model."""

    name = "process"

    def __init__(self, workload: Any, workers: list[WorkerInfo], queue_depth: int) -> None:
        ctx = multiprocessing.get_context("spawn")  # fork is unsafe once torch or CUDA has started
        self.work = ctx.Queue(queue_depth)
        self._results = ctx.Queue(queue_depth + len(workers))
        self.released = ctx.Value("q", 0)
        self._runners = [
            ctx.Process(target=process_main,
                        args=(info, workload, self.work, self._results, self.released),
                        name=f"gpufeed-worker-{info.index}-{info.device}", daemon=True)
            for info in workers]
        self._workers = workers

    def casualties(self) -> list[tuple[WorkerInfo, int]]:
        """Workers whose process ended with a non-zero exit code (a signal, a crash)."""
        return [(info, process.exitcode) for info, process in zip(self._workers, self._runners)
                if process.exitcode not in (None, 0)]

    def shutdown(self, clean: bool) -> None:
        """End the workers (cleanly: END_OF_WORK, else terminate); kill any left after JOIN_SECONDS."""
        if clean:
            self._send_end_of_work()
        else:
            for process in self._runners:
                if process.is_alive():
                    process.terminate()
        for process in self._runners:
            process.join(JOIN_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()
        for q in (self.work, self._results):
            q.cancel_join_thread()  # items left unread must not block interpreter exit
            q.close()


class ThreadBackend(_Backend):
    """One thread per worker; threads on the same device share one model."""

    name = "thread"

    def __init__(self, workload: Any, workers: list[WorkerInfo], queue_depth: int) -> None:
        self.work: queue.Queue = queue.Queue(queue_depth)
        self._results: queue.Queue = queue.Queue(queue_depth + len(workers))
        self._stop = threading.Event()
        self.released = _Counter()
        models = SharedModels()
        self._runners = [
            threading.Thread(target=thread_main, name=f"gpufeed-worker-{info.index}-{info.device}",
                             args=(info, workload, models, self.work, self._results,
                                   self.released, self._stop),
                             daemon=True)
            for info in workers]

    def casualties(self) -> list[tuple[WorkerInfo, int]]:
        return []  # a thread cannot die without its Failed message (see worker.thread_main)

    def shutdown(self, clean: bool) -> None:
        """Stop and join the threads; one busy with a workunit finishes it first (daemon threads
        that outlive JOIN_SECONDS do not block interpreter exit)."""
        if clean:
            self._send_end_of_work()
        self._stop.set()
        for thread in self._runners:
            thread.join(None if clean else JOIN_SECONDS)


class _Counter:
    """The thread backend's stand-in for a shared ``multiprocessing.Value``."""

    value = 0


def make_backend(name: str, workload: Any, workers: list[WorkerInfo], queue_depth: int):
    """The backend called ``name`` (one of BACKENDS), not yet started."""
    if name == "process":
        return ProcessBackend(workload, workers, queue_depth)
    if name == "thread":
        return ThreadBackend(workload, workers, queue_depth)
    raise ValueError(f"backend: expected one of {BACKENDS}, got {name!r}")
