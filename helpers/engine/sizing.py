"""Workunit sizes per worker, from each worker's measured rate (``workunit_size="auto"``).

A workunit should take about ``workunit_seconds`` on the worker that runs it: long enough that its
fixed costs (a message each way, a kernel launch, a sync) are small beside it, short enough that
a retry costs little. So a fast device gets larger workunits and a slow one smaller: each worker's
target is its measured rate × ``workunit_seconds``, where the rate is records ÷ seconds inside
``workload.process`` (smoothed). Until a worker has reported, it gets FIRST_SIZE records; a target
grows at most GROWTH times per result, so a first, cold measurement cannot run away with it.

With a fixed cost per workunit, the rate measured at size n is n / (fixed + n × per_record); a
target of rate × seconds, measured again at that size, converges to the size whose workunit takes
``workunit_seconds``.

The end of a job: once the records left are known (the reader has read everything, or the
source's length is known), no worker takes more than TAIL_SHARE of its fair part of them (its rate
÷ the sum of the rates), so the last workunits shrink as the job ends and every worker finishes
at about the same time: guided self-scheduling, weighted by speed. A workunit is never cut below
MIN_SECONDS of its worker's work, so that the tail does not turn into single records.

The out-of-memory cap (helpers.engine.scheduler) still applies on top of the target.
"""
from __future__ import annotations

import math

FIRST_SIZE = 64  # records in a worker's workunits until its rate is known
GROWTH = 4.0  # a target grows at most this factor per result
SMOOTHING = 0.5  # weight of the newest rate in the running estimate
TAIL_SHARE = 0.5  # near the end: at most this share of a worker's fair part of what is left
MIN_SECONDS = 0.05  # the tail's workunits take at least this long on their worker


class Sizing:
    """Each worker's workunit size, from its measured rate."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.rates: dict[int, float] = {}  # worker slot -> records per second (smoothed)
        self.targets: dict[int, int] = {}  # worker slot -> records per workunit

    def observe(self, slot: int, records: int, seconds: float) -> None:
        """A workunit of ``records`` took ``seconds`` on the worker in ``slot``."""
        if records <= 0 or seconds <= 0:
            return
        rate = records / seconds
        old = self.rates.get(slot)
        self.rates[slot] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate
        wanted = self.rates[slot] * self.seconds
        self.targets[slot] = max(1, math.floor(min(wanted, GROWTH * records)))

    def forget(self, slot: int) -> None:
        """The worker in ``slot`` is gone (retired): its rate no longer shares the tail."""
        self.rates.pop(slot, None)
        self.targets.pop(slot, None)

    def size(self, slot: int, remaining: int | None = None, slots: list[int] | None = None) -> int:
        """Records for the next workunit of the worker in ``slot``; ``remaining``: records not yet
        dispatched (None: not known yet), shared among the workers in ``slots``."""
        target = self.targets.get(slot, FIRST_SIZE)
        rate = self.rates.get(slot)
        if remaining is None or rate is None:
            return target
        rates = [self.rates.get(s, rate) for s in (slots or [slot])]
        fair = remaining * rate / max(sum(rates), rate)
        floor = max(1, math.ceil(rate * MIN_SECONDS))
        return max(1, min(target, max(floor, math.ceil(TAIL_SHARE * fair))))

    def largest(self) -> int:
        """The largest target: the size the reader cuts at (a slower worker's workunit is cut
        from one, the rest waits for the next worker)."""
        return max(self.targets.values(), default=FIRST_SIZE)
