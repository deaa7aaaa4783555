"""Exports (helpers.engine.outputs.export): read back, they hold every row of the output, with its
id."""
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import SyntheticWorkload, read_output, run_pipeline
from helpers.engine.outputs import export as export_module
from helpers.engine.outputs.export import ExportError, export, exported_attrs, load_strings
from helpers.study.paths import ROOT

pytestmark = pytest.mark.timeout(120)  # reached only on deadlock


@pytest.fixture
def output(tmp_path, monkeypatch):
    """An output with string keys, a kept column and 16-d vectors, exported in chunks of 300."""
    monkeypatch.setattr(export_module, "EXPORT_ROWS", 300)
    table = pa.table({"text": [f"r{i}" for i in range(1000)],
                      "doc": [f"doc-{i}" for i in range(1000)],
                      "score": np.arange(1000) / 4})
    pq.write_table(table, tmp_path / "in.parquet")
    run_pipeline(tmp_path / "in.parquet", SyntheticWorkload(0.0, dim=16), devices="cpu,cpu",
                 workunit_size=64, output=tmp_path / "out.h5", id_column="doc",
                 keep_columns=["score"], progress=False)
    return tmp_path / "out.h5"


def by_id(ids: np.ndarray, *columns):
    order = np.argsort(ids)
    return [np.asarray(c)[order] for c in (ids, *columns)]


def test_parquet_export_reads_back_with_vectors_as_fixed_size_lists(output, tmp_path):
    """Issue 59: a string id column comes back under its own name (it was ``keys``, beside row
    numbers as ``ids``), first; the row numbers only where asked for."""
    assert export(output, "parquet", tmp_path / "e.parquet") == 1000
    table = pq.read_table(tmp_path / "e.parquet")
    assert table.column_names == ["doc", "score", "values"]
    assert pa.types.is_fixed_size_list(table.schema.field("values").type)
    data = read_output(output)
    assert table["doc"].to_pylist() == data["doc"].tolist() == [f"doc-{i}" for i in range(1000)]
    values = np.stack(table["values"].to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(values, data["values"])
    np.testing.assert_array_equal(table["score"].to_numpy(), np.arange(1000) / 4)
    export(output, "parquet", tmp_path / "n.parquet", row_numbers=True)
    numbered = pq.read_table(tmp_path / "n.parquet")
    assert numbered.column_names == ["doc", "ids", "score", "values"]
    assert numbered["ids"].to_pylist() == list(range(1000))


def test_npy_export_is_memory_mappable_and_equal(output, tmp_path):
    export(output, "npy", tmp_path / "e")
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == [
        ".gpufeed-export", "attrs.json", "doc.offsets.npy", "doc.utf8.npy", "score.npy",
        "values.npy"]
    values = np.load(tmp_path / "e" / "values.npy", mmap_mode="r")
    data = read_output(output)
    assert isinstance(values, np.memmap) and values.shape == (1000, 16)
    np.testing.assert_array_equal(np.asarray(values), data["values"])
    assert load_strings(tmp_path / "e", "doc").tolist() == data["doc"].tolist()


@pytest.mark.parametrize("to", ["parquet", "npy"])
def test_an_integer_id_column_comes_back_under_its_name_and_line_numbers_as_ids(tmp_path, to):
    """Issue 59: the input's integer ``doc_id`` is the output's ``ids``; an export names it
    ``doc_id``. A JSON-lines input without ids (line numbers) keeps ``ids``."""
    pq.write_table(pa.table({"text": ["a", "b", "c"], "doc_id": [30, 10, 20]}),
                   tmp_path / "in.parquet")
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in "abc"))
    for name, source in (("given", "in.parquet"), ("lines", "in.jsonl")):
        run_pipeline(tmp_path / source, SyntheticWorkload(0.0, dim=2), devices="cpu",
                     output=tmp_path / f"{name}.h5", progress=False,
                     id_column="doc_id" if name == "given" else None)
        target = tmp_path / f"{name}.{to}"
        export(tmp_path / f"{name}.h5", to, target)
        if to == "parquet":
            got = pq.read_table(target).to_pydict()
        else:
            got = {p.name[:-4]: np.load(p).tolist() for p in target.glob("*.npy")}
        column = "doc_id" if name == "given" else "ids"
        assert got[column] == ([10, 20, 30] if name == "given" else [0, 1, 2])
        assert {"ids", "doc_id"} - {column} <= {"ids", "doc_id"} - set(got)


def test_an_existing_target_is_refused_and_only_an_export_is_overwritten(output, tmp_path):
    (tmp_path / "mine.parquet").write_text("my notes")
    with pytest.raises(ExportError, match="is not a gpufeed parquet export; it is left as it is: "
                                          "give another path") as refused:
        export(output, "parquet", tmp_path / "mine.parquet")
    assert "overwrite=True" not in str(refused.value)  # (issue 44: it suggested what it refuses)
    with pytest.raises(ExportError, match="is not a gpufeed parquet export; it is left as it is"):
        export(output, "parquet", tmp_path / "mine.parquet", overwrite=True)
    assert (tmp_path / "mine.parquet").read_text() == "my notes"
    export(output, "npy", tmp_path / "e")
    export(output, "npy", tmp_path / "e", overwrite=True)
    assert len(np.load(tmp_path / "e" / "values.npy")) == 1000
    assert not [p for p in tmp_path.iterdir() if "gpufeed-tmp" in p.name]


def test_the_cli_exports_and_says_what_it_wrote(output, tmp_path):
    done = subprocess.run([sys.executable, "-m", "helpers", "export", str(output), "--to",
                           "parquet", "--output", str(tmp_path / "x.parquet")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and "1,000 rows as parquet" in done.stderr
    again = subprocess.run([sys.executable, "-m", "helpers", "export", str(output), "--to",
                            "parquet", "--output", str(tmp_path / "x.parquet")],
                           capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 2 and "exists" in again.stderr


def test_overwrite_replaces_only_gpufeed_s_exports_and_an_unfinished_run_needs_partial(
        output, tmp_path):
    (tmp_path / "arrays").mkdir()
    np.save(tmp_path / "arrays" / "train.npy", np.arange(3))
    with pytest.raises(ExportError, match="not a gpufeed npy export"):
        export(output, "npy", tmp_path / "arrays", overwrite=True)
    pq.write_table(pa.table({"x": [1]}), tmp_path / "theirs.parquet")
    with pytest.raises(ExportError, match="not a gpufeed parquet export"):
        export(output, "parquet", tmp_path / "theirs.parquet", overwrite=True)
    assert np.load(tmp_path / "arrays" / "train.npy").tolist() == [0, 1, 2]
    with pytest.raises(ExportError, match="not a gpufeed output .not an HDF5 file"):
        export(tmp_path / "theirs.parquet", "npy", tmp_path / "x")
    import h5py

    with h5py.File(output, "a") as f:
        f.attrs["complete"] = False  # as a killed run leaves it
    with pytest.raises(ExportError, match="has not finished .1,000 rows so far.*--partial"):
        export(output, "parquet", tmp_path / "p.parquet")
    assert export(output, "parquet", tmp_path / "p.parquet", partial=True) == 1000


def test_npy_strings_are_not_padded_to_the_longest(tmp_path):
    """Issue 44: string columns were fixed-width ``<U``: 4 bytes x the longest string for every
    row (~8 GB per 100-character key column at 20 M rows; one 5,000-character note was refused).
    They are Arrow's layout now: UTF-8 bytes and offsets."""
    notes = ["x" * 5000, "y", "", "naïve ☃"] + ["z"] * 996
    table = pa.table({"text": [f"r{i}" for i in range(1000)], "note": notes})
    pq.write_table(table, tmp_path / "in.parquet")
    run_pipeline(tmp_path / "in.parquet", SyntheticWorkload(0.0), devices="cpu",
                 output=tmp_path / "o.h5", keep_columns=["note"], progress=False)
    export(tmp_path / "o.h5", "npy", tmp_path / "e")
    assert load_strings(tmp_path / "e", "note").tolist() == notes
    data = np.load(tmp_path / "e" / "note.utf8.npy", mmap_mode="r")
    assert data.nbytes == len("".join(notes).encode())  # (not 1,000 x 5,000 x 4 bytes)


@pytest.mark.parametrize("to", ["parquet", "npy"])
def test_rows_are_exported_in_id_order_however_they_arrived(tmp_path, monkeypatch, to):
    """Issue 44: exports were in arrival order (ids.npy[:3] = [53, 95, 198]) while read_output
    and embed give input order: a user lining embeddings.npy up with their Parquet by position
    got wrong pairs. Rows are stored here out of order (windows shuffled, one row far late) and
    exported in id order, gathered a stretch at a time; --order stored keeps them as stored."""
    from helpers.engine.contract.protocol import OutputSpec
    from helpers.engine.outputs.hdf5_sink import HDF5Sink

    monkeypatch.setattr(export_module, "EXPORT_ROWS", 64)
    rng = np.random.default_rng(0)
    arrival = np.concatenate([rng.permutation(np.arange(a, a + 100)) for a in range(0, 1000, 100)])
    arrival = np.r_[arrival[arrival != 5], 5]  # (a retried row, written last)
    with HDF5Sink(tmp_path / "out.h5", {"values": OutputSpec((4,), "float32"),
                                        "keys": OutputSpec((), "str")}) as sink:
        for piece in np.array_split(arrival, 17):
            sink.append(piece, {"values": np.repeat(piece[:, None], 4, 1).astype(np.float32),
                                "keys": np.array([f"k{i}" for i in piece], dtype=object)})
    target = tmp_path / ("e.parquet" if to == "parquet" else "e")
    assert export(tmp_path / "out.h5", to, target) == 1000
    if to == "parquet":
        table = pq.read_table(target)
        ids, keys = table["ids"].to_numpy(), table["keys"].to_pylist()
        values = np.stack(table["values"].to_numpy(zero_copy_only=False))
    else:
        ids, keys = np.load(target / "ids.npy"), load_strings(target, "keys").tolist()
        values = np.load(target / "values.npy")
    assert ids.tolist() == list(range(1000)) and keys == [f"k{i}" for i in range(1000)]
    np.testing.assert_array_equal(values, np.repeat(np.arange(1000)[:, None], 4, 1))
    export(tmp_path / "out.h5", to, target, overwrite=True, order="stored")
    stored = pq.read_table(target)["ids"].to_numpy() if to == "parquet" else \
        np.load(target / "ids.npy")
    assert stored.tolist() == arrival.tolist()


def test_each_stored_form_is_exported_as_it_is_with_what_made_it(tmp_path):
    """An int8 (or float16, binary) dataset keeps its dtype in both exports, and the output's
    attributes go along (a stored int8's calibration ranges: a reader dequantizes with them)."""
    import h5py

    from helpers.engine.outputs.atomic import set_attrs

    path = tmp_path / "out.h5"
    run_pipeline([(i, i) for i in range(50)], SyntheticWorkload(0.0, dim=16), devices="cpu",
                 output=path, progress=False)
    ranges = np.vstack((np.full(16, -0.5), np.full(16, 0.5))).astype(np.float32)
    with h5py.File(path, "r+") as f:  # (as a run storing int8 leaves it)
        values = f["values"][...]
        del f["values"]
        f["values"] = (values * 100).astype(np.int8)
        set_attrs(f, {"stored": "int8", "ranges": ranges})
    export(path, "parquet", tmp_path / "e.parquet")
    export(path, "npy", tmp_path / "e")
    assert pq.read_schema(tmp_path / "e.parquet").field("values").type.value_type == pa.int8()
    assert np.load(tmp_path / "e" / "values.npy").dtype == np.int8
    for exported in (tmp_path / "e.parquet", tmp_path / "e"):
        attrs = exported_attrs(exported)
        assert attrs["stored"] == "int8" and attrs["workload"] == "synthetic"
        np.testing.assert_array_equal(np.asarray(attrs["ranges"], np.float32), ranges)
    export(path, "npy", tmp_path / "e", overwrite=True)  # (attrs.json: still an export)
