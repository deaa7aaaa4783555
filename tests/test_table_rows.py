"""A worker reading a table's rows itself (helpers.engine.table_rows): Parquet row groups and Arrow
record batches found from their metadata, any rows in any order equal to what the driver reads,
a row group decoded once per worker that reads it in order, and files that differ refused."""
import os
import pickle
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import SyntheticWorkload, read_output, run_pipeline
from helpers.engine import table_rows
from helpers.engine.id_ranges import IdRanges
from helpers.engine.protocol import BadRecord
from helpers.engine.sources import reads_by_position
from helpers.engine.tables import TableSource
from helpers.workloads.synthetic import record_vector

pytestmark = pytest.mark.timeout(300)  # reached only on deadlock

NULL, BROKEN = 1234, 2001  # a null text; bytes that are not UTF-8


def texts(n):
    values = [f"r{i}".encode() for i in range(n)]
    values[NULL], values[BROKEN] = None, b"\xff broken"
    return pa.array(values, pa.binary())


def parquet_folder(folder, n=3000):
    """Two files, row groups of 700 and 333 rows: pieces every workunit size cuts across."""
    folder.mkdir()
    column = texts(n)
    pq.write_table(pa.table({"text": column.slice(0, 1800)}), folder / "a.parquet",
                   row_group_size=700)
    pq.write_table(pa.table({"text": column.slice(1800)}), folder / "b.parquet",
                   row_group_size=333)
    return folder


def arrow_file(path, n=3000):
    table = pa.table({"text": texts(n)})
    with pa.ipc.new_file(path, table.schema) as f:
        for batch in table.to_batches(max_chunksize=450):
            f.write_batch(batch)
    return path


def as_driver_reads(source):
    """Every record of ``source`` as the driver's slices give them, by id."""
    return {i: r for ids, records, _ in source.slices(IdRanges(), None)
            for i, r in zip(ids.tolist(), records)}


def same(got, expected):
    if isinstance(expected, BadRecord):
        return isinstance(got, BadRecord) and (got.error_type, got.message) == \
            (expected.error_type, expected.message)
    return got == expected


@pytest.mark.parametrize("make", [parquet_folder, arrow_file], ids=["parquet", "arrow"])
def test_any_rows_in_any_order_read_as_the_driver_reads_them(tmp_path, make):
    source = TableSource(make(tmp_path / ("in" if make is parquet_folder else "in.arrow")))
    assert reads_by_position(source)
    expected = as_driver_reads(source)
    (ids, rows), = source.rows(IdRanges(), None)
    assert ids.tolist() == list(range(3000))
    rng = random.Random(0)
    for _ in range(60):  # forward, backward, across pieces and files; pickled as sent
        start = rng.randrange(3000)
        part = pickle.loads(pickle.dumps(rows[start:start + rng.randrange(1, 900)]))
        got = part.read()
        assert len(got) == len(part)
        assert all(same(g, expected[i]) for g, i in zip(got, part.ids.tolist()))
    assert isinstance(expected[NULL], BadRecord) and "the text is null" in expected[NULL].message
    assert expected[BROKEN].error_type == "UnicodeDecodeError"


def test_a_row_group_read_in_order_is_decoded_once(tmp_path, monkeypatch):
    made = []
    real = table_rows._Cursor

    def counted(*args):
        made.append(args[1:])
        return real(*args)

    monkeypatch.setattr(table_rows, "_Cursor", counted)
    table_rows._opened.cache_clear()
    source = TableSource(parquet_folder(tmp_path / "in"))
    (_, rows), = source.rows(IdRanges(), None)
    for start in range(0, 3000, 64):
        rows[start:start + 64].read()
    assert made == [(0, "text"), (1, "text"), (2, "text"), (0, "text"), (1, "text"),
                    (2, "text"), (3, "text")]  # a.parquet's 3 row groups, b.parquet's 4


def test_skip_and_limit_leave_out_rows_unread(tmp_path):
    source = TableSource(parquet_folder(tmp_path / "in"))
    pieces = list(source.rows(IdRanges.from_ids(np.arange(100, 2900)), 2950))
    assert np.concatenate([ids for ids, _ in pieces]).tolist() == \
        list(range(100)) + list(range(2900, 2950))


def test_what_workers_cannot_read_by_row_stays_with_the_driver(tmp_path):
    table = pa.table({"text": ["a", "b"], "doc": ["x", "y"], "n": [1, 2]})
    pq.write_table(table, tmp_path / "t.parquet")
    with pa.ipc.new_stream(tmp_path / "s.arrow", table.schema) as f:
        f.write_table(table)
    for source in [TableSource(tmp_path / "t.parquet"),
                   TableSource(tmp_path / "t.parquet", id_column="doc", keep_columns=["n"])]:
        assert reads_by_position(source)
    for source in [TableSource(tmp_path / "t.parquet", id_column="n"),  # ids are not rows
                   TableSource(tmp_path / "s.arrow")]:  # a stream is read in order
        assert not reads_by_position(source)
        with pytest.raises(ValueError, match="workers cannot read it by row"):
            source.rows(IdRanges(), None)


def keyed_folder(folder, n=3000):
    """``parquet_folder`` with a ``doc`` key per row (row 77's repeats row 5's, row 90's is
    null) and a kept ``n`` column."""
    parquet_folder(folder, n)
    keys = [f"doc-{i:05d}" for i in range(n)]
    keys[77], keys[90] = keys[5], None
    for name, start, stop in (("a.parquet", 0, 1800), ("b.parquet", 1800, n)):
        texts_only = pq.read_table(folder / name)
        pq.write_table(texts_only.append_column("doc", pa.array(keys[start:stop]))
                       .append_column("n", pa.array(np.arange(start, stop) * 3)), folder / name,
                       row_group_size=700 if name == "a.parquet" else 333)
    return folder


def test_a_keyed_table_s_rows_carry_their_keys_and_bad_keys_come_apart(tmp_path):
    """Keys and kept columns are read (and checked) by the driver, the texts by the workers:
    the rows and columns read_slices gives are those of the driver's own reading."""
    from helpers.engine.sources import read_slices

    source = TableSource(keyed_folder(tmp_path / "in"), id_column="doc", keep_columns=["n"])

    def read(rows):
        rejected, carried = [], {}

        def carry(ids, columns):
            carried.update(zip(ids.tolist(), zip(*(c.tolist() for c in columns.values()))))

        pieces = read_slices(source, IdRanges(), None, rejected.extend, None, carry, rows=rows)
        ids = np.concatenate([ids for ids, _ in pieces]).tolist()
        return ids, sorted((row[0], row[1]) for row in rejected), carried

    driver_ids, driver_rejected, driver_carried = read(False)
    ids, rejected, carried = read(True)
    assert rejected == [(77, "DuplicateId"), (90, "ValueError")]  # keys: found by the driver
    assert driver_rejected == sorted(rejected + [(NULL, "ValueError"),  # texts: by the workers
                                                 (BROKEN, "UnicodeDecodeError")])
    assert ids == [i for i in range(3000) if i not in (77, 90)]
    assert driver_ids == [i for i in ids if i not in (NULL, BROKEN)]
    assert {i: carried[i] for i in driver_ids} == driver_carried
    assert carried[2500] == ("doc-02500", 7500)


def test_a_worker_finding_other_files_refuses_to_read_them(tmp_path):
    folder = parquet_folder(tmp_path / "in")
    (_, rows), = TableSource(folder).rows(IdRanges(), None)
    pq.write_table(pa.table({"text": ["changed"] * 1200}), folder / "b.parquet")
    os.utime(folder / "b.parquet", ns=(1, 1))
    with pytest.raises(OSError, match="the files differ from those the driver found"):
        rows[:10].read()


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_workers_read_a_parquet_corpus_themselves_and_resume(tmp_path, monkeypatch, backend):
    """writes="workers": the driver reads no text (its slices are gone), each worker reads its
    rows from the row groups; a limit, then a resume; every row once, the two bad ones filed."""
    folder = parquet_folder(tmp_path / "in")
    monkeypatch.setattr(TableSource, "slices", None)
    workload = SyntheticWorkload(0.0, dim=8)
    first = run_pipeline(folder, workload, ["cpu"] * 2, 64, tmp_path / "out.h5", backend,
                         progress=False, writes="workers", limit=1000)
    stats = run_pipeline(folder, workload, ["cpu"] * 2, 64, tmp_path / "out.h5", backend,
                         progress=False, writes="workers", resume=True)
    assert first.records == 1000 and stats.resumed_after == 1000 and stats.records == 1998
    data = read_output(tmp_path / "out.h5")
    good = [i for i in range(3000) if i not in (NULL, BROKEN)]
    assert data["ids"].tolist() == good
    np.testing.assert_array_equal(data["values"][::101],
                                  np.stack([record_vector(f"r{i}", 8) for i in good[::101]]))
    assert sorted((e["id"], e["type"]) for e in data["errors"]) == \
        [(NULL, "ValueError"), (BROKEN, "UnicodeDecodeError")]


def test_workers_read_the_texts_of_a_keyed_corpus_the_driver_its_keys(tmp_path, monkeypatch):
    """writes="workers" with string keys and a kept column: the driver reads no text (its text
    slices are gone), carries each row's key and kept value to the worker that writes it; a bad
    key is filed by the driver, a bad text by a worker (named by its key); a resume still finds
    a repeat of a key in the rows it skips."""
    folder = keyed_folder(tmp_path / "in")
    monkeypatch.setattr(TableSource, "_slice", None)
    options = dict(workunit_size=64, output=tmp_path / "out.h5", backend="process",
                   progress=False, writes="workers", id_column="doc", keep_columns=["n"])
    run_pipeline(folder, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, limit=1000, **options)
    stats = run_pipeline(folder, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, resume=True,
                         **options)
    assert stats.resumed_after == 1000 - 2  # (the two bad keys are known by their positions)
    data = read_output(tmp_path / "out.h5")
    good = [i for i in range(3000) if i not in (77, 90, NULL, BROKEN)]
    assert data["ids"].tolist() == good
    assert data["keys"].tolist() == [f"doc-{i:05d}" for i in good]
    assert data["n"].tolist() == [3 * i for i in good]
    np.testing.assert_array_equal(data["values"][::101],
                                  np.stack([record_vector(f"r{i}", 8) for i in good[::101]]))
    errors = {e["id"]: e for e in data["errors"]}
    assert sorted(errors) == [77, 90, NULL, BROKEN]
    assert errors[77]["type"] == "DuplicateId" and errors[BROKEN]["type"] == "UnicodeDecodeError"
    assert errors[NULL]["message"].endswith(f"the text is null (key 'doc-0{NULL}')")
