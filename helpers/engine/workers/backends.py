"""Where workers run: processes (one model each; ``process_context``) or threads (one model per
device).

Every worker has its own channels: an inbox only the driver writes and an outbox only that worker
writes. Nothing is shared between workers, so a worker killed at any instant (SIGKILL, a segfault,
``os._exit``) can leave a half-written message or a held lock only in its own pipes, which die with
it; a queue shared by every worker would stay locked or corrupt for the survivors.

Both backends, and Ray's actors (helpers.engine.workers.ray_backend), implement the ``Backend``
protocol, all the scheduler knows of them: ``spawn(info)`` starts a worker in a slot (a
replacement reuses the slot), ``send(slot, units)`` hands it one message of workunits and never
blocks, ``events`` is one thread-safe
queue of ``(slot, message)`` in arrival order (Ready, Result, Failed, and the backend's own Died
when a worker ends without a word), ``kill(slot)`` and ``shutdown(clean)``. A ``Wakeup`` on the same
queue lets another thread (the reader) end the scheduler's wait early, the way CPython's process
pool wakes its manager thread.

Process backend, per worker: a sender thread writes its inbox pipe (a full pipe blocks that thread,
never the pool), a listener thread reads its outbox pipe (helpers.engine.workers.transfer: results'
arrays come as raw bytes, read straight into their arrays) and posts each message; end of file on
the outbox means the process is gone, and the listener posts Died with its exit code. Detection is
as fast as the kernel closes the pipe: milliseconds.

Thread backend: threads on one device share one model. A thread cannot be killed; ``kill``
abandons it (it is told to stop at its next workunit, and whatever it says later is ignored) and
posts Died at once, so that the pool can put a fresh thread in its slot.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from helpers.engine.contract.messages import END_OF_WORK, Died, WorkerInfo, Workunit
from helpers.engine.contract.protocol import close_inputs
from helpers.engine.contract.settings import BACKENDS, PoolSettings
from helpers.engine.workers import transfer
from helpers.engine.workers.worker import JOIN_SECONDS, SharedModels, process_main, thread_main

IMPORTED_MAIN_EXIT = 75  # a worker's start ran the user's script, which started a pool
IMPORTED_MAIN = ("your script starts a pipeline when it is imported, and each worker process "
                 "imports it: put the lines that run it under `if __name__ == \"__main__\":` "
                 "(Python's multiprocessing: 'safe importing of main module')")


def refuse_in_a_starting_worker() -> None:
    """End this process with IMPORTED_MAIN_EXIT and one line if it is a worker process still
    importing the user's main script (a script without the ``__main__`` guard starts a pipeline
    there: each worker would start its own pool). Called before anything is opened."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        sys.stderr.write(f"gpufeed worker (pid {os.getpid()}): {IMPORTED_MAIN}\n")
        sys.stderr.flush()
        os._exit(IMPORTED_MAIN_EXIT)


class Backend(Protocol):
    """Where workers run, as the scheduler sees it (see the module docstring)."""

    name: str
    recyclable: bool  # killing a worker replaces its process (and so a broken CUDA context)
    answers_together: bool  # a message's answers arrive together when it returns (a Ray call),
    # not each as its workunit ends, and a worker's death may lose those of its last messages
    events: queue.Queue  # (slot, message) from every worker, in arrival order; thread-safe

    def spawn(self, info: WorkerInfo) -> None:
        """Start a worker in slot ``info.index``; it posts Ready once its model is loaded."""

    def send(self, slot: int, units: list[Workunit]) -> None:
        """Hand ``units`` to the worker in ``slot`` as one message; never blocks."""

    def kill(self, slot: int) -> None:
        """Stop the worker in ``slot`` now; a Died for it follows on ``events``."""

    def shutdown(self, clean: bool) -> None:
        """End every worker (cleanly: after the work sent; else now); returns when none is left."""


class Wakeup:
    """Ends a wait on a backend's ``events`` from another thread, carrying no message.

    ``wake()`` puts a token on the queue; ``Wakeup.drop`` filters the tokens out of what a wait
    returned, so that whoever reads the queue sees only ``(slot, message)`` pairs.
    """

    TOKEN = object()

    def __init__(self, events: queue.Queue) -> None:
        self._events = events

    def wake(self) -> None:
        self._events.put(self.TOKEN)

    @classmethod
    def drop(cls, items: list) -> list:
        return [item for item in items if item is not cls.TOKEN]


FORK_SERVER = "multiprocessing.forkserver"  # in the command line of the server and of every
# process it forks (a worker's parent is the server; the server's is the pool's process)


def is_fork_server(command: str, parent_command: str) -> bool:
    """Whether a process of command line ``command`` is the fork server itself, not a worker it
    forked (whose parent, the server, has FORK_SERVER in its command line too)."""
    return FORK_SERVER in command and FORK_SERVER not in parent_command


START_METHOD_ENV = "GPUFEED_START_METHOD"  # "spawn" or "forkserver": how worker processes start
PRELOAD_ENV = "GPUFEED_PRELOAD"  # the fork server's: what helpers.engine.workers.preload imports
START_METHODS = ("forkserver", "spawn")


def process_context(workload: Any) -> Any:
    """multiprocessing's fork server on Linux (Python 3.11 or later); elsewhere spawn (macOS
    forbids forking a process that has loaded its system frameworks, as torch does);
    ``$GPUFEED_START_METHOD`` says which.

    Spawning, every worker process imports torch and the workload's libraries itself: ~6 s for
    sentence-transformers, paid again by each worker and by every pool a tuner or a notebook
    starts. The fork server is started once per Python process, from a clean interpreter (never a
    fork of the pool's process, whose threads and CUDA state a fork would copy), imports the
    workload's ``imports`` (the heavy modules its ``load`` imports) once, and forks each worker
    from there: a worker starts with them imported, sharing their pages. The server keeps the
    modules of the first process pool that started it; a later workload's others are imported by
    its workers, as spawned ones would. A module that initialises CUDA when imported (none of
    ours does: torch, sentence-transformers and onnxruntime only look when asked) would leave the
    forked workers unable to use it ("Cannot re-initialize CUDA in forked subprocess"):
    GPUFEED_START_METHOD=spawn is the way out.
    """
    method = os.environ.get(START_METHOD_ENV) or (
        "forkserver" if sys.platform == "linux" and sys.version_info >= (3, 11) else "spawn")
    offered = [m for m in START_METHODS if m in multiprocessing.get_all_start_methods()]
    if method not in offered:
        raise ValueError(f"${START_METHOD_ENV}={method!r}: worker processes start with one of "
                         f"{offered}")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        imports = getattr(workload, "imports", ())
        ctx.set_forkserver_preload(["helpers.engine.workers.worker",
                                    "helpers.engine.workers.preload"])
        _start_fork_server([imports] if isinstance(imports, str) else list(imports))
    return ctx


def _start_fork_server(imports: list[str]) -> None:
    """Start the fork server, if it is not running, importing from this process's ``sys.path``,
    then ``imports`` (helpers.engine.workers.preload).

    multiprocessing starts it as ``python -c ...``, which puts the current folder first on its
    path (and, before Python 3.13, ignores ours): a ``helpers`` folder or ``helpers.py`` where the
    user runs their script would be imported in place of ours and break every worker. Started
    with PYTHONSAFEPATH (no current folder) and our path as PYTHONPATH, it imports what we do;
    the workers get our environment back (``process_main``)."""
    from multiprocessing import forkserver

    if getattr(forkserver._forkserver, "_forkserver_alive_fd", None) is not None:
        return  # running: os.environ is not touched again while other pools copy it
    saved = {name: os.environ.get(name) for name in ("PYTHONSAFEPATH", "PYTHONPATH", PRELOAD_ENV)}
    os.environ[PRELOAD_ENV] = ",".join(imports)
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path)
    try:
        forkserver.ensure_running()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class ProcessBackend:
    """One process per worker (``process_context``); each loads its own copy of the model."""

    name = "process"
    recyclable = True
    answers_together = False  # each Result is sent as its workunit ends

    def __init__(self, workload: Any) -> None:
        self._ctx = process_context(workload)
        self._workload = workload
        self.events: queue.Queue = queue.Queue()
        self._workers: dict[int, _Process] = {}

    def spawn(self, info: WorkerInfo) -> None:
        self._workers[info.index] = _Process(self._ctx, info, self._workload, self.events)

    def send(self, slot: int, units: list[Workunit]) -> None:
        self._workers[slot].outgoing.put(units[0] if len(units) == 1 else units)

    def kill(self, slot: int) -> None:
        self._workers[slot].process.kill()

    def shutdown(self, clean: bool) -> None:
        """End every worker (cleanly: END_OF_WORK, else terminate); kill any left after
        JOIN_SECONDS, one deadline for them all (eight stuck workers cost 5 s, not 40). Returns
        once no worker process is left."""
        workers = list(self._workers.values())
        for worker in workers:
            if clean:
                worker.outgoing.put(END_OF_WORK)
            elif worker.process.is_alive():
                worker.process.terminate()
        deadline = time.monotonic() + JOIN_SECONDS
        for worker in workers:
            worker.stop(deadline)
        self._workers.clear()


class _Process:
    """One worker process with its two pipes and the driver's two threads that serve them."""

    def __init__(self, ctx: Any, info: WorkerInfo, workload: Any, events: queue.Queue) -> None:
        self.info, self._events = info, events
        inbox_read, inbox_write = ctx.Pipe(duplex=False)
        outbox_read, outbox_write = ctx.Pipe(duplex=False)
        # the kernel's death signal (see watch_parent) follows the thread that forked the worker:
        # the fork server's, or ours when we spawn it from our main thread
        forked = ctx.get_start_method() == "forkserver"
        death_signal = forked or threading.current_thread() is threading.main_thread()
        self.process = ctx.Process(target=process_main, args=(info, workload, inbox_read,
                                                              outbox_write, death_signal,
                                                              dict(os.environ) if forked else None),
                                   name=f"gpufeed-worker-{info.index}-{info.device}", daemon=True)
        self.process.start()
        inbox_read.close()  # the child holds its own copies: our closing them lets EOF through
        outbox_write.close()
        transfer.widen(outbox_read)
        self._inbox, self._outbox = inbox_write, outbox_read
        self.outgoing: queue.Queue = queue.Queue()
        self._threads = [
            threading.Thread(target=self._send_loop, daemon=True,
                             name=f"gpufeed-send-{info.index}"),
            threading.Thread(target=self._listen_loop, daemon=True,
                             name=f"gpufeed-listen-{info.index}")]
        for thread in self._threads:
            thread.start()

    def _send_loop(self) -> None:
        while True:
            item = self.outgoing.get()
            if item is None:
                return
            try:
                self._inbox.send(item)
            except (OSError, ValueError):  # the worker is gone (its listener reports that)
                return
            if item == END_OF_WORK:
                return

    def _listen_loop(self) -> None:
        while True:
            try:
                message = transfer.receive(self._outbox)
            except (EOFError, OSError):  # every writer closed: the process has ended
                break
            except Exception:  # a message cut short by the worker's death does not unpickle
                break
            self._events.put((self.info.index, message))
        self.process.join(JOIN_SECONDS)
        if self.process.exitcode is None:  # closed its pipe but lives on: make it a death
            self.process.kill()
            self.process.join()
        self.outgoing.put(None)  # the sender thread ends with its worker
        self._events.put((self.info.index, Died(self.info.index, self.process.exitcode)))

    def stop(self, deadline: float) -> None:
        """Wait until ``deadline`` (time.monotonic) for the process to end, then kill it."""
        self.process.join(max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.outgoing.put(None)
        for thread in self._threads:  # they end with the process
            thread.join(max(0.1, deadline - time.monotonic()))
        for conn in (self._inbox, self._outbox):
            conn.close()


class ThreadBackend:
    """One thread per worker; threads on the same device share one model."""

    name = "thread"
    recyclable = False  # a thread shares its device's model: a fresh thread fixes nothing
    answers_together = False

    def __init__(self, workload: Any) -> None:
        self._workload = workload
        self.events: queue.Queue = queue.Queue()
        self._models = SharedModels()
        self._workers: dict[int, tuple[threading.Thread, queue.Queue, threading.Event]] = {}

    def spawn(self, info: WorkerInfo) -> None:
        inbox: queue.Queue = queue.Queue()
        abandoned = threading.Event()

        def post(message: Any, slot: int = info.index) -> None:
            self.events.put((slot, message))

        thread = threading.Thread(target=thread_main, daemon=True,
                                  name=f"gpufeed-worker-{info.index}-{info.device}",
                                  args=(info, self._workload, self._models, inbox, post, abandoned))
        self._workers[info.index] = (thread, inbox, abandoned)
        thread.start()

    def send(self, slot: int, units: list[Workunit]) -> None:
        for unit in units:  # (a queue, not a pipe: nothing to save by sending them as one)
            self._workers[slot][1].put(unit)

    def kill(self, slot: int) -> None:
        _, _, abandoned = self._workers[slot]
        abandoned.set()
        self.events.put((slot, Died(slot, None)))

    def shutdown(self, clean: bool) -> None:
        """Stop and join the threads; one busy with a workunit finishes it first (daemon threads
        that outlive JOIN_SECONDS do not block interpreter exit)."""
        for thread, inbox, abandoned in self._workers.values():
            if clean:
                inbox.put(END_OF_WORK)
            else:
                abandoned.set()
        deadline = time.monotonic() + JOIN_SECONDS
        for thread, _, _ in self._workers.values():
            thread.join(None if clean else max(0.0, deadline - time.monotonic()))
        self._models.close(self._workload)
        self._workers.clear()
        close_inputs()  # (the files its workers read are open in this process)


def visible_devices(backend: str, address: str | None = None
                    ) -> Callable[[], tuple[str, ...]] | None:
    """What ``"auto"`` devices stand for on ``backend`` (PoolSettings' ``visible``): None, this
    machine's, but on Ray every GPU of the cluster at ``address``
    (helpers.engine.workers.ray_backend,
    imported only when asked)."""
    if backend != "ray":
        return None

    def cluster() -> tuple[str, ...]:
        from helpers.engine.workers.ray_backend import cluster_devices

        return cluster_devices(address)

    return cluster


def pool_settings(devices: Any, backend: str = PoolSettings.backend, **options: Any
                  ) -> PoolSettings:
    """PoolSettings for ``backend``, its ``"auto"`` devices what that backend says they are."""
    return PoolSettings(devices, backend, **options,
                        visible=visible_devices(backend, options.get("ray_address")))


def make_backend(settings: PoolSettings, workload: Any) -> Backend:
    """The backend ``settings`` name (one of BACKENDS), with no worker started yet; Ray is
    imported only for the ray backend."""
    if settings.backend == "ray":
        from helpers.engine.workers.ray_backend import RayBackend

        return RayBackend(workload, settings)
    kinds = {"process": ProcessBackend, "thread": ThreadBackend}
    if settings.backend not in kinds:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {settings.backend!r}")
    return kinds[settings.backend](workload)
