"""Each backend on its own, through the Backend protocol the scheduler is typed against: a worker
starts and says Ready, answers a workunit, dies when killed (and says so), and leaves nothing
behind."""
import queue
import typing

import numpy as np
import psutil
import pytest

from conftest import live_children
from helpers.engine.contract.messages import Died, Ready, Result, WorkerInfo, Workunit
from helpers.engine.contract.settings import PoolSettings
from helpers.engine.workers.backends import (START_METHOD_ENV, Backend, ProcessBackend,
                                             ThreadBackend, Wakeup, make_backend)
from helpers.workloads import SyntheticWorkload

pytestmark = pytest.mark.timeout(120)  # reached only on deadlock


def next_event(backend, seconds=60.0):
    return backend.events.get(timeout=seconds)


@pytest.mark.parametrize("name", ["process", "thread"])  # ray's: tests/test_ray_backend.py
def test_a_worker_starts_answers_dies_when_killed_and_leaves_nothing(name):
    backend = make_backend(PoolSettings(("cpu",), name), SyntheticWorkload(0.0))
    assert isinstance(backend, (ProcessBackend, ThreadBackend)) and backend.name == name
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        backend.spawn(WorkerInfo(0, "cpu", 1))
        slot, ready = next_event(backend)
        assert slot == 0 and isinstance(ready, Ready) and "values" in ready.outputs
        backend.send(0, [Workunit(7, np.arange(3, dtype=np.int64), ["a", "b", "c"])])
        slot, result = next_event(backend)
        assert isinstance(result, Result) and result.workunit == 7 and result.ids.tolist() == [0, 1, 2]
        backend.send(0, [Workunit(8, np.arange(3, 5), ["d", "e"]), Workunit(9, np.arange(5, 6),
                                                                            ["f"])])
        answers = [next_event(backend)[1] for _ in range(2)]  # one message, an answer each
        assert [(a.workunit, a.ids.tolist()) for a in answers] == [(8, [3, 4]), (9, [5])]
        backend.kill(0)
        slot, died = next_event(backend)
        assert slot == 0 and isinstance(died, Died)
        assert died.exitcode == (-9 if name == "process" else None)
        backend.spawn(WorkerInfo(0, "cpu", 1))  # a replacement takes the same slot
        assert isinstance(next_event(backend)[1], Ready)
    finally:
        backend.shutdown(clean=True)
    assert not [p for p in live_children() if p.pid not in before]


def test_both_backends_have_every_member_of_the_protocol_and_no_other_name_is_one():
    members = set(typing.get_type_hints(Backend)) | {
        name for name in vars(Backend) if not name.startswith("_")}
    assert members == {"name", "recyclable", "answers_together", "events", "spawn", "send",
                       "kill", "shutdown"}
    for cls in (ProcessBackend, ThreadBackend):
        backend = cls(SyntheticWorkload(0.0))
        assert all(hasattr(backend, member) for member in members), cls.__name__
        backend.shutdown(clean=True)
    # (an instance needs Ray: test_ray_backend)
    from helpers.engine.workers.ray_backend import RayBackend

    assert all(hasattr(RayBackend, member) for member in members - {"events"})
    with pytest.raises(ValueError, match=r"expected one of \('process', 'thread', 'ray'\)"):
        PoolSettings(("cpu",), "dask")


def test_a_wakeup_ends_a_wait_and_is_never_mistaken_for_a_message():
    events = queue.Queue()
    wakeup = Wakeup(events)
    wakeup.wake()
    events.put((0, "a message"))
    wakeup.wake()
    items = [events.get(timeout=1) for _ in range(3)]
    assert Wakeup.drop(items) == [(0, "a message")]


def test_a_script_without_the_main_guard_is_told_what_to_do(tmp_path):
    """The workers of a script that starts a pipeline at import (no ``if __name__ ==
    "__main__":``) each import it again: they end with one line, not a traceback each, and the
    run's error names the cause and the fix; nothing is written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "script.py"
    script.write_text(
        "from helpers import run_pipeline\n"
        "from helpers.workloads import SyntheticWorkload\n"
        "run_pipeline([(i, f't{i}') for i in range(20)], SyntheticWorkload(0.0), ['cpu', 'cpu'],"
        " 5, 'out.h5', 'process', progress=False)\n")
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=100, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 1
    assert "could not start: your script starts a pipeline when it is imported" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr and done.stderr.count("Traceback") == 1
    assert "bootstrapping phase" not in done.stderr and not (tmp_path / "out.h5").exists()


FORKED = """
import os, sys
from helpers.engine.pipeline import WorkerPool
from helpers.workloads import SyntheticWorkload

class Marked(SyntheticWorkload):
    imports = ("colorsys",)  # imported by nothing else here

    def load(self, device, threads):
        print("worker", "colorsys" in sys.modules, os.environ.get("GPUFEED_MARK"), flush=True)
        return super().load(device, threads)

if __name__ == "__main__":
    for mark in ("first", "second"):
        os.environ["GPUFEED_MARK"] = mark
        with WorkerPool(Marked(0.0), ["cpu"], "process", progress=False):
            pass
    print("parent", "colorsys" in sys.modules, flush=True)
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_workers_fork_with_the_workload_imports_done_and_the_parent_environment(tmp_path, method):
    """The fork server imports a workload's ``imports`` once, not the pool's process; each
    worker still sees the parent's environment as of its own start, as a spawned one would
    (GPUFEED_START_METHOD=spawn: the workers import them themselves)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    script = tmp_path / "script.py"  # (a file: the workers import its Marked)
    script.write_text(FORKED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=100, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": root, START_METHOD_ENV: method})
    assert done.returncode == 0, done.stderr
    preloaded = method == "forkserver"
    assert done.stdout.split("\n")[:3] == [f"worker {preloaded} first",
                                           f"worker {preloaded} second", "parent False"]


def test_an_unknown_start_method_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(START_METHOD_ENV, "fork")  # (unsafe once torch or CUDA started: not offered)
    with pytest.raises(ValueError, match=r"\$GPUFEED_START_METHOD='fork': .*'spawn'"):
        ProcessBackend(SyntheticWorkload(0.0))


def test_a_helpers_folder_where_the_user_runs_is_not_imported_in_place_of_ours(tmp_path):
    """The fork server starts with no current folder on its path (a user's own ``helpers``
    there would be imported by it in place of ours, and no worker could start)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    (here / "helpers").mkdir(parents=True)
    (here / "helpers" / "__init__.py").write_text("")  # the user's own, importable
    elsewhere.mkdir()
    (elsewhere / "script.py").write_text(
        "from helpers.engine.pipeline import WorkerPool\n"
        "from helpers.workloads import SyntheticWorkload\n"
        "if __name__ == '__main__':\n"
        "    with WorkerPool(SyntheticWorkload(0.0), ['cpu'], 'process', progress=False) as pool:\n"
        "        print('started', len(pool.pids), flush=True)\n")
    done = subprocess.run([sys.executable, str(elsewhere / "script.py")], capture_output=True,
                          text=True, timeout=100, cwd=here,
                          env={**os.environ, "PYTHONPATH": root, START_METHOD_ENV: "forkserver"})
    assert done.returncode == 0 and done.stdout == "started 1\n", done.stderr[-2000:]
