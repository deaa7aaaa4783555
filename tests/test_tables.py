"""Tabular sources (helpers.engine.tables): Parquet, CSV/TSV, Arrow, a saved Hugging Face dataset,
their text and id columns, keys carried to the output, and what is refused before any worker."""
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from helpers import SyntheticWorkload, read_output, run_pipeline
from helpers.engine.id_ranges import IdRanges
from helpers.engine.sources import JSONLSource, SourceError, open_source, read_slices
from helpers.engine.tables import TableSource
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
    assert data["keys"].tolist() == [f"doc-{i:06d}" for i in expected]
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
    assert data["attrs"]["source"].endswith("#body")


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


def test_keys_stay_with_their_rows_through_retries_and_splits(tmp_path):
    """A record that fails its workunit makes the scheduler split it down to that record; the
    keys of the others still land on their own rows."""
    path = write(corpus(), tmp_path / "c", "parquet")
    workload = SyntheticWorkload(seconds_per_record=0.0, dim=8,
                                 fail_on_records=frozenset({"r333", "r1999"}))
    stats = run_pipeline(path, workload, devices="cpu,cpu", workunit_size=256,
                         output=tmp_path / "o.h5", text_column="body", id_column="doc",
                         progress=False)
    assert stats.recovery["splits"] > 0
    check_rows(read_output(tmp_path / "o.h5"), missing={NULL_TEXT, 333, 1999})


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
    assert len(source) == N and source.carried() == {"keys": source.carried()["keys"]}
    got = []
    list(read_slices(source, IdRanges.from_ids(np.arange(500, 1600)), limit=1800,
                     carry=lambda ids, columns: got.append((ids, columns["keys"]))))
    ids = np.concatenate([i for i, _ in got])
    assert ids.tolist() == [i for i in range(1800) if not 500 <= i < 1600 and i != NULL_TEXT]
    assert np.concatenate([k for _, k in got]).tolist() == [f"doc-{i:06d}" for i in ids]


def test_missing_columns_odd_types_and_disagreeing_files_are_refused_when_opened(tmp_path):
    path = write(corpus(10), tmp_path / "c", "parquet")
    with pytest.raises(SourceError, match=r"no column 'text'.*its columns: body, doc, n, other"):
        open_source(path)
    with pytest.raises(SourceError, match="'other' holds double, not text"):
        open_source(path, text_column="other")
    with pytest.raises(SourceError, match="id column 'other' holds double"):
        open_source(path, text_column="body", id_column="other")
    folder = tmp_path / "mixed"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["a"], "id": pa.array([1], pa.int64())}), folder / "a.parquet")
    pq.write_table(pa.table({"text": ["b"], "id": ["x"]}), folder / "b.parquet")
    with pytest.raises(SourceError, match="files disagree on column 'id': int64 in .*a.parquet"):
        open_source(folder, id_column="id")
    (tmp_path / "fake.parquet").write_text("text,id\na,1\n")
    with pytest.raises(SourceError, match="not a readable parquet file"):
        open_source(tmp_path / "fake.parquet")
    splits = tmp_path / "dd"
    (splits / "train").mkdir(parents=True)
    (splits / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(SourceError, match="a dataset with splits \\(train\\); name one"):
        open_source(splits)


def test_a_folder_of_images_with_a_labels_csv_is_still_images(tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "labels.csv").write_text("file,label\na.png,x\n")
    assert type(open_source(tmp_path)).__name__ == "ImageFolderSource"


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
    assert data["keys"].tolist() == [f"doc-{i:06d}" for i in data["ids"]]
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
    assert read_output(tmp_path / "o.h5")["keys"][:2].tolist() == ["doc-000000", "doc-000001"]


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
    with pytest.raises(SourceError, match="no column 'url' to keep .*its columns: body"):
        open_source(path, text_column="body", keep_columns=["url"])
    with pytest.raises(SourceError, match="doc cannot be kept under its own name"):
        open_source(path, text_column="body", id_column="doc", keep_columns=["doc"])
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(SourceError, match="only a Parquet, CSV/TSV or Arrow input keeps"):
        open_source(tmp_path / "in.jsonl", keep_columns=["x"])
