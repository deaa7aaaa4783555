"""A slice's ids (helpers.engine.inputs.id_checks): an unusable or repeated id makes its record a
BadRecord under NO_ID, with its position; done ids drop; the rest pass as they are."""
import numpy as np
import pyarrow as pa

from helpers.engine.contract.id_ranges import IdRanges, SeenIds, SeenValues
from helpers.engine.contract.protocol import NO_ID, BadRecord
from helpers.engine.inputs.id_checks import REPEAT, checked_ids, integer_ids, key_problems, screen


def where(position):
    return f"line {position}: id"


def test_plain_ids_pass_and_unusable_ones_become_bad_records():
    records = ["a", "b", "c", "d", "e"]
    ids = checked_ids((1, "x", 2**63, 3, int(NO_ID)), records, (0, 1, 2, 3, 4), where)
    assert ids.tolist() == [1, NO_ID, NO_ID, 3, NO_ID]
    assert records[0] == "a" and records[3] == "d"
    assert [r.message for r in records if isinstance(r, BadRecord)] == [
        "line 1: id is not an integer: 'x'",
        f"line 2: id {2**63} is outside the ids gpufeed takes ({NO_ID + 1} to {2**63 - 1})",
        f"line 4: id {NO_ID} is outside the ids gpufeed takes ({NO_ID + 1} to {2**63 - 1})"]
    fast = ["a", "b"]
    assert checked_ids((7, 8), fast, (0, 1), where).dtype == np.int64 and fast == ["a", "b"]


def test_a_repeat_is_filed_by_its_position_and_done_ids_drop():
    seen = SeenIds()
    first = screen(np.array([5, 6]), ["a", "b"], np.array([0, 1]), seen, IdRanges())
    assert first[0].tolist() == [5, 6]
    records = ["c", "d", "e"]
    ids, kept, mask = screen(np.array([6, 7, 8]), records, np.array([2, 3, 4]), seen,
                             IdRanges.from_ids(np.array([8])))
    assert ids.tolist() == [6, 7] and mask.tolist() == [True, True, False]
    assert isinstance(kept[0], BadRecord) and kept[0].error_type == "DuplicateId"
    assert kept[0].position == 2 and kept[0].message == f"id 6 {REPEAT}"
    assert screen(np.array([9]), ["f"], np.array([5]), seen,
                  IdRanges.from_ids(np.array([9]))) is None  # (all done: nothing left)


def test_an_id_column_s_nulls_strings_and_repeats_are_each_a_problem():
    ids, problems = integer_ids(pa.array(["1", "2", None, "x", "1"]), SeenIds())
    assert ids.tolist() == [1, 2, NO_ID, NO_ID, NO_ID]
    assert problems == [(2, "is null"), (3, "is not an integer: 'x'"), (4, f"1 {REPEAT}")]
    clean, none = integer_ids(pa.array([10, 11], pa.int32()), SeenIds())
    assert clean.tolist() == [10, 11] and none == []


def test_keys_that_are_null_empty_hold_a_nul_or_repeat_are_problems():
    seen = SeenValues()
    assert key_problems(["doc-1", "doc-2"], seen) == []
    problems = dict(key_problems(["doc-3", None, "", "a\0b", "doc-1", 7], seen))
    assert problems[1] == "is null" and problems[2] == "is empty"
    assert "holds a NUL character" in problems[3] and problems[4].endswith(REPEAT)
    assert problems[5] == "is not a string: 7" and 0 not in problems
