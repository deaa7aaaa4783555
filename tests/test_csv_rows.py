"""A worker reading a CSV/TSV input's rows itself (helpers.engine.inputs.csv_rows): any rows in
any order read as the driver reads them (its pass over the file: tests/test_csv_scan.py), a
workunit's message carries only the starts it needs, a file that differs or a count that
disagrees stops the run, and keys and kept columns stay with the driver."""
import pickle
import random

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from conftest import (as_driver_reads, assert_rows_are, read_by_either_side, run_changed_half_way,
                      run_then_resume, same_record)
from helpers import SyntheticWorkload, read_output, run_pipeline
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import NO_ID, BadRecord, SourceError
from helpers.engine.inputs import csv_rows, table_files
from helpers.engine.inputs.sources import reads_by_position
from helpers.engine.inputs.table_files import MAX_LINES_IN_VALUE, count_lines
from helpers.engine.inputs.tables import TableSource

pytestmark = pytest.mark.timeout(300)  # reached only on deadlock

NULL, NOT_UTF8, SPANNING = 700, 1234, 2000  # rows (ids) that are errors
WIDE, NARROW = 5, 1500  # lines of another width (no id: before the row of that id)


def text_of(i):
    """Row i's text: commas, doubled quotes and line breaks in some, a stray quote in one."""
    return [f"r{i} " + "é" * (i % 7), f'r{i}, "q"', f"r{i}\nnext", f"r{i}\r\n,x"][i % 4]


def field(i):
    text = text_of(i)
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\r\n') else text


def corpus(path, n=3000, end="\n", first=0):
    """n rows of ``text,n`` (ids first..), and one of each kind of bad row."""
    lines, rows = ["text,n"], []
    for i in range(first, first + n):
        if i == WIDE:
            lines.append("a,b,c")
        if i == NARROW:
            lines.append("lonely")
        value = {NULL: "", SPANNING: '"' + "\n" * (MAX_LINES_IN_VALUE + 1) + '"',
                 100: '5" tall'}.get(i, field(i))
        lines.append(f"{value},{i}")
        rows.append(i)
        if i % 500 == 3:
            lines.append("")  # a blank line: no row
    data = end.join(lines).encode() + end.encode()
    data = data.replace(f"{field(NOT_UTF8)},".encode(), b"bad\xff,")
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("files", [1, 2])
def test_any_rows_in_any_order_read_as_the_driver_reads_them(tmp_path, end, files):
    for k in range(files):
        corpus(tmp_path / f"part-{k}.csv", 3000 // files, end, first=k * (3000 // files))
    source = TableSource(tmp_path if files > 1 else tmp_path / "part-0.csv")
    expected = pyarrow_streams(source)
    assert all(same_record(expected[i], r) for i, r in as_driver_reads(source).items() if i >= 0)
    (ids, rows), *bad = source.rows(IdRanges(), None)
    assert reads_by_position(source) and ids.tolist() == sorted(i for i in expected if i >= 0)
    assert len(ids) == 3000 == len(source)
    assert sorted(message for _, records, _ in bad for message in
                  [r.message.split(": ", 1)[1] for r in records]) == [
        "a row with the wrong number of fields: 'a,b,c'",
        "a row with the wrong number of fields: 'lonely'"]
    assert all((i == NO_ID).all() for i, _, _ in bad)
    rng = random.Random(0)
    for _ in range(60):
        a = rng.randrange(len(ids))
        b = min(len(ids), a + rng.randrange(1, 700))
        picked = np.sort(rng.sample(range(a, b), min(b - a, rng.choice([b - a, 3]))))
        sent = pickle.loads(pickle.dumps(rows[a:b]))  # as a worker gets it
        got = sent.read()
        assert all(same_record(g, expected[i]) for g, i in zip(got, ids[a:b].tolist())), (a, b)
        assert len(got) == b - a
        some = pickle.loads(pickle.dumps(csv_rows_of(rows, picked))).read()
        assert all(same_record(g, expected[i]) for g, i in zip(some, ids[picked].tolist()))
    assert expected[1] == text_of(1) and expected[2] == text_of(2) and expected[100] == '5" tall'
    assert expected[NULL].message.endswith(f"part-0.csv row {NULL}: the text is null")
    assert expected[NOT_UTF8].error_type == "UnicodeDecodeError"
    assert "spans over 1000 lines" in expected[SPANNING].message
    csv_rows.close_all()


def pyarrow_streams(source):
    """Each record by id as pyarrow's streaming reader gives them (the driver's reading of a
    CSV with keys or kept columns)."""
    return {i: r for ids, records, _ in source._read(IdRanges(), None)
            for i, r in zip(ids.tolist(), records)}


def csv_rows_of(rows, picked):
    """Rows ``picked`` (positions in ``rows``) as one Rows (ids with gaps)."""
    from helpers.engine.contract.protocol import Rows

    return Rows(rows.opener, rows.ids[picked])


def test_a_workunit_s_message_stays_small_however_long_the_file(tmp_path):
    path = tmp_path / "long.csv"
    path.write_bytes(b"text\n" + b"a\n" * 400_000)
    (ids, rows), *_ = TableSource(path).rows(IdRanges(), None)
    whole = len(pickle.dumps(rows.opener))
    unit = rows[1000:1064]
    assert len(pickle.dumps(unit)) < len(pickle.dumps(unit.ids)) + 1000 < whole


def test_its_length_counts_rows_not_lines(tmp_path):
    path = corpus(tmp_path / "in.csv")
    assert len(TableSource(path)) == 3000 < count_lines([str(path)], header=True)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_workers_read_a_csv_corpus_themselves_and_resume(tmp_path, monkeypatch, backend):
    """writes="workers": the driver parses no row (its reading is gone), each worker reads its
    own; a limit, then a resume; every row once, each bad one filed as the driver files it."""
    monkeypatch.setattr(TableSource, "_read", None)
    first, stats, data = run_then_resume(corpus(tmp_path / "in.csv"), tmp_path / "out.h5",
                                         backend, limit=1000)
    assert first.records == 999 and stats.resumed_after == 1002  # (700, and the two rows of
    assert stats.failed_records == 2  # other widths filed: not again; 1234 and 2000 are new)
    bad = (NULL, NOT_UTF8, SPANNING)
    good = [i for i in range(3000) if i not in bad]
    assert_rows_are(data, good, text_of)
    assert stats.records == len(good) - first.records
    assert sorted(e["id"] for e in data["errors"] if e["id"] is not None) == list(bad)
    assert sorted(e["message"].split(": ")[-1] for e in data["errors"] if e["id"] is None) == [
        "'a,b,c'", "'lonely'"]  # each once


def test_a_resume_files_each_row_of_another_width_once_whoever_writes(tmp_path):
    """Such a row has no id: it is known by a position after the input's rows, which the
    resumed run skips (it was filed again by every resume)."""
    path = corpus(tmp_path / "in.csv")
    for writes, changes in [("driver", dict(limit=1000)), ("workers", dict(resume=True)),
                            ("driver", dict(resume=True))]:
        run_pipeline(path, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 64, tmp_path / "out.h5",
                     "thread", progress=False, writes=writes, **changes)
    errors = read_output(tmp_path / "out.h5")["errors"]
    assert sorted(e["position"] for e in errors if e["id"] is None) == [3000, 3001]
    assert len(errors) == 5


def test_a_bad_row_is_filed_alike_whichever_side_reads_it(tmp_path):
    driver, workers = read_by_either_side(corpus(tmp_path / "in.csv"), tmp_path)
    assert len(driver[0]) == 5 and driver == workers


def test_an_integer_id_column_stays_with_the_driver(tmp_path):
    """Ids that are values, not row numbers: the driver reads the file (it checks them), the
    workers still write; asking its rows is refused by name."""
    source = TableSource(corpus(tmp_path / "in.csv"), id_column="n")
    assert not reads_by_position(source)
    with pytest.raises(ValueError, match="workers cannot read it by row"):
        source.rows(IdRanges(), None)
    run_pipeline(source, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 64, tmp_path / "out.h5",
                 "thread", progress=False, writes="workers")
    assert len(read_output(tmp_path / "out.h5")["ids"]) == 2997


def test_keys_and_kept_columns_are_read_by_the_driver_and_the_texts_by_the_workers(tmp_path):
    """String keys (a repeat, a null, one with a NUL among them) and a kept column: the driver
    reads those columns from the same spans, the workers the texts; the same output either
    way, each bad row filed alike."""
    lines = ["text,doc,m"] + [f"t{i},d{i:05d},{i}" for i in range(600)]
    lines[100], lines[200], lines[300] = "t99,d00050,99", "t199,,199", "a,b,c,d"
    lines[500] = '"' + "\n" * 1001 + '",d00499,499'  # (a text over 1,000 lines)
    path = tmp_path / "in.csv"
    path.write_bytes(("\n".join(lines) + "\n").replace("d00400", "d\x004").encode())
    source = TableSource(path, id_column="doc", keep_columns=["m"])
    assert reads_by_position(source) and source.keyed
    (driver_errors, driver_ids), (worker_errors, worker_ids) = read_by_either_side(
        source, tmp_path)
    assert driver_errors == worker_errors and driver_ids == worker_ids
    found = {row[3]: (row[1], row[2]) for row in driver_errors}
    assert sorted(found) == [99, 199, 399, 498, 599] and found[99][0] == "DuplicateId"
    assert found[498][1].endswith("the rows after it (key 'd00499')")
    assert "'d00050' appeared earlier" in found[99][1] and "is null" in found[199][1]
    assert "holds a NUL" in found[399][1] and "wrong number of fields" in found[599][1]
    for name in ["driver", "workers"]:
        data = read_output(tmp_path / f"{name}.h5")
        line = [i + (i >= 299) for i in data["ids"].tolist()]  # (the row of another width:
        assert data["doc"].tolist() == [f"d{k:05d}" for k in line]  # no row, no id)
        assert data["m"].tolist() == line


def test_a_file_changed_half_way_stops_the_run(tmp_path, monkeypatch):
    path = corpus(tmp_path / "in.csv")

    def append():
        with open(path, "a") as f:
            f.write("more,1\n")

    data = run_changed_half_way(monkeypatch, path, tmp_path / "out.h5", csv_rows.CSVRows, append,
                                "in.csv")
    assert len(data["ids"]) < 2997


@pytest.mark.parametrize("case", ["cut", "shifted"])
def test_starts_that_are_not_the_driver_s_rows_stop_rather_than_renumber(tmp_path, case):
    """Starts that are not the file's rows (what a pass that misread a quote would find): the
    worker's parse fails or finds another number of rows, and it refuses, naming the bytes."""
    path = corpus(tmp_path / "in.csv")
    (ids, rows), *_ = TableSource(path).rows(IdRanges(), None)
    file = rows.opener.files[0]
    starts = file.starts.copy()
    starts[3] = starts[2] + 10 if case == "cut" else starts[4]  # (inside row 256; row 512)
    broken = type(rows)(type(rows.opener)(rows.opener.format, rows.opener.text_column, (
        type(file)(file.path, file.stat, file.columns, file.first, file.rows, starts,
                   file.bad),)), rows.ids[300:310])
    with pytest.raises(OSError, match="in.csv: bytes [0-9]+-[0-9]+ " + (
            "are not the rows the driver found: CSV parse error" if case == "cut" else
            "hold 256 rows, the driver counted 128: it would credit a text to another row")):
        broken.read()
    assert rows[300:310].read() == [text_of(i) for i in range(300, 310)]
    csv_rows.close_all()


@pytest.mark.parametrize("where", ["first-block", "later"])
def test_a_row_of_another_width_that_is_not_utf8_costs_only_itself(tmp_path, monkeypatch, where):
    """pyarrow fails on such a row (it decodes the text it hands its handler): the columns are
    read from the first block without it, and either side parses its rows' bytes without the
    rows the driver files."""
    if where == "later":
        monkeypatch.setattr(table_files, "CSV_BLOCK_BYTES", 1024)
    path = tmp_path / "in.csv"
    path.write_bytes(b"text,n\n" + b"".join(b"r%d,%d\n" % (i, i) for i in range(300)) +
                     b"wide\xff,1,2\n" + b"".join(b"s%d,%d\n" % (i, i) for i in range(300)))
    source = TableSource(path)
    (ids, rows), (_, bad, _) = source.rows(IdRanges(), None)
    texts = [f"r{i}" for i in range(300)] + [f"s{i}" for i in range(300)]
    assert rows.read() == texts == [r for _, rs, _ in source.slices(IdRanges(), None)
                                    for r in rs if isinstance(r, str)]
    assert [r.message for r in bad] == ["in.csv row 300 (every row counted): a row with the "
                                        "wrong number of fields: 'wide\ufffd,1,2'"]
    csv_rows.close_all()


@pytest.mark.parametrize("case", ["crlf-at-a-block-s-end", "nul-near-the-end"])
def test_the_driver_reads_a_csv_as_pyarrow_reads_the_whole_file(tmp_path, case):
    """Where pyarrow's streaming reader, 4 MiB at a time, reads a row otherwise than its
    reading of the whole file (it drops the line feed of a quoted CRLF whose CR ends a block:
    apache/arrow#51368; it splits a quoted value after a NUL near the file's end:
    apache/arrow#50481), the driver reads what the whole file holds, as the workers do: the
    same text, the ids of the next file not shifted."""
    from helpers.engine.inputs.table_files import CSV_BLOCK_BYTES as BLOCK

    (tmp_path / "in").mkdir()
    if case == "crlf-at-a-block-s-end":
        row = b"y" * 999 + b"\n"
        data = b"text\n" + row * ((BLOCK - 5) // len(row) - 1)
        data = data.ljust(BLOCK - 4, b"z") + b'\n"a\r\nb"\n' + row * 100
        assert data.index(b"\r") == BLOCK - 1
    else:
        data = b"text,n\n"
        while len(data) + 1000 < BLOCK - 2000:
            data += b"f" * 997 + b",0\n"
        data += b"x" * (BLOCK - 12 - len(data)) + b",1\n" + b'\x00a,"q\nb,c\nd,e"\n' + \
            b"f,g\nh,i\n"
        assert data.index(b'"') == BLOCK - 6 and len(data) - BLOCK < 16
    (tmp_path / "in" / "a.csv").write_bytes(data)
    (tmp_path / "in" / "b.csv").write_bytes(data[:data.index(b"\n") + 1] + b"b0,0\nb1,1\n"
                                            [:None if case != "crlf-at-a-block-s-end" else 0] +
                                            (b"b0\nb1\n" if case == "crlf-at-a-block-s-end"
                                             else b""))
    whole = [t.decode() for name in ("a.csv", "b.csv") for t in pacsv.read_csv(
        tmp_path / "in" / name, pacsv.ReadOptions(block_size=len(data) + 1),
        convert_options=pacsv.ConvertOptions(column_types={"text": pa.binary()})
    ).column("text").to_pylist()]
    source = TableSource(tmp_path / "in")
    got = as_driver_reads(source)
    assert len(source) == len(whole) and [got[i] for i in range(len(got))] == whole
    assert whole[-1] == "b1" and ("a\r\nb" in whole or case != "crlf-at-a-block-s-end")
    csv_rows.close_all()


def test_a_file_changed_after_its_columns_were_read_is_refused(tmp_path):
    """The same width, its columns reordered between opening the source and reading it: the
    columns read at the start would name the wrong one (the workers would read the ids as the
    texts)."""
    path = tmp_path / "in.csv"
    path.write_text("text,n\n" + "".join(f"t{i},{i}\n" for i in range(100)))
    source = TableSource(path)
    path.write_text("n,text\n" + "".join(f"{i},t{i}\n" for i in range(100)))
    with pytest.raises(SourceError, match="in.csv.: written to since it was opened"):
        source.rows(IdRanges(), None)
    with pytest.raises(SourceError, match="written to since it was opened"):
        len(source)


@pytest.mark.parametrize("options", [{}, {"id_column": "n"}], ids=["rows", "ids"])
def test_a_file_of_no_row_of_the_header_s_width_still_files_its_rows(tmp_path, options):
    path = tmp_path / "in.csv"
    path.write_bytes(b"text,n\nx,y,z\nlonely\n")
    records = [r for _, rs, _ in TableSource(path, **options).slices(IdRanges(), None)
               for r in rs]
    assert [r.message for r in records] == [
        "in.csv row 0 (every row counted): a row with the wrong number of fields: 'x,y,z'",
        "in.csv row 1 (every row counted): a row with the wrong number of fields: 'lonely'"]


def test_a_header_that_is_not_utf8_is_refused_by_name(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b"te\xffxt,n\na,1\n")
    with pytest.raises(SourceError, match="in.csv.: not a readable csv file"):
        TableSource(path)


def test_an_empty_file_in_a_folder_is_named(tmp_path):
    corpus(tmp_path / "a.csv", 10)
    (tmp_path / "b.csv").write_bytes(b"")
    with pytest.raises(SourceError, match=r"\('.*b\.csv'\): not a readable csv file"):
        TableSource(tmp_path)


@pytest.mark.parametrize("first", ["long-row", "quoted-across", "bad-rows", "blank-lines"])
def test_the_columns_types_come_from_rows_of_the_header_s_width(tmp_path, monkeypatch, first):
    """A first block holding no such row (a first row longer than it, a quoted value across
    its end, rows of another width, blank lines) grows until it holds one: an integer id column
    read from the header alone would be null, taken for keys (ids row numbers)."""
    monkeypatch.setattr(table_files, "CSV_BLOCK_BYTES", 1024)
    top = {"long-row": "1000,x" + "y" * 3000 + "\n", "quoted-across": '1000,"' + "z\n" * 1500 +
           '"\n', "bad-rows": "a,b,c\n" * 400, "blank-lines": "\n" * 2000}[first]
    path = tmp_path / "in.csv"
    path.write_text("n,text\n" + top + "".join(f"{1001 + i},r{i}\n" for i in range(100)))
    source = TableSource(path, id_column="n")
    assert not source.keyed
    ids = [i for ids, _, _ in source.slices(IdRanges(), None) for i in ids.tolist() if i >= 0]
    assert ids == ([1000] if first in ("long-row", "quoted-across") else []) + \
        list(range(1001, 1101))


def test_a_row_of_another_width_is_filed_once_with_integer_ids_too(tmp_path):
    """Its position (the input's rows, then its place) may be a done id's value: it is still
    filed (a run killed before it came to it files it on resume), and once."""
    lines = ["text,n"] + [f"t{i},{i + 100}" for i in range(300)] + ["x,y,z"]
    path = tmp_path / "in.csv"
    path.write_text("\n".join(lines) + "\n")
    done = IdRanges.from_ids(np.arange(100, 350))  # (300 among them)
    filed = [r for _, rs, _ in TableSource(path, id_column="n").slices(done, None) for r in rs
             if isinstance(r, BadRecord)]
    assert [r.position for r in filed] == [300]
    for changes in [dict(limit=200), dict(resume=True), dict(resume=True)]:
        run_pipeline(TableSource(path, id_column="n"), SyntheticWorkload(0.0, dim=8),
                     ["cpu"] * 2, 64, tmp_path / "out.h5", "thread", progress=False, **changes)
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(100, 400))
    assert [(e["id"], e["position"]) for e in data["errors"]] == [(None, 300)]
