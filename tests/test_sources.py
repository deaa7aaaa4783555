import json

import h5py
import numpy as np
import pytest

from helpers.engine.protocol import BadRecord
from helpers.engine.sources import IterableSource, JSONLSource, SourceError, open_source


def write_batches(path, batches):
    with h5py.File(path, "w") as f:
        for n, batch in enumerate(batches):
            f.create_dataset(f"batches/{n}", data=np.array(batch, dtype=object),
                             dtype=h5py.string_dtype("utf-8"))


def test_hdf5_ids_are_global_order_across_numbered_batches(tmp_path):
    batches = [[f"b{n}-{i}" for i in range(n + 2)] for n in range(12)]  # 10 sorts before 2
    write_batches(tmp_path / "in.h5", batches)
    source = open_source(tmp_path / "in.h5")
    flat = [text for batch in batches for text in batch]
    assert list(source) == list(enumerate(flat))
    assert len(source) == len(flat)


def test_hdf5_invalid_utf8_becomes_a_bad_record_not_an_error(tmp_path):
    with h5py.File(tmp_path / "in.h5", "w") as f:
        data = np.array([b"fine", b"\xff\xfe broken", b"also fine"], dtype=object)
        f.create_dataset("batches/0", data=data, dtype=h5py.string_dtype("ascii"))
    records = list(open_source(tmp_path / "in.h5"))
    assert records[0] == (0, "fine") and records[2] == (2, "also fine")
    assert isinstance(records[1][1], BadRecord) and "UTF-8" in records[1][1].message


@pytest.mark.parametrize("layout, message", [
    ({"other/0": ["x"]}, "no group 'batches'"),
    ({"batches/first": ["x"]}, "not a numbered batch"),
    ({"batches/0": [[1, 2]]}, "not a 1-D string dataset"),
])
def test_hdf5_wrong_layout_names_the_problem(tmp_path, layout, message):
    with h5py.File(tmp_path / "in.h5", "w") as f:
        for name, data in layout.items():
            f.create_dataset(name, data=np.array(data, dtype=object if isinstance(
                data[0], str) else None), **({"dtype": h5py.string_dtype()}
                                             if isinstance(data[0], str) else {}))
    with pytest.raises(SourceError, match=message):
        open_source(tmp_path / "in.h5")


def test_missing_and_unknown_inputs_fail_before_any_work(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        open_source(tmp_path / "missing.h5")
    (tmp_path / "in.csv").write_text("a,b\n")
    with pytest.raises(SourceError, match="unknown format"):
        open_source(tmp_path / "in.csv")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(SourceError, match="not a readable HDF5"):
        open_source(tmp_path / "junk.h5")


def test_jsonl_uses_id_field_or_line_number_and_reports_bad_lines(tmp_path):
    lines = [json.dumps({"text": "zero"}), "", json.dumps({"id": 40, "text": "forty"}),
             "{not json", json.dumps({"body": "no text"}), json.dumps({"text": "five"})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    records = dict(JSONLSource(tmp_path / "in.jsonl"))
    assert records[0] == "zero" and records[40] == "forty" and records[5] == "five"
    assert isinstance(records[3], BadRecord) and "line 4" in records[3].message
    assert isinstance(records[4], BadRecord) and "no field 'text'" in records[4].message


def test_iterable_checks_pairs_as_they_stream():
    assert list(IterableSource([(np.int64(3), "a"), (1, "b")])) == [(3, "a"), (1, "b")]
    with pytest.raises(SourceError, match="item 1 is not an .id, record. pair"):
        list(IterableSource([(0, "a"), "b"]))
    with pytest.raises(SourceError, match="id 'x' is not an integer"):
        list(IterableSource([("x", "a")]))
