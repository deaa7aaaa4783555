"""The start's check of ``writes="workers"``: can every worker read the input and write parts
where the driver sees them?

On a cluster the output must be on storage every node and the driver share, and a source the
workers read themselves must be reachable from every node. Found at the first commit, a node
without it would cost the workunits already sent; found at the end, the run. So before the first
record each worker gets one probe workunit: it reads the first records of its input (Rows) and
writes an empty part under the name the driver gives; the driver then looks for that file,
and removes it::

    driver ── probe (Rows of the first ids, a part's name) ──► worker: reads, writes wpart-…-N.h5
      ▲                                                                       │
      └── stat the part's path ◄── Result (the part's path) ◄─────────────────┘

A worker that cannot read or write, or whose file the driver cannot see, stops the run before
any record with a PipelineError naming the worker and its machine.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from helpers.engine.contract.messages import POLL_SECONDS, Died, Failed, Ready, Result, Workunit
from helpers.engine.dispatch.scheduler import PipelineError, RemoteTraceback, Scheduler
from helpers.engine.dispatch.slots import State

PROBE_SECONDS = 120.0  # longest the start's check waits for a worker's answer
PROBE_RECORDS = 2  # records of the input each worker reads


def check_workers(scheduler: Scheduler, target: Callable[[], Any],
                  first: tuple[np.ndarray, Any] | None,
                  admit: Callable[[int, Ready], None] = lambda slot, ready: None) -> None:
    """Ask every ready worker to read ``first`` (``(ids, Rows)``, the input's first records; None
    if the driver reads the input) and write an empty part at a ``target()`` of its own;
    PipelineError, naming the worker and its machine, unless each did and its part is visible
    here. A worker ready meanwhile goes through ``admit`` (the job's) first."""
    ids, records = first if first is not None else (np.empty(0, np.int64), [])
    ids, records = ids[:PROBE_RECORDS], records[:PROBE_RECORDS]
    units = {index: Workunit(-1, ids, records, target=target(), probe=True)
             for index, slot in scheduler.slots.items() if slot.state is State.READY}
    answers = ask_each(scheduler, units, PROBE_SECONDS, admit)
    try:
        for index, answer in sorted(answers.items()):
            if isinstance(answer, Failed):
                error = PipelineError(f"the start's check (writes='workers'): worker "
                                      f"{answer.worker} on {answer.device}: {answer.error_type}: "
                                      f"{answer.message}")
                error.__cause__ = RemoteTraceback(answer.traceback)
                raise error
            if not os.path.exists(answer.part.path):
                raise PipelineError(
                    f"the start's check (writes='workers'): {answer.part.writer} wrote "
                    f"{answer.part.path}, which the driver on {os.uname().nodename} cannot see: "
                    f"the output must be on storage every worker and the driver share (a network "
                    f"filesystem), not a disk of one machine")
    finally:
        for answer in answers.values():
            if not isinstance(answer, Failed):
                answer.part.discard()


def ask_each(scheduler: Scheduler, units: dict[int, Workunit], seconds: float,
             admit: Callable[[int, Ready], None] = lambda slot, ready: None
             ) -> dict[int, Result | Failed]:
    """Send ``units[slot]`` to each of those slots' workers, outside the job's bookkeeping
    (nothing else may be in flight), and return their answers; a worker that dies is replaced
    as usual and not asked again, one ready meanwhile goes through ``admit`` first.
    PipelineError after ``seconds``."""
    for index, unit in units.items():
        scheduler.backend.send(index, [unit])
    answers: dict[int, Result | Failed] = {}
    deadline = time.monotonic() + seconds
    waiting = set(units)
    while waiting:
        if time.monotonic() > deadline:
            names = ", ".join(str(scheduler.slots[s].info) for s in sorted(waiting))
            raise PipelineError(f"{names}: no answer to the start's check after "
                                f"{seconds:.0f} s (storage that hangs?)")
        for index, message in scheduler.next_messages(POLL_SECONDS):
            if index in waiting and isinstance(message, (Result, Failed)):
                answers[index] = message
                waiting.discard(index)
                continue
            if isinstance(message, Died):
                waiting.discard(index)
            if isinstance(message, Ready):
                admit(index, message)
            scheduler.handle(index, message)
    return answers
