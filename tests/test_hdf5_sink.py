import time

import h5py
import numpy as np
import pytest

import helpers.engine.outputs.checkpoint
import helpers.engine.outputs.hdf5_sink
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import NO_ID, OutputSpec
from helpers.engine.outputs.hdf5_sink import HDF5Sink, read_output

SPEC = {"embeddings": OutputSpec((4,), "float32")}


def rows(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return ids, {"embeddings": np.repeat(ids[:, None], 4, axis=1).astype(np.float32)}


def test_out_of_order_appends_map_back_by_id(tmp_path):
    with HDF5Sink(tmp_path / "out.h5", SPEC, {"model": "m", "devices": ["cpu", "cpu"]}) as sink:
        for chunk in ([5, 6], [0, 1, 2], [7], [3, 4]):
            sink.append(*rows(chunk))
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(8))
    assert np.array_equal(data["embeddings"][:, 0], np.arange(8, dtype=np.float32))
    assert data["attrs"]["model"] == "m" and data["attrs"]["devices"] == ["cpu", "cpu"]
    with h5py.File(tmp_path / "out.h5") as f:
        assert f["embeddings"].maxshape == (None, 4) and not f["embeddings"].is_virtual
        assert f["ids"].dtype == np.int64 and f["embeddings"].dtype == np.float32
    assert not (tmp_path / "out.h5.parts").exists()  # a finished run is one file


def wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_full_part_goes_to_the_writer_thread_and_a_partial_one_waits(tmp_path, monkeypatch):
    monkeypatch.setattr(helpers.engine.outputs.hdf5_sink, "PART_ROWS", 100)
    sink = HDF5Sink(tmp_path / "out.h5", SPEC)
    sink.append(*rows(range(10)))
    assert not wait_for(lambda: sink.records_written > 0, 0.3)  # buffered, not yet on disk
    sink.append(*rows(range(10, 100)))  # a full part: written without anyone waiting for it
    assert wait_for(lambda: sink.records_written == 100)
    sink.append(*rows(range(100, 105)))
    sink.flush()  # hands over the rest and waits
    assert sink.records_written == 105
    sink.close()
    assert read_output(tmp_path / "out.h5")["ids"].tolist() == list(range(105))


def test_a_buffer_older_than_flush_seconds_is_written_on_poll(tmp_path, monkeypatch):
    monkeypatch.setattr(helpers.engine.outputs.hdf5_sink, "FLUSH_SECONDS", 0.1)
    with HDF5Sink(tmp_path / "out.h5", SPEC) as sink:
        sink.append(*rows(range(3)))
        time.sleep(0.2)
        sink.poll()
        assert wait_for(lambda: sink.records_written == 3)


def test_a_failing_writer_thread_fails_the_next_call_naming_the_error(tmp_path, monkeypatch):
    def broken(self, blocks):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(helpers.engine.outputs.checkpoint.Parts, "write", broken)
    sink = HDF5Sink(tmp_path / "out.h5", SPEC)
    sink.append(*rows(range(3)))
    with pytest.raises(RuntimeError, match="writer thread failed: OSError.*No space left"):
        sink.flush()
    with pytest.raises(RuntimeError, match="writer thread failed"):
        sink.close(complete=False)


def test_wrong_shape_or_missing_output_is_refused(tmp_path):
    with HDF5Sink(tmp_path / "out.h5", SPEC) as sink:
        with pytest.raises(ValueError, match="declared"):
            sink.append(np.arange(2), {"embeddings": np.zeros((2, 3), np.float32)})
        with pytest.raises(ValueError, match="declared"):
            sink.append(np.arange(2), {"other": np.zeros((2, 4), np.float32)})
    with pytest.raises(ValueError, match="reserved"):
        HDF5Sink(tmp_path / "bad.h5", {"ids": OutputSpec((), "int64")})


def test_a_finished_output_over_the_merge_limit_stays_an_index_and_options_are_named(
        tmp_path, monkeypatch):
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "MERGE_AT_END_BYTES", 0)
    monkeypatch.setattr(helpers.engine.outputs.hdf5_sink, "PART_ROWS", 4)
    with HDF5Sink(tmp_path / "out.h5", SPEC) as sink:
        for start in range(0, 12, 4):
            sink.append(*rows(range(start, start + 4)))
    assert read_output(tmp_path / "out.h5")["ids"].tolist() == list(range(12))
    with h5py.File(tmp_path / "out.h5") as f:
        assert f["embeddings"].is_virtual and f.attrs["complete"]
    assert (tmp_path / "out.h5.parts").is_dir()
    with pytest.raises(TypeError):  # (its fourth was durable, then whole: never positional now)
        HDF5Sink(tmp_path / "other.h5", SPEC, {}, True)


def test_errors_table(tmp_path):
    with HDF5Sink(tmp_path / "out.h5", SPEC) as sink:
        sink.append_errors([(3, "TypeError", "expected a text string, got NoneType", 1.0e9)])
        sink.append_errors([(NO_ID, "JSONDecodeError", "in.jsonl line 8: not JSON", 2.0e9, 7)])
        sink.append_errors([(4, "ValueError", "empty (key 'doc-4')", 3.0e9, -1, "doc-4")])
    errors = read_output(tmp_path / "out.h5")["errors"]
    assert errors == [{"id": 3, "type": "TypeError", "position": None, "key": None,
                       "message": "expected a text string, got NoneType", "time": 1.0e9},
                      {"id": None, "type": "JSONDecodeError", "position": 7, "key": None,
                       "message": "in.jsonl line 8: not JSON", "time": 2.0e9},
                      {"id": 4, "type": "ValueError", "position": None, "key": "doc-4",
                       "message": "empty (key 'doc-4')", "time": 3.0e9}]
    with h5py.File(tmp_path / "out.h5") as f:  # (a column of its own, issue 59)
        assert f["errors/key"].asstr()[...].tolist() == ["", "", "doc-4"]


def test_an_interrupted_durable_run_leaves_an_index_that_reads_like_the_file(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with HDF5Sink(tmp_path / "out.h5", SPEC, {"model": "m"}) as sink:
            sink.append(*rows(range(5)))
            sink.append_errors([(9, "ValueError", "bad", 1.0)])
            raise KeyboardInterrupt
    data = read_output(tmp_path / "out.h5")  # everything appended before the interruption
    assert data["ids"].tolist() == list(range(5)) and [e["id"] for e in data["errors"]] == [9]
    assert data["attrs"]["model"] == "m"
    with h5py.File(tmp_path / "out.h5") as f:
        assert f["ids"].is_virtual
    with HDF5Sink(tmp_path / "out.h5", SPEC, resume=True) as sink:
        assert sink.done == IdRanges(np.array([0, 9]), np.array([4, 9]))  # [0, 4] and [9, 9]
        sink.append(*rows(range(5, 9)))
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(9)) and data["attrs"]["resumed_after"] == 6


def test_resume_finds_a_part_written_before_the_index_named_it(tmp_path):
    """The index lags the parts; killed after the first part, the index is still empty."""
    out = tmp_path / "out.h5"
    sink = HDF5Sink(out, SPEC)
    parts = sink._parts
    parts.refresh_index = lambda force=False: None  # the index is not due yet ... then SIGKILL
    sink.append(*rows(range(7)))
    sink.flush()
    sink._lock.close()  # SIGKILL: the kernel drops the dead run's lock
    assert len(read_output(out)["ids"]) == 0 and any((tmp_path / "out.h5.parts").glob("*.h5"))
    with HDF5Sink(out, SPEC, resume=True) as again:
        assert len(again.done) == 7
        again.append(*rows(range(7, 9)))
    assert read_output(out)["ids"].tolist() == list(range(9))
