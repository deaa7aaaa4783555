"""IdRanges: the done ids of a resumed run, held as ranges; checked against a plain set."""
import numpy as np
import pytest

from helpers.engine.id_ranges import IdRanges


def test_ids_become_ranges_in_any_order_with_repeats():
    ranges = IdRanges.from_ids(np.array([7, 3, 4, 5, 5, 9, 8, 20]))
    assert ranges.as_pairs().tolist() == [[3, 6], [7, 10], [20, 21]]
    assert len(ranges) == 7 and ranges.runs == 3
    assert len(IdRanges.from_ids(np.array([], np.int64))) == 0


def test_union_joins_overlapping_and_touching_ranges():
    a = IdRanges.from_pairs(np.array([[0, 10], [20, 30]]))
    b = IdRanges.from_pairs(np.array([[10, 15], [25, 40], [50, 51]]))
    assert a.union(b).as_pairs().tolist() == [[0, 15], [20, 40], [50, 51]]
    assert a.union(IdRanges()) == a and IdRanges().union(a) == a


@pytest.mark.parametrize("seed", range(5))
def test_contains_and_covers_agree_with_a_set(seed):
    rng = np.random.default_rng(seed)
    chunks = [rng.integers(0, 5000, 300), np.arange(1000, 2500)]  # scattered ids and one long run
    ranges = IdRanges()
    for chunk in chunks:
        ranges = ranges.union(IdRanges.from_ids(chunk))
    members = set(np.concatenate(chunks).tolist())
    probe = np.arange(-5, 5100)
    assert ranges.contains(probe).tolist() == [int(i) in members for i in probe]
    assert len(ranges) == len(members)
    for start, stop in [(1000, 2500), (999, 1001), (4990, 5005), (1500, 1501)]:
        assert ranges.covers(start, stop) == all(i in members for i in range(start, stop))


def test_pairs_round_trip():
    ranges = IdRanges.from_ids(np.array([1, 2, 3, 10, 11, 40]))
    assert IdRanges.from_pairs(ranges.as_pairs()) == ranges
    assert "6 ids" in repr(ranges)
