"""A worker reading a JSON-lines file's lines itself (helpers.engine.inputs.jsonl_rows): the
driver's one pass finds the lines, their starts and the blank ones; any lines in any order read as
the driver reads them; a workunit's message carries only the starts it needs; a file that differs
refused; ids that are not line numbers stay with the driver."""
import json
import os
import pickle
import random

import numpy as np
import pytest

from conftest import (as_driver_reads, assert_rows_are, read_by_either_side, run_changed_half_way,
                      run_then_resume, same_record)
from helpers import SyntheticWorkload, read_output, run_pipeline
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import BadRecord
from helpers.engine.inputs import jsonl_rows
from helpers.engine.inputs.jsonl import JSONLSource
from helpers.engine.inputs.sources import reads_by_position
from helpers.engine.inputs.table_files import count_lines

pytestmark = pytest.mark.timeout(300)  # reached only on deadlock

BLANK, SPACES, NOT_JSON, NULL, GIVEN, NO_TEXT = 5, 700, 900, 1234, 1500, 2000


def corpus(path, n=3000, final_newline=False):
    """n lines of short texts (some of two-byte characters), and one of each kind of bad line."""
    lines = [json.dumps({"text": f"r{i} " + "é" * (i % 7)}, ensure_ascii=False)
             for i in range(n)]
    lines[BLANK], lines[SPACES], lines[NOT_JSON] = "", "   \t", "not json"
    lines[NULL] = json.dumps({"text": None})
    lines[GIVEN] = json.dumps({"text": "x", "id": 3})
    lines[NO_TEXT] = json.dumps({"other": 1})
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""), encoding="utf-8")
    return path


def text_of(i):
    return f"r{i} " + "é" * (i % 7)


@pytest.mark.parametrize("final_newline", [False, True], ids=["no-last-newline", "newline"])
def test_any_lines_in_any_order_read_as_the_driver_reads_them(tmp_path, final_newline):
    source = JSONLSource(corpus(tmp_path / "in.jsonl", final_newline=final_newline))
    expected = as_driver_reads(source)
    (ids, rows), = source.rows(IdRanges(), None)
    assert reads_by_position(source) and ids.tolist() == sorted(expected)
    assert BLANK not in expected and SPACES not in expected and len(source) == 3000
    rng = random.Random(0)
    for _ in range(100):
        a = rng.randrange(len(ids))
        b = min(len(ids), a + rng.randrange(1, 700))
        sent = pickle.loads(pickle.dumps(rows[a:b]))  # as a worker gets it
        got = sent.read()
        assert len(got) == b - a
        assert all(same_record(g, expected[i]) for g, i in zip(got, ids[a:b].tolist())), (a, b)
        step = jsonl_rows.LINE_STEP
        assert len(sent.opener.starts) == ids[b - 1] // step - ids[a] // step + 1
    assert isinstance(expected[NOT_JSON], BadRecord) and expected[NULL].message.endswith(
        "line 1235: the text is null")
    assert "ids are the line numbers" in expected[GIVEN].message
    jsonl_rows.close_all()


def test_a_workunit_s_message_stays_small_however_long_the_file(tmp_path):
    """A workunit's Rows pickle the starts near its lines, not the file's (400,000 lines: 1,563
    starts, 12.5 KB, which every message would carry)."""
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"text": "a"}\n' * 400_000)
    (ids, rows), *_ = JSONLSource(path).rows(IdRanges(), None)
    whole = len(pickle.dumps(rows.opener))
    unit = rows[1000:1064]
    assert len(pickle.dumps(unit)) < len(pickle.dumps(unit.ids)) + 1000 < whole


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_the_line_index_is_the_same_however_the_file_is_read(tmp_path, monkeypatch, chunk):
    """Lines, starts and blank lines, with the reads cut anywhere (a blank line of spaces split
    across two reads, a line longer than a read, a line that starts with a space and is not
    blank, a last line of spaces without its newline)."""
    path = tmp_path / "in.jsonl"
    lines = [b'{"text": "%d"}' % i for i in range(1000)]
    lines[3], lines[255], lines[256], lines[600] = b"", b" " * 20, b"\t\r", b'{"text": "' + \
        b"x" * 300 + b'"}'
    lines[700], lines[999] = b'  {"text": "indented"}', b"   "
    path.write_bytes(b"\n".join(lines))
    monkeypatch.setattr(jsonl_rows, "SCAN_BYTES", chunk)
    index = jsonl_rows.line_index(str(path))
    data = path.read_bytes()
    line_starts = np.r_[0, np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1]
    assert index.lines == 1000 == count_lines([str(path)], header=False)
    np.testing.assert_array_equal(index.starts, line_starts[::jsonl_rows.LINE_STEP])
    assert index.blank.tolist() == [3, 255, 256, 999]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_workers_read_a_jsonl_corpus_themselves_and_resume(tmp_path, monkeypatch, backend):
    """writes="workers": the driver parses no line (its slices are gone), each worker reads its
    own; a limit, then a resume; every line once, each bad one filed as the driver files it."""
    monkeypatch.setattr(JSONLSource, "slices", None)
    first, stats, data = run_then_resume(corpus(tmp_path / "in.jsonl"), tmp_path / "out.h5",
                                         backend, limit=1000)
    assert (first.records, first.failed_records) == (997, 1)  # (two blank lines, one not JSON)
    assert stats.resumed_after == 998
    bad = (NOT_JSON, NULL, GIVEN, NO_TEXT)
    good = [i for i in range(3000) if i not in (BLANK, SPACES) + bad]
    assert_rows_are(data, good, text_of)
    assert stats.records == len(good) - first.records
    assert sorted(e["id"] for e in data["errors"]) == list(bad)


def test_a_bad_line_is_filed_alike_whichever_side_reads_it(tmp_path):
    driver, workers = read_by_either_side(corpus(tmp_path / "in.jsonl"), tmp_path)
    assert len(driver[0]) == 4 and driver == workers


@pytest.mark.parametrize("ids", ["given", "keys"])
def test_ids_that_are_not_line_numbers_stay_with_the_driver(tmp_path, ids):
    """A file whose lines name their ids: the driver reads it (it checks and carries them), the
    workers still write; asking its rows is refused by name."""
    path = tmp_path / "in.jsonl"
    value = (lambda i: 10 * i) if ids == "given" else (lambda i: f"doc-{i}")
    path.write_text("".join(json.dumps({"id": value(i), "text": f"r{i}"}) + "\n"
                            for i in range(500)))
    source = JSONLSource(path)
    assert not reads_by_position(source)
    with pytest.raises(ValueError, match="only where its ids are line numbers"):
        source.rows(IdRanges(), None)
    run_pipeline(path, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 64, tmp_path / "out.h5",
                 "thread", progress=False, writes="workers")
    data = read_output(tmp_path / "out.h5")
    assert len(data["ids"]) == 500 and not len(data["errors"])


@pytest.mark.parametrize("change", ["appended", "replaced"])
def test_a_worker_finding_the_file_changed_refuses_to_read_it(tmp_path, change):
    path = corpus(tmp_path / "in.jsonl")
    (_, rows), = JSONLSource(path).rows(IdRanges(), None)
    rows[:10].read()  # open in this process
    if change == "appended":
        with open(path, "a") as f:
            f.write('\n{"text": "more"}')
    else:  # (a worker that has it open reads on the file the driver read; one that opens it:)
        other = corpus(tmp_path / "other.jsonl", n=3001)
        os.replace(other, path)
        jsonl_rows.close_all()
    with pytest.raises(OSError, match="in.jsonl: changed since the run started"):
        rows[2000:2010].read()
    jsonl_rows.close_all()


def test_a_file_changed_half_way_stops_the_run(tmp_path, monkeypatch):
    """Lines appended while the workers read: the worker that reads next refuses, and the run
    stops naming the input (no line of the new file is written, none filed as an error)."""
    path = corpus(tmp_path / "in.jsonl")

    def append():
        with open(path, "a") as f:
            f.write('\n{"text": "more"}')

    data = run_changed_half_way(monkeypatch, path, tmp_path / "out.h5", jsonl_rows.JSONLRows,
                                append, "in.jsonl")
    assert len(data["ids"]) < 3000 and 3000 not in data["ids"].tolist()


@pytest.mark.parametrize("case", ["bad-utf8-elsewhere", "object-over-lines", "deep"])
def test_a_line_pyarrow_would_read_otherwise_is_the_same_record_in_any_block(tmp_path, case):
    """Invalid UTF-8 in a field the run ignores, an object spread over two lines beside two
    objects on one line (pyarrow's row count came out right, each text on another's line), a
    line nested past Python's recursion limit: the same record or error row whether its block
    is the driver's (with a bad line in it: parsed a line at a time) or a worker's one line."""
    lines = {"bad-utf8-elsewhere": [b"oops", b'{"text": "ok", "x": "\xff"}', b'{"text": "r2"}'],
             "object-over-lines": [b'{"text":', b'"a"}', b'{"text": "x"}{"text": "y"}',
                                   b'{"text": "r3"}'],
             "deep": [b"oops", b'{"text": "r1"}', b'{"text": "r2", "x": ' + b"[" * 5000 +
                      b"]" * 5000 + b"}"]}[case]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    source = JSONLSource(path)
    expected = as_driver_reads(source)
    (ids, rows), = source.rows(IdRanges(), None)
    one_at_a_time = [pickle.loads(pickle.dumps(rows[k:k + 1])).read()[0] for k in range(len(ids))]
    assert all(same_record(got, expected[i]) for got, i in zip(one_at_a_time, ids.tolist()))
    if case == "object-over-lines":  # no line credited with another's text
        assert not any(isinstance(r, str) for i, r in expected.items() if i < 3)
    if case == "bad-utf8-elsewhere":
        assert expected[1].error_type == "UnicodeDecodeError"
    jsonl_rows.close_all()


def test_an_input_through_a_link_is_named_as_the_user_named_it(tmp_path):
    target = corpus(tmp_path / "v3.jsonl")
    (tmp_path / "latest.jsonl").symlink_to(target)
    source = JSONLSource(tmp_path / "latest.jsonl")
    (ids, rows), = source.rows(IdRanges(), None)
    got = pickle.loads(pickle.dumps(rows)).read()
    bad = [r for r in got if isinstance(r, BadRecord)]
    assert bad and all(r.message.startswith("latest.jsonl line ") for r in bad)
    jsonl_rows.close_all()


def test_rows_joined_from_two_narrowed_openers_refuse_rather_than_read_other_lines(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"".join(b'{"text": "t%d"}\n' % i for i in range(3000)))
    (ids, rows), = JSONLSource(path).rows(IdRanges(), None)
    early = pickle.loads(pickle.dumps(rows[2000:2010]))
    late = pickle.loads(pickle.dumps(rows[10:20]))
    assert (early + late)[:10].read() == [f"t{i}" for i in range(2000, 2010)]
    with pytest.raises(ValueError, match="not among this opener's line starts"):
        (early + late).read()
    jsonl_rows.close_all()
