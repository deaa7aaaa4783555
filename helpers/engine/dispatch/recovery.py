"""What to do about a workunit that failed, or whose worker died: decisions, which the scheduler
(helpers.engine.dispatch.scheduler) applies to its queue, its workers and its counts.

A failed workunit (``retry_or_split``) that ran out of memory is halved and its worker capped at
the first half; one that raised is tried again up to ``retries`` times, then halved until the bad
record is alone, and a record that fails alone is given up on (to ``errors/``). A worker's death
(``after_death``) charges the workunit it was running, and only that one: the workunits queued
behind it go back as they were; where the death cannot be pinned on one (a call whose answers come
together, two overlapping workunits) each suspect goes again alone, charged nothing; where it was
not theirs (we recycled the worker, its machine went away, the workunit that timed out finished
first) they all go back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from helpers.engine.contract.messages import Workunit


@dataclass(frozen=True)
class Decision:
    """``requeue``: workunits for the front of the queue, the first first (``renumber``: new
    pieces, to be numbered); ``cap``: the worker's largest workunit from now on; ``count``: the
    Recovery counter it adds to; ``given_up``: records filed as errors, ``(id, error type,
    message, time)``; ``charge``: the workunit a death is charged to (a failure of its own:
    ``retry_or_split``); ``warning``: what the log says, if anything."""
    requeue: tuple[Workunit, ...] = ()
    renumber: bool = False
    cap: int | None = None
    count: str | None = None
    given_up: tuple[tuple, ...] = ()
    charge: Workunit | None = None
    warning: str = ""


def retry_or_split(who: str, unit: Workunit, error_type: str, message: str,
                   out_of_memory: bool, retries: int, cap: int | None) -> Decision:
    """A failed workunit of the worker ``who`` (whose cap is ``cap``): retried, split, or given
    up on."""
    unit = replace(unit, pinned=None)
    if out_of_memory and len(unit) > 1:
        first, rest = halves(unit)
        capped = min(cap or len(unit), len(first))
        return Decision((first, rest), renumber=True, cap=capped, count="oom_backoffs",
                        warning=f"{who}: out of memory on {unit.describe()} ({error_type}); "
                                f"retrying as {len(first)} + {len(rest)} records, and this "
                                f"worker now takes at most {capped} records per workunit")
    if unit.attempts < retries:
        return Decision((replace(unit, attempts=unit.attempts + 1),), count="retries",
                        warning=f"{who}: {unit.describe()} failed ({error_type}: {message}); "
                                f"retry {unit.attempts + 1} of {retries}")
    if len(unit) > 1:
        first, rest = halves(unit)
        return Decision((first, rest), renumber=True, count="splits",
                        warning=f"{who}: {unit.describe()} failed again ({error_type}); "
                                f"splitting it into {len(first)} + {len(rest)} records to find "
                                f"the bad one(s)")
    record_id = int(unit.ids[0])
    return Decision(given_up=((record_id, error_type, message, time.time()),))


def after_death(error: str, units: list[Workunit], not_theirs: bool, unknown: bool,
                suspects: int) -> Decision:
    """A worker died (``error``: what happened, in words) holding ``units``, the running one
    first (none: nothing to decide). ``not_theirs``: the death was not the workunits' doing;
    ``unknown``: any of the first ``suspects`` may have done it."""
    if not_theirs:
        return Decision(tuple(replace(u, pinned=None) for u in units))
    if unknown:
        return Decision(tuple(replace(u, pinned=None, alone=n < suspects)
                              for n, u in enumerate(units)),
                        warning=f"{error} holding {len(units)} workunits "
                                f"({units[0].describe()} first), any of "
                                f"{min(suspects, len(units))} of which may have done it; each "
                                f"is sent again alone, charged nothing")
    if units:  # those behind it never started: no attempt charged
        return Decision(tuple(replace(u, pinned=None) for u in units[1:]), charge=units[0],
                        warning=f"{error} during {units[0].describe()}")
    return Decision()


def halves(unit: Workunit) -> tuple[Workunit, Workunit]:
    """``unit`` cut in two, the first half the larger (by one, if its length is odd)."""
    return cut(unit, (len(unit) + 1) // 2)


def cut(unit: Workunit, size: int) -> tuple[Workunit, Workunit]:
    """The first ``size`` records of ``unit`` and the rest (to be numbered anew)."""
    first = replace(unit, ids=unit.ids[:size], records=unit.records[:size])
    rest = replace(unit, ids=unit.ids[size:], records=unit.records[size:])
    return first, rest
