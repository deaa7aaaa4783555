import json
import os

import h5py
import numpy as np
import pytest

from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import NO_ID, BadRecord
from helpers.engine.inputs.sources import (ImageFolderSource, IterableSource, JSONLSource,
                                           SourceError, open_source, read_slices)


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


def test_hdf5_rows_read_only_the_file_the_driver_found(tmp_path):
    """A worker reading an HDF5 input by position (Rows): the file written again, or another
    file in its place, after the driver looked (or while this process held it open) is refused,
    not read."""
    from helpers.engine.inputs.sources import close_opened

    write_batches(tmp_path / "in.h5", [[f"r{i}" for i in range(50)]])
    (_, rows), = open_source(tmp_path / "in.h5").rows(IdRanges(), None)
    assert rows[3:6].read() == ["r3", "r4", "r5"]
    write_batches(tmp_path / "other.h5", [[f"x{i}" for i in range(50)]])
    os.replace(tmp_path / "other.h5", tmp_path / "in.h5")
    with pytest.raises(OSError, match="in.h5: changed since the run started"):
        rows[6:9].read()  # (the old file still open here)
    close_opened()
    with pytest.raises(OSError, match="in.h5: changed since the run started"):
        rows[6:9].read()  # (opened again)
    (_, fresh), = open_source(tmp_path / "in.h5").rows(IdRanges(), None)
    assert fresh[6:8].read() == ["x6", "x7"]  # (a new run reads the new file)
    close_opened()


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
    (tmp_path / "in.xlsx").write_text("a,b\n")
    with pytest.raises(SourceError, match="unknown format"):
        open_source(tmp_path / "in.xlsx")
    (tmp_path / "in.csv").write_text("a,b\n")
    with pytest.raises(SourceError, match="no column 'text' .*its columns: a, b"):
        open_source(tmp_path / "in.csv")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(SourceError, match="not a readable HDF5"):
        open_source(tmp_path / "junk.h5")


def test_iterable_checks_pairs_as_they_stream():
    assert list(IterableSource([(np.int64(3), "a"), (1, "b")])) == [(3, "a"), (1, "b")]
    with pytest.raises(SourceError, match="item 1 is not an .id, record. pair"):
        list(IterableSource([(0, "a"), "b"]))
    (record_id, bad), = list(IterableSource([("x", "a")]))  # costs its own record only
    assert record_id == NO_ID and "id is not an integer: 'x'" in bad.message and bad.position == 0


def slices_and_rejects(source, skip=IdRanges(), positions=None, limit=None):
    rejected = []
    read = list(read_slices(source, skip, limit, rejected.extend, positions))
    ids = [i for chunk, _ in read for i in chunk.tolist()]
    records = [r for _, chunk in read for r in chunk]
    return ids, records, rejected


def test_duplicate_and_unusable_ids_are_rejected_by_position_and_cost_no_other_record(tmp_path):
    top = np.iinfo(np.int64).max
    lines = [{"id": 5, "text": "first five"}, {"id": 5, "text": "second five"},
             "{broken", {"text": "line three has no id"}, {"id": 2**63, "text": "too big"},
             {"id": -2**63, "text": "reserved"}, {"id": top, "text": "the largest id"},
             {"id": 3, "text": "three"}, {"id": "doc-7", "text": "a string"},
             {"id": 3, "text": "three again"}]
    (tmp_path / "in.jsonl").write_text("\n".join(
        line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    ids, records, rejected = slices_and_rejects(JSONLSource(tmp_path / "in.jsonl"))
    assert ids == [5, top, 3] and records == ["first five", "the largest id", "three"]
    by_position = {row[4]: row for row in rejected}
    assert sorted(by_position) == [1, 2, 3, 4, 5, 8, 9]
    assert by_position[1][:2] == (5, "DuplicateId") and by_position[9][:2] == (3, "DuplicateId")
    assert by_position[2][0] == NO_ID and "line 3: not JSON" in by_position[2][2]
    assert by_position[3][0] == NO_ID and "'id' is missing: other lines have ids" in \
        by_position[3][2]
    assert by_position[4][0] == NO_ID and "outside the ids" in by_position[4][2]
    assert by_position[5][0] == NO_ID and by_position[8][0] == NO_ID
    # resumed: the done ids are skipped, the filed rejects too; a duplicate of a done id is
    # still a duplicate (it is known by its position, not by its id)
    ids, _, rejected = slices_and_rejects(JSONLSource(tmp_path / "in.jsonl"),
                                          IdRanges.from_ids(np.array([5, top])),
                                          IdRanges.from_ids(np.array([2, 3, 4, 5, 8])))
    assert ids == [3] and sorted(row[4] for row in rejected) == [1, 9]


def test_an_hdf5_record_that_is_not_utf8_is_rejected_at_its_row(tmp_path):
    with h5py.File(tmp_path / "in.h5", "w") as f:
        data = np.array([b"fine", b"\xff broken", b"fine"], dtype=object)
        f.create_dataset("batches/0", data=data, dtype=h5py.string_dtype("ascii"))
    ids, _, rejected = slices_and_rejects(open_source(tmp_path / "in.h5"))
    assert ids == [0, 2] and [(r[0], r[1], r[4]) for r in rejected] == [
        (1, "UnicodeDecodeError", 1)]


def test_hdf5_data_stored_outside_the_file_is_refused_unless_allowed(tmp_path):
    from helpers.engine.inputs.sources import HDF5BatchesSource

    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0\n" * 4)
    with h5py.File(tmp_path / "external.h5", "w") as f:
        f.create_dataset("batches/0", shape=(4,), dtype="S11", external=[(str(secret), 0, 44)])
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("batches/0", data=np.array(["x"], dtype=object),
                         dtype=h5py.string_dtype())
    with h5py.File(tmp_path / "linked.h5", "w") as f:
        f["batches/0"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "batches/0")
    with pytest.raises(SourceError, match="outside the file .external storage."):
        open_source(tmp_path / "external.h5")
    with pytest.raises(SourceError, match="batches/0 is a link to another file"):
        open_source(tmp_path / "linked.h5")
    allowed = HDF5BatchesSource(tmp_path / "external.h5", allow_external=True)
    assert [r for _, r in allowed] == ["root:x:0:0\n"] * 4


def test_an_image_folder_skips_symbolic_links_unless_asked(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private.png").write_bytes(b"not really")
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"x")
    (folder / "link.png").symlink_to(outside / "private.png")
    (folder / "linked_folder").symlink_to(outside)
    (folder / "loop").symlink_to(folder)
    assert [p.split("/")[-1] for _, p in ImageFolderSource(folder)] == ["a.png"]
    followed = [p for _, p in ImageFolderSource(folder, follow_symlinks=True)]
    assert sorted(p.split("/")[-1] for p in followed) == ["a.png", "link.png", "private.png"]


def test_a_fingerprint_changes_with_the_content_and_not_with_a_second_look(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a"}\n')
    first = JSONLSource(path).fingerprint()
    assert JSONLSource(path).fingerprint() == first
    assert JSONLSource(path, text_column="body").fingerprint()["text_column"] == "body"
    modified = os.stat(path).st_mtime_ns
    path.write_text('{"text": "b"}\n')  # same size, other bytes, and the same time given back
    os.utime(path, ns=(modified, modified))
    second = JSONLSource(path).fingerprint()
    assert second["digest"] != first["digest"] and second["modified"] == first["modified"]


def test_the_drivers_hdf5_reading_stops_at_a_file_changed_half_way(tmp_path):
    write_batches(tmp_path / "in.h5", [[f"r{i}" for i in range(3000)]])
    slices = open_source(tmp_path / "in.h5").slices(IdRanges(), None)
    assert next(slices)[1][0] == "r0"
    write_batches(tmp_path / "other.h5", [[f"x{i}" for i in range(3000)]])
    os.replace(tmp_path / "other.h5", tmp_path / "in.h5")
    with pytest.raises(OSError, match=r"in\.h5: changed since the run started"):
        list(slices)


