"""Tabular sources (helpers.engine.inputs.tables): Parquet, CSV/TSV, Arrow, a saved Hugging Face
dataset, their text and id columns, keys carried to the output, and what is refused before any
worker."""
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from helpers import SyntheticWorkload, read_output, run_pipeline
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.inputs.sources import JSONLSource, SourceError, open_source, read_slices
from helpers.engine.inputs.tables import TableSource
from helpers.study.paths import ROOT
from helpers.workloads.synthetic import record_vector

pytestmark = pytest.mark.timeout(120)  # reached only on deadlock

N = 2500
NULL_TEXT = 1234  # the row whose text is null: one errors/ row, nothing else lost


def corpus(n: int = N) -> pa.Table:
    return pa.table({"body": [None if i == NULL_TEXT else f"r{i}" for i in range(n)],
                     "doc": [f"doc-{i:06d}" for i in range(n)],
                     "n": np.arange(n, dtype=np.int64) * 7,
                     "other": np.ones(n)})


def write(table: pa.Table, path, fmt: str) -> str:
    """``table`` as ``fmt`` at ``path``; returns what to give as the input."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        pq.write_table(table, path.with_suffix(".parquet"), row_group_size=1000)
        return str(path.with_suffix(".parquet"))
    if fmt == "parquet-folder":  # two files, read in name order
        path.mkdir()
        half = table.num_rows // 2
        pq.write_table(table.slice(0, half), path / "part-0.parquet", row_group_size=700)
        pq.write_table(table.slice(half), path / "part-1.parquet", row_group_size=700)
        return str(path)
    if fmt == "csv":
        pacsv.write_csv(table, path.with_suffix(".csv"))
        return str(path.with_suffix(".csv"))
    if fmt == "arrow":
        with pa.ipc.new_file(path.with_suffix(".arrow"), table.schema) as f:
            for batch in table.to_batches(max_chunksize=600):
                f.write_batch(batch)
        return str(path.with_suffix(".arrow"))
    if fmt == "hf":  # what datasets' save_to_disk writes: Arrow *streams* and two JSON files
        path.mkdir()
        with pa.ipc.new_stream(path / "data-00000-of-00001.arrow", table.schema) as f:
            for batch in table.to_batches(max_chunksize=600):
                f.write_batch(batch)
        (path / "state.json").write_text(json.dumps({"_data_files": [
            {"filename": "data-00000-of-00001.arrow"}]}))
        (path / "dataset_info.json").write_text("{}")
        return str(path)
    raise ValueError(fmt)


def synthetic() -> SyntheticWorkload:
    return SyntheticWorkload(seconds_per_record=0.0, dim=8)


def check_rows(data: dict, n: int = N, missing: set = frozenset({NULL_TEXT})) -> None:
    expected = [i for i in range(n) if i not in missing]
    assert data["ids"].tolist() == expected
    assert data["doc"].tolist() == [f"doc-{i:06d}" for i in expected]
    for k in range(0, len(expected), 97):
        assert data["values"][k].tolist() == record_vector(f"r{expected[k]}", 8).tolist()


@pytest.mark.parametrize("fmt", ["parquet", "parquet-folder", "csv", "arrow", "hf"])
def test_each_format_keeps_its_string_keys_and_files_a_null_text_alone(tmp_path, fmt):
    source = write(corpus(), tmp_path / "corpus", fmt)
    stats = run_pipeline(source, synthetic(), devices="cpu", workunit_size=300,
                         output=tmp_path / "o.h5", text_column="body", id_column="doc",
                         progress=False)
    data = read_output(tmp_path / "o.h5")
    check_rows(data)
    assert [e["id"] for e in data["errors"]] == [NULL_TEXT] and stats.failed_records == 1
    error = data["errors"][0]  # filed by the reader, naming the row and its key; known by its
    assert error["position"] is None and f"row {NULL_TEXT}" in error["message"]  # id (its own)
    assert error["message"].endswith(f"the text is null (key 'doc-00{NULL_TEXT}')")
    assert error["key"] == f"doc-00{NULL_TEXT}"  # (issue 59: errors/key, a column of its own)
    assert data["attrs"]["source"].endswith("#body")


def test_a_record_failing_in_a_keyed_run_is_named_by_its_key(tmp_path):
    """The id of a keyed run's record is its row number; its error names the user's key too."""
    source = write(corpus(300), tmp_path / "corpus", "parquet")
    run_pipeline(source, SyntheticWorkload(0.0, dim=8, fail_on_records=frozenset({"r17"})),
                 devices="cpu", workunit_size=50, output=tmp_path / "o.h5", text_column="body",
                 id_column="doc", progress=False)
    (error,) = read_output(tmp_path / "o.h5")["errors"]
    assert error["id"] == 17 and error["message"].endswith("(key 'doc-000017')")
    assert error["key"] == "doc-000017" and error["message"].count("doc-000017") == 1


def test_an_integer_id_column_is_the_ids_and_a_repeated_or_null_one_costs_its_row(tmp_path):
    table = corpus(1000)
    n = table.column("n").to_pylist()
    n[10], n[20] = n[5], None  # a repeat of row 5's id, and no id
    table = table.set_column(2, "n", pa.array(n, pa.int64()))
    path = write(table, tmp_path / "c", "parquet")
    run_pipeline(path, synthetic(), devices="cpu", output=tmp_path / "o.h5", text_column="body",
                 id_column="n", progress=False)
    data = read_output(tmp_path / "o.h5")
    good = [i for i in range(1000) if i not in (10, 20)]
    assert data["ids"].tolist() == sorted(n[i] for i in good) and "keys" not in data
    errors = {e["position"]: e for e in data["errors"]}
    assert errors[10]["type"] == "DuplicateId" and "35 appeared earlier" in errors[10]["message"]
    assert errors[20]["type"] == "ValueError" and "'n' is null" in errors[20]["message"]


@pytest.mark.parametrize("writes", ["driver", "workers"])
def test_keys_stay_with_their_rows_through_retries_and_splits(tmp_path, monkeypatch, writes):
    """A record that fails its workunit makes the scheduler split it down to that record; the
    keys of the others still land on their own rows, whoever writes them (workers: the driver's
    writer gets no row, only the errors)."""
    from helpers.engine.outputs.hdf5_sink import HDF5Sink

    appended = []
    append = HDF5Sink.append
    monkeypatch.setattr(HDF5Sink, "append", lambda self, ids, arrays: appended.append(len(ids))
                        or append(self, ids, arrays))
    path = write(corpus(), tmp_path / "c", "parquet")
    workload = SyntheticWorkload(seconds_per_record=0.0, dim=8,
                                 fail_on_records=frozenset({"r333", "r1999"}))
    stats = run_pipeline(path, workload, devices="cpu,cpu", workunit_size=256,
                         output=tmp_path / "o.h5", text_column="body", id_column="doc",
                         progress=False, writes=writes)
    assert stats.recovery["splits"] > 0 and stats.records == N - 3
    check_rows(read_output(tmp_path / "o.h5"), missing={NULL_TEXT, 333, 1999})
    assert sum(appended) == (N - 3 if writes == "driver" else 0)


def test_a_resume_reads_no_row_group_the_first_run_finished(tmp_path):
    path = write(corpus(), tmp_path / "c", "parquet")  # row groups of 1000: 0-999, 1000-1999, ...
    run_pipeline(path, synthetic(), devices="cpu", workunit_size=100, output=tmp_path / "o.h5",
                 text_column="body", id_column="doc", limit=2000, progress=False)
    source = TableSource(path, text_column="body", id_column="doc")
    run_pipeline(source, synthetic(), devices="cpu", workunit_size=100, output=tmp_path / "o.h5",
                 resume=True, progress=False)
    assert source.reads == 1  # the third row group only
    check_rows(read_output(tmp_path / "o.h5"))


def test_slices_cut_row_groups_and_honour_limit_and_skip(tmp_path):
    source = TableSource(write(corpus(), tmp_path / "c", "parquet"), "body", "doc")
    assert len(source) == N and source.carried() == {"doc": source.carried()["doc"]}
    got = []
    list(read_slices(source, IdRanges.from_ids(np.arange(500, 1600)), limit=1800,
                     carry=lambda ids, columns: got.append((ids, columns["doc"]))))
    ids = np.concatenate([i for i, _ in got])
    assert ids.tolist() == [i for i in range(1800) if not 500 <= i < 1600 and i != NULL_TEXT]
    assert np.concatenate([k for _, k in got]).tolist() == [f"doc-{i:06d}" for i in ids]


def test_missing_columns_odd_types_and_disagreeing_files_are_refused_when_opened(tmp_path):
    path = write(corpus(10), tmp_path / "c", "parquet")
    with pytest.raises(SourceError, match=r"no column 'text'.*its columns: body, doc, n, other"):
        open_source(path)
    with pytest.raises(SourceError, match="'other' holds float, not text"):
        open_source(path, text_column="other")
    with pytest.raises(SourceError, match="id column 'other' holds float"):
        open_source(path, text_column="body", id_column="other")
    folder = tmp_path / "mixed"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["a"], "id": pa.array([1], pa.int64())}), folder / "a.parquet")
    pq.write_table(pa.table({"text": ["b"], "id": ["x"]}), folder / "b.parquet")
    with pytest.raises(SourceError, match="files disagree on column 'id': integer in .*a.parquet"):
        open_source(folder, id_column="id")
    (tmp_path / "fake.parquet").write_text("text,id\na,1\n")
    with pytest.raises(SourceError, match="not a readable parquet file"):
        open_source(tmp_path / "fake.parquet")
    splits = tmp_path / "dd"
    (splits / "train").mkdir(parents=True)
    (splits / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(SourceError, match="a dataset with splits \\(train\\); name one"):
        open_source(splits)


def test_a_folder_of_both_images_and_tables_is_read_as_what_it_most_likely_is(tmp_path, caplog):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "labels.csv").write_text("file,text\na.png,x\n")
    assert type(open_source(tmp_path)).__name__ == "ImageFolderSource"  # a manifest beside them
    assert type(open_source(tmp_path, id_column="file")).__name__ == "TableSource"  # asked
    pq.write_table(keyed(3), tmp_path / "data.parquet")
    (tmp_path / "labels.csv").unlink()
    assert type(open_source(tmp_path)).__name__ == "TableSource"  # a logo beside the data
    assert "holds both tables (.parquet) and images (.png): read as tables" in caplog.text


def test_jsonl_with_string_ids_keeps_them_as_keys(tmp_path):
    lines = [{"text": f"r{i}", "id": f"doc-{i:06d}"} for i in range(30)]
    lines[7]["id"] = lines[3]["id"]  # a repeat: its record alone goes to errors/
    lines[9]["id"] = None
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert JSONLSource(tmp_path / "in.jsonl").keyed and len(JSONLSource(tmp_path / "in.jsonl")) == 30
    run_pipeline(tmp_path / "in.jsonl", synthetic(), devices="cpu", output=tmp_path / "o.h5",
                 progress=False)
    data = read_output(tmp_path / "o.h5")
    assert data["ids"].tolist() == [i for i in range(30) if i not in (7, 9)]
    assert data["id"].tolist() == [f"doc-{i:06d}" for i in data["ids"]]
    assert sorted((e["position"], e["type"]) for e in data["errors"]) == [
        (7, "DuplicateId"), (9, "ValueError")]


def test_the_cli_reads_a_parquet_corpus_and_refuses_a_missing_column_with_exit_2(tmp_path):
    path = write(corpus(300), tmp_path / "c", "parquet")
    command = [sys.executable, "-m", "helpers", "run", "--input", path, "--workload", "synthetic",
               "--seconds-per-record", "0", "--devices", "cpu", "--no-progress",
               "--output", str(tmp_path / "o.h5")]
    missing = subprocess.run(command + ["--id-column", "url"], capture_output=True, text=True,
                             cwd=ROOT)
    assert missing.returncode == 2 and "no column 'text'" in missing.stderr
    assert not (tmp_path / "o.h5").exists()
    done = subprocess.run(command + ["--text-column", "body", "--id-column", "doc"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert read_output(tmp_path / "o.h5")["doc"][:2].tolist() == ["doc-000000", "doc-000001"]


def test_kept_columns_ride_with_their_rows_nulls_marked(tmp_path):
    table = corpus(1500).append_column("url", pa.array([f"u{i}" if i % 5 else None
                                                         for i in range(1500)]))
    table = table.append_column("score", pa.array([None if i == 7 else i / 2 for i in range(1500)]))
    table = table.append_column("count", pa.array([None if i == 9 else i for i in range(1500)],
                                                  pa.int32()))
    table = table.append_column("flag", pa.array([i % 2 == 0 for i in range(1500)]))
    for fmt in ("parquet", "csv"):
        path = write(table, tmp_path / fmt, fmt)
        workload = SyntheticWorkload(seconds_per_record=0.0, dim=8, fail_on_records=frozenset({"r600"}))
        run_pipeline(path, workload, devices="cpu", workunit_size=64,
                     output=tmp_path / f"{fmt}.h5", text_column="body", id_column="doc",
                     keep_columns=["url", "score", "count", "flag"], progress=False)
        data = read_output(tmp_path / f"{fmt}.h5")
        ids = data["ids"]
        assert 600 not in ids and 601 in ids
        assert data["url"].tolist() == [f"u{i}" if i % 5 else "" for i in ids], fmt
        assert np.array_equal(data["score"], [np.nan if i == 7 else i / 2 for i in ids],
                              equal_nan=True)
        assert data["count"].tolist() == [np.iinfo(np.int64).min if i == 9 else i for i in ids]
        assert data["flag"].tolist() == [int(i % 2 == 0) for i in ids]


def test_keep_columns_are_refused_clearly(tmp_path):
    table = corpus(10).append_column("tags", pa.array([["a"]] * 10))
    path = write(table, tmp_path / "c", "parquet")
    with pytest.raises(SourceError, match="'tags' holds list<.*>; only numbers"):
        open_source(path, text_column="body", keep_columns=["tags"])
    with pytest.raises(SourceError, match="no column 'url' .a column to keep. .*its columns: body"):
        open_source(path, text_column="body", keep_columns=["url"])
    with pytest.raises(SourceError, match="doc cannot be kept under its own name"):
        open_source(path, text_column="body", id_column="doc", keep_columns=["doc"])
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(SourceError, match="no field 'x' .a field to keep. in its first 1 "
                                          "objects; their fields: text"):
        open_source(tmp_path / "in.jsonl", keep_columns=["x"])
    with pytest.raises(SourceError, match=r"only a table \(Parquet, CSV/TSV, Arrow\) or "
                                          r"JSON-lines input keeps columns"):
        open_source(tmp_path / "in.h5", keep_columns=["x"])


def keyed(n: int, repeat_at: int | None = None) -> pa.Table:
    keys = [f"k{i}" for i in range(n)]
    if repeat_at is not None:
        keys[repeat_at] = "k5"
    return pa.table({"text": [f"r{i}" for i in range(n)], "k": keys})


def test_a_resume_still_finds_a_key_repeated_in_the_rows_it_skips(tmp_path):
    pq.write_table(keyed(3000, repeat_at=2500), tmp_path / "c.parquet", row_group_size=500)
    run_pipeline(tmp_path / "c.parquet", synthetic(), devices="cpu", output=tmp_path / "o.h5",
                 id_column="k", limit=1000, progress=False)
    source = TableSource(tmp_path / "c.parquet", id_column="k")
    run_pipeline(source, synthetic(), devices="cpu", output=tmp_path / "o.h5", resume=True,
                 progress=False)
    assert source.reads == 4  # the first two row groups: their keys only
    data = read_output(tmp_path / "o.h5")
    assert len(data["ids"]) == 2999 and data["k"].tolist().count("k5") == 1
    (error,) = data["errors"]
    assert error["position"] == 2500 and error["type"] == "DuplicateId"
    assert "c.parquet row 2500: 'k' 'k5' appeared earlier" in error["message"]


def test_a_resume_that_drops_or_changes_the_id_or_kept_columns_is_refused(tmp_path):
    from helpers import OutputError

    table = keyed(600).append_column("n", pa.array(range(600)))
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=100)
    common = dict(devices="cpu", output=tmp_path / "o.h5", progress=False)
    run_pipeline(tmp_path / "c.parquet", synthetic(), id_column="k", keep_columns=["n"],
                 limit=200, **common)
    for change, named in (({}, "id_column"), ({"id_column": "k"}, "keep_columns"),
                          ({"id_column": "n", "keep_columns": ["k"]}, "id_column")):
        with pytest.raises(OutputError, match=named):
            run_pipeline(tmp_path / "c.parquet", synthetic(), resume=True, **change, **common)
    data = read_output(tmp_path / "o.h5")  # untouched by the refusals
    assert len(data["ids"]) == 200 and data["k"][:2].tolist() == ["k0", "k1"]


def test_a_csv_quote_left_open_and_a_ragged_row_cost_their_rows_and_say_why(tmp_path):
    rows = [f"k{i},r{i}" for i in range(4000)]
    rows[40] = 'k40,a,ragged row'
    rows[2000] = 'k2000,"a quote left open'
    (tmp_path / "c.csv").write_text("k,text\n" + "\n".join(rows) + "\n")
    stats = run_pipeline(tmp_path / "c.csv", synthetic(), devices="cpu", id_column="k",
                         output=tmp_path / "o.h5", progress=False)
    data = read_output(tmp_path / "o.h5")
    messages = sorted((e["message"] for e in data["errors"]), key=lambda m: "ragged" not in m)
    assert stats.failed_records == 2 and len(data["ids"]) == 3998  # (the rows after the quote
    # were lost into its text until issue 44)
    assert "a row with the wrong number of fields: 'k40,a,ragged row'" in messages[0]
    assert "a quote opened in this row never closes" in messages[1]
    assert data["k"][-1] == "k3999" and data["k"][40] == "k41"


def test_odd_ids_keys_and_kept_values_cost_only_their_rows(tmp_path):
    """A repeated integer id (no null in its slice), a key or kept string holding NUL, a kept
    unsigned value above 2**63: the run finishes; each bad row is one error."""
    big = 2**64 - 5
    table = pa.table({"text": ["a", "b", "c", "d"], "n": pa.array([1, 2, 1, 3], pa.int32()),
                      "k": ["x", "y\0", "z", "w"], "note": ["", "", "n\0", ""],
                      "u": pa.array([big, 0, 1, 2], pa.uint64())})
    pq.write_table(table, tmp_path / "c.parquet")
    run_pipeline(tmp_path / "c.parquet", synthetic(), devices="cpu", output=tmp_path / "o.h5",
                 id_column="n", progress=False)
    data = read_output(tmp_path / "o.h5")
    assert data["ids"].tolist() == [1, 2, 3] and [e["position"] for e in data["errors"]] == [2]
    run_pipeline(tmp_path / "c.parquet", synthetic(), devices="cpu", output=tmp_path / "k.h5",
                 id_column="k", keep_columns=["note", "u"], progress=False)
    data = read_output(tmp_path / "k.h5")
    assert data["k"].tolist() == ["x", "w"] and data["u"].tolist() == [big, 2]
    assert sorted(e["position"] for e in data["errors"]) == [1, 2]
    assert any("NUL" in e["message"] for e in data["errors"])


def test_column_names_and_encodings_users_have(tmp_path):
    (tmp_path / "dup.csv").write_text("id,text,text\n1,a,b\n")
    with pytest.raises(SourceError, match="column 'text' appears 2 times"):
        open_source(tmp_path / "dup.csv")
    pq.write_table(keyed(4), tmp_path / "c.parquet")
    with pytest.raises(SourceError, match="'text' is the text column too"):
        open_source(tmp_path / "c.parquet", id_column="text")
    with pytest.raises(SourceError, match="'a/b'.*no '/'"):
        open_source(tmp_path / "c.parquet", keep_columns=["a/b"])
    with pytest.raises(SourceError, match="attrs cannot be kept"):
        open_source(tmp_path / "c.parquet", keep_columns=["attrs"])
    folder = tmp_path / "mixed"  # pandas writes string, polars large_string; a category column
    folder.mkdir()
    pq.write_table(pa.table({"text": pa.array(["a", "b"]).dictionary_encode(), "k": ["x", "y"]}),
                   folder / "1.parquet")
    pq.write_table(pa.table({"text": pa.array(["c"], pa.large_string()),
                             "k": pa.array(["z"], pa.large_string())}), folder / "2.parquet")
    run_pipeline(folder, synthetic(), devices="cpu", output=tmp_path / "o.h5", id_column="k",
                 progress=False)
    data = read_output(tmp_path / "o.h5")
    assert data["k"].tolist() == ["x", "y", "z"]
    assert data["values"][2].tolist() == record_vector("c", 8).tolist()


def test_text_that_is_not_utf8_costs_its_row_in_csv_and_jsonl(tmp_path):
    (tmp_path / "c.csv").write_bytes(b"k,text\nk0,fine\nk1,caf\xe9\nk2,also fine\n")
    lines = [b'{"text": "fine"}', b'{"text": "caf\xe9"}', b'{"text": "also fine"}']
    (tmp_path / "j.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    for name, id_column in (("c.csv", "k"), ("j.jsonl", None)):
        run_pipeline(tmp_path / name, synthetic(), devices="cpu", id_column=id_column,
                     output=tmp_path / f"{name}.h5", progress=False)
        data = read_output(tmp_path / f"{name}.h5")
        assert data["ids"].tolist() == [0, 2], name
        assert [(e["position"], e["type"]) for e in data["errors"]] == [
            (1, "UnicodeDecodeError")], name


def test_zero_padded_csv_ids_are_keys_kept_as_written(tmp_path):
    (tmp_path / "c.csv").write_text("id,text\n000123,a\n123,b\n7,c\n")
    run_pipeline(tmp_path / "c.csv", synthetic(), devices="cpu", id_column="id",
                 output=tmp_path / "o.h5", progress=False)
    data = read_output(tmp_path / "o.h5")
    assert data["id"].tolist() == ["000123", "123", "7"] and not data["errors"]
    (tmp_path / "n.csv").write_text("id,text\n-5,a\n123,b\n")
    run_pipeline(tmp_path / "n.csv", synthetic(), devices="cpu", id_column="id",
                 output=tmp_path / "n.h5", progress=False)
    assert read_output(tmp_path / "n.h5")["ids"].tolist() == [-5, 123]


def test_an_empty_csv_id_costs_its_row_not_the_other_rows_ids(tmp_path):
    """An integer id column with one empty cell: that row goes to errors/, the others keep their
    integers (the empty cell, read as text, made every id a key)."""
    (tmp_path / "c.csv").write_text("id,text\n10,a\n,b\n30,c\n")
    run_pipeline(tmp_path / "c.csv", synthetic(), devices="cpu", id_column="id",
                 output=tmp_path / "o.h5", progress=False)
    data = read_output(tmp_path / "o.h5")
    assert data["ids"].tolist() == [10, 30] and "keys" not in data
    [error] = data["errors"]
    assert error["position"] == 1 and "'id' is null" in error["message"]


def test_carried_values_of_failed_records_are_all_let_go():
    from helpers.engine.contract.protocol import OutputSpec
    from helpers.engine.inputs.carried import Carried

    held = Carried({"keys": OutputSpec((), "str"), "n": OutputSpec((), "int64")}, "keys")
    held.add(np.arange(4), {"keys": np.array(list("abcd"), dtype=object), "n": np.arange(4)})
    named = held.drop([(1, "E", "failed", 0.0), (3, "E", "failed", 0.0), (9, "E", "x", 0.0)])
    assert named == [(1, "E", "failed (key 'b')", 0.0, -1, "b"),
                     (3, "E", "failed (key 'd')", 0.0, -1, "d"),
                     (9, "E", "x", 0.0)]  # (9: none held, the row as it was)
    taken = held.take(np.array([2, 0]))
    assert taken["keys"].tolist() == ["c", "a"] and taken["n"].tolist() == [2, 0]
    assert len(held) == 0


@pytest.mark.parametrize("first", ["short", "quoted-lines", "long"])
def test_opening_a_csv_reads_its_first_block_only(tmp_path, monkeypatch, first):
    """A table's columns come from its first block's whole rows (pyarrow's own reader read
    several blocks ahead: 25-50 MB of each CSV file, most of a folder of small ones); a first
    row longer than the block grows it, a value with line breaks across the block's end is not
    cut, and the columns are those the whole file has."""
    import psutil

    from helpers.engine.inputs import table_files

    monkeypatch.setattr(table_files, "CSV_BLOCK_BYTES", 1 << 16)
    row = {"short": "a", "quoted-lines": '"' + "x\n" * 40_000 + '"', "long": "y" * 200_000}[first]
    path = tmp_path / "in.csv"
    path.write_text("text,n\n" + f"{row},1\n" + "".join(f"r{i},{i}\n" for i in range(1_000_000)))
    process = psutil.Process()
    before = process.io_counters().read_chars
    source = TableSource(path)
    read = process.io_counters().read_chars - before
    assert read < 4 * max(1 << 16, len(row)) + (1 << 16) < path.stat().st_size // 10
    assert source.layout.columns == [("text", "n")]
    assert source.carried() == {} and len(source) == 1_000_001


def rewrite_in_place(path, table):
    """``path`` written again, in place, holding ``table`` (same inode, other bytes)."""
    import os
    import time

    time.sleep(0.01)  # (a time that differs, on any filesystem's clock)
    with open(path, "r+b") as f:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=1000) if str(path).endswith(".parquet") \
            else _arrow_bytes(table, sink, stream=False)
        f.write(sink.getvalue().to_pybytes())
        f.truncate()
    os.utime(path)


def _arrow_bytes(table, sink, stream):
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as f:
        for batch in table.to_batches(max_chunksize=600):
            f.write_batch(batch)


def replace_by_rename(path, table):
    """Another file renamed over ``path`` (what ``mv``, rsync and most writers do)."""
    import os

    other = path.with_name("other" + path.suffix)
    if str(path).endswith(".parquet"):
        pq.write_table(table, other, row_group_size=1000)
    else:
        with open(other, "wb") as f:
            _arrow_bytes(table, pa.PythonFile(f), stream=False)
    os.replace(other, path)


def cut_short(path, _table):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
@pytest.mark.parametrize("change", [rewrite_in_place, replace_by_rename, cut_short])
def test_the_drivers_reading_stops_at_a_file_changed_half_way_naming_it(tmp_path, fmt, change):
    """Issue 44: the driver's reading (what --writes driver runs) mixed an input replaced, or
    rewritten, half way into the run with the old one (exit 0); one cut short exited 2 with
    pyarrow's "magic bytes" and no file named."""
    from pathlib import Path

    path = Path(write(corpus(4000), tmp_path / "in", fmt))
    source = TableSource(path, "body", "doc")
    slices = source.slices(IdRanges(), None)
    first = next(slices)
    assert first[2]["doc"][0] == "doc-000000"
    newer = corpus(4000).set_column(1, "doc", pa.array([f"new-{i}" for i in range(4000)]))
    change(path, newer)
    with pytest.raises(OSError, match=rf"in\.{fmt}: changed since the run started .*never a "
                                      rf"mix of two") as raised:
        for _, _, carried in slices:
            assert not any(k.startswith("new-") for k in carried["doc"])
    assert not isinstance(raised.value, ValueError)  # (exit 1, a failed run: not a bad argument)


@pytest.mark.parametrize("writes", ["driver", "workers"])
@pytest.mark.parametrize("opened", [2995, 1500])
def test_a_csv_quote_left_open_costs_its_row_alone(tmp_path, writes, opened):
    """Issue 44: in a 3,000-row key,text file, row 2,995 ``key2995,"row 2995 open`` swallowed
    the rows after it into its text (exit 0, keys 2,996-2,999 nowhere); opened more than 1,000
    lines before the end, its row was filed and the 1,499 after it were nowhere. pandas and
    Python's csv report the quote: here its row is filed, saying so, and every other row read."""
    path = tmp_path / "in.csv"
    path.write_text("key,text\n" + "".join(
        f'key{i},"row {i} open\n' if i == opened else f"key{i},row {i}\n" for i in range(3000)))
    run_pipeline(str(path), synthetic(), ["cpu"] * 2, 256, tmp_path / "out.h5", "thread",
                 progress=False, writes=writes, id_column="key")
    data = read_output(tmp_path / "out.h5")
    assert data["key"].tolist() == [f"key{i}" for i in range(3000) if i != opened]
    assert [e["message"] for e in data["errors"]] == [
        f"in.csv row {opened} (every row counted): a quote opened in this row never closes (it "
        f"would swallow every row after "
        f"it; the rows after it are read from its next line on): 'key{opened},\"row {opened} "
        f"open'"]
    k = data["key"].tolist().index("key2999")
    assert data["values"][k].tolist() == record_vector("row 2999", 8).tolist()


def test_a_resume_over_a_folder_with_files_replaced_and_their_times_put_back_is_refused(
        tmp_path):
    """Issue 44: a folder's fingerprint held names, sizes and times only; three files replaced
    by same-size files of other texts, their times restored (``cp -p``, ``rsync -a``), were
    resumed over, mixing both inputs (exit 0). Each file's content is sampled now."""
    import os

    from helpers.engine.outputs.ownership import OutputError

    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(4):
        pq.write_table(pa.table({"text": [f"a{k}-{i:04d}" for i in range(1000)]}),
                       folder / f"part-{k}.parquet", compression="none")
    run_pipeline(str(folder), synthetic(), "cpu", 128, tmp_path / "out.h5", "thread",
                 progress=False, limit=1500)
    for k in (1, 2, 3):
        path = folder / f"part-{k}.parquet"
        size, times = path.stat().st_size, (path.stat().st_atime_ns, path.stat().st_mtime_ns)
        pq.write_table(pa.table({"text": [f"b{k}-{i:04d}" for i in range(1000)]}), path,
                       compression="none")
        os.utime(path, ns=times)
        assert path.stat().st_size == size
    with pytest.raises(OutputError, match=r"was made from another input: digest"):  # (the
        # samples: a run with a limit took no digest of every byte)
        run_pipeline(str(folder), synthetic(), "cpu", 128, tmp_path / "out.h5", "thread",
                     progress=False, resume=True)
    assert len(read_output(tmp_path / "out.h5")["ids"]) == 1500  # (untouched)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_an_empty_key_is_no_key_in_every_format(tmp_path, fmt):
    """Issue 44: an empty-string key was "null" in CSV (its empty field) but a valid key in
    Parquet, so the same data ran differently by format. One rule: it costs its row."""
    table = pa.table({"key": ["a", "", "b", ""], "text": ["t0", "t1", "t2", "t3"]})
    given = write(table, tmp_path / "in", fmt)
    run_pipeline(given, synthetic(), "cpu", 64, tmp_path / "out.h5", "thread", progress=False,
                 id_column="key")
    data = read_output(tmp_path / "out.h5")
    assert data["key"].tolist() == ["a", "b"]
    assert [e["message"].split(": ", 1)[1] for e in data["errors"]] == ["'key' is empty"] * 2


def test_a_string_id_column_comes_back_under_its_name_or_as_keys_where_the_output_uses_it(
        tmp_path):
    """Issue 59: a user's ``doc_id`` came back as ``keys``; it is ``doc_id`` now. A name the
    output uses for itself (``ids``, ``errors``) or that cannot name a dataset keeps ``keys``,
    and an export still names it as the input did."""
    from helpers.engine.contract.protocol import key_column
    from helpers.engine.outputs.export import export

    assert [key_column(n) for n in ("doc_id", "ids", "errors", "a/b", ".x", "keys")] == \
        ["doc_id", "keys", "keys", "keys", "keys", "keys"]
    for name in ("doc_id", "ids"):
        pq.write_table(pa.table({"text": ["a", "b"], name: ["x", "y"]}), tmp_path / "in.parquet")
        run_pipeline(tmp_path / "in.parquet", synthetic(), "cpu", output=tmp_path / f"{name}.h5",
                     id_column=name, progress=False, overwrite=True)
        data = read_output(tmp_path / f"{name}.h5")
        assert data[key_column(name)].tolist() == ["x", "y"] and data["ids"].tolist() == [0, 1]
        export(tmp_path / f"{name}.h5", "parquet", tmp_path / f"{name}.parquet", row_numbers=True)
        table = pq.read_table(tmp_path / f"{name}.parquet")
        assert table.column_names[:2] == [name, "ids" if name != "ids" else "row_numbers"]
        assert table[name].to_pylist() == ["x", "y"]
