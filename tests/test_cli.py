"""``python -m helpers run``: JSON on the last line, exit status by outcome, Ctrl-C leaves
nothing."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from conftest import live_children
from helpers.engine.outputs.hdf5_sink import read_output, rows_written
from helpers.study.paths import ROOT, SAMPLE_TEXT

pytestmark = pytest.mark.timeout(180)  # reached only on deadlock


def cli(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "helpers", "run", *args], capture_output=True,
                          text=True, env=env, timeout=150, **kwargs)


@pytest.mark.slow
def test_embedding_run_prints_stats_json_last(tmp_path):
    out = tmp_path / "out.h5"
    done = cli("--input", str(SAMPLE_TEXT), "--output", str(out), "--workload", "embedding",
               "--devices", "cpu", "--workunit-size", "8", "--limit", "20", "--backend", "thread")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["records"] == 20 and stats["records_per_s"] > 0 and not stats["partial"]
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
    # ids are line numbers: the broken line and the null text are filed by the reader under
    # their own, with their positions
    assert sorted((e["id"], e["position"] or -1) for e in data["errors"]) == [(1, 1), (2, 2)]


@pytest.mark.parametrize("args, message", [
    (["--devices", "gpu"], "unknown device 'gpu'"),
    (["--workunit-size", "0"], "workunit_size"),
    (["--workload", "embedding", "--devices", "cuda:7"], "cuda:7 not available on this machine"),
])
def test_bad_arguments_exit_2_naming_the_argument(tmp_path, args, message):
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    done = cli("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.h5"),
               "--workload", "synthetic", *args)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_self_tuning_run_from_the_command_line(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(3000)))
    done = cli("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.h5"),
               "--workload", "synthetic", "--devices", "auto", "--workers-per-device", "auto",
               "--workunit-size", "auto", "--workunit-seconds", "0.1", "--parallelism", "1",
               "--seconds-per-record", "0.0005", "--seconds-per-workunit", "0.005",
               "--no-progress")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["workunit_size"] == "auto" and stats["devices"][0] == "cpu"  # no GPU here
    assert [d["action"] for d in stats["decisions"]][:1] == ["add"]
    assert "growth: cpu add -> 2 workers" in done.stderr and ": add -> 2 workers" in done.stderr
    assert read_output(tmp_path / "out.h5")["ids"].tolist() == list(range(3000))


def test_help_shows_every_default_worth_saying_and_names_each_argument_once():
    """A default of 1 or 1.0 is shown too (1 == True hid them), a flag's off-switch is listed,
    and export's usage does not call two different things OUTPUT."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "helpers", "run", "--help"], capture_output=True,
                         text=True, env=env, timeout=60).stdout
    entries = {" ".join(e.split()).split()[0]: " ".join(e.split())
               for e in re.split(r"\n  (?=-)", run)[1:]}  # each option's entry, by its flag
    for flag, default in (("--retries", "1"), ("--workunit-seconds", "1.0"),
                          ("--max-restarts", "10"), ("--backend", "process")):
        assert f"(default: {default})" in entries[flag], entries[flag]
    assert "--no-compile" in entries["--compile,"] and "(default: False)" not in run
    export = subprocess.run([sys.executable, "-m", "helpers", "export", "--help"],
                            capture_output=True, text=True, env=env, timeout=60).stdout
    usage = " ".join(export.split("\n\n")[0].split())
    assert "--output PATH" in usage and usage.endswith("RUN_OUTPUT")


def test_missing_input_exits_2(tmp_path):
    done = cli("--input", str(tmp_path / "nope.h5"), "--output", str(tmp_path / "o.h5"))
    assert done.returncode == 2 and "no such file" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_stops_quickly_leaves_whole_records_and_resumes(tmp_path, signum):
    from helpers.workloads.synthetic import record_vector

    n = 20000
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(n)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "helpers", "run", "--input", str(tmp_path / "in.jsonl"),
               "--output", str(tmp_path / "o.h5"), "--workload", "synthetic",
               "--seconds-per-record", "0.0005", "--devices", "cpu,cpu", "--workunit-size", "10",
               "--no-progress"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    parent = psutil.Process(run.pid)
    deadline = time.monotonic() + 30
    while len(workers := live_children(parent)) < 2:
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.1)
    # mid-run, once the first flush is indexed (a fixed sleep may come before it on a busy machine)
    while not rows_written(tmp_path / "o.h5"):
        assert run.poll() is None and time.monotonic() < deadline, "no rows written"
        time.sleep(0.1)
    run.send_signal(signum)
    started = time.monotonic()
    run.wait(timeout=20)
    stopped, stderr = time.monotonic() - started, run.stderr.read().decode()
    assert stopped < 10 and run.returncode == 130, f"{stopped:.1f} s, exit {run.returncode}:\n{stderr}"
    assert "--resume" in stderr
    said = json.loads(run.stdout.read().decode().strip().splitlines()[-1])  # (issue 44: none)
    assert said["interrupted"] and not said["complete"] and 0 < said["records"] < n
    time.sleep(0.5)
    assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    partial = read_output(tmp_path / "o.h5")  # opens, and every row in it is whole
    assert 0 < len(partial["ids"]) < n and len(set(partial["ids"].tolist())) == len(partial["ids"])
    for k in range(0, len(partial["ids"]), max(1, len(partial["ids"]) // 50)):  # (the ids
        i = int(partial["ids"][k])  # written need not be 0, 1, ...: a workunit may be missing)
        assert partial["values"][k].tolist() == record_vector(f"r{i}", 8).tolist()
    done = subprocess.run(command + ["--resume"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert read_output(tmp_path / "o.h5")["ids"].tolist() == list(range(n))


@pytest.mark.slow
def test_bad_records_through_the_cli_exit_3_with_one_error_row_each(tmp_path):
    good = ["a sentence to embed", "another one", "and a third"]
    lines = [json.dumps({"text": good[0]}).encode(), json.dumps({"text": ""}).encode(),
             json.dumps({"text": None}).encode(), json.dumps({"text": 5}).encode(),
             b'{"text": "caf\xe9 au lait"}', json.dumps({"text": "x" * 2**20}).encode(),
             json.dumps({"text": good[1]}).encode(), json.dumps({"text": good[2]}).encode()]
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    done = cli("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.h5"),
               "--devices", "cpu", "--backend", "thread", "--workunit-size", "3", "--no-progress")
    assert done.returncode == 3, done.stderr
    assert "partial: 5 records failed" in done.stderr
    assert "record 1 failed: ValueError: empty text" in done.stderr  # and in the log
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == [0, 6, 7] and data["embeddings"].shape == (3, 384)
    errors = {e["id"] if e["id"] is not None else f"line {e['position'] + 1}": e
              for e in data["errors"]}
    assert {i: e["type"] for i, e in errors.items()} == {
        1: "ValueError", 2: "ValueError", 3: "TypeError", 4: "UnicodeDecodeError",
        5: "ValueError"}
    assert "line 5" in errors[4]["message"] and errors[4]["position"] == 4
    assert errors[2]["message"] == "in.jsonl line 3: the text is null"  # (the reader's)
    assert "max_chars" in errors[5]["message"]
    assert all(e["time"] > 1.7e9 for e in errors.values())
    stats = json.loads(done.stdout.splitlines()[-1])
    assert stats["partial"] and stats["failed_records"] == 5 and stats["records"] == 3


def test_notebooks_with_an_unknown_parameter_set_exits_2():
    from helpers.cli import main

    assert main(["notebooks", "--params", "nosuch"]) == 2


def test_notebooks_with_an_unknown_notebook_prefix_exits_2(capsys):
    from helpers.cli import main

    assert main(["notebooks", "--params", "smoke", "--only", "99"]) == 2
    assert "only: no notebook matches ['99']" in capsys.readouterr().err


@pytest.mark.slow
def test_binning_bad_images_get_error_rows_and_the_rest_is_binned(tmp_path):
    """Corrupt, truncated, non-image, 1×1 and 12,000×12,000 files among good ones, through the
    CLI."""
    import csv
    import shutil

    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("page_000.png", "photo_coffee.jpg", "collage_000.jpg"):
        shutil.copy(ROOT / "data" / "images" / name, folder / name)
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8)
    data = (folder / "photo_coffee.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(data[:len(data) // 3])
    (folder / "notes.png").write_text("a text file with an image's name\n")
    Image.new("RGB", (1, 1)).save(folder / "dot.png")
    Image.new("RGB", (12000, 12000), "white").save(folder / "huge.png")
    done = cli("--workload", "binning", "--input", str(folder), "--output", str(tmp_path / "out.h5"),
               "--devices", "cpu,cpu", "--workunit-size", "2", "--no-progress")
    assert done.returncode == 3, done.stderr  # partial: some records are in errors/
    out = read_output(tmp_path / "out.h5")
    failed = {e["id"]: e for e in out["errors"]}
    assert len(out["ids"]) == 5 and len(failed) == 3
    table = {row["path"].split("/")[-1]: row for row in csv.DictReader(open(tmp_path / "out.csv"))}
    assert len(table) == 8
    assert table["corrupt.jpg"]["error"].startswith("ValueError: corrupt.jpg: not an image")
    assert table["notes.png"]["error"].startswith("ValueError: notes.png: not an image")
    assert table["truncated.jpg"]["error"].startswith("OSError: truncated.jpg: cannot decode")
    assert table["page_000.png"]["bin"] == "A" and table["collage_000.jpg"]["bin"] == "B"
    assert table["dot.png"]["bin"] == table["huge.png"]["bin"] == "C"
    assert json.loads(done.stdout.splitlines()[-1])["failed_records"] == 3


MERGE_SLOWLY = """
import sys, time
import helpers.engine.outputs.checkpoint as checkpoint
from helpers.cli import main
merge = checkpoint.merge_into
def slow(*args, **kwargs):
    print("merging", file=sys.stderr, flush=True)
    time.sleep(1.5)  # the signal lands here, inside the final merge
    return merge(*args, **kwargs)
checkpoint.merge_into = slow
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_during_the_final_merge_is_not_lost_and_the_output_is_whole(tmp_path):
    """It was swallowed inside HDF5's clean-up ('Exception ignored ... KeyboardInterrupt'): the
    run ended 0. Now the merge finishes, then the signal is delivered: exit 130."""
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(300)))
    run = subprocess.Popen([sys.executable, "-c", MERGE_SLOWLY, "run", "--input",
                            str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.h5"),
                            "--workload", "synthetic", "--devices", "cpu", "--backend", "thread",
                            "--no-progress"], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    for line in run.stderr:
        if line.strip() == "merging":
            break
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    assert "Exception ignored" not in stderr
    data = read_output(tmp_path / "o.h5")
    assert data["attrs"]["complete"] and data["ids"].tolist() == list(range(300))
    assert not (tmp_path / "o.h5.parts").exists()  # merged into one file before the exit


@pytest.mark.parametrize("after_s", [0.3, 0.9])
def test_ctrl_c_pressed_again_and_again_ends_the_run_at_once_and_never_hangs(tmp_path, after_s):
    """Five SIGINTs 3 ms apart: a second KeyboardInterrupt once escaped the wait for the writer
    thread, which was left inside HDF5 as the interpreter exited: the exit hung on h5py's lock."""
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(3000)))
    out = tmp_path / "o.h5"
    run = subprocess.Popen([sys.executable, "-m", "helpers", "run", "--input",
                            str(tmp_path / "in.jsonl"), "--output", str(out), "--workload",
                            "synthetic", "--devices", "cpu", "--backend", "thread",
                            "--no-progress", "--seconds-per-record", "0.001"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 30
    while not out.exists():  # the run has begun writing
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(after_s)
    for _ in range(5):
        run.send_signal(signal.SIGINT)
        time.sleep(0.003)
    _, stderr = run.communicate(timeout=15)  # (it hung forever)
    assert run.returncode in (130, -signal.SIGINT), stderr  # (-2: a signal after main returned)
    resumed = cli("--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--workload",
                  "synthetic", "--devices", "cpu", "--backend", "thread", "--no-progress",
                  "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert read_output(out)["ids"].tolist() == list(range(3000))


def test_flags_are_never_abbreviated_and_a_typo_is_told_by_its_command_with_a_suggestion():
    """Issue 44: ``--text-colum`` was taken for ``--text-column``; a typo in a command's flag
    printed the top-level usage with no suggestion; run --help had one "options:" heading;
    tune --help said no exit statuses."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def helpers_cli(*args):
        return subprocess.run([sys.executable, "-m", "helpers", *args], capture_output=True,
                              text=True, env=env, timeout=60)

    done = helpers_cli("run", "--input", "in.parquet", "--output", "o.h5", "--text-colum", "b")
    assert done.returncode == 2
    assert "usage: python -m helpers run --input INPUT --output OUTPUT" in done.stderr
    assert "unrecognized arguments: --text-colum (did you mean --text-column" in done.stderr
    done = helpers_cli("export", "o.h5", "--to", "npy", "--outptu", "e")
    assert done.returncode == 2 and "--outptu (did you mean --output?)" in done.stderr
    assert "usage: python -m helpers export" in done.stderr
    headings = re.findall(r"^(\S[^\n]*):$", helpers_cli("run", "--help").stdout, re.M)
    assert headings[:5] == ["options", "input", "devices and layout", "output",
                            "failures and resuming"]
    for command in ("tune", "export", "compact"):
        assert "exit status: 0 done" in helpers_cli(command, "--help").stdout


def test_a_failed_run_says_what_it_kept_and_a_changed_input_how_to_go_on(tmp_path, capsys):
    """A run stopped by its input changing said "--resume finishes the run", which resume then
    refused; and a failed run printed no last stdout line (an interrupted one does)."""
    import numpy as np

    from helpers import cli
    from helpers.engine.contract.fingerprint import InputChanged
    from helpers.engine.contract.protocol import OutputSpec
    from helpers.engine.dispatch.scheduler import PipelineError
    from helpers.engine.outputs.hdf5_sink import HDF5Sink

    out = tmp_path / "out.h5"
    sink = HDF5Sink(out, {"values": OutputSpec((2,), "float32")})
    sink.append(np.arange(5), {"values": np.zeros((5, 2), np.float32)})
    sink.close(complete=False)
    cli._failed(str(out), InputChanged("in.parquet: changed since the run started"), True)
    said = capsys.readouterr()
    assert "5 records written so far" in said.err and "--resume carries on only once the " \
        "input is again the file the run started with" in said.err
    line = json.loads(said.out.strip().splitlines()[-1])
    assert line["failed"] and line["records"] == 5 and not line["complete"]
    assert line["error"].startswith("InputChanged: in.parquet: changed since")
    assert cli._input_changed(PipelineError("InputUnreadable: worker 0 on h cannot read the "
                                            "input: OSError: /a.parquet: changed since the run "
                                            "started (1 bytes then, 2 now)"))
    assert not cli._input_changed(OSError("No space left on device"))


@pytest.mark.slow
def test_encode_options_reach_the_output_and_a_resume_that_changes_one_is_refused(tmp_path):
    """--prompt, --truncate-dim and --stored int8 (calibrated on the input's first texts, the
    ranges kept in the output); --resume reuses the kept ranges, and refuses another prompt
    naming it, before anything is written."""
    out = tmp_path / "out.h5"
    given = ["--input", str(SAMPLE_TEXT), "--output", str(out), "--devices", "cpu",
             "--backend", "thread", "--limit", "12", "--no-progress", "--truncate-dim", "32",
             "--stored", "int8", "--calibration-rows", "40"]
    done = cli(*given, "--prompt", "query: ")
    assert done.returncode == 0, done.stderr
    assert "int8: calibrating on the input's first 40 texts" in done.stderr
    data = read_output(out)
    assert data["embeddings"].shape == (12, 32) and data["embeddings"].dtype.name == "int8"
    attrs = data["attrs"]
    assert attrs["prompt"] == "query: " and attrs["stored"] == "int8"
    assert attrs["truncate_dim"] == 32 and np.shape(attrs["ranges"]) == (2, 32)
    again = cli(*given, "--prompt", "query: ", "--resume")
    assert again.returncode == 0, again.stderr
    assert "int8: the calibration ranges" in again.stderr and "calibrating" not in again.stderr
    assert "--calibration-rows 40 is not used: its rows were cut with these" in again.stderr
    refused = cli(*given, "--prompt", "passage: ", "--resume")
    assert refused.returncode == 2
    assert "prompt 'query: ' -> 'passage: '" in refused.stderr
    twice = cli(*given, "--prompt", "a", "--prompt", "b", "--overwrite")
    assert twice.returncode == 2 and "--prompt: the embedding workload takes one" in twice.stderr
    assert read_output(out)["embeddings"].shape == (12, 32)  # (untouched by either)
    other = cli(*given, "--prompt", "query: ", "--resume", "--truncate-dim", "16")
    assert other.returncode == 2 and "stores 32 dimensions, not --truncate-dim 16" in \
        other.stderr


@pytest.mark.slow
def test_an_option_the_model_turns_down_is_a_bad_argument(tmp_path):
    """Found where the model loads, said as a bad argument (exit 2), not a failed run."""
    done = cli("--input", str(SAMPLE_TEXT), "--output", str(tmp_path / "o.h5"), "--devices",
               "cpu", "--backend", "thread", "--limit", "4", "--no-progress",
               "--prompt-name", "passage")
    assert done.returncode == 2
    assert "prompt_name='passage': the model has no prompt of that name (its prompts: " \
           "['document', 'query'])" in done.stderr
    assert "remote traceback" not in done.stderr


def test_a_resume_over_an_output_holding_error_rows_exits_partial(tmp_path):
    """Issue 59: the first run exited 3 (some records in errors/), its --resume exited 0 over
    the same output: the exit status says what the output holds, an earlier run's error rows
    included."""
    lines = [json.dumps({"text": t}) for t in ["one", "two", "three", "four", "five", "six"]]
    lines[1] = "{broken"
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    common = ("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.h5"),
              "--workload", "synthetic", "--devices", "cpu", "--backend", "thread",
              "--workunit-size", "2", "--no-progress")
    first = cli(*common, "--limit", "3")
    assert first.returncode == 3, first.stderr
    then = cli(*common, "--resume")
    assert then.returncode == 3, then.stderr
    assert "partial: 1 records failed (1 in an earlier run)" in then.stderr
    assert json.loads(then.stdout.splitlines()[-1])["failed_before"] == 1
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == [0, 2, 3, 4, 5] and [e["id"] for e in data["errors"]] == [1]
