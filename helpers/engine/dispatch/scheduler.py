"""Which workunit goes to which worker, and what happens when a worker or a workunit fails.

The scheduler lives in the driver's main thread and owns every workunit from the moment it leaves
the reader until its result is written: a workunit is in exactly one place at a time (waiting in
the taker, helpers.engine.dispatch.taker, or in flight on one worker), and a result counts only if its workunit is in flight on
the worker that sent it, so nothing is written twice and nothing is dropped.

Recovery, per failure::

    worker dies (signal, os._exit) ─┐
    workunit times out (killed) ────┼─► the workunit it was running failed; the rest it held
    workunit raises ────────────────┘   go back to the front of the line; a dead worker is
                                        replaced on the same device (up to max_restarts)
    worker's machine lost (a Ray node): all it held goes back to the line, charged nothing
    failed workunit: retried whole up to ``retries`` times, then split in halves, and so on down
                     to single records; a single record that still fails goes to ``errors``
    out of memory:   split in halves at once; that worker takes at most the smaller size from
                     then on, down to one record
    a worker's second failure in a row: the worker is replaced (process and ray backends) and that
                     workunit requeued without charge, in case the fault is the worker's own
                     (a broken CUDA context), not its workunits'
    a death or timeout while a worker holds several workunits, on a backend whose answers come
                     back a message at a time (a Ray call; a death may lose the answers of the
                     calls just before it), or on a worker that overlaps them (Ready.overlaps:
                     it starts the next before it finishes the last): which one did it is not
                     known, so all are requeued
                     without charge, each to be sent ``alone`` (nothing else in flight on its
                     worker), where a death is its own

Messages: a worker gets up to ``per_message`` workunits in one message (``units_per_message``:
fewer messages, so less of the driver's CPU per workunit; with ``growing_messages`` and fixed
workunit sizes, more for a worker whose workunits take under MESSAGE_SECONDS, up to about that
much of its work, at most twice its last message's: ``message_size``; the reader queues as
much as the scheduler takes), and holds up to PREFETCH messages, one
running and one waiting (``Slot.messages``); the next message goes out once a whole message's
answers are back. A worker that overlaps workunits (``Ready.overlaps``) starts each before it
answers the one before, so a workunit's timeout, counted from when it heads the worker's
queue, also spans the start of the next. Near the end of a job, a message takes a second
workunit only while a message's worth is left for every worker (and a second message waits
behind the running one only while one workunit is), so that the last workunits go one at a time
to whichever worker is free first. A workunit to be sent alone goes to a worker holding nothing,
and nothing goes behind it.

Names, each for one thing: a *slot* is a worker's place in the pool (a replacement takes the same
slot) and is LOADING, READY, DRAINING (retired once it has finished what it holds) or RETIRED;
the scheduler *kills* a worker for a reason (a workunit TIMEOUT, a LOAD_TIMEOUT, or to RECYCLE
it), and *retires* one the pool no longer wants (helpers.engine.dispatch.growth); *recovery* is the
tally of what it recovered from (deaths, timeouts, restarts, retries, splits, ...), reported per job
as ``PipelineStats.recovery``; the words for what goes wrong (*rejected*, *Failed*, *given up*,
*died*) are helpers.engine.contract.messages'.
"""
from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from helpers.engine.contract.messages import (POLL_SECONDS, Died, Failed, Ready, Result, WorkerInfo,
                                              Workunit)
from helpers.engine.contract.protocol import Rows
from helpers.engine.contract.settings import (MAX_UNITS_PER_MESSAGE, MESSAGE_RECORDS,
                                              MESSAGE_SECONDS, PoolSettings)
from helpers.engine.dispatch.failures import (Failures, PipelineError, Recovery, RefusedOption,
                                              RemoteTraceback, remote_error)
from helpers.engine.dispatch.slots import Slot, State, answered
from helpers.engine.dispatch.taker import Feed, Taker
from helpers.engine.workers.backends import Backend, Wakeup

__all__ = ["Dispatches", "Feed", "PipelineError", "Recovery", "RefusedOption", "RemoteTraceback",
           "Scheduler", "remote_error"]

log = logging.getLogger("gpufeed")

PREFETCH = 2  # messages in flight per worker: one running, one waiting behind it
UNIT_SECONDS_WEIGHT = 0.2  # a shorter workunit's weight in its worker's average (_slow_to_fall)


@dataclass
class Dispatches:
    """When messages of workunits were sent in a job: the first, the last, the longest gap
    between two (nothing dispatched for that long), and how many."""

    first: float | None = None
    last: float = 0.0
    longest_gap: float = 0.0
    messages: int = 0

    def note(self, now: float) -> None:
        self.messages += 1
        if self.first is None:
            self.first = now
        else:
            self.longest_gap = max(self.longest_gap, now - self.last)
        self.last = now


class Scheduler:
    """Feeds workunits to the backend's workers and recovers from their failures.

    What may be done to it, from outside helpers.engine.dispatch, is its public methods and
    properties (tests/test_imports.py checks that nothing else is touched): workers
    (``start``, ``spawn``, ``await_ready``, ``discard``, ``retire``; ``slots``, ``live``, read
    only), a job (``new_job``, then ``dispatch``, ``next_messages``, ``handle``,
    ``check_timeouts`` until ``idle``; ``wake`` from the reader's thread), and what it
    measured (``dispatches``, ``recovery``, ``take_recovery``). A workunit's size and the
    workunits waiting are the ``taker``'s (helpers.engine.dispatch.taker), which the pool holds
    too; the start's check asks each worker through its public methods (probe.ask_each).
    """

    def __init__(self, backend: Backend, workers: list[WorkerInfo], settings: PoolSettings,
                 taker: Taker | None = None) -> None:
        self.backend, self.settings = backend, settings
        self.taker = taker if taker is not None else Taker()
        self._slots = {info.index: Slot(info) for info in workers}
        self._failures = Failures(backend, settings, self.taker, self.spawn, lambda: self.live)
        self._dispatches = Dispatches()
        self._wakeup = Wakeup(backend.events)
        self._stamp: Callable[[Workunit], Workunit] | None = None  # writes="workers": a
        # workunit as it is sent, with where its worker writes its part (a part of its own each)
        self._per_message = 1  # workunits in one message to a worker (set per job)
        self._growing_messages = False  # more for a worker whose workunits are short (set too)

    @property
    def slots(self) -> MappingProxyType[int, Slot]:
        """Every worker's slot, by index (read only: the scheduler alone changes a slot)."""
        return MappingProxyType(self._slots)

    @property
    def dispatches(self) -> Dispatches:
        """When this job's messages were sent."""
        return self._dispatches

    @property
    def recovery(self) -> Recovery:
        """What was recovered from since the last ``take_recovery`` (read only)."""
        return self._failures.recovery

    def take_recovery(self) -> Recovery:
        """What was recovered from since the last call (the first includes spin-up)."""
        recovery, self._failures.recovery = self._failures.recovery, Recovery()
        return recovery

    def wake(self) -> None:
        """End a wait in ``next_messages`` (from another thread: the reader's)."""
        self._wakeup.wake()

    # -- workers -------------------------------------------------------------------------------

    def spawn(self, info: WorkerInfo, optional: bool = False) -> None:
        """Start a worker in slot ``info.index``; an ``optional`` one that fails to start is
        retired (the pool goes on without it) instead of failing the run."""
        slot = self._slots.setdefault(info.index, Slot(info, optional=optional))
        slot.state, slot.since, slot.ready = State.LOADING, time.monotonic(), None
        slot.unit_s = None  # (a replacement may be on another machine)
        self.backend.spawn(info)

    def retire(self, index: int) -> None:
        """Take the worker in slot ``index`` out of the pool once it has finished what it holds."""
        slot = self._slots[index]
        slot.state = State.DRAINING
        self.taker.forget(index)
        self._retire_if_drained(slot)

    def _retire_if_drained(self, slot: Slot) -> None:
        if slot.state is State.DRAINING and not slot.in_flight:
            slot.state = State.RETIRED  # its Died is expected: not counted, not replaced
            self.backend.kill(slot.info.index)

    def start(self) -> dict[int, Ready]:
        """Spawn every worker and wait until each is Ready; PipelineError if one fails."""
        for slot in list(self._slots.values()):
            self.spawn(slot.info)
        return self.await_ready(list(self._slots))

    def await_ready(self, slots: list[int]) -> dict[int, Ready]:
        timeout = self.settings.load_timeout
        deadline = time.monotonic() + timeout
        while any(self._slots[s].state is State.LOADING for s in slots):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = [str(self._slots[s].info) for s in slots
                           if self._slots[s].state is State.LOADING]
                raise PipelineError(f"{', '.join(waiting)} not ready after {timeout:.0f} s "
                                    f"(load_timeout): model load hung or is too slow")
            for index, message in self.next_messages(min(remaining, POLL_SECONDS)):
                self._failures.while_starting(self._slots.get(index), message)
                self.handle(index, message)  # a death while loading: a replacement starts
        return {s: self._slots[s].ready for s in slots}

    def next_messages(self, timeout: float) -> list[tuple[int, Any]]:
        """Every ``(slot, message)`` waiting; waits up to ``timeout`` for the first, less if
        woken (``wakeup``: then possibly none)."""
        try:
            items = [self.backend.events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                items.append(self.backend.events.get_nowait())
            except queue.Empty:
                return Wakeup.drop(items)

    def discard(self, index: int) -> None:
        """Stop and forget the worker in slot ``index`` (it never became part of the pool)."""
        self.backend.kill(index)
        del self._slots[index]

    @property
    def live(self) -> list[Slot]:
        return [s for s in self._slots.values() if s.state is not State.RETIRED]

    # -- work ----------------------------------------------------------------------------------

    def new_job(self, per_message: int, growing_messages: bool = False,
                stamp: Callable[[Workunit], Workunit] | None = None) -> None:
        """Messages of ``per_message`` workunits for the next job, growing or not (with fixed
        sizes: ``message_size``), each workunit ``stamp``ed as it is sent (writes="workers");
        what an earlier job's workunits took, and when its messages went, are forgotten."""
        self._per_message, self._growing_messages, self._stamp = \
            per_message, growing_messages, stamp
        self._dispatches = Dispatches()
        for slot in self._slots.values():
            slot.unit_s = None

    @property
    def idle(self) -> bool:
        return not self.taker.waiting and not any(s.in_flight for s in self._slots.values())

    def dispatch(self, feed: Feed) -> None:
        """Give each ready worker a message of workunits (retried ones first, then the feed's),
        then a second to wait behind the running one while there is enough left for every worker
        (the feed's backlog), so that the last workunits of a job go to whichever worker is free
        first, not behind a slow worker's running one. One left short (the feed held too
        little) is owed more: the feed wakes this scheduler when records come after its look."""
        mark = feed.records_put
        ready = [s for s in self._slots.values() if s.state is State.READY]
        self._give(feed, ready)
        if any(len(s.messages) < PREFETCH and _takes_more(s) for s in ready):
            feed.wake_on_more(mark)

    def _give(self, feed: Feed, ready: list[Slot]) -> None:
        indexes = [s.info.index for s in ready]
        for depth in range(PREFETCH):
            for slot in [s for s in ready if len(s.messages) == depth and _takes_more(s)]:
                if depth and not self.taker.enough_left(feed, indexes):
                    return
                message = self._message_for(slot, feed, indexes)
                if not message:
                    if not self.taker.waiting:
                        return  # nothing left to give anyone
                    continue  # what waits is pinned to other workers
                now = time.monotonic()
                if not slot.in_flight:
                    slot.head_since = now
                slot.in_flight.extend(message)
                slot.messages.append({unit.index for unit in message})
                slot.last_message = len(message)
                slot.held = max(0 if isinstance(u.records, Rows) else len(u) for u in message)
                if self._stamp is not None:
                    message = [self._stamp(unit) for unit in message]
                self.backend.send(slot.info.index, message)
                self._dispatches.note(now)

    def _message_for(self, slot: Slot, feed: Feed, ready: list[int]) -> list[Workunit]:
        """Up to ``per_message`` workunits for one message to ``slot``: one at least if there is
        one for it, more while a message's worth is left for every worker (counting those this
        message took); a workunit to be sent ``alone`` only to a slot holding nothing, by itself."""
        message: list[Workunit] = []
        size = self.message_size(slot)
        while len(message) < size:
            if message and not self.taker.enough_left(feed, ready, size, message):
                break
            unit = self.taker.next_for(slot.info.index, ready, feed,
                                       alone=not (message or slot.in_flight))
            if unit is None:
                break
            message.append(unit)
            if unit.alone:
                break
        return message

    def message_size(self, slot: Slot) -> int:
        """Workunits in a message to ``slot``: ``per_message``, or where messages grow (fixed
        workunit sizes: auto sizes make each workunit about a second already), as many as its
        worker runs in about MESSAGE_SECONDS, at most twice its last message's,
        MAX_UNITS_PER_MESSAGE, and MESSAGE_RECORDS of records the driver holds."""
        if not self._growing_messages or self.taker.auto or slot.unit_s is None:
            return self._per_message
        fit = int(MESSAGE_SECONDS / max(slot.unit_s, 1e-6))
        if slot.held:
            fit = min(fit, MESSAGE_RECORDS // slot.held)
        return max(self._per_message, min(MAX_UNITS_PER_MESSAGE, 2 * slot.last_message, fit))

    # -- messages ------------------------------------------------------------------------------

    def handle(self, index: int, message: Any) -> tuple[list[Result], list[tuple]]:
        """Act on one message; returns (results to write, records given up on)."""
        slot = self._slots.get(index)
        if slot is None:  # a worker discarded while it started ("fit")
            return [], []
        if isinstance(message, Ready):
            if slot.state is State.LOADING:
                if slot.restarts:
                    self._failures.recovery.restart_s.append(time.monotonic() - slot.since)
                slot.state, slot.ready, slot.optional = State.READY, message, False
            return [], []
        if isinstance(message, Result):
            unit = answered(slot, message.workunit)
            if unit is None and message.part is not None:
                message.part.discard()  # its workunit is redone, or done, elsewhere
            slot.failures_in_a_row = 0
            if unit is not None and len(message.ids):  # (all rejected: says nothing of the rest)
                slot.unit_s = _slow_to_fall(slot.unit_s, message.compute_s)
            if unit is not None:
                self.taker.observe(index, len(message.ids) + len(message.rejected),
                                   message.compute_s)
            self._retire_if_drained(slot)
            return ([message] if unit is not None else []), []
        if isinstance(message, Failed):
            return [], self._failures.failed(slot, message)
        if isinstance(message, Died):
            return [], self._failures.died(slot, message)
        raise TypeError(f"unexpected message from {slot.info}: {type(message).__name__}")

    def check_timeouts(self) -> None:
        """Kill workers stuck on a workunit (or a model load) for longer than allowed."""
        self._failures.check_timeouts(self._slots.values())

def _takes_more(slot: Slot) -> bool:
    """Whether a message may go to ``slot`` beside what it holds (not beside one sent alone)."""
    return not (slot.in_flight and slot.in_flight[0].alone)


def _slow_to_fall(average: float | None, seconds: float) -> float:
    """A workunit's ``seconds`` into its worker's ``average``: a longer one at once (messages
    shrink on the first long workunit), a shorter one by UNIT_SECONDS_WEIGHT (they grow slowly)."""
    if average is None or seconds >= average:
        return seconds
    return average + UNIT_SECONDS_WEIGHT * (seconds - average)
