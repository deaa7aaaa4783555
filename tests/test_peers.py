"""Notebook 09's harness: which process a fault kills, the systems it knows, and the findings its
tables give (the runs themselves run in the notebook suite's smoke run)."""
import subprocess
import sys
import textwrap

import pandas as pd
import psutil
import pytest

from helpers.study import findings, peers

pytestmark = pytest.mark.timeout(120)  # reached only on deadlock


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_a_fault_kills_a_pool_s_worker_never_its_tracker_or_fork_server_and_bare_s_own(start):
    script = textwrap.dedent("""
        import multiprocessing, sys, time
        if __name__ == "__main__":
            context = multiprocessing.get_context(sys.argv[1])
            context.Lock()  # starts a resource tracker too
            worker = context.Process(target=time.sleep, args=(60,))
            worker.start()
            print(worker.pid, flush=True)
            worker.join()
    """)
    child = subprocess.Popen([sys.executable, "-c", script, start], stdout=subprocess.PIPE,
                             text=True)
    try:
        worker = int(child.stdout.readline())
        root = psutil.Process(child.pid)
        assert peers.victim("gpufeed_process", root).pid == worker
        assert peers.victim("st_pool", root).pid == worker
        assert peers.victim("bare", root) == root
        assert peers.victim("ray_data", root) is None  # no Ray actor in this tree
        alone = [psutil.Process(pid).memory_info().rss / 2**20 for pid in (child.pid, worker)]
        assert peers.tree_rss_mib(root) > max(alone)  # the parent, its worker and its tracker
        assert 0 < peers.tree_pss_mib(root) < peers.tree_rss_mib(root)  # (pages they share)
    finally:
        for process in psutil.Process(child.pid).children(recursive=True):
            process.kill()
        child.kill()
        child.wait()


def test_a_run_s_output_is_read_a_whole_line_at_a_time_as_it_grows(tmp_path):
    path = tmp_path / "stdout.txt"
    path.write_text("")
    lines = peers._Lines(path)
    assert lines.new() == []
    with open(path, "a") as out:
        out.write("loading\n" + peers.STEADY[:5])
        out.flush()
        assert lines.new() == ["loading"]  # half a line waits for its end
        out.write(peers.STEADY[5:] + "\n{\"spinup_s\": 1}\n")
        out.flush()
        assert lines.new() == [peers.STEADY, '{"spinup_s": 1}']
        assert lines.new() == []


def test_only_known_systems_are_run_and_each_gets_its_share_of_threads(monkeypatch):
    with pytest.raises(ValueError, match="systems: expected some of"):
        peers.peers(["bare", "dask"], "cpu", 8, 4, 2, 4, 1)
    with pytest.raises(ValueError, match="systems: expected some of"):
        peers.faults([], "cpu", 8, 4, 2, 4, 0.1, 10)
    monkeypatch.setattr(peers, "_cores", lambda: 8)
    assert peers.threads_for("bare", 4) == 8 and peers.threads_for("st_pool", 4) is None
    assert peers.threads_for("gpufeed_process", 3) == 2 and peers.threads_for("ray_data", 16) == 1
    assert set(peers.LABELS) == set(peers.FAMILIES) == set(peers.SYSTEMS) == set(peers.RUNNERS)


def _row(system, replicate, rate, **extra):
    return {"system": system, "label": peers.LABELS[system], "family": peers.FAMILIES[system],
            "replicate": replicate, "records": 100, "records_per_s": rate, "spinup_s": 5.0,
            "end_to_end_s": 100 / rate + 5.0, "peak_pss_mib": 500.0 * (1 + replicate), **extra}


def test_the_peers_finding_reads_each_system_against_bare_in_its_own_replicate():
    table = pd.DataFrame([_row("bare", 0, 10.0), _row("gpufeed_process", 0, 19.0),
                          _row("bare", 1, 20.0), _row("gpufeed_process", 1, 42.0)])
    text = findings.peers(table)
    assert text.startswith("steady state (models loaded, medians of 2): bare model.encode 15.0")
    assert "gpufeed (processes) 30.5 (2.00× bare)" in text  # 1.9 and 2.1: paired, not 30.5/15
    assert "gpufeed (processes) is quickest" in text


def test_the_faults_finding_names_who_kept_every_row_who_failed_and_who_was_spared():
    rows = [{"system": s, "label": peers.LABELS[s], "records": 64, "killed_pid": pid,
             "outcome": outcome, "rows_lost": lost, "rows_duplicated": twice, "error": error,
             "fault": fault}
            for s, pid, outcome, lost, twice, error, fault in [
                ("bare", 1, "failed", 64, 0, "killed by signal 9", "SIGKILL"),
                ("ray_data", 2, "finished", 0, 0, "", "SIGKILL"),
                ("gpufeed_process", 3, "finished", 0, 0, "", "SIGKILL"),
                ("st_pool", 4, "hung", 64, 0, "", "SIGKILL"),
                ("gpufeed_ray", 5, "finished", 3, 2, "", "SIGKILL"),
                ("gpufeed_thread", None, "finished", 0, 0, "", "none possible")]]
    text = findings.faults(pd.DataFrame(rows))
    assert text.startswith("with one model process SIGKILLed mid-run, every row came back once "
                           "from Ray Data map_batches, gpufeed (processes)")
    assert "failed: bare model.encode (64 of 64 rows lost; killed by signal 9)" in text
    assert "hung past the time limit: sentence-transformers pool (64 of 64 rows lost)" in text
    assert "rows lost or twice: gpufeed (Ray actors) (3 lost, 2 twice)" in text
    assert text.endswith("not killed: gpufeed (threads) (none possible)")
