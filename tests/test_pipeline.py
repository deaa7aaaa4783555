"""The pipeline under each backend: exactly once, same output from every source, failures, speed."""
import json
import time

import numpy as np
import pytest

from helpers import (EmbeddingWorkload, PipelineError, SyntheticWorkload, WorkerPool, read_output,
                     run_pipeline)
from helpers.workloads.embedding import PHASES
from helpers.workloads.synthetic import record_vector

pytestmark = pytest.mark.timeout(180)  # reached only on deadlock: every run here ends in seconds

BACKENDS = ["process", "thread"]
FAIL_FAST_SECONDS = 15.0  # a failing run must end well before this (spawn + import included)


def run(source, workload, tmp_path, **kwargs):
    kwargs.setdefault("progress", False)
    return run_pipeline(source, workload, output=tmp_path / "out.h5", **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_workers", [1, 2, 3, 4])
@pytest.mark.parametrize("workunit_size", [1, 7, 1000])
def test_synthetic_exactly_once(tmp_path, backend, n_workers, workunit_size):
    records = [(i * 3, f"record {i}") for i in range(150)]  # ids need not be 0..n-1
    stats = run(records, SyntheticWorkload(0.0), tmp_path, devices=["cpu"] * n_workers,
                workunit_size=workunit_size, backend=backend)
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == [i for i, _ in records]
    expected = np.stack([record_vector(r, 8) for _, r in records])
    assert np.array_equal(data["values"], expected)
    assert stats.records == 150 and sum(w.records for w in stats.workers) == 150


EMBEDDING_CASES = [  # (backend, workers, workunit size): every pair on threads (a thread costs
    # a second); on processes (each imports torch: ~5 s) the two ends: many workers on workunits
    # of one record, and one worker on a workunit larger than the input
    *[("thread", n, size) for n in (1, 2, 3, 4) for size in (1, 7, 1000)],
    ("process", 3, 1), ("process", 1, 1000)]


@pytest.mark.slow
@pytest.mark.parametrize("backend, n_workers, workunit_size", EMBEDDING_CASES)
def test_embeddings_exactly_once_and_equal_to_encode(tmp_path, texts, reference_embeddings,
                                                      backend, n_workers, workunit_size):
    stats = run(list(enumerate(texts)), EmbeddingWorkload(), tmp_path,
                devices=["cpu"] * n_workers, workunit_size=workunit_size, backend=backend)
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(len(texts)))  # each id once, none missing
    assert data["embeddings"].shape == (len(texts), 384) and data["embeddings"].dtype == np.float32
    np.testing.assert_allclose(data["embeddings"], reference_embeddings, atol=1e-5, rtol=0)
    assert data["attrs"]["workunit_size"] == workunit_size
    assert data["attrs"]["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert stats.records == len(texts) and len(stats.workers) == n_workers
    for span in stats.timeline:  # each thread's own phases, even where threads share a model
        assert set(span.phases) == set(PHASES) and min(span.phases.values()) >= 0
        assert span.phases["forward"] > 0 and span.phases["tokenize"] > 0
        assert sum(span.phases.values()) <= span.end_s - span.start_s + 1e-3
    assert stats.phases == pytest.approx(
        {p: sum(s.phases[p] for s in stats.timeline) for p in PHASES})
    assert sum(stats.phases.values()) <= stats.stages["compute"] + 1e-3


def test_hdf5_jsonl_and_iterable_sources_give_the_same_output(tmp_path, texts):
    import h5py

    with h5py.File(tmp_path / "in.h5", "w") as f:
        for n, start in enumerate(range(0, len(texts), 10)):
            f.create_dataset(f"batches/{n}", data=np.array(texts[start:start + 10], dtype=object),
                             dtype=h5py.string_dtype("utf-8"))
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    outputs = []
    with WorkerPool(EmbeddingWorkload(), ["cpu"], "thread", progress=False) as pool:
        for n, source in enumerate((tmp_path / "in.h5", tmp_path / "in.jsonl",
                                    list(enumerate(texts)))):
            pool.run(source, tmp_path / f"out-{n}.h5", workunit_size=5)
            outputs.append(read_output(tmp_path / f"out-{n}.h5"))
    for other in outputs[1:]:
        assert np.array_equal(other["ids"], outputs[0]["ids"])
        np.testing.assert_array_equal(other["embeddings"], outputs[0]["embeddings"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_workers_read_an_hdf5_input_themselves_and_write_it_the_driver_reads_no_record(
        tmp_path, monkeypatch, backend):
    """writes="workers" on a source with ``rows``: workunits are ids and a way to open the file;
    each worker reads its records (a broken string: its own error row) and writes its part; a
    resume skips what is done. The same output as the driver's reading and writing."""
    import h5py

    from helpers.engine.inputs.sources import HDF5BatchesSource

    texts = [f"r{i}" for i in range(1500)]
    with h5py.File(tmp_path / "in.h5", "w") as f:
        for n, start in enumerate(range(0, len(texts), 400)):
            batch = [t.encode() for t in texts[start:start + 400]]
            if n == 1:
                batch[17] = b"\xff broken"  # record 417: not UTF-8
            f.create_dataset(f"batches/{n}", data=np.array(batch, dtype=object),
                             dtype=h5py.string_dtype("ascii"))
    reference = run_pipeline(tmp_path / "in.h5", SyntheticWorkload(0.0), ["cpu"] * 2, 64,
                             tmp_path / "driver.h5", backend, progress=False)
    monkeypatch.setattr(HDF5BatchesSource, "slices", None)  # the driver must not read records
    run_pipeline(tmp_path / "in.h5", SyntheticWorkload(0.0), ["cpu"] * 2, 64,
                 tmp_path / "workers.h5", backend, progress=False, writes="workers", limit=700)
    stats = run_pipeline(tmp_path / "in.h5", SyntheticWorkload(0.0), ["cpu"] * 2, 64,
                         tmp_path / "workers.h5", backend, progress=False, writes="workers",
                         resume=True)
    assert stats.resumed_after == 700 and stats.records == 1500 - 700
    driver, workers = read_output(tmp_path / "driver.h5"), read_output(tmp_path / "workers.h5")
    assert workers["ids"].tolist() == [i for i in range(1500) if i != 417]
    np.testing.assert_array_equal(workers["values"], driver["values"])
    assert reference.records == 1499
    assert [(e["id"], e["type"]) for e in workers["errors"]] == [(417, "UnicodeDecodeError")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_failure_at_load_names_worker_and_carries_traceback(tmp_path, backend):
    started = time.monotonic()
    with pytest.raises(PipelineError, match=r"worker \d on cuda:1 failed in loading the model: "
                                            r"InjectedFailure") as caught:
        run([(i, i) for i in range(100)], SyntheticWorkload(fail_on_load=True), tmp_path,
            devices=["cuda:1", "cuda:1"], backend=backend)
    assert time.monotonic() - started < FAIL_FAST_SECONDS
    assert "fail_on_load: refusing to load on cuda:1" in str(caught.value.__cause__)
    assert "synthetic.py" in str(caught.value.__cause__)  # the remote traceback, not ours


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failing_workunit_costs_only_its_bad_record(tmp_path, backend):
    records = [(i, f"r{i}") for i in range(2000)]
    stats = run(records, SyntheticWorkload(0.0001, fail_on_records={"r1234"}), tmp_path,
                devices=["cpu", "cpu"], workunit_size=10, backend=backend, sort_window=0)
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == [i for i in range(2000) if i != 1234]
    [error] = data["errors"]
    assert error["id"] == 1234 and error["type"] == "InjectedFailure" and "'r1234'" in error["message"]
    assert stats.partial and stats.recovery["retries"] == 1 and stats.recovery["splits"] >= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_fast_devices_take_more_workunits(tmp_path, backend):
    speed = {"cuda:0": 1.0, "cuda:1": 0.35, "cuda:2": 0.35}
    stats = run([(i, i) for i in range(600)], SyntheticWorkload(0.005, speed), tmp_path,
                devices=list(speed), workunit_size=5, backend=backend)
    share = {w.device: w.records / stats.records for w in stats.workers}
    expected = {d: s / sum(speed.values()) for d, s in speed.items()}  # 0.59, 0.21, 0.21
    for device in speed:
        assert share[device] == pytest.approx(expected[device], abs=0.08), share
    assert stats.workers[0].records > 2 * stats.workers[1].records


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_records_go_to_errors_and_cost_nothing_else(tmp_path, backend):
    records = [(0, "good"), (1, None), (2, 42), (3, "also good"), (4, b"bytes"), (5, ""),
               (6, "x" * 2**20)]
    stats = run(records, EmbeddingWorkload(), tmp_path, devices=["cpu"], workunit_size=4,
                backend=backend)
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == [0, 3]
    errors = {e["id"]: e for e in data["errors"]}
    assert {i: e["type"] for i, e in errors.items()} == {
        1: "TypeError", 2: "TypeError", 4: "TypeError", 5: "ValueError", 6: "ValueError"}
    assert "got NoneType" in errors[1]["message"] and "empty text" in errors[5]["message"]
    assert "1,048,576 characters" in errors[6]["message"]
    assert stats.partial and stats.failed_records == 5 and stats.records == 2


def test_stats_separate_spinup_from_steady_state(tmp_path):
    stats = run([(i, i) for i in range(200)], SyntheticWorkload(0.002), tmp_path,
                devices=["cpu", "cpu"], workunit_size=10)
    assert stats.spinup_s > 0 and stats.wall_s > 0
    assert stats.records_per_s == pytest.approx(200 / stats.wall_s)
    assert stats.wall_s >= 200 * 0.002 / 2  # two sleeping workers cannot beat this
    assert set(stats.stages) == {"read", "reader_blocked", "wait", "compute", "write",
                                 "write_blocked"}
    assert stats.stages["compute"] == pytest.approx(sum(w.busy_s for w in stats.workers))
    assert sum(w.workunits for w in stats.workers) == 20
    assert json.loads(json.dumps(stats.to_dict()))["records_per_s"] > 0


@pytest.mark.parametrize("bad, message", [
    ({"devices": ["gpu0"]}, "unknown device 'gpu0'"),
    ({"workunit_size": 0}, "workunit_size: expected an integer >= 1 or 'auto', got 0"),
    ({"backend": "dask"}, "backend: expected one of"),
    ({"queue_depth": -1}, "queue_depth"),
])
def test_bad_settings_fail_before_any_worker_starts(tmp_path, bad, message):
    kwargs = {"devices": ["cpu"], "workunit_size": 10, **bad}
    with pytest.raises(ValueError, match=message):
        run([(0, "x")], SyntheticWorkload(), tmp_path, **kwargs)


@pytest.mark.slow
def test_static_and_queue_fed_give_identical_binning_results(tmp_path):
    """The study's static split and the queue-fed pipeline on the same images and workers."""
    from helpers.engine.inputs.sources import ImageFolderSource
    from helpers.engine.outputs.hdf5_sink import read_output
    from helpers.study.paths import DATA
    from helpers.workloads.binning import BinningWorkload

    source = ImageFolderSource(DATA / "images")
    pairs = [pair for pair in source if "/page_" not in pair[1]][::20]  # 8 charts, collages and
    # photos: pages cost ~4 s each to OCR here
    with WorkerPool(BinningWorkload(), ["cpu", "cpu"], "process") as pool:
        queued = pool.run(pairs, tmp_path / "queue.h5", workunit_size=1, progress=False)
        static = pool.run_static(pairs, tmp_path / "static.h5")
    assert queued.records == static.records == len(pairs)
    assert sorted(s.worker for s in static.timeline) == [0, 1]  # one slice each
    a, b = read_output(tmp_path / "queue.h5"), read_output(tmp_path / "static.h5")
    np.testing.assert_array_equal(a["ids"], b["ids"])
    for name in ("bin", "classes", "text_boxes", "objects", "path"):
        np.testing.assert_array_equal(a[name], b[name])


def test_static_strategy_falls_back_to_one_worker_for_tiny_inputs(tmp_path):
    pairs = [(i, f"r{i}") for i in range(7)]  # fewer than 4 per worker on two workers
    stats = run_pipeline(pairs, SyntheticWorkload(), ["cpu", "cpu"], 2, tmp_path / "o.h5",
                         "thread", "static", progress=False)
    assert stats.devices == ("cpu",) and stats.records == 7
    stats = run_pipeline(pairs + [(7, "r7")], SyntheticWorkload(), ["cpu", "cpu"], 2,
                         tmp_path / "p.h5", "thread", "static", progress=False)
    assert stats.devices == ("cpu", "cpu") and stats.workunit_size == 4
    with pytest.raises(ValueError, match="strategy"):
        run_pipeline(pairs, SyntheticWorkload(), "cpu", 2, tmp_path / "q.h5", strategy="round")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_scheduler_dispatches_while_a_slow_write_is_in_progress(tmp_path, backend,
                                                                     monkeypatch):
    import helpers.engine.outputs.checkpoint
    import helpers.engine.outputs.hdf5_sink

    write, slow = helpers.engine.outputs.checkpoint.Parts.write, []

    def slow_first_write(self, blocks):
        if not slow:
            slow.append(time.monotonic())
            time.sleep(1.5)  # a disk that stalls: the workers must not notice
            slow.append(time.monotonic())
        return write(self, blocks)

    monkeypatch.setattr(helpers.engine.outputs.checkpoint.Parts, "write", slow_first_write)
    # parts from the first results on
    monkeypatch.setattr(helpers.engine.outputs.hdf5_sink, "PART_ROWS", 20)
    stats = run([(i, f"r{i}") for i in range(600)], SyntheticWorkload(0.002), tmp_path,
                devices=["cpu", "cpu"], workunit_size=5, backend=backend)
    assert len(slow) == 2 and slow[1] - slow[0] >= 1.5
    assert stats.records == 600 and read_output(tmp_path / "out.h5")["ids"].tolist() == \
        list(range(600))
    # 5 records of 2 ms: a dispatch every ~5 ms; writing on the scheduler's thread made it 1.5 s
    assert stats.longest_dispatch_gap_s < 0.5, stats.longest_dispatch_gap_s
    assert stats.longest_idle_s < 0.5, stats.longest_idle_s  # no worker waited
    assert stats.stages["write"] >= 1.5 and stats.stages["write_blocked"] < 0.5


def test_resume_skips_written_ranges_without_decoding_them(tmp_path, monkeypatch):
    import h5py

    import helpers.engine.inputs.sources

    with h5py.File(tmp_path / "in.h5", "w") as f:
        for n in range(3):  # 3 batches of 1,000: slices straddle what the first run wrote
            f.create_dataset(f"batches/{n}", dtype=h5py.string_dtype("utf-8"),
                             data=np.array([f"r{n * 1000 + i}" for i in range(1000)], dtype=object))
    workload = SyntheticWorkload(0.0)
    first = run(tmp_path / "in.h5", workload, tmp_path, devices=["cpu"], workunit_size=50,
                backend="thread", limit=1700)
    assert first.records == 1700
    decoded = []
    decode = helpers.engine.inputs.sources.decoded
    monkeypatch.setattr(helpers.engine.inputs.sources, "decoded",
                        lambda raw, position: decoded.append(raw) or decode(raw, position))
    stats = run(tmp_path / "in.h5", workload, tmp_path, devices=["cpu"], workunit_size=50,
                backend="thread", resume=True)
    assert stats.resumed_after == 1700 and stats.records == 1300
    assert len(decoded) == 1300 and decoded[0] == b"r1700"  # only what was left was decoded
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(3000))
    np.testing.assert_array_equal(data["values"][2500], record_vector("r2500", 8))


def test_an_input_rewritten_while_the_driver_reads_it_stops_the_run_unmixed(tmp_path):
    """Issue 44: with --writes driver, a Parquet input rewritten 3.5 s into a run gave 18,000
    old and 22,000 new rows, exit 0. The run now stops naming the file (an OSError: exit 1),
    and the output holds only the old file's rows."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from helpers.engine.inputs.sources import open_source

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"old{i}" for i in range(20_000)]}), path,
                   row_group_size=1000)
    source = open_source(path)
    real = source.slices

    def slices(skip, limit):
        for n, piece in enumerate(real(skip, limit)):
            if n == 3:
                pq.write_table(pa.table({"text": [f"new{i}" for i in range(20_000)]}), path,
                               row_group_size=1000)
                os.utime(path, ns=(1, 1))  # (another time, on any filesystem's clock)
            yield piece

    source.slices = slices
    with pytest.raises(OSError, match=r"in\.parquet: changed since the run started"):
        run_pipeline(source, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 256,
                     tmp_path / "out.h5", "thread", progress=False, writes="driver")
    done = read_output(tmp_path / "out.h5")
    assert len(done["ids"]) < 20_000  # (what was written before the stop: the old rows)
    assert all(np.array_equal(v, record_vector(f"old{i}", 8))
               for i, v in zip(done["ids"].tolist()[::50], done["values"][::50]))


def _corpus(path, fmt: str, word: str, n: int) -> None:
    """``n`` texts ``word0``, ``word1``, ... in ``fmt`` at ``path``: the same bytes for any
    three-letter ``word`` but the words themselves."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"{word}{i} " + "x" * 100 for i in range(n)]  # (a CSV read in blocks of 1 MiB)
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), path, row_group_size=500, compression="none",
                       use_dictionary=False)
    elif fmt == "csv":
        path.write_text("text\n" + "".join(f"{t}\n" for t in texts))
    else:
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


@pytest.mark.parametrize("writes", ["driver", "workers"])
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_an_input_rewritten_in_place_with_its_time_put_back_stops_the_run_unmixed(
        tmp_path, fmt, writes):
    """Issue 59: an input rewritten in place at the same size, its modification time put back
    (os.utime, touch -d, what cp -p and rsync -a leave), was mixed into the output on every
    format and either reading side (JSONL 17,236 old / 22,764 new rows, exit 0): the mid-run
    check compared size and time. Its change time moves with the write: the run stops naming
    the file, and what it wrote is the old file's rows alone."""
    import os

    path = tmp_path / f"in.{fmt}"
    _corpus(path, fmt, "old", 30_000)
    stat = os.stat(path)
    staged = tmp_path / f"staged.{fmt}"
    _corpus(staged, fmt, "new", 30_000)
    assert staged.stat().st_size == stat.st_size
    new, done = staged.read_bytes(), []

    class Rewriting(SyntheticWorkload):
        def process(self, model, records):
            if not done:  # (the first workunit: the rest of the input is still to be read)
                done.append(True)
                time.sleep(0.01)  # (a change time apart on any filesystem's clock)
                with open(path, "r+b") as f:
                    f.write(new)
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            return super().process(model, records)

    with pytest.raises((OSError, PipelineError), match=rf"in\.{fmt}: changed since the run "
                                                       rf"started"):
        run_pipeline(str(path), Rewriting(0.0, dim=8), ["cpu"] * 2, 250, tmp_path / "out.h5",
                     "thread", progress=False, writes=writes, queue_depth=1)
    assert os.stat(path).st_mtime_ns == stat.st_mtime_ns  # (the time was put back)
    data = read_output(tmp_path / "out.h5")
    assert len(data["ids"]) < 30_000
    np.testing.assert_array_equal(data["values"], np.array(  # (no row, if stopped before any)
        [record_vector(f"old{i} " + "x" * 100, 8) for i in data["ids"].tolist()],
        dtype=np.float32).reshape(-1, 8))


class Relinking(SyntheticWorkload):
    """Its first workunit (in whichever worker or process: the rest of the input still unread)
    gives the input another mode and a second name."""

    def __init__(self, path, flag):
        super().__init__(0.0, dim=8)
        self.path, self.flag = path, flag

    def process(self, model, records):
        import os

        try:
            os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return super().process(model, records)
        time.sleep(0.01)  # (a change time apart on any filesystem's clock)
        os.chmod(self.path, 0o600 if os.stat(self.path).st_mode & 0o777 != 0o600 else 0o640)
        os.link(self.path, self.path.parent / "backup")
        return super().process(model, records)


@pytest.mark.parametrize("writes,backend", [("driver", "thread"), ("workers", "process")])
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_an_input_given_a_new_mode_and_a_hard_link_mid_run_is_read_to_its_end(tmp_path, fmt,
                                                                               writes, backend):
    """Issue 59: a chmod, or a backup's new hard link (cp -al, rsnapshot), moves a file's change
    time as a rewrite does, and stopped a run of hours as "changed". The bytes tell them
    apart: digested again, the same as the run started with, the run goes on, on the driver's
    reader and on workers in their own processes (the digest travels with the file's stat)."""
    import os

    path = tmp_path / f"in.{fmt}"
    _corpus(path, fmt, "old", 10_000)
    flag = tmp_path / "changed"
    stats = run_pipeline(str(path), Relinking(path, flag), ["cpu"] * 2, 250,
                         tmp_path / "out.h5", backend, progress=False, writes=writes,
                         queue_depth=1)
    assert flag.exists() and os.stat(path).st_nlink == 2 and stats.records == 10_000
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(10_000))
    np.testing.assert_array_equal(data["values"][::97], np.stack(
        [record_vector(f"old{i} " + "x" * 100, 8) for i in range(0, 10_000, 97)]))


def test_a_text_that_is_not_valid_utf8_is_refused_once_at_its_record(tmp_path):
    """Issue 59: a text holding a lone surrogate ("\\ud800", what a JSON "\\\\ud800" escape
    reads as) was filed after two retries and three splits under the tokenizer's "TextEncodeInput
    must be Union...": it is refused at its record, saying what is wrong, and its workunit's
    other texts, accented ones included, are embedded."""
    records = [(0, "good"), (1, "half \ud800 a pair"), (2, "café naïve"), (3, "also good")]
    stats = run(records, EmbeddingWorkload(), tmp_path, devices=["cpu"], workunit_size=4,
                backend="thread")
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == [0, 2, 3]
    error, = data["errors"]
    assert (error["id"], error["type"]) == (1, "ValueError")
    assert "not valid UTF-8: surrogates not allowed '\\ud800' at character 5" in error["message"]
    assert not stats.recovery.get("retries") and not stats.recovery.get("splits")
