"""A set of record ids held as sorted, disjoint ranges: what a resumed run has already done.

A run of 20 million records writes ids in long runs (the reader cuts the source in order; only the
frontier of workunits in flight is ragged), so ``[start, stop)`` ranges hold them in a few
kilobytes where one int64 per id would take 160 MB, and a whole slice of the source can be
skipped with one binary search before any of it is read or decoded.
"""
from __future__ import annotations

import numpy as np


class IdRanges:
    """Ids as sorted, disjoint, non-adjacent half-open ranges ``[starts[i], stops[i])``."""

    def __init__(self, starts: np.ndarray | None = None, stops: np.ndarray | None = None) -> None:
        self.starts = np.asarray([] if starts is None else starts, dtype=np.int64)
        self.stops = np.asarray([] if stops is None else stops, dtype=np.int64)

    @classmethod
    def from_ids(cls, ids: np.ndarray) -> "IdRanges":
        """The ranges covering ``ids`` (any order, repeats allowed)."""
        ids = np.sort(np.asarray(ids, dtype=np.int64))  # mostly in order already: quick
        if not len(ids):
            return cls()
        ids = ids[np.r_[True, ids[1:] != ids[:-1]]]
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1
        return cls(ids[np.r_[0, breaks]], ids[np.r_[breaks - 1, len(ids) - 1]] + 1)

    @classmethod
    def from_pairs(cls, pairs: np.ndarray) -> "IdRanges":
        """From an ``[n, 2]`` array of (start, stop), as stored beside a part (``as_pairs``)."""
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return cls(pairs[:, 0], pairs[:, 1])._coalesced()

    def as_pairs(self) -> np.ndarray:
        return np.stack([self.starts, self.stops], axis=1)

    def union(self, other: "IdRanges") -> "IdRanges":
        return IdRanges(np.concatenate([self.starts, other.starts]),
                        np.concatenate([self.stops, other.stops]))._coalesced()

    def _coalesced(self) -> "IdRanges":
        """Overlapping or touching ranges joined: sort by start, a new range begins where a start
        lies beyond every stop before it."""
        if len(self.starts) < 2:
            return self
        order = np.argsort(self.starts, kind="stable")
        starts, stops = self.starts[order], self.stops[order]
        reach = np.maximum.accumulate(stops)
        new = np.r_[True, starts[1:] > reach[:-1]]
        return IdRanges(starts[new], np.maximum.reduceat(stops, np.flatnonzero(new)))

    def __len__(self) -> int:
        """The number of ids."""
        return int((self.stops - self.starts).sum())

    @property
    def runs(self) -> int:
        return len(self.starts)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """A boolean mask: which of ``ids`` are in the set."""
        ids = np.asarray(ids, dtype=np.int64)
        at = np.searchsorted(self.starts, ids, side="right") - 1
        inside = at >= 0
        inside[inside] = ids[inside] < self.stops[at[inside]]
        return inside

    def covers(self, start: int, stop: int) -> bool:
        """True if every id of ``[start, stop)`` is in the set (one binary search)."""
        at = int(np.searchsorted(self.starts, start, side="right")) - 1
        return at >= 0 and stop <= self.stops[at]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdRanges) and np.array_equal(self.starts, other.starts) \
            and np.array_equal(self.stops, other.stops)

    def __repr__(self) -> str:
        shown = ", ".join(f"[{a}, {b})" for a, b in zip(self.starts[:4], self.stops[:4]))
        more = f", ... {self.runs - 4} more" if self.runs > 4 else ""
        return f"IdRanges({len(self)} ids: {shown}{more})"
