"""Which workunit goes to which worker, and what happens when a worker or a workunit fails.

The scheduler lives in the driver's main thread and owns every workunit from the moment it leaves
the reader until its result is written: a workunit is in exactly one place at a time (waiting in
``pending``, or in flight on one worker), and a result counts only if its workunit is in flight on
the worker that sent it, so nothing is written twice and nothing is dropped.

Recovery, per failure::

    worker dies (signal, os._exit) ─┐
    workunit times out (killed) ────┼─► the workunit it was running failed; the rest it held
    workunit raises ────────────────┘   go back to the front of ``pending``; a dead worker is
                                        replaced on the same device (up to max_restarts)
    worker's machine lost (a Ray node): all it held goes back to ``pending``, charged nothing
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

import itertools
import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from helpers.engine.contract.messages import (POLL_SECONDS, UNREADABLE, UNWRITABLE, Died, Failed,
                                              Ready, Result, WorkerInfo, Workunit)
from helpers.engine.contract.protocol import OptionRefused, Rows
from helpers.engine.contract.settings import (MAX_UNITS_PER_MESSAGE, MESSAGE_RECORDS,
                                              MESSAGE_SECONDS, PoolSettings)
from helpers.engine.dispatch.recovery import Decision, after_death, cut, retry_or_split
from helpers.engine.dispatch.slots import Kill, Slot, State
from helpers.engine.measure.sizing import Sizing
from helpers.engine.workers.backends import IMPORTED_MAIN, IMPORTED_MAIN_EXIT, Backend, Wakeup

log = logging.getLogger("gpufeed")

PREFETCH = 2  # messages in flight per worker: one running, one waiting behind it
UNIT_SECONDS_WEIGHT = 0.2  # a shorter workunit's weight in its worker's average (_slow_to_fall)
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


class Feed(Protocol):
    """Where new records come from (the reader; nothing more, for a static split). The
    scheduler alone decides how many a workunit holds; the feed is never told."""

    def take(self, n: int) -> Workunit | None:
        """A workunit of up to ``n`` records (fewer at the end of what the feed holds together),
        or None if none is waiting."""

    def backlog(self, n: int) -> int:
        """Workunits of ``n`` records waiting, or about to be (0 once the source is exhausted)."""

    def remaining(self) -> int | None:
        """Records not taken yet, or None while that is not known."""

    def exhausted(self) -> bool:
        """Whether every record has been taken."""


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
    """Feeds workunits to the backend's workers and recovers from their failures."""

    def __init__(self, backend: Backend, workers: list[WorkerInfo], settings: PoolSettings) -> None:
        self.backend, self.settings = backend, settings
        self.slots = {info.index: Slot(info) for info in workers}
        self.pending: deque[Workunit] = deque()
        self.recovery = Recovery()
        self.dispatches = Dispatches()
        self.wakeup = Wakeup(backend.events)
        self.sizing: Sizing | None = None  # per-worker workunit sizes (workunit_size="auto")
        self.stamp: Callable[[Workunit], Workunit] | None = None  # writes="workers": a workunit
        # as it is sent, with where its worker writes its part (each sending a part of its own)
        self.per_message = 1  # workunits in one message to a worker (set per job by the pool)
        self.workunit_size: int | None = None  # records a workunit, where sizes are fixed (set
        # per job too; None: a workunit as it is, a static split's slice)
        self.growing_messages = False  # more for a worker whose workunits are short (set too)
        self._numbers = itertools.count()

    # -- workers -------------------------------------------------------------------------------

    def spawn(self, info: WorkerInfo, optional: bool = False) -> None:
        """Start a worker in slot ``info.index``; an ``optional`` one that fails to start is
        retired (the pool goes on without it) instead of failing the run."""
        slot = self.slots.setdefault(info.index, Slot(info, optional=optional))
        slot.state, slot.since, slot.ready = State.LOADING, time.monotonic(), None
        slot.unit_s = None  # (a replacement may be on another machine)
        self.backend.spawn(info)

    def retire(self, index: int) -> None:
        """Take the worker in slot ``index`` out of the pool once it has finished what it holds."""
        slot = self.slots[index]
        slot.state = State.DRAINING
        if self.sizing is not None:
            self.sizing.forget(index)
        self._retire_if_drained(slot)

    def _retire_if_drained(self, slot: Slot) -> None:
        if slot.state is State.DRAINING and not slot.in_flight:
            slot.state = State.RETIRED  # its Died is expected: not counted, not replaced
            self.backend.kill(slot.info.index)

    def start(self) -> dict[int, Ready]:
        """Spawn every worker and wait until each is Ready; PipelineError if one fails."""
        for slot in list(self.slots.values()):
            self.spawn(slot.info)
        return self.await_ready(list(self.slots))

    def await_ready(self, slots: list[int]) -> dict[int, Ready]:
        timeout = self.settings.load_timeout
        deadline = time.monotonic() + timeout
        while any(self.slots[s].state is State.LOADING for s in slots):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = [str(self.slots[s].info) for s in slots
                           if self.slots[s].state is State.LOADING]
                raise PipelineError(f"{', '.join(waiting)} not ready after {timeout:.0f} s "
                                    f"(load_timeout): model load hung or is too slow")
            for index, message in self.next_messages(min(remaining, POLL_SECONDS)):
                slot = self.slots.get(index)
                if isinstance(message, Failed):
                    raise remote_error(message)
                if isinstance(message, Died) and message.exitcode == IMPORTED_MAIN_EXIT:
                    raise PipelineError(f"{slot.info if slot else 'a worker'} could not start: "
                                        f"{IMPORTED_MAIN}")
                if isinstance(message, Died) and slot is not None \
                        and slot.state is State.LOADING \
                        and slot.restarts >= self.settings.max_restarts:
                    raise PipelineError(f"{slot.info} died unexpectedly ({message.how()}) while "
                                        f"starting or loading its model")
                self.handle(index, message)  # a death while loading: a replacement starts
        return {s: self.slots[s].ready for s in slots}

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
        del self.slots[index]

    @property
    def live(self) -> list[Slot]:
        return [s for s in self.slots.values() if s.state is not State.RETIRED]

    # -- work ----------------------------------------------------------------------------------

    def number(self, unit: Workunit) -> Workunit:
        """The same workunit under an index no other workunit of this pool has."""
        return replace(unit, index=next(self._numbers))

    def new_job(self, per_message: int, growing_messages: bool = False,
                sizing: Sizing | None = None, workunit_size: int | None = None) -> None:
        """Messages of ``per_message`` workunits for the next job, growing or not, and its
        workunits' ``sizing`` (workunit_size="auto") or, if None, their fixed ``workunit_size``
        (None: as they are, a static split's slices); what an earlier job's workunits took is
        forgotten (this one's may be of another size)."""
        self.per_message, self.growing_messages, self.sizing = per_message, growing_messages, sizing
        self.workunit_size = workunit_size
        for slot in self.slots.values():
            slot.unit_s = None

    @property
    def idle(self) -> bool:
        return not self.pending and not any(s.in_flight for s in self.slots.values())

    def dispatch(self, feed: Feed) -> None:
        """Give each ready worker a message of workunits (retried ones first, then the feed's),
        then a second to wait behind the running one while there is enough left for every worker
        (the feed's backlog), so that the last workunits of a job go to whichever worker is free
        first, not behind a slow worker's running one."""
        ready = [s for s in self.slots.values() if s.state is State.READY]
        for depth in range(PREFETCH):
            for slot in [s for s in ready if len(s.messages) == depth
                         and not (s.in_flight and s.in_flight[0].alone)]:
                if depth and not self._enough_left(feed, ready):
                    return
                message = self._message_for(slot, feed, ready)
                if not message:
                    if not self.pending:
                        return  # nothing left to give anyone
                    continue  # what is pending is pinned to other workers
                now = time.monotonic()
                if not slot.in_flight:
                    slot.head_since = now
                slot.in_flight.extend(message)
                slot.messages.append({unit.index for unit in message})
                slot.last_message = len(message)
                slot.held = max(0 if isinstance(u.records, Rows) else len(u) for u in message)
                if self.stamp is not None:
                    message = [self.stamp(unit) for unit in message]
                self.backend.send(slot.info.index, message)
                self.dispatches.note(now)

    def _message_for(self, slot: Slot, feed: Feed, ready: list[Slot]) -> list[Workunit]:
        """Up to ``per_message`` workunits for one message to ``slot``: one at least if there is
        one for it, more while a message's worth is left for every worker (counting those this
        message took); a workunit to be sent ``alone`` only to a slot holding nothing, by itself."""
        message: list[Workunit] = []
        size = self.message_size(slot)
        while len(message) < size:
            if message and not self._enough_left(feed, ready, size, message):
                break
            unit = self._next_for(slot, feed, alone=not (message or slot.in_flight))
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
        if not self.growing_messages or self.sizing is not None or slot.unit_s is None:
            return self.per_message
        fit = int(MESSAGE_SECONDS / max(slot.unit_s, 1e-6))
        if slot.held:
            fit = min(fit, MESSAGE_RECORDS // slot.held)
        return max(self.per_message, min(MAX_UNITS_PER_MESSAGE, 2 * slot.last_message, fit))

    def _enough_left(self, feed: Feed, ready: list[Slot], each: int = 1,
                     taken: list[Workunit] = ()) -> bool:
        """Whether a second workunit may wait behind a worker's running one (or go in the same
        message: ``each`` a worker left, a message's worth, counting those ``taken`` for it): not
        at the end of a job, when the last workunits should go to whichever worker is free
        first."""
        if self.sizing is None:
            return len(self.pending) + feed.backlog(self.workunit_size or 1) + len(taken) >= \
                len(ready) * each
        left = self._remaining(feed)
        return left is None or \
            left + sum(map(len, taken)) >= sum(self._size(s, None) for s in ready) * each

    def _remaining(self, feed: Feed) -> int | None:
        """Records of the job not yet dispatched, or None while the feed cannot tell."""
        left = feed.remaining()
        return None if left is None else left + sum(len(u) for u in self.pending)

    def _size(self, slot: Slot, remaining: int | None) -> int | None:
        """The most records ``slot`` takes in one workunit: its Sizing target, or the job's fixed
        size (None: a workunit as it is), and never more than its out-of-memory cap."""
        size = self.workunit_size
        if self.sizing is not None:
            ready = None if remaining is None else \
                [s.info.index for s in self.slots.values() if s.state is State.READY]
            size = self.sizing.size(slot.info.index, remaining, ready)  # (shared only at the end)
        if slot.cap is not None:
            size = slot.cap if size is None else min(size, slot.cap)
        return size

    def _next_for(self, slot: Slot, feed: Feed, alone: bool = True) -> Workunit | None:
        """The next workunit for ``slot`` (None: none for it); one to be sent alone only if
        ``alone`` (else it stays first in line, uncut, for a worker holding nothing)."""
        size = self._size(slot, self._remaining(feed) if self.sizing else None)  # (this one's
        # records among those left)
        unit = None
        for candidate in self.pending:
            if candidate.pinned in (None, slot.info.index):
                unit = candidate
                break
        if unit is not None:
            if unit.alone and not alone:
                return None
            self.pending.remove(unit)
        else:
            unit = None if size is None else feed.take(size)  # (None: a static split's job)
            if unit is None:
                return None
            unit = self.number(unit)
        if self.sizing is not None and _fresh(unit):  # a window's end, a cut's rest: joined
            while len(unit) < size and \
                    (more := self._fresh_pending() or feed.take(size - len(unit))) is not None:
                unit = _joined(unit, more)
        limit = size if self.sizing is not None else slot.cap  # (with fixed sizes a workunit
        # keeps the size it was taken at, a static split's slice its own: only a cap cuts it)
        if limit is not None and len(unit) > limit:  # a retried or joined one over it
            first, rest = cut(unit, limit)
            self.pending.appendleft(self.number(rest))
            unit = self.number(first)
        return unit

    def _fresh_pending(self) -> Workunit | None:
        """A workunit waiting in ``pending`` that never failed and is nobody's (the rest of a
        cut), or None."""
        for unit in self.pending:
            if _fresh(unit):
                self.pending.remove(unit)
                return unit
        return None

    def ask_each(self, units: dict[int, Workunit], seconds: float) -> dict[int, Result | Failed]:
        """Send ``units[slot]`` to each of those slots' workers, outside the job's bookkeeping
        (nothing else may be in flight), and return their answers; a worker that dies is
        replaced as usual and not asked again. PipelineError after ``seconds``."""
        for index, unit in units.items():
            self.backend.send(index, [unit])
        answers: dict[int, Result | Failed] = {}
        deadline = time.monotonic() + seconds
        waiting = set(units)
        while waiting:
            if time.monotonic() > deadline:
                names = ", ".join(str(self.slots[s].info) for s in sorted(waiting))
                raise PipelineError(f"{names}: no answer to the start's check after "
                                    f"{seconds:.0f} s (storage that hangs?)")
            for index, message in self.next_messages(POLL_SECONDS):
                if index in waiting and isinstance(message, (Result, Failed)):
                    answers[index] = message
                    waiting.discard(index)
                    continue
                if isinstance(message, Died):
                    waiting.discard(index)
                self.handle(index, message)
        return answers

    # -- messages ------------------------------------------------------------------------------

    def handle(self, index: int, message: Any) -> tuple[list[Result], list[tuple]]:
        """Act on one message; returns (results to write, records given up on)."""
        slot = self.slots.get(index)
        if slot is None:  # a worker discarded while it started ("fit")
            return [], []
        if isinstance(message, Ready):
            if slot.state is State.LOADING:
                if slot.restarts:
                    self.recovery.restart_s.append(time.monotonic() - slot.since)
                slot.state, slot.ready, slot.optional = State.READY, message, False
            return [], []
        if isinstance(message, Result):
            unit = _take(slot, message.workunit)
            if unit is None and message.part is not None:
                message.part.discard()  # its workunit is redone, or done, elsewhere
            slot.failures_in_a_row = 0
            if unit is not None and len(message.ids):  # (all rejected: says nothing of the rest)
                slot.unit_s = _slow_to_fall(slot.unit_s, message.compute_s)
            if unit is not None and self.sizing is not None:
                self.sizing.observe(index, len(message.ids) + len(message.rejected),
                                    message.compute_s)
            self._retire_if_drained(slot)
            return ([message] if unit is not None else []), []
        if isinstance(message, Failed):
            return [], self._on_failed(slot, message)
        if isinstance(message, Died):
            return [], self._on_died(slot, message)
        raise TypeError(f"unexpected message from {slot.info}: {type(message).__name__}")

    def check_timeouts(self) -> None:
        """Kill workers stuck on a workunit (or a model load) for longer than allowed."""
        now, limit = time.monotonic(), self.settings.workunit_timeout
        for slot in self.slots.values():
            if slot.killed is not None:
                continue
            size = self._running_call(slot)  # answered together: each of its workunits' time
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

    def _running_call(self, slot: Slot) -> int:
        """Workunits in the message ``slot``'s worker runs, where a message's answers come back
        together (a Ray call); else 1 (each is answered as it ends)."""
        if self.backend.answers_together and slot.messages:
            return len(slot.messages[0])
        return 1

    def _kill(self, slot: Slot, why: Kill, message: str = "") -> None:
        slot.killed, slot.kill_message = why, message
        self.backend.kill(slot.info.index)

    def _on_failed(self, slot: Slot, message: Failed) -> list[tuple]:
        """A worker reports that a workunit (or its model load) raised."""
        if message.workunit is None:
            self._load_failed(slot, message)
            return []
        unit = _take(slot, message.workunit)
        if unit is None:
            return []
        if message.error_type in (UNWRITABLE, UNREADABLE):  # storage, not records: no retry
            raise remote_error(message)
        if not message.out_of_memory:
            slot.failures_in_a_row += 1
        recycling = slot.killed is Kill.RECYCLE
        if recycling or (slot.failures_in_a_row >= RECYCLE_AFTER
                         and self.backend.recyclable and slot.killed is None):
            self.pending.appendleft(replace(unit, pinned=None))  # not charged: the worker is
            if not recycling:                                    # suspect, not the workunit
                log.warning("%s: %d workunits failed in a row; replacing the worker in case the "
                            "fault is its own (e.g. a CUDA context left unusable)", slot.info,
                            slot.failures_in_a_row)
                self.recovery.recycles += 1
                self._kill(slot, Kill.RECYCLE)  # (a unit queued behind may fail before it lands)
            return []
        return self._apply(slot, retry_or_split(str(slot.info), unit, message.error_type,
                                                message.message, message.out_of_memory,
                                                self.settings.retries, slot.cap), failed=True)

    def _on_died(self, slot: Slot, message: Died) -> list[tuple]:
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
            unknown = self._running_call(slot) > 1 or overlapping
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
                retries=self.settings.retries, cap=slot.cap), failed=True)
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
            if not self.live:
                raise PipelineError(f"every worker is gone: the last, {slot.info}, died ({how}) "
                                    f"after {slot.restarts} restarts (max_restarts)")
            return
        slot.restarts += 1
        self.recovery.restarts += 1
        log.warning("%s: starting a replacement (restart %d of %d)", slot.info, slot.restarts,
                    self.settings.max_restarts)
        self.spawn(slot.info)

    def _load_failed(self, slot: Slot, message: Failed) -> None:
        if not slot.restarts and not slot.optional:
            raise remote_error(message)
        slot.state = State.RETIRED  # it loaded once: what changed is the device (memory), not us
        log.log(logging.WARNING if slot.optional else logging.ERROR,
                "%s: %s failed to load (%s: %s); the slot is retired", slot.info,
                "an added worker" if slot.optional else "replacement", message.error_type,
                message.message)
        self.backend.kill(slot.info.index)
        if not self.live:
            raise remote_error(message)

    def _apply(self, slot: Slot, decision: Decision, failed: bool = False) -> list[tuple]:
        """Carry out a recovery decision about ``slot``'s workunits (``failed``: one of them
        failed, a Recovery count); returns the records given up on."""
        if failed:
            self.recovery.failed_workunits += 1
        if decision.count is not None:
            setattr(self.recovery, decision.count, getattr(self.recovery, decision.count) + 1)
        if decision.cap is not None:
            slot.cap = decision.cap
        if decision.given_up:
            record_id, error_type, message, _ = decision.given_up[0]
            log.error("record %d failed: %s: %s", record_id, error_type, message)
        elif decision.warning:
            log.warning("%s", decision.warning)
        units = reversed(decision.requeue)  # numbered as they go in, the last first
        self.pending.extendleft([self.number(u) for u in units] if decision.renumber else units)
        return list(decision.given_up)


def _take(slot: Slot, index: int) -> Workunit | None:
    """Remove workunit ``index`` from the slot's in-flight list, or None if it is not there (a
    result from a worker we have already given up on)."""
    for unit in slot.in_flight:
        if unit.index == index:
            slot.in_flight.remove(unit)
            for message in slot.messages:
                if index in message:
                    message.discard(index)
                    if not message:
                        slot.messages.remove(message)
                    break
            slot.head_since = time.monotonic()
            return unit
    return None


def _slow_to_fall(average: float | None, seconds: float) -> float:
    """A workunit's ``seconds`` into its worker's ``average``: a longer one at once (messages
    shrink on the first long workunit), a shorter one by UNIT_SECONDS_WEIGHT (they grow slowly)."""
    if average is None or seconds >= average:
        return seconds
    return average + UNIT_SECONDS_WEIGHT * (seconds - average)


def _fresh(unit: Workunit) -> bool:
    return unit.attempts == 0 and unit.pinned is None and not unit.alone


def _joined(unit: Workunit, more: Workunit) -> Workunit:
    """One workunit holding ``unit``'s records, then ``more``'s."""
    return replace(unit, ids=np.concatenate([unit.ids, more.ids]),
                   records=unit.records + more.records)


def remote_error(message: Failed) -> PipelineError:
    """A PipelineError naming the worker, its device and the workunit, with the remote traceback."""
    kind = RefusedOption if message.error_type == OptionRefused.__name__ else PipelineError
    error = kind(f"worker {message.worker} on {message.device} failed in {message.where}: "
                 f"{message.error_type}: {message.message}")
    error.__cause__ = RemoteTraceback(message.traceback)
    error.worker, error.device, error.workunit = message.worker, message.device, message.where
    return error
