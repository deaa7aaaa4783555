"""Workunit sizes per worker, from each worker's measured rate (``workunit_size="auto"``).

A workunit should take about ``workunit_seconds`` on the worker that runs it: long enough that its
fixed costs (a message each way, a kernel launch, a sync) are small beside it, short enough that
a retry costs little. So a fast device gets larger workunits and a slow one smaller: each worker's
target is its measured rate × ``workunit_seconds``, where the rate is records ÷ seconds inside
``workload.process`` (smoothed). Until a worker has reported, it gets FIRST_SIZE records; a target
grows at most GROWTH times per result, so a first, cold measurement cannot run away with it, and
is never above MAX_SIZE.

A fixed cost per workunit (a message each way, a launch, a sync: ``fixed``) makes a workunit of n
records take ``fixed + n × per_record``. Two workunits of one worker whose sizes differ by
PAIR_RATIO or more give both (a line through two points, kept below the shorter time; the fixed
cost is the median of the last FIXED_SAMPLES such estimates: a wait inside one workunit of a pair
moves its estimate either way, up when the smaller one waited, down to zero when the larger one
did, and on a GPU such waits are common: the first lent H200 measured workunits of 819 and 1,398
records at 0.8 and 1.3 s between ones of 470 at 0.16 s and 1,189 at 0.37 s. The smallest estimate,
kept until then, fell to zero at the first such wait and never rose: the workunits of 2 records
that each took the card's 0.08 s fixed cost then counted as slow records, and a job's tail of
2,000 records took 320 workunits and 20 s of its 28);
the target is then the size whose workunit takes ``workunit_seconds``, or ``fixed ÷ FIXED_SHARE``
if that is longer: a fixed cost larger than the time asked for would otherwise shrink every
target (each measured rate lower than the last) down to one record, the worst size there is.
Until a worker has had two such sizes its fixed cost counts as zero.

The end of a job: once the records left are known (the reader has read everything, or the
source's length is known), no worker takes more than TAIL_SHARE of its fair part of them (its rate
÷ the sum of the rates), so the last workunits shrink as the job ends and every worker finishes
at about the same time: guided self-scheduling, weighted by speed. A workunit is never cut below
MIN_SECONDS of its worker's work, nor below the work of its fixed cost (half a workunit fixed
cost at worst), so that the tail does not turn into single records that are all fixed cost.

The out-of-memory cap (helpers.engine.dispatch.taker) still applies on top of the target.

Who changes a Sizing, only through its methods: the pool starts each job (``start_job``) and
hands it to its taker (helpers.engine.dispatch.taker), which alone uses it from then on: it feeds
it each result (``observe``), forgets a retired worker, asks it for each workunit (``size``) and
takes that many records from the reader, starts the reader's bound at the ``largest`` target,
and shortens the workunits of the devices whose worker count growth is deciding (``explore``).
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence

FIRST_SIZE = 16  # records in a worker's workunits until its rate is known
GROWTH = 4.0  # a target grows at most this factor per result
SMOOTHING = 0.5  # weight of the newest rate in the running estimate
TAIL_SHARE = 0.5  # near the end: at most this share of a worker's fair part of what is left
MIN_SECONDS = 0.05  # the tail's workunits take at least this long on their worker
FIXED_SHARE = 0.2  # a workunit's fixed cost is at most this share of its time
PAIR_RATIO = 1.5  # two workunits whose sizes differ this much measure the fixed cost
FIXED_SAMPLES = 9  # the fixed cost: the median of this many of its latest estimates
MAX_SIZE = 131_072  # records a workunit holds at most: a second of a fast card is less (one H100
# embeds 110-165k texts/s of 128 tokens with MiniLM: ANCHORS.md), while a workload that costs next
# to nothing inside ``process`` (its rate unbounded) grew workunits to millions of records, whose
# results the driver holds: 11.7-14.6 GB of it over 20.6 M records of 384-d float32 (bench scale,
# the synthetic model, workunit_size="auto")


class Sizing:
    """Each worker's workunit size, from its measured rate."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.rates: dict[int, float] = {}  # worker slot -> records per second (smoothed)
        self.targets: dict[int, int] = {}  # worker slot -> records per workunit
        self.fixed: dict[int, float] = {}  # worker slot -> seconds of fixed cost per workunit
        self._costs: dict[int, float] = {}  # worker slot -> seconds per record, fixed cost apart
        self._last: dict[int, tuple[int, float]] = {}  # worker slot -> its last (records, seconds)
        self._fixes: dict[int, deque[float]] = {}  # worker slot -> its latest fixed-cost estimates
        self.capped: dict[int, float] = {}  # worker slot -> shorter seconds for it (while growing)

    def start_job(self, seconds: float) -> None:
        """A job's seconds per workunit; the rates measured so far carry over from job to job."""
        self.seconds, self.capped = seconds, {}

    def explore(self, slots: Iterable[int], seconds: float) -> None:
        """Workunits of at most ``seconds`` for the workers in ``slots`` (those of devices whose
        worker count is being decided: helpers.engine.dispatch.growth), the job's for the others."""
        self.capped = dict.fromkeys(slots, seconds)

    def observe(self, slot: int, records: int, seconds: float) -> None:
        """A workunit of ``records`` took ``seconds`` on the worker in ``slot``."""
        if records <= 0 or seconds <= 0:
            return
        self.rates[slot] = _smoothed(self.rates.get(slot), records / seconds)
        self._fit(slot, records, seconds)
        fixed = min(self.fixed.get(slot, 0.0), seconds)
        cost = _smoothed(self._costs.get(slot), max(seconds - fixed, 0.1 * seconds) / records)
        self._costs[slot] = cost
        seconds = min(self.seconds, self.capped.get(slot, self.seconds))
        wanted = (max(seconds, fixed / FIXED_SHARE) - fixed) / cost
        self.targets[slot] = max(1, math.floor(min(wanted, GROWTH * records, MAX_SIZE)))

    def _fit(self, slot: int, records: int, seconds: float) -> None:
        """The fixed cost through this workunit and the last one, if their sizes differ enough."""
        last, self._last[slot] = self._last.get(slot), (records, seconds)
        if last is None or max(records, last[0]) < PAIR_RATIO * min(records, last[0]):
            return
        per_record = (seconds - last[1]) / (records - last[0])
        if per_record <= 0:
            return  # noise larger than the difference: nothing learnt
        fixed = min(max(seconds - per_record * records, 0.0), 0.9 * min(seconds, last[1]))
        estimates = self._fixes.setdefault(slot, deque(maxlen=FIXED_SAMPLES))
        estimates.append(fixed)
        self.fixed[slot] = statistics.median(estimates)  # (a wait moves one estimate, not it)

    def forget(self, slot: int) -> None:
        """The worker in ``slot`` is gone (retired): its rate no longer shares the tail."""
        for known in (self.rates, self.targets, self.fixed, self._costs, self._last, self._fixes):
            known.pop(slot, None)

    def size(self, slot: int, remaining: int | None = None,
             slots: Sequence[int] | None = None) -> int:
        """Records for the next workunit of the worker in ``slot``; ``remaining``: records not yet
        dispatched (None: not known yet), shared among the workers in ``slots``."""
        target = self.targets.get(slot, FIRST_SIZE)
        rate = self.rates.get(slot)
        if remaining is None or rate is None:
            return target
        rates = [self.rates.get(s, rate) for s in (slots or [slot])]
        fair = remaining * rate / max(sum(rates), rate)
        seconds = max(MIN_SECONDS, self.fixed.get(slot, 0.0))  # at most half of it fixed cost
        floor = max(1, math.ceil(seconds / self._costs[slot]))
        return max(1, min(target, max(floor, math.ceil(TAIL_SHARE * fair))))

    def largest(self) -> int:
        """The largest target (a job's reader queues a few workunits of it to start with)."""
        return max(self.targets.values(), default=FIRST_SIZE)


def _smoothed(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
