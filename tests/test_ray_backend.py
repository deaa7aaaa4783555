"""The ray backend on a multi-node cluster simulated on this machine (``ray.cluster_utils.Cluster``:
a raylet per node, each with its own CPUs): every id once and embeddings equal to encode's, an
actor killed, a hung workunit, a node lost, the driver SIGKILLed and resumed, a poison record —
each the scheduler's own recovery — and no Ray process left behind."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from helpers.engine.contract.devices import visible_devices as visible_devices_here
from helpers.engine.contract.messages import WorkerInfo
from helpers.engine.contract.settings import PoolSettings
from helpers.engine.outputs.hdf5_sink import read_output, rows_written
from helpers.engine.pipeline import PipelineError, WorkerPool, run_pipeline
from helpers.engine.workers import ray_backend
from helpers.engine.workers.backends import visible_devices
from helpers.engine.workers.ray_backend import resources
from helpers.study.paths import ROOT
from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.synthetic import SyntheticWorkload, record_vector

# the timeout is reached only on deadlock; slow: every case starts a Ray cluster (make test runs
# them, make quick does not)
pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

NODE_CPUS = 2  # each simulated node: 2 workers of one thread
NICENESS = ray_backend.NICENESS_ENV
GONE_SECONDS = 15.0  # an actor Ray was told to kill, or whose owner died, is gone within this


def _ray_processes(marker: str = "") -> list[psutil.Process]:
    """This machine's live processes of Ray (``marker``: those whose command line has it), but
    those of another test process beside this one: pytest-xdist's other workers run the
    notebooks' smoke run and benches, which start Rays (and gpufeed's actors) of their own.
    An orphan, whose starter is gone, counts."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            line = " ".join(process.info["cmdline"] or ())
            if process.info["status"] == psutil.STATUS_ZOMBIE or process.pid == os.getpid():
                continue
            if "multiprocessing.forkserver" in line:  # (another test's process pool, whose
                continue  # sys.path, in its command line, holds Ray's folders)
            if ("ray::" in line or "/ray/" in line or "raylet" in line or "gcs_server" in line) \
                    and marker in line and not _another_test_process_s(process):
                found.append(process)
        except psutil.Error:
            pass
    return found


def _another_test_process_s(process: psutil.Process) -> bool:
    """Started under a sibling of this test process (another pytest-xdist worker)."""
    for ancestor in process.parents():
        if ancestor.pid == os.getpid():
            return False
        if ancestor.ppid() == os.getppid():
            return True
    return False


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_until_gone(marker: str, seconds: float = GONE_SECONDS) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while (left := _ray_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module")
def cluster():
    """A head node and one more, NODE_CPUS each, this process their driver; torn down at the end,
    with a check that not one Ray process is left."""
    before = {p.pid for p in _ray_processes()}
    # (its workers at the driver's niceness, as every Ray gpufeed starts: at Ray's 15, beside
    # the suite's other processes, an embedding check of 9 s alone took 105-140 s)
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": NODE_CPUS, "include_dashboard": False,
                                      "_system_config": ray_backend.local_system()})
    cluster.add_node(num_cpus=NODE_CPUS)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    deadline = time.monotonic() + GONE_SECONDS
    while (left := [p for p in _ray_processes() if p.pid not in before]) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"Ray processes left behind: {[' '.join(p.cmdline())[:80] for p in left]}"


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Overrides conftest's: Ray keeps idle worker processes of its own between tests; ours, the
    actors (``ray::_Worker``), must all be gone after each test."""
    yield
    left = _wait_until_gone("ray::_Worker")
    assert not left, f"actors left behind: {[p.pid for p in left]}"


def _records(n: int) -> list[tuple[int, str]]:
    return [(i, f"r{i}") for i in range(n)]


def _assert_each_once(path, n: int, dim: int = 8, missing: tuple = ()) -> dict:
    data = read_output(path)
    expected = [i for i in range(n) if i not in missing]
    assert data["ids"].tolist() == expected  # each id once, none lost
    for i in expected[:: max(1, n // 40)]:  # every row under its own id
        row = expected.index(i)
        assert data["values"][row].tolist() == record_vector(f"r{i}", dim).tolist()
    return data


# -- what an actor asks of the cluster (no cluster needed) -----------------------------------------

@pytest.mark.parametrize("units", [1, 3])
def test_a_call_that_fails_in_ray_charges_its_one_workunit_or_none_of_several(units,
                                                                               monkeypatch):
    """An error in Ray's machinery (the call's arguments that do not unpickle on the actor, say)
    is a Failed for a call of one workunit; for a call of several it cannot say which, so the
    actor is replaced and the scheduler sends each alone (charging the first of them bisected
    innocent records)."""
    import queue
    from concurrent.futures import Future

    from helpers.engine.contract.messages import Died, Failed, Workunit

    monkeypatch.setattr(ray_backend, "_kill", lambda handle: None)  # (ray.kill would start Ray)
    backend = object.__new__(ray_backend.RayBackend)  # (its Ray side is not called here)
    backend.events, backend._closing = queue.Queue(), False
    actor = ray_backend._Actor(WorkerInfo(0, "cpu", 1), None)
    call = ray_backend._Call([Workunit(i, np.arange(i, i + 1), [f"r{i}"]) for i in range(units)])
    actor.calls.append(call)
    done = Future()
    done.set_exception(ray.exceptions.RayTaskError("run", "Traceback: boom",
                                                   ValueError("cannot unpickle")))
    backend._settle(actor, call, done)
    messages = [backend.events.get_nowait()[1] for _ in range(backend.events.qsize())]
    if units == 1:
        assert [(type(m), m.workunit, m.error_type) for m in messages] == [
            (Failed, 0, "ValueError")]
    else:
        assert [type(m) for m in messages] == [Died] and not messages[0].lost
        assert "a call of 3 workunits failed in Ray" in messages[0].cause and actor.gone


@pytest.mark.parametrize("gpus, sharing, expected", [(8, 1, 2), (2, 2, 4), (1, 1, 16),
                                                     (0, 1, 16), (0.5, 1, 16)])
def test_a_card_actor_takes_its_node_s_cores_shared_among_its_gpus_workers(monkeypatch, gpus,
                                                                          sharing, expected):
    """Where Ray placed it, not the driver's share of the driver's cores: a node of 16 cores and
    8 GPUs, a worker each: 2 cores each; its card is the node's cuda:0."""
    from helpers.engine.workers.ray_backend import on_its_node

    monkeypatch.setattr("helpers.engine.contract.devices.available_cores", lambda: 16)
    placed = on_its_node(WorkerInfo(3, "cuda:5", 1, 1), gpus, sharing)
    assert placed == WorkerInfo(3, "cuda:0", expected, 1)


def test_an_actor_asks_for_its_share_of_a_gpu_and_its_threads():
    assert resources(WorkerInfo(0, "cpu", 4), True, 1) == {"num_cpus": 4}
    assert resources(WorkerInfo(0, "cuda:1", 1), True, 2) == {"num_cpus": 1, "num_gpus": 0.5}
    # beside a card, its threads are the driver's share of its own cores: not asked of a node
    assert resources(WorkerInfo(0, "cuda:1", 8), True, 1) == {"num_cpus": 1, "num_gpus": 1.0}
    # a workload that only labels devices (simulated cards) runs on CPUs anywhere
    assert resources(WorkerInfo(0, "cuda:1", 1), False, 2) == {"num_cpus": 1}


def test_a_ray_gpufeed_starts_gets_a_new_config_each_time_and_a_user_s_niceness_stays(
        monkeypatch):
    monkeypatch.delenv(NICENESS, raising=False)
    first = ray_backend.local_system()
    first["object_spilling_config"] = "a session's"  # (what Ray writes into the one it is given)
    assert ray_backend.local_system() == {"worker_niceness": 0}
    monkeypatch.setenv(NICENESS, "5")
    assert ray_backend.local_system() == {}  # (the raylet reads the variable itself)


def test_a_ray_address_without_the_ray_backend_is_refused():
    with pytest.raises(ValueError, match="ray_address: only for backend='ray'"):
        PoolSettings(("cpu",), "process", ray_address="10.0.0.1:6379")


def test_a_cluster_that_cannot_be_joined_is_named_with_the_token_it_may_want(monkeypatch):
    """Ray >= 2.59's `ray start` clusters want a token that a driver given an address sends only
    with RAY_AUTH_MODE=token; Ray itself then says only that it could not connect."""
    def refused(**options):
        raise ConnectionError(f"Failed to connect to Ray cluster at {options['address']}")

    monkeypatch.setattr(ray_backend.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_backend.ray, "init", refused)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(RuntimeError, match=r"cluster at 10\.0\.0\.1:6379 \(Failed to connect.*"
                       r"RAY_AUTH_MODE is not set; .*set RAY_AUTH_MODE=token") as raised:
        ray_backend.connect("10.0.0.1:6379")
    assert isinstance(raised.value.__cause__, ConnectionError)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(RuntimeError, match="RAY_AUTH_MODE=token; a cluster"):
        ray_backend.connect("10.0.0.1:6379")


# -- on the cluster --------------------------------------------------------------------------------

def test_auto_devices_on_ray_are_the_cluster_s(cluster):
    # no GPU in this cluster: one cpu worker per node
    assert PoolSettings("auto", "ray", visible=visible_devices("ray")).devices == ("cpu", "cpu")
    assert PoolSettings("auto", "process").devices == visible_devices_here()  # (this machine's)


def test_two_nodes_two_actors_each_every_id_once(cluster, tmp_path):
    n = 400
    stats = run_pipeline(_records(n), SyntheticWorkload(0.002), ["cpu"] * 4, 5,
                         tmp_path / "out.h5", "ray", progress=False)
    data = _assert_each_once(tmp_path / "out.h5", n)
    assert data["attrs"]["backend"] == "ray"
    by_node = {}
    for span in stats.timeline:
        by_node.setdefault(span.node, set()).add(span.worker)
    assert len(by_node) == 2 and all(len(workers) == 2 for workers in by_node.values()), by_node
    assert len({w.pid for w in stats.workers}) == 4  # an actor, a process, per worker


def test_an_actor_s_embeddings_equal_encode_s(cluster, tmp_path, texts, reference_embeddings):
    """The embedding workload's rows through Ray, one actor (an actor imports torch and
    sentence-transformers itself: four did, with the placement checked above, 41-183 s of
    this file's time; two, 139 s beside the suite on a slow day)."""
    run_pipeline(list(enumerate(texts)), EmbeddingWorkload(), ["cpu"], 3,
                 tmp_path / "out.h5", "ray", progress=False)
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(len(texts)))
    np.testing.assert_allclose(data["embeddings"], reference_embeddings, atol=1e-5, rtol=0)


def test_an_actor_killed_mid_run_is_replaced_and_each_id_written_once(cluster, tmp_path):
    n = 600
    with WorkerPool(SyntheticWorkload(0.01), ["cpu"] * 4, backend="ray", progress=False) as pool:
        killer = threading.Timer(0.5, os.kill, (pool.pids[1], signal.SIGKILL))  # as a segfault
        killer.start()
        stats = pool.run(_records(n), tmp_path / "out.h5", workunit_size=10)
        killer.join()
    _assert_each_once(tmp_path / "out.h5", n)
    assert stats.recovery["deaths"] == 1 and stats.recovery["restarts"] == 1
    assert stats.failed_records == 0


def test_a_hung_workunit_s_actor_is_killed_by_the_pool_and_the_workunit_redone(cluster, tmp_path):
    n = 200
    (tmp_path / "faults").mkdir()
    workload = SyntheticWorkload(0.002, hang_on_records=frozenset({"r57"}),
                                 transient=str(tmp_path / "faults"))
    stats = run_pipeline(_records(n), workload, ["cpu"] * 2, 10, tmp_path / "out.h5", "ray",
                         progress=False, workunit_timeout=2.0)
    _assert_each_once(tmp_path / "out.h5", n)
    assert stats.recovery["timeouts"] == 1 and stats.recovery["deaths"] == 1


def test_a_poison_record_costs_one_error_row_and_a_failed_load_its_traceback(cluster, tmp_path):
    n = 200
    workload = SyntheticWorkload(0.0, fail_on_records=frozenset({"r37"}))
    stats = run_pipeline(_records(n), workload, ["cpu"] * 2, 20, tmp_path / "out.h5", "ray",
                         progress=False)
    data = _assert_each_once(tmp_path / "out.h5", n, missing=(37,))
    assert [(e["id"], e["type"]) for e in data["errors"]] == [(37, "InjectedFailure")]
    assert stats.records == n - 1 and stats.failed_records == 1
    with pytest.raises(PipelineError, match="InjectedFailure") as raised:
        run_pipeline(_records(4), SyntheticWorkload(fail_on_load=True), ["cpu"], 2,
                     tmp_path / "never.h5", "ray", progress=False)
    assert "Traceback" in str(raised.value.__cause__)  # the actor's own, brought back


def test_a_record_that_kills_its_actor_in_a_call_of_four_costs_that_record_alone(cluster,
                                                                                  tmp_path,
                                                                                  caplog):
    """A call of four workunits answers when it returns, and a segfault can lose the answer of a
    call finished just before it: the death of an actor holding several workunits cannot say
    which one did it, so each goes again alone (nothing else on its actor), and only then is the
    one that kills charged (then split down to the record). Charging the first it held filed
    innocent records as errors here."""
    n = 200
    workload = SyntheticWorkload(0.0, exit_on_records=frozenset({"r102"}))  # mid-run: in a
    with caplog.at_level(logging.WARNING, logger="gpufeed"):                 # call of four
        stats = run_pipeline(_records(n), workload, ["cpu"] * 2, 4, tmp_path / "out.h5", "ray",
                             progress=False, retries=0, units_per_message=4)
    data = _assert_each_once(tmp_path / "out.h5", n, missing=(102,))
    assert [(e["id"], e["type"]) for e in data["errors"]] == [(102, "WorkerDied")]
    assert "each is sent again alone, charged nothing" in caplog.text
    # the 4 records alone, then 2, then 1 charged: not the call's first workunit, nor its halves
    assert (stats.recovery["failed_workunits"], stats.recovery["deaths"]) == (3, 4), stats.recovery
    assert stats.failed_records == 1


def _lose_once_at_work(cluster, node, pool):
    """Lose ``node`` 0.5 s after every worker answered its first workunit (of 0.1 s), so that
    work ran on all three nodes. A set time from the job's call was too early on a loaded
    machine (the start's check and the first dispatch came after the node was gone), and so
    was 1 s after the first messages were sent (the lost node's workers had answered none)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            pool._scheduler.dispatches.messages < 12 or
            sum(s.unit_s is not None for s in pool._scheduler.slots.values()) < 6):
        time.sleep(0.01)
    time.sleep(0.5)
    cluster.remove_node(node, allow_graceful=False)


@pytest.mark.parametrize("writes", ["driver", "workers"])
def test_a_node_lost_mid_run_its_workunits_are_redone_on_the_others(cluster, tmp_path, writes):
    lost = cluster.add_node(num_cpus=NODE_CPUS)  # a third node, to lose
    cluster.wait_for_nodes()
    n = 3600  # (6 s of work on 6 workers)
    with WorkerPool(SyntheticWorkload(0.01), ["cpu"] * 6, backend="ray", progress=False) as pool:
        remover = threading.Thread(target=_lose_once_at_work, args=(cluster, lost, pool))
        remover.start()
        started = time.monotonic()
        stats = pool.run(_records(n), tmp_path / "out.h5", workunit_size=10, writes=writes)
        remover.join()
    _assert_each_once(tmp_path / "out.h5", n)
    assert stats.recovery["deaths"] == 2  # the lost node's two actors
    assert stats.recovery["failed_workunits"] == 0  # a lost node's workunits are not suspect
    nodes = {span.node for span in stats.timeline}
    assert len(nodes) == 3  # work ran on all three, then on the two left
    # 36 s of work on 6 workers, then on 4 (22-25 s alone, 46 s beside the rest of the suite
    # on a slow day): no hang waiting for the lost node's replacements, which could not be
    # placed and would hold the job to the load timeout (600 s; this test's own limit, 240)
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("writes", ["driver", "workers"])
def test_the_driver_killed_the_run_resumes_on_the_cluster(cluster, tmp_path, writes):
    n = 4800  # (enough that the workers cannot write it all before the index shows a row)
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(n)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "helpers", "run", "--input", str(tmp_path / "in.jsonl"),
               "--output", str(tmp_path / "o.h5"), "--workload", "synthetic",
               "--seconds-per-record", "0.002", "--devices", "cpu,cpu", "--workunit-size", "20",
               "--no-progress", "--backend", "ray", "--ray-address", cluster.address,
               "--writes", writes]
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 90
    while not rows_written(tmp_path / "o.h5"):  # mid-run: the index shows durable rows
        assert driver.poll() is None, driver.stderr.read().decode()
        assert time.monotonic() < deadline, "no rows written"
        time.sleep(0.1)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=10)
    assert not _wait_until_gone("ray::_Worker"), "the dead driver's actors outlived it"
    indexed = rows_written(tmp_path / "o.h5")
    done = subprocess.run(command + ["--resume"], capture_output=True, text=True, env=env,
                          timeout=150)
    assert done.returncode == 0, done.stderr
    stats = [line for line in done.stdout.splitlines() if line.startswith("{")]  # (Ray adds
    resumed_after = json.loads(stats[-1])["resumed_after"]  # its raylets' words to stdout too)
    assert indexed <= resumed_after < n  # the parts the index had not caught up with, too
    _assert_each_once(tmp_path / "o.h5", n)


def test_the_driver_killed_mid_workunit_leaves_no_actor_behind(cluster, tmp_path):
    """Ray's owner fate-sharing ends a dead driver's actors even inside a long workunit (the
    process backend's workers watch their parent: tests/test_worker.py)."""
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(4)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([sys.executable, "-m", "helpers", "run", "--input",
                               str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.h5"),
                               "--workload", "synthetic", "--seconds-per-record", "600",
                               "--devices", "cpu,cpu", "--workunit-size", "1", "--no-progress",
                               "--backend", "ray", "--ray-address", cluster.address],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 90
    while not (tmp_path / "o.h5").exists():  # the actors are up: the job has its output
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(2.0)  # the first workunits are on the actors, each for ten minutes
    assert driver.poll() is None and _ray_processes("ray::_Worker")
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=10)
    assert not _wait_until_gone("ray::_Worker"), "the dead driver's actors outlived it"


def test_without_an_address_a_local_ray_is_started_said_and_stopped(tmp_path):
    code = ("import logging, sys\n"
            "from helpers.engine.pipeline import run_pipeline\n"
            "from helpers.workloads.synthetic import SyntheticWorkload\n"
            "logging.basicConfig()\n"
            "stats = run_pipeline([(i, str(i)) for i in range(40)], SyntheticWorkload(0.1), "
            "['cpu'] * 2, 5, sys.argv[1], 'ray', progress=False)\n"
            "print(stats.records, stats.spinup_s)")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", NICENESS)}
    seen, niceness = {}, set()  # this run's Ray processes (the driver's descendants: not a Ray
    # another test process starts beside it) and its actors' niceness, while the job runs (2 s
    # of work each)
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        driver = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out.h5")],
                                  stdout=out, stderr=err, cwd=ROOT, env=env)
        try:
            deadline = time.monotonic() + 150
            while driver.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(psutil.Error):
                    for process in psutil.Process(driver.pid).children(recursive=True):
                        with contextlib.suppress(psutil.Error):
                            seen[process.pid] = process
                            if " ".join(process.cmdline()).startswith("ray::_Worker"):
                                niceness.add(process.nice())
                time.sleep(0.2)
        finally:
            if driver.poll() is None:  # (hung: killed, and its Ray checked below)
                driver.kill()
            driver.wait(timeout=30)
    said = (tmp_path / "err.txt").read_text()
    assert driver.returncode == 0, said
    assert (tmp_path / "out.txt").read_text().split()[0] == "40"
    assert "started a local Ray" in said and "dashboard" in said
    assert niceness == {os.nice(0)}, f"the local Ray's actors ran at nice {niceness}"
    deadline = time.monotonic() + GONE_SECONDS
    while (left := [p for p in seen.values() if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"the local Ray outlived its run: {[' '.join(p.cmdline())[:80] for p in left]}"
