"""A worker slot as the scheduler sees it: the worker's state, what it holds, and why it was
killed. The scheduler (helpers.engine.dispatch.scheduler) is the only one that changes a slot;
growth and the start's check read its ``state``."""
from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from helpers.engine.contract.messages import Ready, WorkerInfo, Workunit


class State(enum.Enum):
    LOADING = "loading"  # spawned, model not loaded yet
    READY = "ready"  # takes workunits
    DRAINING = "draining"  # being retired: finishes what it holds, takes nothing new
    RETIRED = "retired"  # out of restarts, its replacement failed to load, or retired on purpose


class Kill(enum.Enum):
    """Why the scheduler killed a worker; the value is the error type its workunit is charged."""

    TIMEOUT = "WorkunitTimeout"  # a workunit ran past workunit_timeout
    LOAD_TIMEOUT = "LoadTimeout"  # the model did not load within load_timeout
    RECYCLE = "Recycled"  # failures in a row: the worker may be broken (not charged)


@dataclass
class Slot:
    info: WorkerInfo
    state: State = State.LOADING
    in_flight: deque = field(default_factory=deque)  # Workunits, in the order the worker runs them
    messages: deque = field(default_factory=deque)  # per message in flight, the indexes of its
    # workunits not answered yet (all of them, where a message is answered together: Ray)
    head_since: float = 0.0  # when the first in-flight workunit started (as near as we know)
    since: float = 0.0  # when the current worker was spawned
    restarts: int = 0
    killed: Kill | None = None  # set when we killed the current worker, until its Died arrives
    kill_message: str = ""
    kill_unit: int | None = None  # the workunit a timeout kill was about
    failures_in_a_row: int = 0
    ready: Ready | None = None
    unit_s: float | None = None  # its workunits' seconds (read, run and written, as its
    # worker timed them): up at once, down as a moving average; the size of its messages
    last_message: int = 0  # workunits in the last message it was sent
    held: int = 0  # records a workunit of it holds in the driver's memory (0: its worker reads
    # them itself), the largest of the last message's
    optional: bool = False  # an added worker (growth): if it cannot start, the pool goes on


def answered(slot: Slot, index: int) -> Workunit | None:
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


def loaded_reports(slots: Iterable[Slot]) -> dict[str, dict]:
    """What each device's ready workers said of the model they loaded (``workload.report``: its
    variant, the guard's figures, how it tokenizes), by device: the pool's, and each job's."""
    return {slot.info.device: slot.ready.report for slot in slots
            if slot.ready is not None and slot.ready.report}
