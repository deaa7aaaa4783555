"""Workers as Ray actors: the cluster is Ray's; the scheduling, the writer and the guarantees ours.

Data flow::

    driver (this process)                                       Ray cluster
    scheduler ── send(slot, units) ─ actor.run.remote(units) ─► actor, slot 0 (node A, ½ GPU)
        ▲                                                        actor, slot 1 (node A, ½ GPU)
        │                                                        actor, slot 2 (node B, 1 GPU)
        └── events ◄── a callback as each call's result lands ◄── (Ray's object store)

One actor per worker slot, placed by Ray wherever its resources are free: ``num_gpus`` = 1/k for k
workers per GPU (so k actors share one card), ``num_cpus`` = a CPU worker's threads, one beside
a card. A device entry names a share of some GPU of the cluster, not GPU N of the driver's
machine: Ray gives each actor its card as ``cuda:0`` (CUDA_VISIBLE_DEVICES), and its threads are
its node's cores shared among the workers of the node's GPUs (``on_its_node``). A workload
that only labels devices (the synthetic one) asks for CPUs alone, so simulated cards run on any
cluster.

It is the same Backend as the process and thread backends (helpers.engine.workers.backends), so the
scheduler in the driver still owns every workunit: exactly once, retries, splits down to the bad
record, recycling, timeouts, out-of-memory backoff, durable parts and resume work unchanged. An
actor runs one call at a time, in order; a call carries a message of workunits (four with fixed
workunit sizes: a call costs the driver ~1 ms of CPU whatever it carries, while it stays under
Ray's 100 KB for inline arguments, which packed ids keep it in), the scheduler keeps two
in flight per actor (one running, one waiting), and each call's answers — Ready, or a Result or
Failed per workunit, the same messages a process sends — come back together through Ray's object
store when it returns. An actor that dies takes with it the answers of calls it had not yet
returned, and sometimes of one it had just finished (a segfault can beat the reply out of the
process): a death while an actor holds more than one workunit cannot say which did it, and the
scheduler sends each again alone. Nothing polls: Ray calls back as each result lands
(``ObjectRef.future``), and the answers of each actor are posted in the order it ran them.

Failures become the events the scheduler knows. Each actor also runs a ``watch`` call, on a thread
of its own, that never returns: the moment Ray reports that call (or any other)
failed with the actor — ``ray.kill``, a segfault, its node lost — ``Died`` is posted with Ray's
words (``lost`` when the node went away: its workunits are not charged, only redone), the
actor's other calls are dropped, and the scheduler starts a replacement in the slot, wherever the
cluster has the resources. A call that raised inside Ray's machinery (not the workload: ``answer``
turns those into Failed) comes back as ``Failed`` with the remote traceback.

Connecting: with an address, the driver joins that cluster; with none, a cluster this process
already joined, or $RAY_ADDRESS, else a local Ray started for the pool and stopped with it (the
default, which says where its dashboard is). Ray is imported here only: the other backends never
load it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

import ray
import ray.exceptions

from helpers.engine.contract.devices import available_cores, share_of_cores
from helpers.engine.contract.messages import Died, Result, WorkerInfo, Workunit
from helpers.engine.contract.protocol import MODEL_COPY_ENV
from helpers.engine.workers.worker import JOIN_SECONDS, answer, failed, load, ready

log = logging.getLogger("gpufeed")

NODE_LOST = ("node has died", "node died", "node is dead")  # in Ray's words for an actor whose
# node went away (ActorUnavailableError says less: its node is unreachable, taken as lost)
NICENESS_ENV = "RAY_worker_niceness"  # (ray_constants.RAY_WORKER_NICENESS): a user's wins
_unclaimed = False  # a local Ray started before any pool (devices="auto"): the next pool owns it


def local_system() -> dict[str, int]:
    """The system config of a Ray that gpufeed starts (a new dict each time: Ray writes its
    session's spilling settings into the one it is given). Its workers at the driver's
    niceness: Ray starts them at nice 15, so that a driver at 0 comes first, but here the actors
    do the work while the driver reads and writes beside them (an embedding actor beside busy
    processes at nice 0 took 105-140 s for 9 s of work). $RAY_worker_niceness, set, is kept."""
    return {} if os.environ.get(NICENESS_ENV) else {"worker_niceness": 0}


def cluster_address(address: str | None = None) -> str | None:
    """The cluster a pool joins: ``address``, else $RAY_ADDRESS; None: a local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def connect(address: str | None = None, cpus: int = 0) -> bool:
    """Join the Ray cluster at ``address``; with None, the one this process already joined, or
    $RAY_ADDRESS, else start a local Ray with at least ``cpus`` CPUs (more logical CPUs than
    cores is fine: a worker's ``num_cpus`` only places it). Says where the dashboard is; returns
    True when it started Ray (whoever did stops it: ``ray.shutdown()``)."""
    if ray.is_initialized():
        return False
    address = cluster_address(address)
    local = address is None
    try:
        context = ray.init(address="local" if local else address, namespace="gpufeed",
                           num_cpus=max(cpus, available_cores()) if local else None,
                           _system_config=local_system() if local else None,
                           logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise RuntimeError(unreachable(address, exc)) from exc
    resources = ray.cluster_resources()
    dashboard = f"http://{context.dashboard_url}" if context.dashboard_url else "not running"
    log.warning("ray: %s %s (%d nodes, %g CPUs, %g GPUs); dashboard: %s",
                "started a local Ray at" if local else "joined the cluster at",
                context.address_info.get("gcs_address", address), len(_alive_nodes()),
                resources.get("CPU", 0), resources.get("GPU", 0), dashboard)
    return local


def unreachable(address: str | None, error: BaseException) -> str:
    """Why joining ``address`` may have failed, and what to do. Ray >= 2.59 turns on token
    authentication for a cluster ``ray start`` makes, but a driver given an address sends the
    token only with RAY_AUTH_MODE=token: without it Ray retries for ~20 s, then says only that
    it could not connect."""
    hint = ("a cluster that `ray start` made with Ray >= 2.59 wants its token: set "
            "RAY_AUTH_MODE=token here, with the head's ~/.ray/auth_token copied to this machine "
            "(or RAY_AUTH_TOKEN set)")
    mode = os.environ.get("RAY_AUTH_MODE")
    said = "RAY_AUTH_MODE is not set" if mode is None else f"RAY_AUTH_MODE={mode}"
    return (f"ray_address: could not join the Ray cluster at {address} ({error}). Is it up "
            f"(`ray status` on its head)? {said}; {hint}")


def cluster_devices(address: str | None = None) -> tuple[str, ...]:
    """``devices="auto"`` on Ray: every GPU of the cluster (``cuda:0`` ... ``cuda:N-1``); with
    none, one ``cpu`` worker per node."""
    global _unclaimed
    _unclaimed = connect(address) or _unclaimed
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus:
        return tuple(f"cuda:{i}" for i in range(gpus))
    return ("cpu",) * max(1, len(_alive_nodes()))


def _alive_nodes() -> list[dict]:
    return [node for node in ray.nodes() if node.get("Alive")]


def resources(info: WorkerInfo, hardware: bool, workers_on_device: int) -> dict[str, float]:
    """What an actor asks of the cluster: a 1/k share of a GPU for k workers on a CUDA device,
    and its CPU threads on the CPU, one CPU beside a card (its threads, the driver's share of its
    own cores, may be more than a node of the cluster has; a workload that only labels devices
    asks for CPUs alone)."""
    options = {"num_cpus": info.threads if info.device == "cpu" else 1}
    if hardware and info.device.startswith("cuda"):
        options["num_gpus"] = 1.0 / workers_on_device
    return options


def on_its_node(info: WorkerInfo, gpus: float, sharing: int) -> WorkerInfo:
    """A CUDA worker's WorkerInfo where Ray placed it: its share of a card is the node's
    ``cuda:0`` (Ray made it the only one visible), and its threads the node's cores shared
    among the workers its ``gpus`` hold, ``sharing`` each (the pool's workers on a device; one
    where they are added one at a time). The driver's share was of the driver's cores; a pool
    on fewer of the node's GPUs than it has leaves some of its cores idle."""
    return replace(info, device="cuda:0", threads=share_of_cores(max(1, round(gpus * sharing))))


def node_gpus() -> float:
    """The GPUs of the node this process runs on, as Ray counts them (0 where none)."""
    node = ray.get_runtime_context().get_node_id()
    return next((float(n.get("Resources", {}).get("GPU", 0.0)) for n in _alive_nodes()
                 if n.get("NodeID") == node), 0.0)


def node_label() -> str:
    """This actor's node: its IP and the start of Ray's node id (simulated nodes share an IP)."""
    context = ray.get_runtime_context()
    return f"{ray.util.get_node_ip_address()}/{context.get_node_id()[:6]}"


@ray.remote(concurrency_groups={"watch": 1})
class _Worker:
    """One worker slot's actor: loads the model once, then answers each workunit in turn."""

    def __init__(self, info: WorkerInfo, workload: Any, epoch: float, sharing: int = 1) -> None:
        os.environ[MODEL_COPY_ENV] = str(info.copy)  # like torchrun's LOCAL_RANK, for the workload
        if getattr(workload, "requires_hardware", True) and info.device.startswith("cuda"):
            info = on_its_node(info, node_gpus(), sharing)
        self.info, self.workload = info, workload
        # this node's time.monotonic() + shift = the driver's: a timeline across machines
        self.shift = (time.time() - time.monotonic()) - epoch
        self.model = self.specs = None

    def load(self) -> Any:
        try:
            self.model, self.specs, seconds = load(self.info, self.workload)
            return ready(self.info, self.workload, self.model, self.specs, seconds, node_label())
        except Exception as exc:
            return failed(self.info, None, exc)

    def run(self, units: list[Workunit]) -> list[Any]:
        """Each workunit's Result or Failed, in order."""
        return [self._answer(unit) for unit in units]

    def _answer(self, unit: Workunit) -> Any:
        message = answer(self.info, self.workload, self.model, self.specs, unit)
        if isinstance(message, Result):
            message = replace(message, started=message.started + self.shift,
                              ended=message.ended + self.shift)
        return message

    @ray.method(concurrency_group="watch")
    def watch(self) -> None:
        """Never returns, on a thread of its own: fails, in the driver, the moment the actor is
        gone, whether or not it holds a workunit."""
        threading.Event().wait()


class _Call:
    """One call on an actor: its workunits (none: the model load) and, once Ray has it, its
    outcome (a concurrent.futures.Future, done)."""

    def __init__(self, units: list[Workunit]) -> None:
        self.units, self.outcome = units, None


class _Actor:
    """The driver's side of one actor: its handle, its calls in the order it runs them, and the
    watch call that fails when it goes."""

    def __init__(self, info: WorkerInfo, handle: Any) -> None:
        self.info, self.handle = info, handle
        self.calls: deque[_Call] = deque()
        self.lock = threading.Lock()  # Ray's callback threads and the scheduler's share calls
        self.killed = self.gone = False


class RayBackend:
    """One Ray actor per worker slot; each loads its own copy of the model."""

    name = "ray"
    recyclable = True  # killing an actor replaces its process, CUDA context included
    answers_together = True  # a call's answers come back when it returns; a death may lose
    # those of the calls before it

    def __init__(self, workload: Any, settings: Any) -> None:
        """``settings``: the pool's PoolSettings (its devices, workers and ray_address)."""
        global _unclaimed
        self._hardware = getattr(workload, "requires_hardware", True)
        self._workers_per_device = (
            {d: settings.max_workers_per_device for d in settings.devices}
            if settings.growing or settings.filling else
            {d: settings.worker_devices.count(d) for d in settings.devices})
        self._sharing = {d: 1 for d in settings.devices} if settings.growing or \
            settings.filling else dict(self._workers_per_device)  # (workers sharing a card's
        # node cores, as PoolSettings.models counts them)
        cpus = sum(self._resources(info)["num_cpus"] for info in settings.workers())
        if settings.growing or settings.filling:
            cpus = len(set(settings.devices)) * settings.max_workers_per_device
        self._owns_ray = connect(settings.ray_address, cpus) or _unclaimed
        _unclaimed = False
        self._workload = ray.put(workload)  # shipped once, whatever the number of actors
        self._epoch = time.time() - time.monotonic()
        self.events: queue.Queue = queue.Queue()
        self._actors: dict[int, _Actor] = {}
        self._watches: list[Any] = []
        self._closing = False

    def _resources(self, info: WorkerInfo) -> dict[str, float]:
        return resources(info, self._hardware, self._workers_per_device.get(info.device, 1))

    def spawn(self, info: WorkerInfo) -> None:
        handle = _Worker.options(**self._resources(info), name=None, max_restarts=0,
                                 max_task_retries=0).remote(
            info, self._workload, self._epoch, self._sharing.get(info.device, 1))
        actor = self._actors[info.index] = _Actor(info, handle)
        self._call(actor, handle.load.remote(), [])
        watch = handle.watch.remote()
        self._watches.append(watch)
        watch.future().add_done_callback(lambda done: self._died(actor, done.exception()))

    def send(self, slot: int, units: list[Workunit]) -> None:
        actor = self._actors[slot]
        self._call(actor, actor.handle.run.remote(units), units)

    def _call(self, actor: _Actor, ref: Any, units: list[Workunit]) -> None:
        call = _Call(units)
        with actor.lock:
            actor.calls.append(call)
        ref.future().add_done_callback(lambda done: self._settle(actor, call, done))

    def kill(self, slot: int) -> None:
        actor = self._actors.get(slot)
        if actor is not None and not actor.gone:
            actor.killed = True
            ray.kill(actor.handle, no_restart=True)  # its watch call fails: _died posts Died

    def shutdown(self, clean: bool) -> None:
        """Kill every actor (a clean end has nothing left in flight: the scheduler is idle) and
        return once Ray reports each gone; stop the local Ray if this pool started it."""
        self._closing = True
        for actor in self._actors.values():
            _kill(actor.handle)
        if self._watches:
            ray.wait(self._watches, num_returns=len(self._watches), timeout=JOIN_SECONDS)
        self._actors.clear()
        self._watches.clear()
        if self._owns_ray:
            ray.shutdown()

    # -- Ray's callback threads ------------------------------------------------------------------

    def _settle(self, actor: _Actor, call: _Call, done: Any) -> None:
        """A call finished: post the answers of the actor's oldest calls, in the order it ran
        them (its message, a Failed, or its death)."""
        with actor.lock:
            call.outcome = done
            while actor.calls and actor.calls[0].outcome is not None and not actor.gone:
                head = actor.calls.popleft()
                error = head.outcome.exception()
                if error is None:
                    answers = head.outcome.result()
                    for message in answers if isinstance(answers, list) else [answers]:
                        self._post(actor, message)
                elif isinstance(error, ray.exceptions.RayTaskError) and len(head.units) > 1:
                    first = str(error).strip().splitlines()[0]  # which of them? none charged:
                    self._died_locked(actor, error, f"a call of {len(head.units)} workunits "
                                                    f"failed in Ray ({first}); the actor is "
                                                    f"replaced")  # each then sent alone
                elif isinstance(error, ray.exceptions.RayTaskError):  # Ray's machinery, not
                    cause = error.cause if isinstance(error.cause, BaseException) else error
                    self._post(actor, replace(failed(actor.info, (head.units or [None])[0],
                                                     cause),  # the workload
                                              traceback=str(error)))
                else:  # the actor died, or its node (and its results)
                    self._died_locked(actor, error)

    def _died(self, actor: _Actor, error: BaseException | None) -> None:
        with actor.lock:
            self._died_locked(actor, error)

    def _died_locked(self, actor: _Actor, error: BaseException | None, why: str = "") -> None:
        if actor.gone:
            return
        actor.gone = True
        actor.calls.clear()
        if self._closing:
            return
        # no Ray call from Ray's callback thread: "unavailable" must not come back, so kill apart
        threading.Thread(target=_kill, args=(actor.handle,), daemon=True).start()
        text = str(error).lower()
        lost = not why and not actor.killed and (
            isinstance(error, ray.exceptions.ActorUnavailableError)
            or getattr(error, "preempted", False) or any(words in text for words in NODE_LOST))
        if why:
            cause = why
        elif actor.killed:
            cause = "killed by the pool (ray.kill)"
        elif lost:
            cause = "its Ray node was lost"
        else:
            first = str(error).strip().splitlines()[0] if error is not None else "stopped"
            cause = f"Ray actor died: {first}"
        self.events.put((actor.info.index, Died(actor.info.index, None, cause, lost)))

    def _post(self, actor: _Actor, message: Any) -> None:
        if not self._closing:
            self.events.put((actor.info.index, message))


def _kill(handle: Any) -> None:
    with contextlib.suppress(Exception):  # gone already
        ray.kill(handle, no_restart=True)
