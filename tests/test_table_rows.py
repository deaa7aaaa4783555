"""A worker reading a table's rows itself (helpers.engine.inputs.table_rows): Parquet row groups and
Arrow record batches found from their metadata, any rows in any order equal to what the driver
reads, a row group decoded once per worker that reads it in order, and files that differ refused."""
import os
import pickle
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import as_driver_reads, read_by_either_side, run_changed_half_way, same_record
from helpers import SyntheticWorkload, read_output, run_pipeline
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import BadRecord
from helpers.engine.inputs import table_rows
from helpers.engine.inputs.sources import reads_by_position
from helpers.engine.inputs.tables import TableSource
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
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as f:
        for batch in table.to_batches(max_chunksize=450):
            f.write_batch(batch)
    return path


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
        assert all(same_record(g, expected[i]) for g, i in zip(got, part.ids.tolist()))
    assert isinstance(expected[NULL], BadRecord) and "the text is null" in expected[NULL].message
    assert expected[BROKEN].error_type == "UnicodeDecodeError"


def test_a_row_group_read_in_order_is_decoded_once(tmp_path, monkeypatch):
    made = []
    real = table_rows._Cursor

    def counted(*args):
        made.append(args[1:])
        return real(*args)

    monkeypatch.setattr(table_rows, "_Cursor", counted)
    table_rows.close_all()
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
    from helpers.engine.inputs.sources import read_slices

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


def test_a_worker_first_opening_the_input_after_a_chmod_reads_it_if_its_bytes_are_the_run_s(
        tmp_path):
    """Issue 59: a worker that opens a folder's tables for the first time after a chmod or a
    new hard link (a replacement, a worker added by growth) found its stats no longer the
    driver's and stopped the run. Their bytes, digested again against the digests the driver
    took as the run started (sent with the opener), tell it: the same, it reads; others, it
    refuses."""
    import subprocess
    import sys

    from helpers.engine.contract.fingerprint import source_fingerprint
    from helpers.study.paths import ROOT

    folder = parquet_folder(tmp_path / "in")
    source = TableSource(folder)
    source_fingerprint(source)  # (the run's start: every file's bytes digested)
    (_, rows), = source.rows(IdRanges(), None)
    pickled = tmp_path / "rows.pickle"
    pickled.write_bytes(pickle.dumps(rows[1000:1010]))
    read = ("import pickle, sys; rows = pickle.loads(open(sys.argv[1], 'rb').read()); "
            "print(repr(rows.read()))")

    def in_a_fresh_worker():
        return subprocess.run([sys.executable, "-c", read, str(pickled)], capture_output=True,
                              text=True, cwd=ROOT)

    os.chmod(folder / "b.parquet", 0o600)
    os.link(folder / "b.parquet", tmp_path / "backup.parquet")
    done = in_a_fresh_worker()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(rows[1000:1010].read())
    pq.write_table(pa.table({"text": ["changed"] * 1200}), folder / "b.parquet")
    refused = in_a_fresh_worker()
    assert refused.returncode != 0 and "the files differ from those the driver found" in \
        refused.stderr


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
    assert stats.resumed_after == 1000  # (the two bad keys known by their positions)
    data = read_output(tmp_path / "out.h5")
    good = [i for i in range(3000) if i not in (77, 90, NULL, BROKEN)]
    assert data["ids"].tolist() == good
    assert data["doc"].tolist() == [f"doc-{i:05d}" for i in good]
    assert data["n"].tolist() == [3 * i for i in good]
    np.testing.assert_array_equal(data["values"][::101],
                                  np.stack([record_vector(f"r{i}", 8) for i in good[::101]]))
    errors = {e["id"]: e for e in data["errors"]}
    assert sorted(errors) == [77, 90, NULL, BROKEN]
    assert errors[77]["type"] == "DuplicateId" and errors[BROKEN]["type"] == "UnicodeDecodeError"
    assert errors[NULL]["message"].endswith(f"the text is null (key 'doc-0{NULL}')")


def error_rows(path):
    return sorted((e["id"], e["type"], e["message"], e["position"])
                  for e in read_output(path)["errors"])


@pytest.mark.parametrize("keyed", [False, True], ids=["row-numbers", "keyed"])
def test_a_bad_text_is_filed_alike_whichever_side_reads_it(tmp_path, keyed):
    """The error rows of the driver's reading and of the workers' are the same rows: message
    (its file's row, its key), type, position."""
    folder = keyed_folder(tmp_path / "in")
    options = dict(id_column="doc", keep_columns=["n"]) if keyed else {}
    (rows, _), workers = read_by_either_side(folder, tmp_path, **options)
    assert rows == workers[0]
    broken = [row for row in rows if row[0] == BROKEN]
    assert broken == [(BROKEN, "UnicodeDecodeError", broken[0][2], BROKEN)]
    assert broken[0][2].startswith("b.parquet row 201 (input row 2001): the text is not valid")
    assert broken[0][2].endswith(" (key 'doc-02001')") == keyed


@pytest.mark.parametrize("first, then", [("driver", "workers"), ("workers", "driver")])
def test_a_resume_on_the_other_write_path_files_each_bad_record_once(tmp_path, first, then):
    folder = parquet_folder(tmp_path / "in")
    for writes, changes in [(first, dict(limit=2500)), (then, dict(resume=True))]:
        run_pipeline(folder, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 64,
                     tmp_path / "out.h5", "process", progress=False, writes=writes, **changes)
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == [i for i in range(3000) if i not in (NULL, BROKEN)]
    assert [(row[0], row[1]) for row in error_rows(tmp_path / "out.h5")] == \
        [(NULL, "ValueError"), (BROKEN, "UnicodeDecodeError")]


def test_a_file_changed_half_way_stops_the_run_and_is_never_read(tmp_path, monkeypatch):
    """b.parquet rewritten (same rows, same row groups, other texts) while the workers read
    a.parquet: the worker that comes to it refuses to read it (its size and time are not the
    driver's), so no row of the new file is written, nor filed as an error."""
    folder = parquet_folder(tmp_path / "in")

    def rewrite():
        other = pa.array([f"other {i}" for i in range(1200)])
        pq.write_table(pa.table({"text": other}), folder / "b.parquet", row_group_size=333)

    data = run_changed_half_way(monkeypatch, folder, tmp_path / "out.h5", table_rows.TableRows,
                                rewrite, "b.parquet")
    assert len(data["ids"]) and data["ids"].max() < 1800
    assert [e["id"] for e in data["errors"]] in ([], [NULL])  # (a.parquet's own)
    np.testing.assert_array_equal(data["values"], np.stack([record_vector(f"r{i}", 8)
                                                            for i in data["ids"].tolist()]))


@pytest.mark.parametrize("change", ["replaced", "cut short"])
def test_a_worker_reading_a_file_changed_since_it_opened_the_input_refuses(tmp_path, change):
    folder = parquet_folder(tmp_path / "in")
    (_, rows), = TableSource(folder).rows(IdRanges(), None)
    rows[:10].read()  # the input open in this process, a.parquet's first row group read
    if change == "replaced":
        other = tmp_path / "other.parquet"
        pq.write_table(pa.table({"text": [f"x{i}" for i in range(1800)]}), other,
                       row_group_size=700)
        os.replace(other, folder / "a.parquet")
    else:
        os.truncate(folder / "a.parquet", 100)
    with pytest.raises(OSError, match="a.parquet: changed since the run started"):
        rows[700:710].read()
    table_rows.close_all()


def test_a_worker_keeps_only_its_latest_arrow_files_open(tmp_path, monkeypatch):
    """A folder of many Arrow files (a datasets export, say) read in random order: at most
    OPEN_FILES of them mapped at a time, each row still the driver's."""
    monkeypatch.setattr(table_rows, "OPEN_FILES", 3)
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(12):
        table = pa.table({"text": [f"r{i}" for i in range(100 * n, 100 * n + 100)]})
        with pa.OSFile(str(folder / f"{n:02d}.arrow"), "wb") as sink, \
                pa.ipc.new_file(sink, table.schema) as f:  # (a path given: left open)
            f.write_table(table, max_chunksize=40)
    source = TableSource(folder)
    (_, rows), = source.rows(IdRanges(), None)
    rng = random.Random(1)
    for _ in range(50):
        start = rng.randrange(1200)
        part = rows[start:start + rng.randrange(1, 150)]
        assert part.read() == [f"r{i}" for i in part.ids.tolist()]
        assert len(next(iter(table_rows._OPEN.values()))._maps) <= 3
    assert len(open_files(folder)) <= 3
    table_rows.close_all()
    assert not open_files(folder)


def open_files(folder):
    """The files under ``folder`` this process holds open (its descriptors and its maps)."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.add(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # (the listing's own)
            pass
    with open("/proc/self/maps") as maps:
        held |= {line.split(maxsplit=5)[-1].strip() for line in maps}
    return {path for path in held if path.startswith(str(folder.resolve()))}


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_thread_workers_leave_no_input_file_open_after_the_run(tmp_path, fmt):
    path = parquet_folder(tmp_path / "in") if fmt == "parquet" else \
        arrow_file(tmp_path / "in.arrow")
    run_pipeline(path, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 64, tmp_path / "out.h5",
                 "thread", progress=False, writes="workers")
    assert len(read_output(tmp_path / "out.h5")["ids"]) == 2998
    assert not open_files(tmp_path)
