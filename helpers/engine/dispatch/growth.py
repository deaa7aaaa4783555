"""A self-tuning worker count per device (``workers_per_device="auto"``), and ``"fit"``'s count
before any work (``fit``).

Each device starts with one worker. Once every worker on it has run GROWTH_RESULTS workunits at
their settled size since the last change, the device's rate is measured by counting completions:
in one window shared by all its workers (from the last of their first ends to the first of their
last ends), each worker's completed records, a workunit's records spread evenly from the end
before it to its own, summed, ÷ the window. What happens inside a workunit (work, or waiting for a
shared device) does not matter, only when workunits finish. One window for all, because workers
sharing a device take turns unevenly (one window per worker read their turns twice, up to +19 %);
spread records, because whole workunits counted at the window's edges were off by up to a tenth.
The rate is judged::

    k = 1, or the rate with k rose by GROWTH_MARGIN over the rate with k - 1
        ├─ memory for another copy (free > MEMORY_HEADROOM × one copy, when the device reports it)
        │  and k < max_workers_per_device ........................ add worker k + 1
        └─ otherwise ............................................ stop at k
    the rate with k did not rise by GROWTH_MARGIN ............... retire worker k, stop at k - 1
    worker k + 1 failed to load (out of memory) ................. stop at k

Every decision is logged and kept (``Decision``: when, which device, what, how many workers, the
rate before and after, why); a job's ``PipelineStats.decisions`` holds those made while it ran.
Devices are judged independently, so a fast card and a slow one settle on their own counts.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from helpers.engine.contract.messages import Ready, WorkerInfo
from helpers.engine.contract.settings import PoolSettings
from helpers.engine.dispatch.scheduler import PipelineError, Scheduler
from helpers.engine.dispatch.slots import State

log = logging.getLogger("gpufeed")

GROWTH_MARGIN = 0.15  # another worker stays only if it raised its device's rate by this much: less
# is within what a loaded machine's noise (and a late dispatch that a spare worker hides) gives
GROWTH_RESULTS = 4  # workunits per worker, after a change, before a device's rate is judged
MEMORY_HEADROOM = 1.2  # another copy only if the device's free memory exceeds this × one copy
EXPLORE_SECONDS = 0.25  # with workunit_size="auto": workunits take at most this long while a
# device's count is being decided, so that each decision comes within seconds


def short_of_memory(ready: Ready | None, headroom: float) -> bool:
    """Whether the device a worker has just loaded on lacks room for another copy (free memory
    below ``headroom`` × one copy); False where the device does not report its memory."""
    if ready is None or ready.free_mib is None or ready.model_mib is None:
        return False
    return ready.free_mib < headroom * ready.model_mib


@dataclass(frozen=True)
class Decision:
    seconds: float  # since the job's start
    device: str
    action: str  # "add", "retire" or "stop"
    workers: int  # on the device once the action is done
    rate_before: float | None  # records/s with one worker fewer than were measured
    rate_after: float | None  # records/s measured with the workers the device had
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Device:
    """What growth knows of one device."""

    name: str
    slots: list[int]  # its live workers, oldest first
    since: float | None = None  # when the current count took effect; None while one loads
    loading: int | None = None  # the slot of a worker being added
    rates: dict[int, float] = field(default_factory=dict)  # workers -> measured records/s
    units: dict[int, list] = field(default_factory=dict)  # slot -> [(start, end, records)]
    done: bool = False

    def measured(self) -> float | None:
        """The device's rate once each of its workers ran GROWTH_RESULTS workunits, else None."""
        units = [self.units.get(s, []) for s in self.slots]
        if any(len(u) < GROWTH_RESULTS for u in units):
            return None
        start = max(u[0][1] for u in units)  # a window inside every worker's first and last end
        end = min(u[-1][1] for u in units)
        if end - start < 0.5 * max(u[-1][1] - u[0][1] for u in units):
            return None  # the workers' measurements hardly overlap (one had the device to
            # itself for a while): a short window is a noisy one, so wait for more
        done = sum(_completed(u, end) - _completed(u, start) for u in units)
        return done / (end - start)


def _completed(units: list, at: float) -> float:
    """The records a worker had completed at ``at`` (between its first and its last end), each
    workunit's records spread evenly from the end before it to its own end."""
    total = 0.0
    for (_, before, _), (_, ended, records) in zip(units, units[1:]):
        if at >= ended:
            total += records
        else:
            if at > before:
                total += records * (at - before) / (ended - before)
            break
    return total


class Growth:
    """Adds and retires workers per device while a pool runs its jobs (see the module docstring).

    The pool calls ``observe`` for every result and ``step`` after each batch of messages; ``step``
    starts and retires workers through the scheduler (its ``spawn(info, optional=True)`` and
    ``retire(slot)``).
    """

    def __init__(self, workers: list[WorkerInfo], max_workers: int,
                 new_worker: Callable[[int, str, int], WorkerInfo],
                 margin: float = GROWTH_MARGIN) -> None:
        self.max_workers, self.margin = max_workers, margin
        self._new_worker = new_worker  # (index, device, copy): PoolSettings.worker
        self.devices: dict[str, _Device] = {}
        for info in workers:
            self.devices.setdefault(info.device, _Device(info.device, [])).slots.append(info.index)
        self.decisions: list[Decision] = []

    @property
    def settled(self) -> bool:
        return all(device.done for device in self.devices.values())

    def deciding(self) -> set[int]:
        """The slots of the devices whose count is not decided yet."""
        return {slot for device in self.devices.values() if not device.done
                for slot in [*device.slots, device.loading] if slot is not None}

    def hold(self, seconds: float) -> None:
        """Stop growing: every device keeps the workers it has (``seconds``: since the job's
        start, for the decisions)."""
        for device in self.devices.values():
            if not device.done:
                self._decide(device, seconds, "stop", len(device.slots), None,
                             device.rates.get(len(device.slots)), "held by the caller")
                device.done = True

    def new_job(self) -> None:
        """A job starts: what was measured before (and the idle time between the jobs) is not
        part of the next measurement."""
        for device in self.devices.values():
            if not device.done and device.loading is None:
                device.since, device.units = None, {}

    def observe(self, slot: int, device: str, records: int, started: float,
                ended: float) -> None:
        """``slot`` ran a workunit of ``records`` from ``started`` to ``ended`` (time.monotonic();
        one begun before the last change is not counted)."""
        state = self.devices.get(device)
        if state is None or state.done or state.since is None or started < state.since \
                or slot not in state.slots:
            return
        state.units.setdefault(slot, []).append((started, ended, records))

    def step(self, scheduler: Scheduler, now: float, clock: float) -> None:
        """Judge every device whose measurement is complete; ``clock``: the job's start."""
        for device in self.devices.values():
            if device.done:
                continue
            if device.loading is not None:
                self._loaded(device, scheduler, now, clock)
            elif device.since is None:
                device.since = now  # the pool's first job: measuring starts now
            else:
                rate = device.measured()
                if rate is not None:
                    self._judge(device, rate, scheduler, now - clock)

    def _loaded(self, device: _Device, scheduler: Scheduler, now: float, clock: float) -> None:
        slot = scheduler.slots[device.loading]
        if slot.state is State.LOADING:
            return
        if slot.state is State.READY:
            device.slots.append(device.loading)
            device.since, device.loading, device.units = now, None, {}
            return
        self._decide(device, now - clock, "stop", len(device.slots), None,
                     device.rates.get(len(device.slots)),
                     f"worker {len(device.slots) + 1} failed to load")
        device.loading, device.done = None, True

    def _judge(self, device: _Device, rate: float, scheduler: Scheduler, seconds: float) -> None:
        k = len(device.slots)
        device.rates[k] = rate
        before = device.rates.get(k - 1)
        if before is not None and rate < (1 + self.margin) * before:
            newest = device.slots.pop()
            scheduler.retire(newest)
            self._decide(device, seconds, "retire", k - 1, before, rate,
                         f"worker {k} raised the rate by {rate / before - 1:+.0%} "
                         f"(< {self.margin:.0%})")
            device.done = True
            return
        why = "first measurement" if before is None else \
            f"worker {k} raised the rate by {rate / before - 1:+.0%}"
        ready = scheduler.slots[device.slots[-1]].ready
        if k >= self.max_workers:
            self._decide(device, seconds, "stop", k, before, rate,
                         f"{why}; max_workers_per_device={self.max_workers}")
            device.done = True
        elif short_of_memory(ready, MEMORY_HEADROOM):
            self._decide(device, seconds, "stop", k, before, rate,
                         f"{why}; {ready.free_mib:.0f} MiB free, a copy takes "
                         f"{ready.model_mib:.0f} MiB")
            device.done = True
        else:
            index = max(scheduler.slots) + 1
            scheduler.spawn(self._new_worker(index, device.name, k), optional=True)
            device.loading = index
            self._decide(device, seconds, "add", k + 1, before, rate, why)

    def _decide(self, device: _Device, seconds: float, action: str, workers: int,
                before: float | None, after: float | None, reason: str) -> None:
        decision = Decision(round(seconds, 3), device.name, action, workers,
                            None if before is None else round(before, 2),
                            None if after is None else round(after, 2), reason)
        self.decisions.append(decision)
        log.info("growth: %s %s -> %d workers (%s)", device.name, action, workers, reason)


def fit(scheduler: Scheduler, settings: PoolSettings) -> list[WorkerInfo]:
    """workers_per_device="fit" (or adaptive=True), before any work: per device, add one worker
    at a time until one fails to load or the device lacks memory for another copy
    (MEMORY_HEADROOM), or max_workers_per_device; the workers that stayed."""
    workers: list[WorkerInfo] = []
    for device in dict.fromkeys(settings.devices):
        for copy in range(settings.max_workers_per_device):
            info = settings.worker(len(workers), device, copy)
            scheduler.spawn(info)
            try:
                ready = scheduler.await_ready([info.index])
            except PipelineError as exc:
                if copy == 0:
                    raise
                scheduler.discard(info.index)
                log.warning("fit: worker %d on %s failed to start (%s); keeping %d",
                            copy + 1, device, exc, copy)
                break
            workers.append(info)
            if short_of_memory(ready[info.index], MEMORY_HEADROOM):
                log.info("fit: %s has %.0f MiB free after %d copies of %.0f MiB; "
                         "stopping there", device, ready[info.index].free_mib, copy + 1,
                         ready[info.index].model_mib)
                break
    return workers
