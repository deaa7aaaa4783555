"""helpers.engine.contract.protocol: what a workload and a source give the pipeline, and the small
shared rules beside them (an output's spec, a usable id, a record the reader files, Rows)."""
import pickle

import numpy as np
import pytest

from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import (INT64_MAX, NO_ID, ROWS_SLICE, TEXT, BadRecord,
                                              OutputSpec, Rows, Source, Workload, decoded,
                                              id_problem, null_texts, positions)
from helpers.engine.inputs.jsonl import JSONLSource
from helpers.workloads.synthetic import SyntheticWorkload


def test_an_output_spec_takes_rows_of_its_shape_and_dtype_only():
    spec = OutputSpec((3,), "float32")
    spec.check("e", np.zeros((2, 3), np.float32), 2)
    for bad in (np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float64),
                np.zeros((3, 3), np.float32)):
        with pytest.raises(ValueError, match=r"output 'e': got shape .* declared \(2, 3\) float32"):
            spec.check("e", bad, 2)
    text = OutputSpec((), TEXT)
    text.check("path", np.array(["a", "b"], dtype=object), 2)
    with pytest.raises(ValueError, match=r"declared \(2,\) str"):
        text.check("path", np.array(["a", 1], dtype=object), 2)


@pytest.mark.parametrize("record_id, problem", [
    (7, ""), (np.int64(-5), ""), (INT64_MAX, ""),
    (True, "is not an integer: True"), (1.0, "is not an integer: 1.0"),
    ("7", "is not an integer: '7'"),
    (int(NO_ID), f"{NO_ID} is outside the ids gpufeed takes"),
    (INT64_MAX + 1, "is outside the ids gpufeed takes"),
])
def test_an_id_is_an_int64_other_than_no_id(record_id, problem):
    assert (id_problem(record_id) == "") if not problem else problem in id_problem(record_id)


def test_a_null_text_is_filed_by_the_reader_with_its_position_if_known():
    records = ["a", None, "c", None]
    null_texts(records, lambda k: f"line {k}", positions=np.array([10, 11, 12, 13]))
    assert records[0] == "a" and records[2] == "c"
    assert records[1] == BadRecord("ValueError", "line 1: the text is null", 11)
    assert records[3].position == 13
    known_by_id = [None]
    null_texts(known_by_id, lambda k: "id 5")
    assert known_by_id[0].position == -1


def test_bytes_are_decoded_or_filed_naming_what_was_not_utf8():
    assert decoded(b"caf\xc3\xa9", 3) == "café" and decoded("as is", 3) == "as is"
    bad = decoded(b"\xff", 3, "line 4")
    assert isinstance(bad, BadRecord) and bad.position == 3
    assert bad.message.startswith("line 4 is not valid UTF-8")


class Opener:
    """Reads record i as f"r{i}"; pickles only what reading its ids takes (``narrowed``)."""

    def __init__(self, known=()):
        self.known = tuple(known)

    def __eq__(self, other):
        return isinstance(other, Opener)

    def __hash__(self):
        return 0

    def narrowed(self, ids):
        return Opener(k for k in self.known if k in set(ids.tolist()))

    def read(self, ids):
        return [f"r{i}" for i in ids]


def test_rows_slice_join_and_pickle_like_the_records_they_stand_for():
    rows = Rows(Opener(range(100)), np.arange(10, 20))
    assert len(rows) == 10 and rows[2:4].read() == ["r12", "r13"]
    joined = [] + rows[:2] + rows[8:]
    assert joined.read() == ["r10", "r11", "r18", "r19"]
    with pytest.raises(TypeError, match="a worker reads the records"):
        rows[3]
    assert rows.__add__(Rows("another opener", np.arange(2))) is NotImplemented
    again = pickle.loads(pickle.dumps(rows[:3]))
    assert again.read() == ["r10", "r11", "r12"] and again.opener.known == (10, 11, 12)


def test_positions_come_a_slice_at_a_time_without_those_done():
    done = IdRanges.from_ids(np.r_[np.arange(ROWS_SLICE), ROWS_SLICE + 1])  # a whole slice
    # done: not even cut
    got = list(positions(Opener(), ROWS_SLICE + 3, done))
    assert len(got) == 1
    ids, rows = got[0]
    assert ids.tolist() == [ROWS_SLICE, ROWS_SLICE + 2] and rows.ids.tolist() == ids.tolist()


def test_the_protocols_recognise_a_workload_and_a_source(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"id": 0, "text": "a"}\n')
    assert isinstance(SyntheticWorkload(0.0), Workload)
    assert isinstance(JSONLSource(tmp_path / "in.jsonl"), Source)
    assert not isinstance(object(), Workload) and not isinstance(object(), Source)


def test_needs_names_the_extra_only_where_the_package_is_missing(monkeypatch):
    """A missing package: ExtraMissing naming the pip install of its extra; an installed one
    whose own import fails (a missing CUDA library, say): that error, as it is."""
    import sys

    from helpers.engine.contract.protocol import ExtraMissing, needs

    with pytest.raises(ExtraMissing, match=r"the thing needs no_such_package_here, which "
                                           r"gpufeed's \[onnx\] extra installs: pip install "
                                           r"'gpufeed\[onnx\]'"):
        needs("no_such_package_here", "onnx", "the thing")
    monkeypatch.setitem(sys.modules, "json.broken_part", None)  # (json is there; a part of
    with pytest.raises(ImportError) as raised:                   # it fails to import)
        needs("json.broken_part", "onnx", "the thing")
    assert not isinstance(raised.value, ExtraMissing)
    assert needs("json", "onnx", "the thing") is sys.modules["json"]
