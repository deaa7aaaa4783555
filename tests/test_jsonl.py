"""JSON lines in (helpers.engine.inputs.jsonl): ids all given or all line numbers, decided by
the first line that has one; blocks parsed by pyarrow or line by line alike; a file changed
under the driver stops its reading; shards in a folder or glob as one input, their fields kept."""
import json
import os

import numpy as np
import pytest

from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import NO_ID, BadRecord
from helpers.engine.inputs.jsonl import JSONLSource
from helpers.engine.inputs.sources import SourceError, open_source, read_slices


def test_jsonl_ids_are_all_given_or_all_line_numbers_and_bad_lines_are_reported(tmp_path,
                                                                                 monkeypatch):
    from helpers.engine.inputs import jsonl

    lines = [json.dumps({"text": "zero"}), "", json.dumps({"id": 40, "text": "forty"}),
             "{not json", json.dumps({"body": "no text"}), json.dumps({"text": "five"})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    given = dict(JSONLSource(tmp_path / "in.jsonl"))  # an id among the first lines: ids given
    assert given[40] == "forty" and "'id' is missing: other lines have ids" in given[NO_ID].message
    monkeypatch.setattr(jsonl, "ID_LINES", 1)  # the first line decides: no id, line numbers
    source = JSONLSource(tmp_path / "in.jsonl")
    records = dict(source)
    assert source.ids == "lines" and records[0] == "zero" and records[5] == "five"
    # an id where the first lines have none would collide with a line number: filed, not used
    assert isinstance(records[2], BadRecord) and "'id' is there, but the first lines have no ids" \
        in records[2].message and 40 not in records
    # ids are line numbers: a line that is not JSON is filed under its own
    assert isinstance(records[3], BadRecord) and "line 4" in records[3].message
    assert records[3].position == 3
    assert isinstance(records[4], BadRecord) and "no field 'text'" in records[4].message


def test_jsonl_ids_are_decided_by_the_first_line_that_has_one(tmp_path):
    long = "x" * (2 << 20)  # a first line over any block: the ids are still seen
    for first, kind in ((json.dumps({"text": long, "id": None}), "keys"),
                        (json.dumps({"text": long, "id": "doc-0"}), "keys"),
                        (json.dumps({"text": long, "id": 7}), "given")):
        rest = [json.dumps({"text": "a", "id": "doc-1" if kind == "keys" else 8})]
        (tmp_path / "in.jsonl").write_text("\n".join([first] + rest) + "\n")
        assert JSONLSource(tmp_path / "in.jsonl").ids == kind, first[-30:]


@pytest.mark.parametrize("keyed", [False, True])
def test_jsonl_blocks_parsed_by_pyarrow_or_line_by_line_give_the_same_slices(tmp_path, monkeypatch,
                                                                            keyed):
    """Blocks of a few lines: most parse whole in pyarrow, those holding a blank line, a broken
    line, a missing text or an id of another type fall back to the line parser; the records,
    ids, keys and errors are the same as when every block is parsed line by line."""
    from helpers.engine.inputs import jsonl

    lines = []
    for i in range(300):
        record = {"text": f"t{i}", "id": f"k{i}" if keyed else 1000 + i, "extra": [i]}
        if i % 41 == 5:
            del record["id"]
        lines.append(json.dumps(record))
    lines[17], lines[60], lines[99] = "", "{broken", json.dumps({"id": "x" if not keyed else 5})
    lines[150] = json.dumps({"text": None, "id": "k150" if keyed else 1150})
    lines[200] = json.dumps({"text": "dup", "id": "k3" if keyed else 1003})
    (tmp_path / "in.jsonl").write_text("\n".join(lines))  # no newline at the end
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 700)

    def read(**limits):
        got = list(read_slices(JSONLSource(tmp_path / "in.jsonl"), IdRanges.from_ids(
            np.arange(1010, 1020) if not keyed else np.arange(10, 20)), **limits,
            carry=lambda ids, c: keys.extend(c["id"].tolist())))
        return [(i, r if not isinstance(r, BadRecord) else (r.error_type, r.position))
                for ids, records in got for i, r in zip(ids.tolist(), records)]

    keys: list = []
    parse, whole = jsonl.parse, []
    monkeypatch.setattr(jsonl, "parse", lambda *a: whole.append(parse(*a)) or whole[-1])
    fast, fast_keys = read(limit=290), keys
    assert len(fast) > 250 and sum(p is not None for p in whole) > len(whole) // 2
    keys = []
    monkeypatch.setattr(jsonl, "parse", lambda *a: None)
    assert read(limit=290) == fast and keys == fast_keys
    assert ("DuplicateId", 200) in [r for _, r in fast]
    assert ("ValueError", 150) in [r for _, r in fast]  # the null text, filed by the reader
    (null,) = [r for _, r in JSONLSource(tmp_path / "in.jsonl") if isinstance(r, BadRecord)
               and r.position == 150]
    assert null.message.endswith(": the text is null" if not keyed else
                                 " (id 'k150'): the text is null")
    assert max(i for i, _ in fast) == (289 if keyed else 1289)  # the limit: 290 lines


def test_jsonl_lines_that_pyarrow_would_miscount_are_read_line_by_line(tmp_path):
    """Two objects on one line and a blank line in one block: pyarrow's row count would match
    the block's line count and shift every id after them; the line parser says what is wrong."""
    lines = [b'{"text": "a"} {"text": "b"}', b"", b'{"text": "c"}', b'{"text": "d"}']
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    got = dict(JSONLSource(tmp_path / "in.jsonl"))
    assert got[2] == "c" and got[3] == "d" and isinstance(got[0], BadRecord)


def _jsonl(path, n, word="r"):
    path.write_text("".join(json.dumps({"text": f"{word}{i}"}) + "\n" for i in range(n)))


@pytest.mark.parametrize("change", ["in place", "cut to a third", "appended", "renamed over"])
def test_the_drivers_jsonl_reading_stops_at_a_file_changed_half_way(tmp_path, monkeypatch,
                                                                     change):
    """Issue 44: a JSON-lines file rewritten while the driver read it gave 16,510 old and 23,490
    new rows (exit 0); one cut short lost its lines to neither the output nor errors/; 100 lines
    appended were run under the old file's fingerprint. Each now stops the reading, naming it."""
    import time

    import helpers.engine.inputs.jsonl as jsonl

    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 4096)
    path = tmp_path / "in.jsonl"
    _jsonl(path, 3000)
    slices = JSONLSource(path).slices(IdRanges(), None)
    ids, records, _ = next(slices)
    assert records[:2] == ["r0", "r1"]
    time.sleep(0.01)
    if change == "in place":
        with open(path, "r+b") as f:
            f.write(b"".join(json.dumps({"text": f"n{i}"}).encode() + b"\n"
                             for i in range(3000)))
    elif change == "cut to a third":
        os.truncate(path, path.stat().st_size // 3)
    elif change == "appended":
        with open(path, "a") as f:
            f.write(json.dumps({"text": "more"}) + "\n")
    else:
        _jsonl(tmp_path / "other.jsonl", 3000, "n")
        os.replace(tmp_path / "other.jsonl", path)
    if change == "renamed over":  # (the file open reads on as it was: the run's own file)
        assert [r for _, r, _ in slices][-1][-1] == "r2999"
        return
    with pytest.raises(OSError, match=r"in\.jsonl: changed since the run started"):
        for _, records, _ in slices:
            assert not any(r.startswith("n") for r in records if isinstance(r, str))


def test_an_empty_jsonl_file_is_refused_as_an_empty_parquet_or_csv_is(tmp_path):
    """Issue 44: a 0-byte JSONL "succeeded" with 0 records (Parquet and CSV exit 2)."""
    (tmp_path / "in.jsonl").write_bytes(b"")
    with pytest.raises(SourceError, match=r"in\.jsonl': an empty file \(0 bytes\)"):
        open_source(tmp_path / "in.jsonl")


def _shards(folder, files=3, lines=400, ids=None):
    folder.mkdir()
    for k in range(files):
        with open(folder / f"part-{k:02d}.jsonl", "w") as f:
            for i in range(lines):
                row = {"body": f"t{k}-{i}", "lang": ["en", "de"][i % 2], "score": i / 4,
                       "n": i, "ok": i % 3 == 0}
                if ids == "keys":
                    row["doc"] = f"d{k}-{i}"
                elif ids == "given":
                    row["doc"] = k * 1000 + i if (k, i) != (2, 7) else 5  # (5: part-00's)
                f.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("as_glob", [False, True])
def test_a_folder_or_glob_of_jsonl_shards_is_one_input_keeping_its_fields(tmp_path, as_glob):
    """Issue 44: a folder or a glob of .jsonl files failed ("no image files"; "no such file")
    and --keep-columns on JSONL was refused. The shards are one input in sorted order, their
    fields kept as a table's columns are."""
    from helpers import SyntheticWorkload, read_output, run_pipeline

    _shards(tmp_path / "dump", ids="keys")
    given = str(tmp_path / "dump" / "*.jsonl") if as_glob else str(tmp_path / "dump")
    run_pipeline(given, SyntheticWorkload(0.0, dim=4), "cpu", 128, tmp_path / "out.h5",
                 "thread", progress=False, text_column="body", id_column="doc",
                 keep_columns=["lang", "score", "n", "ok"])
    data = read_output(tmp_path / "out.h5")
    assert data["doc"].tolist() == [f"d{k}-{i}" for k in range(3) for i in range(400)]
    assert data["lang"].tolist() == ["en", "de"] * 600
    assert data["score"].tolist() == [i / 4 for i in range(400)] * 3
    assert data["n"].dtype == np.int64 and data["n"].tolist() == list(range(400)) * 3
    assert data["ok"].tolist() == [int(i % 3 == 0) for i in range(400)] * 3
    assert not data["errors"]


def test_jsonl_shards_share_their_ids_and_must_agree_on_them(tmp_path):
    """Integer ids across shards: one repeated in a later shard costs its line alone, named by
    its file's line and the input's; shards that disagree on what an id is are refused."""
    from helpers.engine.inputs.jsonl import JSONLFiles

    _shards(tmp_path / "dump", ids="given")
    source = open_source(tmp_path / "dump", text_column="body", id_column="doc")
    assert isinstance(source, JSONLFiles) and len(source) == 1200
    rejected = []
    ids = np.concatenate([i for i, _ in read_slices(source, IdRanges(), reject=rejected.extend)])
    assert len(ids) == 1199 and 2007 not in ids
    (_, kind, message, _, position), = rejected
    assert position == 807 and message.startswith("id 5 appeared earlier in the input")
    with open(tmp_path / "dump" / "part-03.jsonl", "w") as f:
        f.write(json.dumps({"body": "no id here"}) + "\n")
    with pytest.raises(SourceError, match="its files disagree on what a record's id is: "
                                          "integer ids in .*part-00.jsonl'; line numbers in "):
        open_source(tmp_path / "dump", text_column="body", id_column="doc")


def test_a_jsonl_kept_field_holding_objects_is_refused_and_odd_values_are_nulls(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"text": "a", "meta": {"x": 1}, "n": 1}) + "\n")
    with pytest.raises(SourceError, match="kept field 'meta' holds dict values"):
        open_source(path, keep_columns=["meta"])
    with pytest.raises(SourceError, match="keep_columns: text cannot be kept"):
        open_source(path, keep_columns=["text"])
    path.write_text("".join(json.dumps({"text": f"r{i}", "n": i}) + "\n" for i in range(1000)) +
                    json.dumps({"text": "odd", "n": "many"}) + "\n" + json.dumps({"text": "x"}))
    source = open_source(path, keep_columns=["n"])  # (its kind: from the first 1,000 lines)
    assert source.carried()["n"].dtype == "int64" and not source.positional
    carried = []
    list(read_slices(source, IdRanges(), carry=lambda ids, c: carried.append(c["n"])))
    nothing = np.iinfo(np.int64).min
    assert np.concatenate(carried).tolist() == list(range(1000)) + [nothing, nothing]


def test_jsonl_shards_whose_first_lines_disagree_on_a_kept_fields_kind_share_one(tmp_path):
    """A stray "n": "five" in one shard's first lines made its field text there and refused
    the whole input; the shards now share the kind one file would have: text here, as the
    values' JSON."""
    folder = tmp_path / "dump"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": "t", "n": i}) + "\n"
                                            for i in range(3)))
    (folder / "b.jsonl").write_text(json.dumps({"text": "t", "n": "five"}) + "\n")
    (folder / "c.jsonl").write_text(json.dumps({"text": "t", "n": 2.5}) + "\n")
    source = open_source(folder, keep_columns=["n"])
    assert source.carried()["n"].dtype == "str"
    carried = []
    list(read_slices(source, IdRanges(), carry=lambda ids, c: carried.append(c["n"])))
    assert np.concatenate(carried).tolist() == ["0", "1", "2", "five", "2.5"]
