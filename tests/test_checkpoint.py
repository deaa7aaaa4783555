"""Crash-safe output: a writer killed at any moment leaves a file that opens and holds whole
blocks; a whole run killed with SIGKILL and resumed equals an uninterrupted one."""
import os
import random
import subprocess
import sys
import time

import h5py
import numpy as np
import psutil
import pytest

import helpers.engine.outputs.checkpoint
import helpers.engine.outputs.hdf5_sink
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import OutputSpec
from helpers.engine.outputs.checkpoint import INDEX_EVERY, Index, Parts
from helpers.engine.outputs.hdf5_sink import HDF5Sink, read_output, rows_written
from helpers.study.paths import ROOT
from helpers.workloads.synthetic import record_vector

pytestmark = pytest.mark.timeout(300)  # reached only on deadlock

SPEC = {"values": OutputSpec((8,), "float32"), "label": OutputSpec((), "str")}
BLOCK = 1024  # helpers.engine.outputs.hdf5_sink.CHUNK_RECORDS: one part per block
WRITER = """
import sys
import numpy as np
import helpers.engine.outputs.checkpoint
from helpers.engine.outputs.hdf5_sink import HDF5Sink
from helpers.engine.contract.protocol import OutputSpec
# merges (and their clean-up) happen often: kills hit them
helpers.engine.outputs.checkpoint.COMPACT_PARTS = 3
spec = {"values": OutputSpec((8,), "float32"), "label": OutputSpec((), "str")}
with HDF5Sink(sys.argv[1], spec, {"run": "killed"}) as sink:
    for start in range(0, 10**7, 1024):
        ids = np.arange(start, start + 1024)
        sink.append(ids, {"values": np.repeat(ids[:, None], 8, 1).astype(np.float32),
                          "label": np.array([f"r{i}" for i in ids], dtype=object)})
"""


def check_blocks(path):
    """The file opens; its rows are whole blocks 0..k*BLOCK-1 with matching values and labels."""
    data = read_output(path)
    n = len(data["ids"])
    assert n % BLOCK == 0 and data["ids"].tolist() == list(range(n))
    assert np.array_equal(data["values"][:, 3], np.arange(n, dtype=np.float32))
    assert data["label"].tolist() == [f"r{i}" for i in range(n)]
    return n


@pytest.mark.parametrize("seed", range(8))
def test_a_writer_killed_at_any_moment_leaves_a_readable_file(tmp_path, seed):
    out = tmp_path / "out.h5"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(out)],
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 30
    while not rows_written(out):  # from its first indexed part on (its start varies with load)
        assert writer.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(random.Random(seed).uniform(0.0, 2.0))  # writes, merges, index rewrites, clean-ups
    writer.kill()
    writer.wait()
    written = check_blocks(out)
    assert written > 0
    with HDF5Sink(out, SPEC, resume=True) as sink:  # carries on from what survived
        done = len(sink.done)  # the index may lag the parts: resume finds those too
        assert sink.done == IdRanges(np.array([0]), np.array([done - 1]))
        assert done >= written and done % BLOCK == 0
        ids = np.arange(done, done + 10)
        sink.append(ids, {"values": np.repeat(ids[:, None], 8, 1).astype(np.float32),
                          "label": np.array([f"r{i}" for i in ids], dtype=object)})
    data = read_output(out)
    assert data["ids"].tolist() == list(range(done + 10))
    assert not (tmp_path / "out.h5.parts").exists()


def blocks(parts, n):
    for number in range(n):
        ids = np.arange(number * 10, number * 10 + 10)
        parts.write([{"ids": ids, "values": np.zeros((10, 8), np.float32),
                      "label": np.array(["x"] * 10, dtype=object)}])


def test_parts_merge_by_level_and_a_crash_mid_merge_leaves_no_duplicate(tmp_path, monkeypatch):
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "COMPACT_PARTS", 3)
    parts = Parts(tmp_path / "out.h5", SPEC)
    parts.scan()
    blocks(parts, 10)  # levels: 9 -> one L2 (0-8); then one L0 (9)
    names = sorted(p.path.name for p in parts.parts)
    assert names == ["part-L0-00000009-00000009.h5", "part-L2-00000000-00000008.h5"]
    # a crash after a merge was renamed into place but before its sources were deleted:
    extra = tmp_path / "out.h5.parts" / "part-L0-00000004-00000004.h5"
    with h5py.File(extra, "w") as f:
        for name, (shape, dtype) in helpers.engine.outputs.checkpoint.columns(SPEC).items():
            f.create_dataset(name, shape=(0, *shape), dtype=dtype)
    (tmp_path / "out.h5.parts" / "part-L0-00000010-00000010.h5.tmp").write_bytes(b"half")
    again = Parts(tmp_path / "out.h5", SPEC)
    again.scan()
    assert sorted(p.path.name for p in again.parts) == names  # covered and unfinished: dropped
    assert again.done() == IdRanges(np.array([0]), np.array([99]))


def test_resuming_with_another_workload_is_refused_naming_the_dataset(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with HDF5Sink(tmp_path / "out.h5", SPEC) as sink:
            sink.append(np.arange(3), {"values": np.zeros((3, 8), np.float32),
                                       "label": np.array(["a"] * 3, dtype=object)})
            raise KeyboardInterrupt
    other = {"values": OutputSpec((16,), "float32"), "label": OutputSpec((), "str")}
    with pytest.raises(ValueError, match=r"'values' holds \(8,\) float32, this run writes \(16,\)"):
        HDF5Sink(tmp_path / "out.h5", other, resume=True)


# -- a whole CLI run killed with SIGKILL, then resumed -------------------------------------------

def cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return [sys.executable, "-m", "helpers", "run", *args, "--no-progress"], env


def kill_run_at(command, env, seconds, when=lambda: False):
    """Start the run, SIGKILL it after ``seconds`` or once ``when()``; returns once its workers
    are gone too."""
    run = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(run.pid)
    workers = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and run.poll() is None and not when():
        try:
            workers += [c for c in parent.children() if c not in workers]
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    run.kill()
    run.wait()
    gone, alive = psutil.wait_procs(workers, timeout=5)  # they notice their parent is dead
    assert not alive, f"workers outlived the killed run: {[p.pid for p in alive]}"


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("input") / "in.jsonl"
    path.write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(3000)))
    return path


@pytest.fixture(scope="module")
def uninterrupted(jsonl, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "out.h5"
    command, env = cli("--input", str(jsonl), "--output", str(out), "--workload", "synthetic",
                       "--seconds-per-record", "0.002", "--devices", "cpu,cpu",
                       "--workunit-size", "20")
    assert subprocess.run(command, env=env, capture_output=True).returncode == 0
    return read_output(out)


@pytest.mark.slow
@pytest.mark.parametrize("seed, writes", [(0, "driver"), (1, "driver"), (2, "driver"),
                                         (0, "workers"), (1, "workers")])
def test_a_run_killed_with_sigkill_then_resumed_equals_an_uninterrupted_one(
        tmp_path, jsonl, uninterrupted, seed, writes):
    out = tmp_path / "out.h5"
    command, env = cli("--input", str(jsonl), "--output", str(out), "--workload", "synthetic",
                       "--seconds-per-record", "0.002", "--devices", "cpu,cpu",
                       "--workunit-size", "20", "--writes", writes)
    kill_run_at(command, env, random.Random(seed).uniform(1.0, 4.0))  # ~1 s start, ~3 s of work
    if out.exists():
        survived = read_output(out)  # opens, whatever moment the kill came
        assert len(np.unique(survived["ids"])) == len(survived["ids"])
    done = subprocess.run(command + ["--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = read_output(out)
    np.testing.assert_array_equal(data["ids"], uninterrupted["ids"])
    np.testing.assert_array_equal(data["values"], uninterrupted["values"])
    assert data["values"][7].tolist() == record_vector("r7", 8).tolist()


@pytest.mark.slow
def test_an_embedding_run_killed_and_resumed_equals_an_uninterrupted_one(tmp_path,
                                                                         reference_embeddings,
                                                                         texts):
    path = tmp_path / "in.jsonl"
    import json

    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts * 20))
    out = tmp_path / "out.h5"
    command, env = cli("--input", str(path), "--output", str(out), "--devices", "cpu",
                       "--workunit-size", "8", "--backend", "thread")
    parts = tmp_path / "out.h5.parts"
    kill_run_at(command, env, 60.0, when=lambda: parts.exists() and any(parts.glob("*.h5")))
    assert len(read_output(out)["ids"]) < 480  # killed after its first flush, long before the end
    done = subprocess.run(command + ["--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert 0 < json.loads(done.stdout.splitlines()[-1])["resumed_after"] < 480
    data = read_output(out)
    assert data["ids"].tolist() == list(range(480))
    expected = np.concatenate([reference_embeddings] * 20)
    # texts batched with other neighbours pad differently: float32 noise, nothing more
    np.testing.assert_allclose(data["embeddings"], expected, atol=1e-5, rtol=0)


def test_a_big_output_stays_an_index_of_parts_written_once_and_compacts_to_one_file(
        tmp_path, monkeypatch):
    # every output is "big"
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "MERGE_AT_END_BYTES", 0)
    # 64-row parts are full ones
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "PART_ROWS", 64)
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "COMPACT_PARTS", 3)
    monkeypatch.setattr(helpers.engine.outputs.hdf5_sink, "PART_ROWS", 64)
    out = tmp_path / "out.h5"
    with HDF5Sink(out, SPEC, {"run": "big"}) as sink:
        for start in range(0, 640, 32):
            ids = np.arange(start, start + 32)
            sink.append(ids, {"values": np.repeat(ids[:, None], 8, 1).astype(np.float32),
                              "label": np.array([f"r{i}" for i in ids], dtype=object)})
    names = sorted(p.name for p in (tmp_path / "out.h5.parts").iterdir())
    assert len(names) == 10 and all(n.startswith("part-L0-") for n in names)  # none merged
    before = read_output(out)
    assert before["attrs"]["complete"] and before["ids"].tolist() == list(range(640))
    command, env = cli()
    done = subprocess.run([sys.executable, "-m", "helpers", "compact", str(out)], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out.h5.parts").exists()
    with h5py.File(out) as f:
        assert not f["ids"].is_virtual and "resume/id_spans" in f
    after = read_output(out)
    np.testing.assert_array_equal(after["values"], before["values"])
    assert after["label"].tolist() == before["label"].tolist() and after["attrs"]["run"] == "big"
    again = subprocess.run([sys.executable, "-m", "helpers", "compact", str(out)], env=env,
                           capture_output=True, text=True)
    assert again.returncode == 2 and "not the index of a run" in again.stderr


def test_a_run_killed_after_its_final_merge_but_before_removing_its_parts_resumes_without_duplicates(
        tmp_path, monkeypatch):
    out = tmp_path / "out.h5"
    with monkeypatch.context() as patch:
        # killed there
        patch.setattr(helpers.engine.outputs.checkpoint, "remove_folder", lambda *a, **k: None)
        with HDF5Sink(out, SPEC) as sink:
            for start in (0, 10):
                ids = np.arange(start, start + 10)
                sink.append(ids, {"values": np.zeros((10, 8), np.float32),
                                  "label": np.array(["x"] * 10, dtype=object)})
            sink.flush()  # a part on disk, then the rest at close; both merged into out.h5
    assert any((tmp_path / "out.h5.parts").glob("part-*.h5"))  # left behind by the "kill"
    with HDF5Sink(out, SPEC, resume=True) as sink:
        assert len(sink.done) == 20
        sink.append(np.arange(20, 25), {"values": np.zeros((5, 8), np.float32),
                                        "label": np.array(["y"] * 5, dtype=object)})
    assert read_output(out)["ids"].tolist() == list(range(25))  # each id once


# -- what a hostile pass found ------------------------------------------------------------------

def _rows(sink, ids):
    ids = np.asarray(ids)
    sink.append(ids, {"values": np.repeat(ids[:, None], 8, 1).astype(np.float32),
                      "label": np.array([f"r{i}" for i in ids], dtype=object)})


def test_a_part_gone_missing_is_an_error_never_rows_of_zeros(tmp_path):
    """The final merge failed on the missing part and was taken for a full disk: the run ended
    'complete' and 800 of its rows read as id 0 and zeros; compact then made that permanent."""
    out = tmp_path / "out.h5"
    sink = HDF5Sink(out, SPEC)
    _rows(sink, range(100))
    sink.flush()
    deadline = time.monotonic() + 10
    while not rows_written(out):  # the writer's idle turn puts the part in the index
        assert time.monotonic() < deadline
        time.sleep(0.05)
    _rows(sink, range(100, 200))
    next((tmp_path / "out.h5.parts").glob("part-*.h5")).unlink()  # someone's clean-up
    with pytest.raises(OSError, match="No such file"):
        sink.close()
    with pytest.raises(OSError, match="its part part-L0-00000000-00000000.h5 is missing"):
        read_output(out)
    with pytest.raises(ValueError, match="did not finish"):
        helpers.engine.outputs.checkpoint.compact(out)
    with HDF5Sink(out, SPEC, resume=True) as again:  # the rows of the lost part are redone
        assert sorted(again.done.contains(np.arange(200)).nonzero()[0]) == list(range(100, 200))
        _rows(again, range(100))
    assert read_output(out)["ids"].tolist() == list(range(200))


def test_compact_refuses_an_unfinished_index_and_one_missing_a_part(tmp_path, monkeypatch):
    # stays an index
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "MERGE_AT_END_BYTES", 0)
    out = tmp_path / "out.h5"
    with HDF5Sink(out, SPEC) as sink:
        _rows(sink, range(50))
        sink.flush()
        _rows(sink, range(50, 80))
    part = sorted((tmp_path / "out.h5.parts").glob("part-*.h5"))[0]
    part.rename(part.with_name("elsewhere.bak"))
    with pytest.raises(ValueError, match="is missing .1 in all.: its rows would read as zeros"):
        helpers.engine.outputs.checkpoint.compact(out)
    part.with_name("elsewhere.bak").rename(part)
    assert helpers.engine.outputs.checkpoint.compact(out) > 0
    assert read_output(out)["ids"].tolist() == list(range(80))


@pytest.mark.parametrize("name", ["a 100%.h5", "x%b.h5", "%%.h5"])
def test_a_percent_sign_in_the_output_s_name_reaches_its_parts(tmp_path, monkeypatch, name):
    """HDF5 reads '%' in a virtual source's file name as a format code: the index read 0 rows."""
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "MERGE_AT_END_BYTES", 0)
    with HDF5Sink(tmp_path / name, SPEC) as sink:
        _rows(sink, range(30))
    assert read_output(tmp_path / name)["ids"].tolist() == list(range(30))


def test_a_parts_folder_that_is_a_link_to_another_disk_is_used_and_its_target_kept(tmp_path):
    (tmp_path / "bigger disk").mkdir()
    (tmp_path / "out.h5.parts").symlink_to(tmp_path / "bigger disk")
    with HDF5Sink(tmp_path / "out.h5", SPEC) as sink:
        _rows(sink, range(30))
        sink.flush()
        assert list((tmp_path / "bigger disk").glob("part-*.h5"))
    assert read_output(tmp_path / "out.h5")["ids"].tolist() == list(range(30))
    assert not (tmp_path / "out.h5.parts").exists()  # merged: the link goes
    assert (tmp_path / "bigger disk").is_dir() and not list((tmp_path / "bigger disk").iterdir())


# -- parts written by workers (writes="workers") ---------------------------------------------------

def worker_rows(ids):
    return {"values": np.repeat(ids[:, None], 8, 1).astype(np.float32),
            "label": np.array([f"r{i}" for i in ids], dtype=object)}


def test_workers_parts_are_the_output_once_committed_and_orphans_are_removed(tmp_path):
    """A committed part is in the output; one no commit named (its worker killed after writing
    it, or its workunit redone elsewhere) is never read, and is gone at the end and at a scan."""
    from helpers.engine.outputs.checkpoint import write_worker_part

    out = tmp_path / "out.h5"
    with HDF5Sink(out, SPEC) as sink:
        first = write_worker_part(sink.target("ab12-0"), np.arange(0, 50), worker_rows(np.arange(50)))
        orphan = write_worker_part(sink.target("ab12-1"), np.arange(50, 60),
                                   worker_rows(np.arange(50, 60)))
        sink.commit(first)
        sink.append(np.arange(60, 70), worker_rows(np.arange(60, 70)))  # the driver's own rows
        sink.flush()
        assert not os.path.exists(first.path) and os.path.exists(orphan.path)  # (not committed)
    data = read_output(out)
    assert data["ids"].tolist() == list(range(50)) + list(range(60, 70))
    assert data["label"][49] == "r49" and data["values"][55][0] == 65
    assert not os.path.exists(orphan.path) and not os.path.exists(first.path)

    # a killed run's orphan, found by the resume's scan: removed, its ids not done
    out2 = tmp_path / "out2.h5"
    sink = HDF5Sink(out2, SPEC)
    sink.commit(write_worker_part(sink.target("cd34-0"), np.arange(10), worker_rows(np.arange(10))))
    sink.flush()
    left = write_worker_part(sink.target("cd34-1"), np.arange(10, 20), worker_rows(np.arange(10, 20)))
    sink.close(complete=False)
    with HDF5Sink(out2, SPEC, resume=True) as resumed:
        assert resumed.done.as_bounds().tolist() == [[0, 9]] and not os.path.exists(left.path)


def test_a_late_result_s_part_is_removed_not_committed(tmp_path):
    """A worker answers a workunit the scheduler took back (timed out, redone elsewhere): the
    part it wrote is removed, and nothing of it is written."""
    from helpers.engine.contract.messages import Result, WorkerInfo
    from helpers.engine.contract.settings import PoolSettings
    from helpers.engine.dispatch.scheduler import Scheduler
    from helpers.engine.outputs.checkpoint import WorkerPart

    class Backend:
        events = None

    part = tmp_path / "wpart-ab12-7.h5"
    part.write_bytes(b"rows")
    scheduler = Scheduler(Backend(), [WorkerInfo(0, "cpu", 1)], PoolSettings(("cpu",)))
    late = Result(0, 41, np.arange(3), {}, [], 0.0, 1.0, part=WorkerPart(str(part), 3, 4))
    assert scheduler.handle(0, late) == ([], []) and not part.exists()


@pytest.mark.slow
def test_thousands_of_workers_parts_finish_as_one_file_one_part_open_at_a_time(tmp_path):
    """An output of many small workers' parts is merged at the end with one part open at a
    time: 600 parts under a limit of 128 open files (each part once open: 'Too many open
    files')."""
    script = f"""
import resource, sys
import numpy as np
from helpers.engine.outputs.checkpoint import write_worker_part
from helpers.engine.outputs.hdf5_sink import HDF5Sink, read_output
from helpers.engine.contract.protocol import OutputSpec
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
spec = {{"values": OutputSpec((8,), "float32"), "label": OutputSpec((), "str")}}
with HDF5Sink(sys.argv[1], spec) as sink:
    for i in range(600):
        ids = np.arange(i * 5, i * 5 + 5)
        sink.commit(write_worker_part(sink.target(f"ab-{{i}}"), ids, {{
            "values": np.repeat(ids[:, None], 8, 1).astype(np.float32),
            "label": np.array([f"r{{j}}" for j in ids], dtype=object)}}))
data = read_output(sys.argv[1])
assert data["ids"].tolist() == list(range(3000)), data["ids"][:10]
assert data["label"][2999] == "r2999" and data["values"][1234][0] == 1234
print("one file", not data["attrs"].get("index_of_parts"))
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out.h5")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "one file True"
    assert not (tmp_path / "out.h5.parts").exists()


def test_a_part_of_small_and_big_blocks_holds_them_all_in_order(tmp_path, monkeypatch):
    """Small blocks are gathered per write, a big one is written alone; the part holds every
    row of every block in order, strings included, and makes as many writes as runs."""
    from helpers.engine.outputs.checkpoint import write_rows

    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "GATHER_BYTES", 4096)
    sizes = [3, 16, 16, 1, 300, 16, 16, 16, 16, 2000, 5]  # 8-d float32: 300 rows > 4096 bytes
    starts = np.cumsum([0] + sizes)
    blocks = [{"ids": np.arange(a, b), "label": np.array([f"r{i}" for i in range(a, b)], object),
               "values": np.repeat(np.arange(a, b, dtype=np.float32)[:, None], 8, 1)}
              for a, b in zip(starts[:-1], starts[1:])]
    runs = helpers.engine.outputs.checkpoint._gathered([b["values"] for b in blocks])
    assert [sum(map(len, run)) for run in runs] == [36, 300, 64, 2000, 5]
    cols = {"ids": ((), np.int64), "values": ((8,), np.float32),
            "label": ((), h5py.string_dtype())}
    write_rows(tmp_path / "part.h5", cols, blocks, {})
    with h5py.File(tmp_path / "part.h5", "r") as f:
        assert f["ids"][:].tolist() == list(range(starts[-1]))
        assert f["values"][:, 5].tolist() == list(range(starts[-1]))
        assert f["label"].asstr()[:].tolist() == [f"r{i}" for i in range(starts[-1])]


def test_the_index_reads_each_column_of_every_part_in_turn_errors_and_strings_included(tmp_path):
    """The index's virtual datasets (made with HDF5's calls directly, not h5py's VirtualLayout)
    read every part's rows in order, each column, the errors only where a part holds some."""
    parts = Parts(tmp_path / "out.h5", SPEC)
    parts.folder.mkdir()
    for start, rows, errors in [(0, 5, 0), (5, 0, 2), (7, 3, 1), (10, 1, 0)]:
        ids = np.arange(start, start + rows)
        block = {"ids": ids, "values": np.repeat(ids[:, None], 8, 1).astype(np.float32),
                 "label": np.array([f"r{i}" for i in ids], dtype=object)}
        if errors:
            bad = np.arange(100 + start, 100 + start + errors)
            block |= {"errors/ids": bad, "errors/type": np.array(["E"] * errors, dtype=object),
                      "errors/message": np.array([f"bad {i}" for i in bad], dtype=object),
                      "errors/time": np.zeros(errors), "errors/position": bad - 100,
                      "errors/key": np.array([f"k{i}" for i in bad], dtype=object)}
        parts.write([block])
    parts.write_index({"run": "indexed"})
    data, expected = read_output(tmp_path / "out.h5"), [0, 1, 2, 3, 4, 7, 8, 9, 10]
    assert data["ids"].tolist() == expected and data["attrs"]["run"] == "indexed"
    np.testing.assert_array_equal(data["values"][:, 7], np.array(expected, dtype=np.float32))
    assert data["label"].tolist() == [f"r{i}" for i in expected]
    assert [(e["id"], e["message"], e["position"], e["key"]) for e in data["errors"]] == \
        [(105, "bad 105", 5, "k105"), (106, "bad 106", 6, "k106"), (107, "bad 107", 7, "k107")]
    with h5py.File(tmp_path / "out.h5") as f:
        assert f["values"].is_virtual and len(f["values"].virtual_sources()) == 3
        assert len(f["errors/ids"].virtual_sources()) == 2


def test_a_percent_sign_in_a_column_s_name_reaches_its_rows(tmp_path):
    """HDF5 reads '%' in a virtual source's dataset name as a format code too (found by review:
    the first index write raised)."""
    parts = Parts(tmp_path / "out.h5", {"p%q": OutputSpec((2,), "float32")})
    parts.folder.mkdir()
    for start in (0, 3):
        ids = np.arange(start, start + 3)
        parts.write([{"ids": ids, "p%q": np.repeat(ids[:, None], 2, 1).astype(np.float32)}])
    parts.write_index({})
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(6))
    np.testing.assert_array_equal(data["p%q"][:, 1], np.arange(6, dtype=np.float32))


def test_a_read_raced_by_a_merge_of_parts_is_read_again_never_zeros(tmp_path, monkeypatch):
    """Issue 44: read_output of a run still writing returned all-zero vectors (1,050 of 1,050
    rows) when small parts were merged while it read: the index it opened named parts the merge
    then deleted, which HDF5 reads as zeros. The read is now done again from the new index; an
    export (export(partial=True) from Python, as the command line) is refused while a run holds
    the output."""
    from helpers.engine.outputs.export import export
    from helpers.engine.outputs.ownership import OutputLocked, owning

    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "COMPACT_PARTS", 3)
    parts = Parts(tmp_path / "out.h5", SPEC)
    parts.scan()
    for number in range(2):  # two small parts, indexed; the third will merge all three
        ids = np.arange(number * 10, number * 10 + 10)
        parts.write([{"ids": ids, "values": np.repeat(ids[:, None] + 1, 8, 1).astype(np.float32),
                      "label": np.array([f"r{i}" for i in ids], dtype=object)}])
    parts.write_index({})
    real, merged = helpers.engine.outputs.hdf5_sink._values, []

    def values(dataset):  # the merge happens while the first read is under way
        if not merged:
            merged.append(True)
            ids = np.arange(20, 30)
            parts.write([{"ids": ids, "values": np.repeat(ids[:, None] + 1, 8, 1).astype(
                np.float32), "label": np.array([f"r{i}" for i in ids], dtype=object)}])
            assert [p.path.name for p in parts.parts] == ["part-L1-00000000-00000002.h5"]
        return real(dataset)

    monkeypatch.setattr(helpers.engine.outputs.hdf5_sink, "_values", values)
    data = read_output(tmp_path / "out.h5")
    assert merged and data["ids"].tolist() == list(range(30))
    assert (data["values"] == np.repeat(np.arange(1, 31)[:, None], 8, 1)).all()
    import threading

    held, done = threading.Event(), threading.Event()

    def run():  # a run holds the output (another thread: as another process would)
        with owning(tmp_path / "out.h5"):
            held.set()
            done.wait(10)

    holder = threading.Thread(target=run)
    holder.start()
    try:
        held.wait(10)
        with pytest.raises(OutputLocked):
            export(tmp_path / "out.h5", "npy", tmp_path / "out-npy", partial=True)
    finally:
        done.set()
        holder.join()
    assert not (tmp_path / "out-npy").exists()
    assert export(tmp_path / "out.h5", "npy", tmp_path / "out-npy", partial=True) == 30


def test_the_index_is_due_once_parts_came_and_its_last_rewrite_is_every_times_its_cost_old(
        tmp_path):
    import time

    index = Index(tmp_path / "out.h5", {})
    assert not index.due()  # no part came
    index.stale = True
    assert index.due()  # never written: at once
    written = index.write([], {"run": "first"})
    assert written == (tmp_path / "out.h5").stat().st_size and not index.stale
    index.stale = True
    index._at, index._cost = time.monotonic(), 1.0  # a rewrite that took a second, just now
    assert not index.due()
    index._at -= INDEX_EVERY * 1.0 + 0.1
    assert index.due()
    with h5py.File(tmp_path / "out.h5", "r") as f:
        assert f.attrs["run"] == "first" and f.attrs["index_of_parts"] == "out.h5.parts"
