"""IdRanges: the done ids of a resumed run, held as ranges; checked against a plain set, and at
the edges of int64. SeenIds: duplicates found among millions of ids."""
import numpy as np
import pytest

from helpers.engine.contract.id_ranges import IdRanges, IdRun, SeenIds, packed, unpacked

TOP, BOTTOM = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def test_ids_become_ranges_in_any_order_with_repeats():
    ranges = IdRanges.from_ids(np.array([7, 3, 4, 5, 5, 9, 8, 20]))
    assert ranges.as_bounds().tolist() == [[3, 5], [7, 9], [20, 20]]
    assert len(ranges) == 7 and ranges.runs == 3
    assert len(IdRanges.from_ids(np.array([], np.int64))) == 0


def test_union_joins_overlapping_and_touching_ranges():
    a = IdRanges.from_bounds(np.array([[0, 9], [20, 29]]))
    b = IdRanges.from_bounds(np.array([[10, 14], [25, 39], [50, 50]]))
    assert a.union(b).as_bounds().tolist() == [[0, 14], [20, 39], [50, 50]]
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


def test_spans_round_trip_and_half_open_pairs_of_older_outputs_read_the_same():
    ranges = IdRanges.from_ids(np.array([1, 2, 3, 10, 11, 40]))
    assert IdRanges.from_bounds(ranges.as_bounds()) == ranges
    assert IdRanges.from_half_open(np.array([[1, 4], [10, 12], [40, 41]])) == ranges
    assert "6 ids" in repr(ranges)


def test_the_largest_and_smallest_int64_ids_are_held_exactly():
    """A half-open range cannot hold 2**63 - 1 (its stop overflows): a resumed run redid it."""
    edges = np.array([TOP, TOP - 1, BOTTOM, BOTTOM + 1, -1, 0])
    ranges = IdRanges.from_ids(edges)
    assert ranges.as_bounds().tolist() == [[BOTTOM, BOTTOM + 1], [-1, 0], [TOP - 1, TOP]]
    assert len(ranges) == 6
    assert ranges.contains(edges).all()
    assert not ranges.contains(np.array([TOP - 2, BOTTOM + 2, 1, -2])).any()
    assert ranges.covers(TOP - 1, TOP + 1) and not ranges.covers(TOP - 2, TOP + 1)
    assert IdRanges.from_ids(np.array([BOTTOM, TOP])).runs == 2  # 2**64 - 1 apart: not adjacent
    whole = IdRanges.from_bounds(np.array([[BOTTOM, -1], [0, TOP]]))  # touching across zero
    assert whole.runs == 1 and whole.contains(edges).all()


def test_seen_ids_flags_repeats_within_and_across_slices():
    seen = SeenIds()
    assert seen.add(np.array([5, 6, 5, 7])).tolist() == [False, False, True, False]
    assert seen.add(np.array([8, 6, TOP, TOP])).tolist() == [False, True, False, True]
    assert seen.add(np.array([], np.int64)).tolist() == []


@pytest.mark.parametrize("seed", range(3))
def test_seen_ids_agrees_with_a_set_on_scattered_ids_and_stays_few_levels(seed):
    rng = np.random.default_rng(seed)
    seen, members = SeenIds(), set()
    for _ in range(200):
        chunk = rng.integers(0, 40_000, 500)
        expected = []
        for i in chunk.tolist():
            expected.append(i in members)
            members.add(i)
        assert seen.add(chunk).tolist() == expected
    assert len(seen._levels) <= 20  # merged like a binary counter: log2(slices) levels at most


def test_seen_values_tells_a_repeat_from_a_first_sighting_like_a_set():
    from helpers.engine.contract.id_ranges import SeenValues

    rng, seen, reference = np.random.default_rng(1), SeenValues(), set()
    for _ in range(400):
        values = rng.integers(-2**63, 2**63 - 1, size=int(rng.integers(0, 30)), dtype=np.int64)
        values[: len(values) // 3] = rng.integers(-40, 40, size=len(values) // 3)  # repeats
        edges = np.array([(k - 8) << 60 for k in range(17) if k < 16] + [2**63 - 1],
                         dtype=np.int64)  # each part's first value, and the last of all
        values = np.concatenate([values, rng.choice(edges, 2) + rng.integers(-1, 1, 2)])
        expected = []
        for v in values.tolist():
            expected.append(v in reference)
            reference.add(v)
        assert seen.add(values).tolist() == expected
    assert len(seen) == len(reference)


def test_seen_values_merge_one_part_at_a_time():
    """A merge copies one part's levels (a sixteenth of the hashes), never all of them."""
    from helpers.engine.contract.id_ranges import SeenValues

    rng, seen = np.random.default_rng(2), SeenValues()
    for _ in range(64):
        seen.add(rng.integers(-2**63, 2**63 - 1, size=4096, dtype=np.int64))
    largest = max(len(level) for levels in seen._parts for level in levels)
    assert len(seen) == 64 * 4096 and largest < len(seen) / 8


I64 = np.iinfo(np.int64)


@pytest.mark.parametrize("ids, runs", [
    (np.arange(5, 4101, dtype=np.int64), True),
    (np.array([I64.max - 2, I64.max - 1, I64.max], dtype=np.int64), True),  # ends at the top
    (np.array([I64.min, I64.min + 1], dtype=np.int64), True),
    (np.array([I64.min, I64.max], dtype=np.int64), False),  # the ends' difference wraps
    (np.array([3, 1, 2], dtype=np.int64), False),
    (np.array([1, 2, 2, 3], dtype=np.int64), False),  # a repeat, same span as 1..4 short
    (np.array([1, 2, 4, 4], dtype=np.int64), False),
    (np.array([7], dtype=np.int64), False),
    (np.empty(0, dtype=np.int64), False),
    (np.arange(4, dtype=np.int32), False),  # only int64 ids are packed
    (np.arange(6, dtype=np.int64).reshape(2, 3), False),
])
def test_packed_ids_are_first_and_count_only_when_they_run_one_by_one(ids, runs):
    """What a message pickles: consecutive int64 ids as two numbers, anything else as it is;
    unpacked, the same ids and dtype either way."""
    pack = packed(ids)
    assert isinstance(pack, IdRun) == runs and (runs or pack is ids)
    back = unpacked(pack)
    assert back.dtype == ids.dtype and back.shape == ids.shape and np.array_equal(back, ids)


def test_only_packed_ids_are_unpacked_not_any_pair():
    assert unpacked((5, 7)) == (5, 7) and unpacked([5, 7]) == [5, 7]
    assert unpacked(IdRun(5, 3)).tolist() == [5, 6, 7]
