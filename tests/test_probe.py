"""The start's check of writes="workers" (helpers.engine.dispatch.probe): every worker reads the
input and writes a part where the driver sees it before any record is sent; a worker that cannot is
named then, not at the first commit or the end. (Conftest checks that no worker process is left.)"""
import errno
import os
import threading

import h5py
import numpy as np
import pytest

from helpers import PipelineError, SyntheticWorkload, read_output, run_pipeline

pytestmark = pytest.mark.timeout(300)  # reached only on deadlock


def hdf5_input(path, n=300):
    with h5py.File(path, "w") as f:
        f.create_dataset("batches/0", data=np.array([f"r{i}".encode() for i in range(n)],
                                                    dtype=object), dtype=h5py.string_dtype())
    return path


@pytest.fixture
def writes(monkeypatch):
    """Each call of write_worker_part, in order: (rows, whether a probe's file of an earlier
    call was still there when it came)."""
    from helpers.engine.outputs import checkpoint

    write, calls, lock = checkpoint.write_worker_part, [], threading.Lock()

    def recording(target, ids, arrays, writer=""):
        with lock:
            probes = [path for rows, path in calls if rows == 0]
        assert not (len(ids) and any(os.path.exists(p) for p in probes)), "probe left behind"
        part = write(target, ids, arrays, writer)
        with lock:
            calls.append((len(ids), part.path))
        return part

    monkeypatch.setattr(checkpoint, "write_worker_part", recording)
    return calls


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_each_worker_writes_an_empty_part_before_any_record_and_it_is_removed(
        tmp_path, writes, backend):
    """Both workers answer the check first (an empty part each, gone before the first real one);
    the run then writes every record once. (Process workers write in their own process: the
    recording sees only the thread backend's calls.)"""
    stats = run_pipeline(hdf5_input(tmp_path / "in.h5"), SyntheticWorkload(0.0), ["cpu"] * 2, 40,
                         tmp_path / "out.h5", backend, progress=False, writes="workers")
    assert stats.records == 300
    assert read_output(tmp_path / "out.h5")["ids"].tolist() == list(range(300))
    if backend == "thread":
        assert [rows for rows, _ in writes[:2]] == [0, 0]
        assert all(rows for rows, _ in writes[2:]) and sum(r for r, _ in writes) == 300


@pytest.mark.parametrize("fails, says", [
    ("write", r"OutputUnwritable: worker \d on .* cannot write its part in .*out\.h5\.parts: "
              r".*No space left"),
    ("read", r"InputUnreadable: worker \d on .* cannot read the input: .*No such file .*in\.h5")])
def test_a_worker_that_cannot_write_or_read_is_named_before_any_record(tmp_path, monkeypatch,
                                                                      fails, says):
    from helpers.engine.inputs.sources import HDF5Rows
    from helpers.engine.outputs import checkpoint

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def unreachable(self, ids):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", self.path)

    if fails == "write":
        monkeypatch.setattr(checkpoint, "write_worker_part", full)
    else:
        monkeypatch.setattr(HDF5Rows, "read", unreachable)
    with pytest.raises(PipelineError, match=r"the start's check \(writes='workers'\): worker \d "
                                            r"on cpu: " + says):
        run_pipeline(hdf5_input(tmp_path / "in.h5"), SyntheticWorkload(0.0), ["cpu"], 10,
                     tmp_path / "out.h5", "thread", progress=False, writes="workers")


def test_a_part_the_driver_cannot_see_is_named_before_any_record(tmp_path, monkeypatch):
    """The worker's machine has a folder of the output's name on a disk of its own: what it
    writes there, the driver cannot see."""
    from helpers.engine.outputs import checkpoint

    write, sent = checkpoint.write_worker_part, []

    def elsewhere(target, ids, *args, **kwargs):
        sent.append(len(ids))
        part = write(target, ids, *args, **kwargs)
        os.unlink(part.path)  # as if on another machine's disk
        return part

    monkeypatch.setattr(checkpoint, "write_worker_part", elsewhere)
    with pytest.raises(PipelineError, match=r"the start's check .*worker \d on .* wrote "
                                            r".*wpart-.*\.h5, which the driver on .* cannot see: "
                                            r".*storage every worker and the driver share"):
        run_pipeline(hdf5_input(tmp_path / "in.h5"), SyntheticWorkload(0.0), ["cpu"] * 2, 10,
                     tmp_path / "out.h5", "thread", progress=False, writes="workers")
    assert sent == [0, 0]  # no record was sent


def test_a_worker_ready_during_the_check_goes_through_the_job_s_admit_first():
    """A replacement (or a worker growth adds) ready while the start's check waits is the job's
    to admit (its identity: helpers.engine.job), before the scheduler takes it as ready."""
    from types import SimpleNamespace

    from helpers.engine.contract.messages import Ready, Result, Workunit
    from helpers.engine.dispatch.probe import ask_each

    ready = Ready(1, 4321, 0.1, {}, identity={"model_digest": "d2"})
    answer = Result(0, -1, np.empty(0, np.int64), {}, [], 0.0, 0.0)
    seen = []

    class Scheduler:
        backend = SimpleNamespace(send=lambda index, units: None)
        slots = {}

        def next_messages(self, seconds):
            return [(1, ready), (0, answer)]

        def handle(self, index, message):
            seen.append(("handled", index))

    answers = ask_each(Scheduler(), {0: Workunit(-1, np.empty(0, np.int64), [])}, 5.0,
                       lambda index, message: seen.append(("admitted", index, message)))
    assert answers == {0: answer}
    assert seen == [("admitted", 1, ready), ("handled", 1)]
