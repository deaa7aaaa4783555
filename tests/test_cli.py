"""``python -m helpers run``: JSON on the last line, exit status by outcome, Ctrl-C leaves nothing."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers.hdf5_sink import read_output
from helpers.paths import ROOT, SAMPLE_TEXT

pytestmark = pytest.mark.timeout(180)  # reached only on deadlock


def cli(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "helpers", "run", *args], capture_output=True,
                          text=True, env=env, timeout=150, **kwargs)


def test_embedding_run_prints_stats_json_last(tmp_path):
    out = tmp_path / "out.h5"
    done = cli("--input", str(SAMPLE_TEXT), "--output", str(out), "--workload", "embedding",
               "--devices", "cpu", "--workunit-size", "8", "--limit", "20", "--backend", "thread")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["records"] == 20 and stats["records_per_second"] > 0 and not stats["partial"]
    data = read_output(out)
    assert data["ids"].tolist() == list(range(20)) and data["embeddings"].shape == (20, 384)


def test_partial_run_exits_3_with_errors_table(tmp_path):
    lines = ['{"text": "fine"}', "{broken", '{"text": null}', '{"text": "fine too"}']
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    done = cli("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.h5"),
               "--workload", "synthetic", "--devices", "cpu,cpu", "--no-progress")
    assert done.returncode == 3, done.stderr
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == [0, 3]
    assert [e["id"] for e in data["errors"]] == [1, 2]


@pytest.mark.parametrize("args, message", [
    (["--devices", "gpu"], "unknown device 'gpu'"),
    (["--workunit-size", "0"], "workunit_size"),
])
def test_bad_arguments_exit_2_naming_the_argument(tmp_path, args, message):
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    done = cli("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.h5"),
               "--workload", "synthetic", *args)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_input_exits_1(tmp_path):
    done = cli("--input", str(tmp_path / "nope.h5"), "--output", str(tmp_path / "o.h5"))
    assert done.returncode == 1 and "no such file" in done.stderr


def test_ctrl_c_stops_the_run_and_leaves_no_process(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(100000)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen([sys.executable, "-m", "helpers", "run", "--input",
                            str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.h5"),
                            "--workload", "synthetic", "--seconds-per-record", "0.001",
                            "--devices", "cpu,cpu", "--workunit-size", "10", "--no-progress"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    parent = psutil.Process(run.pid)
    deadline = time.monotonic() + 30
    while len(workers := [c for c in parent.children(recursive=True)
                          if "resource_tracker" not in " ".join(c.cmdline())]) < 2:
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.1)
    time.sleep(1.0)  # mid-run
    run.send_signal(signal.SIGINT)
    started = time.monotonic()
    run.wait(timeout=20)
    assert time.monotonic() - started < 10
    assert run.returncode == 130, run.stderr.read().decode()
    time.sleep(0.5)
    assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert Path(tmp_path / "o.h5").exists()
    read_output(tmp_path / "o.h5")  # the interrupted file still opens


def test_notebooks_with_an_unknown_parameter_set_exits_2():
    from helpers.cli import main

    assert main(["notebooks", "--params", "nosuch"]) == 2


def test_notebooks_with_an_unknown_notebook_prefix_exits_2(capsys):
    from helpers.cli import main

    assert main(["notebooks", "--params", "smoke", "--only", "99"]) == 2
    assert "only: no notebook matches ['99']" in capsys.readouterr().err
