"""Sets of record ids held as sorted, disjoint ranges: what a resumed run has already done, and
what a reader has already seen.

A run of 20 million records writes ids in long runs (the reader cuts the source in order; only the
frontier of workunits in flight is ragged), so ranges hold them in a few kilobytes where one int64
per id would take 160 MB, and a whole slice of the source can be skipped with one binary search
before any of it is read or decoded.

A range is kept with both ends inside it, ``[first, last]``: every int64 id, 2**63 - 1 included,
has a range that holds it (a half-open ``stop`` past the largest id would not fit in an int64).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

_U64 = np.uint64


def _gaps(later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """``later - earlier`` for ``later > earlier`` without int64 overflow: the true difference is
    in [1, 2**64 - 1], which unsigned wrap-around arithmetic gives exactly."""
    return later.astype(_U64) - earlier.astype(_U64)


class IdRun(NamedTuple):
    """Consecutive ids as their first and how many: ``packed``'s form of them."""

    first: int
    count: int


def packed(ids: Any) -> Any:
    """``ids`` as an IdRun if they are an int64 array of consecutive ids (a source read by
    position), else ``ids`` itself: what a message pickles, 16 bytes instead of 8 an id."""
    if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1 \
            or len(ids) < 2:
        return ids
    first = int(ids[0])
    if int(ids[-1]) - first != len(ids) - 1 or not (np.diff(ids) == 1).all():
        return ids  # (a wrapped difference cannot be 1 here: the ends already span len - 1)
    return IdRun(first, len(ids))


def unpacked(ids: Any) -> Any:
    """The ids ``packed`` gave: the array again (first + 0 .. count - 1, never past int64)."""
    if not isinstance(ids, IdRun):
        return ids
    return np.int64(ids.first) + np.arange(ids.count, dtype=np.int64)


class IdRanges:
    """Ids as sorted, disjoint, non-adjacent closed ranges ``[firsts[i], lasts[i]]``."""

    def __init__(self, firsts: np.ndarray | None = None, lasts: np.ndarray | None = None) -> None:
        self.firsts = np.asarray([] if firsts is None else firsts, dtype=np.int64)
        self.lasts = np.asarray([] if lasts is None else lasts, dtype=np.int64)

    @classmethod
    def from_ids(cls, ids: np.ndarray) -> IdRanges:
        """The ranges covering ``ids`` (any order, repeats allowed)."""
        # sorted, then repeats dropped: mostly in order already, so quick (np.unique hashes
        # first: 4x slower on a part's ids here)
        ids = np.sort(np.asarray(ids, dtype=np.int64))
        if not len(ids):
            return cls()
        ids = ids[np.r_[True, ids[1:] != ids[:-1]]]
        breaks = np.flatnonzero(_gaps(ids[1:], ids[:-1]) != 1) + 1
        return cls(ids[np.r_[0, breaks]], ids[np.r_[breaks - 1, len(ids) - 1]])

    @classmethod
    def from_bounds(cls, bounds: np.ndarray) -> IdRanges:
        """From an ``[n, 2]`` array of closed (first, last), as stored beside a part
        (``as_bounds``)."""
        bounds = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
        return cls(bounds[:, 0], bounds[:, 1])._coalesced()

    @classmethod
    def from_half_open(cls, pairs: np.ndarray) -> IdRanges:
        """From an ``[n, 2]`` array of half-open (start, stop): the format of outputs written
        before the ranges were closed (their stops are all below 2**63)."""
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return cls(pairs[:, 0], pairs[:, 1] - 1)._coalesced()

    def as_bounds(self) -> np.ndarray:
        """An ``[n, 2]`` array of each range's closed (first, last)."""
        return np.stack([self.firsts, self.lasts], axis=1)

    def union(self, other: IdRanges) -> IdRanges:
        return IdRanges(np.concatenate([self.firsts, other.firsts]),
                        np.concatenate([self.lasts, other.lasts]))._coalesced()

    def _coalesced(self) -> IdRanges:
        """Overlapping or touching ranges joined: sort by first id; a new range begins where its
        first id lies more than one beyond every last id before it."""
        if len(self.firsts) < 2:
            return self
        order = np.argsort(self.firsts, kind="stable")
        firsts, lasts = self.firsts[order], self.lasts[order]
        reach = np.maximum.accumulate(lasts)
        new = np.r_[True, (firsts[1:] > reach[:-1]) & (_gaps(firsts[1:], reach[:-1]) > 1)]
        return IdRanges(firsts[new], np.maximum.reduceat(lasts, np.flatnonzero(new)))

    def __len__(self) -> int:
        """The number of ids."""
        return int(_gaps(self.lasts, self.firsts).sum()) + self.runs

    @property
    def runs(self) -> int:
        return len(self.firsts)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """A boolean mask: which of ``ids`` are in the set."""
        ids = np.asarray(ids, dtype=np.int64)
        at = np.searchsorted(self.firsts, ids, side="right") - 1
        inside = at >= 0
        inside[inside] = ids[inside] <= self.lasts[at[inside]]
        return inside

    def covers(self, start: int, stop: int) -> bool:
        """True if every id of ``[start, stop)`` is in the set (one binary search)."""
        at = int(np.searchsorted(self.firsts, np.int64(start), side="right")) - 1
        return at >= 0 and stop - 1 <= int(self.lasts[at])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdRanges) and np.array_equal(self.firsts, other.firsts) \
            and np.array_equal(self.lasts, other.lasts)

    def __repr__(self) -> str:
        shown = ", ".join(f"[{a}, {b}]" for a, b in zip(self.firsts[:4], self.lasts[:4]))
        more = f", ... {self.runs - 4} more" if self.runs > 4 else ""
        return f"IdRanges({len(self)} ids: {shown}{more})"


class _Seen:
    """Values seen so far, to tell a repeat from a first sighting: a few sorted levels of
    doubling size, merged like a binary counter, so that adding n values costs O(n log n) in all
    instead of one ever-growing union per slice. A subclass says what a level is."""

    def __init__(self) -> None:
        self._levels: list = []

    def add(self, values: np.ndarray) -> np.ndarray:
        """Record ``values``; returns a mask of those seen before (earlier in ``values``
        included: equal values in input order, the first is not a repeat)."""
        values = np.asarray(values, dtype=np.int64)
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        again = np.r_[False, ordered[1:] == ordered[:-1]] if len(values) else \
            np.zeros(0, dtype=bool)
        self._add_sorted(ordered, again)
        seen = np.empty(len(values), dtype=bool)
        seen[order] = again
        return seen

    def _add_sorted(self, ordered: np.ndarray, again: np.ndarray) -> None:
        self._add_to(self._levels, ordered, again)

    def _add_to(self, levels: list, ordered: np.ndarray, again: np.ndarray) -> None:
        """Marks in ``again`` the ``ordered`` values in ``levels``, then adds the others."""
        for level in levels:  # sorted look-ups: each search starts where the last ended
            again |= self._contains(level, ordered)
        fresh = self._level(ordered[~again])
        if self._size(fresh):
            while levels and self._size(levels[-1]) <= 2 * self._size(fresh):
                fresh = self._merge(levels.pop(), fresh)
            levels.append(fresh)


class SeenIds(_Seen):
    """The ids a reader has seen so far: ids in runs cost a range each (IdRanges levels)."""

    _level = staticmethod(IdRanges.from_ids)

    @staticmethod
    def _contains(level: IdRanges, ordered: np.ndarray) -> np.ndarray:
        return level.contains(ordered)

    @staticmethod
    def _size(level: IdRanges) -> int:
        return level.runs

    @staticmethod
    def _merge(a: IdRanges, b: IdRanges) -> IdRanges:
        return a.union(b)

    @property
    def runs(self) -> int:
        return sum(level.runs for level in self._levels)


class SeenValues(_Seen):
    """Scattered int64 values seen so far (the 64-bit hashes of string keys), 8 bytes each in
    sorted arrays (a range per hash would take 16), in PARTS sets by their top bits: a merge
    copies one part's levels, so that the memory a merge needs beside the values is an
    eighth of theirs, not twice (160 MB of hashes for 20 M keys, not 480 at a merge)."""

    PARTS = 16
    _BOUNDS = np.array([(k - 8) << 60 for k in range(1, 16)], dtype=np.int64)

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[list] = [[] for _ in range(self.PARTS)]

    def _add_sorted(self, ordered: np.ndarray, again: np.ndarray) -> None:
        cuts = [0, *np.searchsorted(ordered, self._BOUNDS).tolist(), len(ordered)]
        for levels, start, stop in zip(self._parts, cuts, cuts[1:]):
            if stop > start:  # (views: the part's marks land in ``again``)
                self._add_to(levels, ordered[start:stop], again[start:stop])

    @staticmethod
    def _level(ordered: np.ndarray) -> np.ndarray:
        return ordered  # sorted, and repeats are out already

    @staticmethod
    def _contains(level: np.ndarray, ordered: np.ndarray) -> np.ndarray:
        return level[np.minimum(np.searchsorted(level, ordered), len(level) - 1)] == ordered

    _size = staticmethod(len)

    @staticmethod
    def _merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.sort(np.concatenate([a, b]), kind="stable")

    def __len__(self) -> int:
        return sum(len(level) for levels in self._parts for level in levels)
