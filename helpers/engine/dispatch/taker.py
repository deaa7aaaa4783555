"""The taker: the one owner of what a workunit holds, from the reader to the scheduler.

The scheduler asks it for a worker's next workunit (``next_for``) and keeps its slots, messages
and events; the taker decides everything about the workunit itself::

    pool ── new_job(sizing | fixed size) ──► Taker ◄── next_for(worker, ready, feed) ── Scheduler
                                              │  ▲
          waiting workunits (retried, cut) ◄──┤  └── requeue(units) / cap(worker): recovery's
          a worker's size: Sizing.size, or ───┤      decisions, applied by the scheduler
            the fixed one, under its cap      │
          feed.expect(n), feed.take(n) ◄──────┘  joins a window's short end to the next, cuts
                                                 one over the size; numbers each workunit

Where sizes come from: ``workunit_size="auto"`` gives the pool's Sizing (each worker's size
from its measured rate, finer at the end: helpers.engine.measure.sizing), a number gives a fixed
size, and a static split gives none (each worker's slice, dealt whole: ``deal``). Whatever the
size, a worker that ran out of memory takes at most its cap from then on (``cap``: recovery's
decision). A workunit keeps the size it was taken at, with fixed sizes; with auto sizes, one
taken short at a window's end or left from a cut is joined to the next records up to its
worker's size, and a retried or joined one over the size is cut. Every workunit the scheduler
sends is numbered here, once (a feed's are not numbered: helpers.engine.dispatch.reader).
"""
from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from helpers.engine.contract.messages import Workunit
from helpers.engine.dispatch.recovery import cut
from helpers.engine.measure.sizing import FIRST_SIZE, Sizing

JOINS = True  # auto sizes: a window's short end (a cut's rest) joined to the next records, up to
# its worker's size (joins_bench.csv: python -m helpers.bench joins)


class Feed(Protocol):
    """Where new records come from (the reader; nothing more, for a static split). The taker
    alone decides how many a workunit holds, and tells the feed the most it will take; asking
    the feed how much it holds changes nothing in it."""

    def expect(self, n: int) -> None:
        """The taker may take ``n`` records at a time from now on (room to queue them)."""

    def take(self, n: int) -> Workunit | None:
        """A workunit of up to ``n`` records (fewer at the end of what the feed holds together),
        or None if none is waiting; not numbered (the taker numbers it)."""

    def backlog(self, n: int) -> int:
        """Workunits of ``n`` records waiting, or about to be (0 once the source is exhausted)."""

    def remaining(self) -> int | None:
        """Records not taken yet, or None while that is not known."""

    def exhausted(self) -> bool:
        """Whether every record has been taken."""

    @property
    def records_put(self) -> int:
        """Records the feed has held so far (a mark for ``wake_on_more``)."""

    def wake_on_more(self, mark: int) -> None:
        """Wake the scheduler when records come after ``mark``: its dispatch left a worker
        short."""


class Taker:
    """Takes workunits from a feed at each worker's size; holds those waiting to go again."""

    def __init__(self) -> None:
        self.waiting: deque[Workunit] = deque()  # retried, cut or dealt: before the feed's
        self._numbers = itertools.count()
        self._sizing: Sizing | None = None
        self._size: int | None = None  # records a workunit, where sizes are fixed
        self._caps: dict[int, int] = {}  # per worker slot: most records, after out of memory

    # -- what the pool says ----------------------------------------------------------------------

    def new_job(self, sizing: Sizing | None = None, size: int | None = None) -> None:
        """The next job's sizes: ``sizing`` (workunit_size="auto") or, if None, a fixed ``size``
        (None: as they are, a static split's slices). A cap stays with its worker."""
        self._sizing, self._size = sizing, size

    @property
    def auto(self) -> bool:
        """Whether each worker's size is measured (workunit_size="auto")."""
        return self._sizing is not None

    def first_size(self) -> int:
        """The largest workunit the job starts with (the reader queues a few of them first)."""
        return self._size or (self._sizing.largest() if self._sizing else FIRST_SIZE)

    def deal(self, units: Iterable[Workunit]) -> None:
        """Workunits dealt before the job starts (a static split's slices, each pinned to its
        worker), numbered, in that order."""
        self.waiting.extend(self.number(unit) for unit in units)

    def explore(self, slots: Iterable[int], seconds: float) -> None:
        """Workunits of at most ``seconds`` for the workers in ``slots`` (those of the devices
        whose worker count growth is deciding), with auto sizes."""
        if self._sizing is not None:
            self._sizing.explore(slots, seconds)

    def settled(self, slot: int, records: int, share: float) -> bool:
        """Whether a workunit of ``records`` is at least ``share`` of ``slot``'s size (auto sizes
        grow at first); always, with fixed sizes."""
        return self._sizing is None or records >= share * self._sizing.targets.get(slot, 0)

    # -- what the scheduler says -----------------------------------------------------------------

    def observe(self, slot: int, records: int, seconds: float) -> None:
        """A workunit of ``records`` took ``seconds`` on the worker in ``slot``."""
        if self._sizing is not None:
            self._sizing.observe(slot, records, seconds)

    def forget(self, slot: int) -> None:
        """The worker in ``slot`` is retired: its rate no longer shares the tail."""
        if self._sizing is not None:
            self._sizing.forget(slot)

    def cap(self, slot: int, records: int | None = None) -> int | None:
        """The most records the worker in ``slot`` takes (None: no cap); with ``records``, that
        cap from now on (out of memory: recovery's decision)."""
        if records is not None:
            self._caps[slot] = records
        return self._caps.get(slot)

    def requeue(self, units: Iterable[Workunit], renumber: bool = False) -> None:
        """Workunits to go again first, the first first (``renumber``: new pieces)."""
        units = list(units)[::-1]
        self.waiting.extendleft([self.number(u) for u in units] if renumber else units)

    def number(self, unit: Workunit) -> Workunit:
        """The same workunit under an index no other workunit of this pool has."""
        return replace(unit, index=next(self._numbers))

    # -- taking ----------------------------------------------------------------------------------

    def next_for(self, slot: int, ready: Sequence[int], feed: Feed,
                 alone: bool = True) -> Workunit | None:
        """The next workunit for the worker in ``slot`` (None: none for it), ``ready`` the slots
        taking workunits (they share the tail); one to be sent alone only if ``alone`` (else it
        stays first in line, uncut, for a worker holding nothing)."""
        size = self._size_of(slot, self._remaining(feed) if self._sizing else None, ready)
        if size is not None:
            feed.expect(size)  # (the feed keeps room for it: said before any take of it)
        unit = next((u for u in self.waiting if u.pinned in (None, slot)), None)
        if unit is not None:
            if unit.alone and not alone:
                return None
            self.waiting.remove(unit)
        else:
            unit = None if size is None else feed.take(size)  # (None: a static split's job)
            if unit is None:
                return None
            unit = self.number(unit)
        if JOINS and self._sizing is not None and _fresh(unit):  # a window's end, a cut's rest
            while len(unit) < size and \
                    (more := self._fresh_waiting() or feed.take(size - len(unit))) is not None:
                unit = _joined(unit, more)
        limit = size if self._sizing is not None else self._caps.get(slot)  # (with fixed sizes
        # a workunit keeps the size it was taken at, a static split's slice its own: only a cap
        # cuts it)
        if limit is not None and len(unit) > limit:  # a retried or joined one over it
            first, rest = cut(unit, limit)
            self.waiting.appendleft(self.number(rest))
            unit = self.number(first)
        return unit

    def enough_left(self, feed: Feed, ready: Sequence[int], each: int = 1,
                    taken: Sequence[Workunit] = ()) -> bool:
        """Whether ``each`` workunits a ready worker are left (counting those ``taken`` already
        for a message): not at the end of a job, where the last should go one at a time."""
        if self._sizing is None:
            return len(self.waiting) + feed.backlog(self._size or 1) + len(taken) >= \
                len(ready) * each
        left = self._remaining(feed)
        return left is None or \
            left + sum(map(len, taken)) >= sum(self._size_of(s, None, ready) for s in ready) * each

    def _remaining(self, feed: Feed) -> int | None:
        """Records of the job not yet sent, or None while the feed cannot tell."""
        left = feed.remaining()
        return None if left is None else left + sum(len(u) for u in self.waiting)

    def _size_of(self, slot: int, remaining: int | None, ready: Sequence[int]) -> int | None:
        """The most records ``slot`` takes in one workunit: its Sizing target (``remaining``
        shared among ``ready`` at the end), or the fixed size (None: a workunit as it is), and
        never more than its cap."""
        size = self._size
        if self._sizing is not None:
            size = self._sizing.size(slot, remaining, None if remaining is None else ready)
        cap = self._caps.get(slot)
        if cap is not None:
            size = cap if size is None else min(size, cap)
        return size

    def _fresh_waiting(self) -> Workunit | None:
        """A waiting workunit that never failed and is nobody's (the rest of a cut), or None."""
        for unit in self.waiting:
            if _fresh(unit):
                self.waiting.remove(unit)
                return unit
        return None


def _fresh(unit: Workunit) -> bool:
    return unit.attempts == 0 and unit.pinned is None and not unit.alone


def _joined(unit: Workunit, more: Workunit) -> Workunit:
    """One workunit holding ``unit``'s records, then ``more``'s."""
    return replace(unit, ids=np.concatenate([unit.ids, more.ids]),
                   records=unit.records + more.records)
