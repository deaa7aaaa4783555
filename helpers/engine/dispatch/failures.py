"""What the scheduler does when a worker or a workunit fails: the failures' side of
helpers.engine.dispatch.scheduler (whose docstring draws the cases), carried out on the slots,
the taker's line of workunits and the tally of what was recovered from.

Recovery's decisions (helpers.engine.dispatch.recovery: retried, split, charged, given up) are
taken there, from what happened; here they are applied: workunits back to the taker (its
``requeue``, its ``cap`` after an out-of-memory), counts into ``Recovery``, a dead worker
replaced through the scheduler's ``spawn`` (up to ``max_restarts``), a stuck one killed
(``check_timeouts``), and the errors that end a run raised (``PipelineError``: storage a worker
cannot use, a model that fails to load, every worker gone).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from helpers.engine.contract.messages import UNREADABLE, UNWRITABLE, Died, Failed, WorkerInfo
from helpers.engine.contract.protocol import OptionRefused
from helpers.engine.contract.settings import PoolSettings
from helpers.engine.dispatch.recovery import Decision, after_death, retry_or_split
from helpers.engine.dispatch.slots import Kill, Slot, State, answered
from helpers.engine.dispatch.taker import Taker
from helpers.engine.workers.backends import IMPORTED_MAIN, IMPORTED_MAIN_EXIT, Backend

log = logging.getLogger("gpufeed")

RECYCLE_AFTER = 2  # failed workunits in a row after which a process worker is replaced (and the
# last failure not charged to its workunit): a CUDA error such as a device-side assert leaves the
# worker's context unusable, so that every later call fails, whatever the workunit


class PipelineError(RuntimeError):
    """A run cannot go on: a model failed to load, or every worker is gone."""


class RefusedOption(PipelineError, ValueError):
    """A worker's OptionRefused, in the driver: a bad argument (ValueError), found where the
    model loads."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a PipelineError."""

    def __str__(self) -> str:
        return "\n\n" + self.args[0]


@dataclass
class Recovery:
    """What the scheduler recovered from: counts, and the seconds each replacement took."""

    deaths: int = 0
    timeouts: int = 0
    restarts: int = 0
    retries: int = 0
    splits: int = 0
    oom_backoffs: int = 0
    failed_workunits: int = 0
    recycles: int = 0
    restart_s: list = field(default_factory=list)  # spawn to Ready of each replacement

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "restart_s"} | {
            "restart_s": [round(s, 3) for s in self.restart_s]}


class Failures:
    """Applies recovery to the slots of one scheduler: ``failed`` and ``died`` for a worker's
    messages, ``check_timeouts`` for the ones that never come; ``recovery`` counts it all."""

    def __init__(self, backend: Backend, settings: PoolSettings, taker: Taker,
                 spawn: Callable[[WorkerInfo], None], live: Callable[[], list[Slot]]) -> None:
        self.backend, self.settings, self.taker = backend, settings, taker
        self._spawn, self._live = spawn, live  # the scheduler's: a replacement, the pool left
        self.recovery = Recovery()

    def while_starting(self, slot: Slot | None, message: Any) -> None:
        """PipelineError where a message while workers start ends the run: a model that failed
        to load, a worker that could not start at all (a main module without its guard), or one
        that died loading with no restart left."""
        if isinstance(message, Failed):
            raise remote_error(message)
        if isinstance(message, Died) and message.exitcode == IMPORTED_MAIN_EXIT:
            raise PipelineError(f"{slot.info if slot else 'a worker'} could not start: "
                                f"{IMPORTED_MAIN}")
        if isinstance(message, Died) and slot is not None and slot.state is State.LOADING \
                and slot.restarts >= self.settings.max_restarts:
            raise PipelineError(f"{slot.info} died unexpectedly ({message.how()}) while "
                                f"starting or loading its model")

    def check_timeouts(self, slots: Iterable[Slot]) -> None:
        """Kill workers stuck on a workunit (or a model load) for longer than allowed."""
        now, limit = time.monotonic(), self.settings.workunit_timeout
        for slot in slots:
            if slot.killed is not None:
                continue
            size = self.running_call(slot)  # answered together: each of its workunits' time
            if slot.state in (State.READY, State.DRAINING) and slot.in_flight \
                    and limit is not None and now - slot.head_since > limit * size:
                unit = slot.in_flight[0]
                slot.kill_unit = unit.index
                together = f" (with {size - 1} more in its call, answered together)" \
                    if size > 1 else ""
                log.warning("%s: %s%s ran past workunit_timeout=%gs; killing the worker",
                            slot.info, unit.describe(), together, limit)
                self.recovery.timeouts += 1
                self._kill(slot, Kill.TIMEOUT, f"no result after {limit * size:g} s "
                                               f"(workunit_timeout{together}); {slot.info} was "
                                               f"killed")
            elif slot.state is State.LOADING and now - slot.since > self.settings.load_timeout:
                self._kill(slot, Kill.LOAD_TIMEOUT, f"{slot.info} not ready after "
                                                    f"{self.settings.load_timeout:g} s (load_timeout)")

    def running_call(self, slot: Slot) -> int:
        """Workunits in the message ``slot``'s worker runs, where a message's answers come back
        together (a Ray call); else 1 (each is answered as it ends)."""
        if self.backend.answers_together and slot.messages:
            return len(slot.messages[0])
        return 1

    def _kill(self, slot: Slot, why: Kill, message: str = "") -> None:
        slot.killed, slot.kill_message = why, message
        self.backend.kill(slot.info.index)

    def failed(self, slot: Slot, message: Failed) -> list[tuple]:
        """A worker reports that a workunit (or its model load) raised; returns the records
        given up on."""
        if message.workunit is None:
            self._load_failed(slot, message)
            return []
        unit = answered(slot, message.workunit)
        if unit is None:
            return []
        if message.error_type in (UNWRITABLE, UNREADABLE):  # storage, not records: no retry
            raise remote_error(message)
        if not message.out_of_memory:
            slot.failures_in_a_row += 1
        recycling = slot.killed is Kill.RECYCLE
        if recycling or (slot.failures_in_a_row >= RECYCLE_AFTER
                         and self.backend.recyclable and slot.killed is None):
            self.taker.requeue([replace(unit, pinned=None)])  # not charged: the worker is
            if not recycling:                                    # suspect, not the workunit
                log.warning("%s: %d workunits failed in a row; replacing the worker in case the "
                            "fault is its own (e.g. a CUDA context left unusable)", slot.info,
                            slot.failures_in_a_row)
                self.recovery.recycles += 1
                self._kill(slot, Kill.RECYCLE)  # (a unit queued behind may fail before it lands)
            return []
        return self._apply(slot, retry_or_split(str(slot.info), unit, message.error_type,
                                                message.message, message.out_of_memory,
                                                self.settings.retries,
                                                self.taker.cap(slot.info.index)), failed=True)

    def died(self, slot: Slot, message: Died) -> list[tuple]:
        """A worker is gone: what it held goes again (or is charged), and it is replaced;
        returns the records given up on."""
        if slot.state is State.RETIRED:
            return []
        if slot.optional and slot.state is State.LOADING:
            log.warning("%s died (%s) while loading its model; the pool goes on without it",
                        slot.info, message.how())
            slot.state = State.RETIRED
            return []
        why, culprit = slot.killed, slot.kill_unit
        error = (why.value, slot.kill_message) if why is not None else \
            ("WorkerDied", f"{slot.info} died ({message.how()})")
        slot.killed, slot.kill_message, slot.kill_unit, slot.failures_in_a_row = None, "", None, 0
        self.recovery.deaths += 1
        units = list(slot.in_flight)
        overlapping = len(units) > 1 and slot.ready is not None and slot.ready.overlaps
        if why is Kill.TIMEOUT:  # its running message hung: which of its workunits?
            unknown = self.running_call(slot) > 1 or overlapping
        else:  # the answers of the messages before the one it died in may be lost with it
            unknown = len(units) > 1 and self.backend.answers_together or overlapping
        slot.in_flight.clear()
        slot.messages.clear()
        # not theirs: we stopped it, its machine went away, or the workunit that timed out
        # finished before the kill landed; suspects, where unknown: of an overlapping worker's,
        # the two it had started
        not_theirs = why is Kill.RECYCLE or message.lost or \
            bool(units and culprit not in (None, units[0].index))
        suspects = len(units) if self.backend.answers_together else 2
        decision = after_death(error[1], units, not_theirs, unknown, suspects)
        given_up = self._apply(slot, decision)
        if not units and not not_theirs:
            log.warning("%s died (%s) %s", slot.info, message.how(),
                        "while loading its model" if slot.state is State.LOADING
                        else "between workunits")
        if decision.charge is not None:
            given_up += self._apply(slot, retry_or_split(
                str(slot.info), decision.charge, *error, out_of_memory=False,
                retries=self.settings.retries, cap=self.taker.cap(slot.info.index)), failed=True)
        self._replace(slot, message.how())
        return given_up

    def _replace(self, slot: Slot, how: str) -> None:
        if slot.state is State.DRAINING:  # it was being retired anyway
            slot.state = State.RETIRED
            return
        if slot.restarts >= self.settings.max_restarts:
            slot.state = State.RETIRED
            log.error("%s: no restart left (max_restarts=%d); the slot is retired",
                      slot.info, self.settings.max_restarts)
            if not self._live():
                raise PipelineError(f"every worker is gone: the last, {slot.info}, died ({how}) "
                                    f"after {slot.restarts} restarts (max_restarts)")
            return
        slot.restarts += 1
        self.recovery.restarts += 1
        log.warning("%s: starting a replacement (restart %d of %d)", slot.info, slot.restarts,
                    self.settings.max_restarts)
        self._spawn(slot.info)

    def _load_failed(self, slot: Slot, message: Failed) -> None:
        if not slot.restarts and not slot.optional:
            raise remote_error(message)
        slot.state = State.RETIRED  # it loaded once: what changed is the device (memory), not us
        log.log(logging.WARNING if slot.optional else logging.ERROR,
                "%s: %s failed to load (%s: %s); the slot is retired", slot.info,
                "an added worker" if slot.optional else "replacement", message.error_type,
                message.message)
        self.backend.kill(slot.info.index)
        if not self._live():
            raise remote_error(message)

    def _apply(self, slot: Slot, decision: Decision, failed: bool = False) -> list[tuple]:
        """Carry out a recovery decision about ``slot``'s workunits (``failed``: one of them
        failed, a Recovery count); returns the records given up on."""
        if failed:
            self.recovery.failed_workunits += 1
        if decision.count is not None:
            setattr(self.recovery, decision.count, getattr(self.recovery, decision.count) + 1)
        if decision.cap is not None:
            self.taker.cap(slot.info.index, decision.cap)
        if decision.given_up:
            record_id, error_type, message, _ = decision.given_up[0]
            log.error("record %d failed: %s: %s", record_id, error_type, message)
        elif decision.warning:
            log.warning("%s", decision.warning)
        self.taker.requeue(decision.requeue, decision.renumber)
        return list(decision.given_up)


def remote_error(message: Failed) -> PipelineError:
    """A PipelineError naming the worker, its device and the workunit, with the remote traceback."""
    kind = RefusedOption if message.error_type == OptionRefused.__name__ else PipelineError
    error = kind(f"worker {message.worker} on {message.device} failed in {message.where}: "
                 f"{message.error_type}: {message.message}")
    error.__cause__ = RemoteTraceback(message.traceback)
    error.worker, error.device, error.workunit = message.worker, message.device, message.where
    return error
