"""An output is owned by one run and touched only with the user's say-so: the mistakes a tired user
makes, each through the command line, each refused before anything changes (or done right)."""
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import helpers.engine.outputs.ownership as ownership
from helpers.engine.outputs.hdf5_sink import read_output, rows_written
from helpers.engine.outputs.ownership import (OutputError, OutputLocked, check_output, claimed,
                                              lock_path, owning)
from helpers.engine.pipeline import run_pipeline
from helpers.study.paths import ROOT
from helpers.workloads.synthetic import SyntheticWorkload, record_vector

pytestmark = pytest.mark.timeout(240)  # reached only on deadlock

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def cli(*args, wait=True):
    command = [sys.executable, "-m", "helpers", "run", "--workload", "synthetic", "--devices",
               "cpu", "--backend", "thread", "--no-progress", *map(str, args)]
    if not wait:
        return subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=200)


def jsonl(path, texts, ids=None):
    lines = [{"text": t} if ids is None else {"id": i, "text": t}
             for t, i in zip(texts, ids if ids is not None else texts)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def snapshot(*paths):
    """Every file under ``paths``, name -> sha256: 'unchanged byte for byte' made checkable (a
    killed run's lock aside: the next run takes it over)."""
    files = {}
    for path in map(Path, paths):
        for file in ([path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []):
            if file.is_file() and file.suffix != ".lock":
                files[str(file)] = hashlib.sha256(file.read_bytes()).hexdigest()
    return files


@pytest.fixture
def a_and_b(tmp_path):
    """Two inputs of 1,500 records whose values differ (texts a0.. and b0..)."""
    return (jsonl(tmp_path / "A.jsonl", [f"a{i}" for i in range(1500)]),
            jsonl(tmp_path / "B.jsonl", [f"b{i}" for i in range(1500)]))


# -- one run at a time --------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_run_on_the_same_output_is_refused_at_once_and_the_first_keeps_its_rows(
        tmp_path, a_and_b):
    a, b = a_and_b
    out = tmp_path / "out.h5"
    first = cli("--input", a, "--output", out, "--seconds-per-record", "0.006", wait=False)
    deadline = time.monotonic() + 60
    while not rows_written(out):  # A is writing
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    for flags in ([], ["--overwrite"]):  # (--resume meets the same lock)
        started = time.monotonic()
        second = cli("--input", b, "--output", out, *flags)
        assert second.returncode == 2, second.stderr
        assert time.monotonic() - started < 20  # refused before any worker starts
        assert f"is being written by another run (pid {first.pid} on" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # (A was still running: the refusal was the lock's)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    data = read_output(out)
    assert data["ids"].tolist() == list(range(1500)) and "A.jsonl" in data["attrs"]["source"]
    expected = np.stack([record_vector(f"a{i}", 8) for i in range(1500)])
    np.testing.assert_array_equal(data["values"], expected)  # every row A's own
    assert not lock_path(out).exists()  # a finished run removes its lock


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path):
    out = tmp_path / "out.h5"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from helpers.engine.outputs.ownership import owning\n"
        "with owning(sys.argv[1]):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"), str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(OutputLocked, match=f"pid {holder.pid} on .*, started"):
        with owning(out):
            pass
    holder.kill()
    holder.wait()
    with owning(out):  # the kernel dropped the dead run's lock: this run takes it over
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    assert not lock_path(out).exists()


def test_an_output_is_claimed_once_and_refused_to_another_thread_and_to_a_second_claim(tmp_path):
    out = tmp_path / "out.h5"
    refused = []

    def other():
        refused.append(_try_owning(out))

    with owning(out) as claim:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        refused.append(_try_owning(out))  # this thread again: claimed once, its Claim handed down
        with claimed(claim) as same:  # what run_pipeline and HDF5Sink do with a Claim given
            assert same is claim
        assert os.fspath(claim) == str(claim) == str(out) and claim.path == out.resolve()
    assert len(refused) == 2 and all(f"pid {os.getpid()}" in r for r in refused)
    with owning(out):  # released once the block ends
        pass
    with claimed(str(out)) as taken:  # a path: claimed there, released at the end
        assert _try_owning(out) and taken.path == out.resolve()
    with owning(out):
        pass


def test_a_run_given_the_claim_of_its_output_writes_it_and_the_lock_stays_the_holder_s(tmp_path):
    """The command line claims the output, then runs into it: run_pipeline and its sink use the
    claim, never taking the lock a second time (which this thread could not: it is held)."""
    out = tmp_path / "out.h5"
    with owning(out) as claim:
        stats = run_pipeline([(i, f"text {i}") for i in range(12)], SyntheticWorkload(0.0, dim=4),
                             ["cpu"], 4, claim, "thread", progress=False)
        assert stats.output == str(out) and lock_path(out).exists()  # still held here
        assert _try_owning(out)  # by this block alone
    assert not lock_path(out).exists()
    assert read_output(out)["ids"].tolist() == list(range(12))


def test_without_working_flock_the_lock_is_a_file_created_exclusively(tmp_path, monkeypatch):
    import errno

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(ownership.fcntl, "flock", no_flock)
    out = tmp_path / "out.h5"
    with owning(out):
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
        refused = []
        thread = threading.Thread(target=lambda: refused.append(_try_owning(out)))
        thread.start()
        thread.join()
        assert "if that run is gone, remove" in refused[0]
    assert not lock_path(out).exists()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    lock_path(out).write_text(json.dumps({"pid": int(gone.stdout), "host": os.uname().nodename,
                                          "started": time.time() - 5, ownership.LOCK_MARK: True}))
    with owning(out):  # a dead process of this machine left it: taken over
        pass
    lock_path(out).write_text(json.dumps({"pid": 1, "host": "another-machine", "started": 0,
                                          ownership.LOCK_MARK: True}))
    assert "another-machine" in _try_owning(out)  # cannot tell: refused, named


def _try_owning(out):
    try:
        with owning(out):
            return ""
    except OutputLocked as exc:
        return str(exc)


# -- refuse before touching ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["in.h5", "in.jsonl", "hardlink"])
def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path, name):
    if name == "in.h5":
        with h5py.File(tmp_path / name, "w") as f:
            f.create_dataset("batches/0", data=np.array(["x", "y"], dtype=object),
                             dtype=h5py.string_dtype())
        source = output = tmp_path / name
    else:
        source = jsonl(tmp_path / "in.jsonl", ["x", "y"])
        output = source
        if name == "hardlink":
            output = tmp_path / "out.h5"
            os.link(source, output)  # another name, the same file
    before = snapshot(tmp_path)
    done = cli("--input", source, "--output", output, "--overwrite")
    assert done.returncode == 2 and "writing it would destroy the input" in done.stderr
    assert "Traceback" not in done.stderr and snapshot(tmp_path) == before


def test_an_existing_output_needs_resume_or_overwrite(tmp_path, a_and_b):
    a, b = a_and_b
    out = tmp_path / "out.h5"
    assert cli("--input", a, "--output", out, "--limit", "100").returncode == 0
    before = snapshot(tmp_path)
    again = cli("--input", a, "--output", out)
    assert again.returncode == 2 and "already holds a finished output" in again.stderr
    assert "--resume" in again.stderr and "--overwrite" in again.stderr
    both = cli("--input", a, "--output", out, "--resume", "--overwrite")
    assert both.returncode == 2 and "choose one" in both.stderr
    assert snapshot(tmp_path) == before
    replaced = cli("--input", b, "--output", out, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    data = read_output(out)
    assert "B.jsonl" in data["attrs"]["source"] and len(data["ids"]) == 1500


@pytest.mark.parametrize("foreign", ["text", "hdf5", "in_parts"])
def test_files_gpufeed_did_not_write_are_never_replaced_moved_or_deleted(tmp_path, a_and_b,
                                                                         foreign):
    a, _ = a_and_b
    out = tmp_path / "out.h5"
    if foreign == "text":
        out.write_text("someone's notes\n")
    elif foreign == "hdf5":
        with h5py.File(out, "w") as f:
            f["measurements"] = np.arange(10)
    else:
        (tmp_path / "out.h5.parts").mkdir()
        (tmp_path / "out.h5.parts" / "my-notes.txt").write_text("keep me\n")
    before = snapshot(tmp_path)
    for flags in ([], ["--overwrite"], ["--resume"]):
        done = cli("--input", a, "--output", out, *flags)
        assert done.returncode == 2, done.stderr
        assert ("not a gpufeed output" if foreign != "in_parts" else "gpufeed did not write") \
            in done.stderr and "Traceback" not in done.stderr
        assert snapshot(tmp_path) == before


def test_an_output_that_is_a_folder_or_a_read_only_place_gets_an_error_line(tmp_path, a_and_b):
    a, _ = a_and_b
    (tmp_path / "folder").mkdir()
    done = cli("--input", a, "--output", tmp_path / "folder")
    assert done.returncode == 2 and "is a folder" in done.stderr and "Traceback" not in done.stderr
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    done = cli("--input", a, "--output", plain / "out.h5")  # a folder that is a file
    assert done.returncode == 2 and "error: cannot write beside the output" in done.stderr
    assert "Not a directory" in done.stderr
    assert "Traceback" not in done.stderr
    done = cli("--input", a, "--output", tmp_path / "o.h5", "--seconds-per-record", "inf")
    assert done.returncode == 2 and "seconds_per_record: expected a finite" in done.stderr


def test_the_binning_table_may_not_land_on_the_output(tmp_path):
    done = cli("--workload", "binning", "--input", ROOT / "data" / "images",
               "--output", tmp_path / "results.csv")
    assert done.returncode == 2 and "binning table would be written over it" in done.stderr
    assert not (tmp_path / "results.csv").exists()


# -- resume checks what it resumes --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("how", ["finished", "killed"])
def test_resume_of_another_input_is_refused_naming_what_differs(tmp_path, a_and_b, how):
    a, b = a_and_b
    out = tmp_path / "out.h5"
    if how == "finished":
        assert cli("--input", a, "--output", out, "--limit", "200").returncode == 0
    else:
        run = cli("--input", a, "--output", out, "--seconds-per-record", "0.003", wait=False)
        while not rows_written(out):
            assert run.poll() is None
            time.sleep(0.05)
        run.kill()
        run.communicate()
    before = snapshot(tmp_path)
    done = cli("--input", b, "--output", out, "--resume")
    assert done.returncode == 2 and "was made from another input" in done.stderr
    assert "digest" in done.stderr and "B.jsonl" in done.stderr and "A.jsonl" in done.stderr
    assert snapshot(tmp_path) == before  # byte for byte: nothing moved, merged or removed
    text = cli("--input", a, "--output", out, "--resume", "--text-field", "body")
    assert text.returncode == 2 and "text_column 'text' -> 'body'" in text.stderr
    finished = cli("--input", a, "--output", out, "--resume")  # its own input: carries on
    assert finished.returncode == 0, finished.stderr
    assert read_output(out)["ids"].tolist() == list(range(1500))


def test_resume_with_another_workload_or_a_foreign_file_is_refused_and_nothing_moves(tmp_path,
                                                                                     a_and_b):
    a, _ = a_and_b
    out = tmp_path / "out.h5"
    assert cli("--input", a, "--output", out, "--limit", "50").returncode == 0
    before = snapshot(tmp_path)
    other = subprocess.run([sys.executable, "-m", "helpers", "run", "--input", str(a), "--output",
                            str(out), "--resume", "--workload", "embedding", "--devices", "cpu",
                            "--backend", "thread", "--no-progress"],
                           env=ENV, capture_output=True, text=True, timeout=200)
    assert other.returncode == 2 and "was made from another workload" in other.stderr
    assert "'synthetic' -> 'embedding'" in other.stderr
    assert snapshot(tmp_path) == before and not (tmp_path / "out.h5.parts").exists()
    mine = tmp_path / "mine.h5"
    with h5py.File(mine, "w") as f:
        f["ids"] = np.arange(3)
    before = snapshot(tmp_path)
    done = cli("--input", a, "--output", mine, "--resume")
    assert done.returncode == 2 and "not a gpufeed output" in done.stderr
    assert snapshot(tmp_path) == before


def test_check_output_names_the_changed_field_and_accepts_a_moved_input(tmp_path, a_and_b, caplog):
    a, _ = a_and_b
    out = tmp_path / "out.h5"
    assert cli("--input", a, "--output", out).returncode == 0  # (no limit: content recorded)
    recorded = ownership.recorded_fingerprints(out)
    moved = {**recorded["input_fingerprint"], "path": "/elsewhere/A.jsonl"}
    assert check_output(out, resume=True, overwrite=False,
                        fingerprints={"input_fingerprint": moved}) == "resume"
    assert "the input moved" in caplog.text
    older = {**recorded["input_fingerprint"], "modified": "2001-01-01T00:00:00.000000000+0000"}
    assert check_output(out, resume=True, overwrite=False,  # (the same bytes: a copy, cp
                        fingerprints={"input_fingerprint": older}) == "resume"  # without -p)
    assert "times differ (modified" in caplog.text and "its bytes are those" in caplog.text
    rewritten = {**older, "content": "0" * 32}
    with pytest.raises(OutputError, match=r"another input: content '.*' -> '0000.*', modified "
                                          r"'.*' -> '2001-01-01"):
        check_output(out, resume=True, overwrite=False,
                     fingerprints={"input_fingerprint": rewritten})
    with h5py.File(out, "r+") as f:  # (an output made before it recorded its input's content)
        f.attrs["input_fingerprint"] = json.dumps({k: v for k, v in recorded[
            "input_fingerprint"].items() if k != "content"})
    with pytest.raises(OutputError, match="modified '.*' -> '2001-01-01.*touch -d"):
        check_output(out, resume=True, overwrite=False, fingerprints={"input_fingerprint": older})


def test_a_run_with_a_limit_reads_no_more_than_it_needs_and_its_resume_says_how_it_checked(
        tmp_path, monkeypatch, caplog):
    """Issue 59: a try of 10 records digested every byte of the input first (a minute for
    100 GB). It now records the input's samples only; the resume of its output without the limit
    is checked on them, and says so, and carries on."""
    import helpers.engine.contract.fingerprint as fingerprint
    source = jsonl(tmp_path / "in.jsonl", [f"t{i}" for i in range(300)])
    out = tmp_path / "out.h5"

    def whole(path):
        raise AssertionError(f"a run with a limit read every byte of {path}")

    with monkeypatch.context() as patched:
        patched.setattr(fingerprint, "_content", whole)
        run_pipeline(source, SyntheticWorkload(0.0, dim=4), ["cpu"], 4, out, "thread",
                     progress=False, limit=10)
    recorded = ownership.recorded_fingerprints(out)["input_fingerprint"]
    assert "content" not in recorded and recorded["digest"] and recorded["size"] > 0
    assert read_output(out)["ids"].tolist() == list(range(10))
    with caplog.at_level("WARNING", logger="gpufeed"):
        run_pipeline(source, SyntheticWorkload(0.0, dim=4), ["cpu"], 4, out, "thread",
                     progress=False, resume=True)
    assert "records no digest of every byte of its input (the run that made it read with a " \
           "limit" in caplog.text
    assert "checked on its size, time and sampled bytes only" in caplog.text
    assert read_output(out)["ids"].tolist() == list(range(300))
    assert "content" in ownership.recorded_fingerprints(out)["input_fingerprint"]  # (whole now)
    stat = os.stat(source)  # (a byte changed, its time put back: refused)
    source.write_text(source.read_text().replace('"t0"', '"x0"'))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(OutputError, match="another input: content '.*', digest"):
        run_pipeline(source, SyntheticWorkload(0.0, dim=4), ["cpu"], 4, out, "thread",
                     progress=False, resume=True)


def test_a_resume_with_a_limit_still_reads_every_byte_of_its_input(tmp_path, monkeypatch):
    """A try reads its samples only; a resume, limited or not, takes the input's whole digest
    again (an output whose run recorded it must be compared on it: a middle rewritten, its time
    put back, would pass the samples)."""
    import helpers.engine.contract.fingerprint as fingerprint
    source = jsonl(tmp_path / "in.jsonl", [f"t{i}" for i in range(300)])
    out = tmp_path / "out.h5"
    run_pipeline(source, SyntheticWorkload(0.0, dim=4), ["cpu"], 4, out, "thread",
                 progress=False)
    read, whole = [], fingerprint._content
    monkeypatch.setattr(fingerprint, "_content", lambda path: read.append(path) or whole(path))
    fingerprint._CONTENTS.clear()
    run_pipeline(source, SyntheticWorkload(0.0, dim=4), ["cpu"], 4, out, "thread",
                 progress=False, resume=True, limit=200)
    assert read  # (its whole content, compared with the one the output records)


# -- ids from the input -------------------------------------------------------------------------

def test_duplicate_broken_and_extreme_ids_cost_only_their_own_records(tmp_path):
    top = 2**63 - 1
    lines = [json.dumps({"id": top, "text": "largest"}), json.dumps({"id": 1, "text": "one"}),
             "{broken", json.dumps({"id": 1, "text": "one again"}),
             json.dumps({"id": 2**63, "text": "too big"}), json.dumps({"id": 2, "text": "two"})]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.h5"
    first = cli("--input", source, "--output", out, "--limit", "2")
    assert first.returncode == 0, first.stderr
    done = cli("--input", source, "--output", out, "--resume")
    assert done.returncode == 3, done.stderr  # partial: three records in errors/
    data = read_output(out)
    assert data["ids"].tolist() == [1, 2, top]  # the largest id written once, not redone
    assert data["values"][0].tolist() == record_vector("one", 8).tolist()  # the first one
    errors = sorted((e["position"], e["id"], e["type"]) for e in data["errors"])
    assert errors == [(2, None, "JSONDecodeError"), (3, 1, "DuplicateId"), (4, None, "ValueError")]
    again = cli("--input", source, "--output", out, "--resume")  # nothing left, nothing twice
    assert again.returncode == 3 and len(read_output(out)["errors"]) == 3  # (what it holds)


# -- what a hostile pass found ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["symlink", "someone's file", "bad json"])
def test_a_lock_path_that_is_not_a_gpufeed_lock_is_never_written_through(tmp_path, a_and_b, kind):
    a, _ = a_and_b
    precious = tmp_path / "precious.txt"
    precious.write_text("my notes\n")
    lock = tmp_path / "out.h5.lock"
    if kind == "symlink":
        lock.symlink_to(precious)
    else:
        lock.write_text("my notes\n" if kind == "someone's file" else '{"started": "yesterday"}')
    before = snapshot(tmp_path) | {str(lock): lock.read_bytes()}
    done = cli("--input", a, "--output", tmp_path / "out.h5")
    assert done.returncode == 2 and "is not a gpufeed lock" in done.stderr
    assert "Traceback" not in done.stderr
    assert snapshot(tmp_path) | {str(lock): lock.read_bytes()} == before


def test_names_beside_the_output_that_are_not_gpufeed_s_are_kept(tmp_path, a_and_b):
    """OUT.tmp (someone's draft) was truncated and renamed over the output; a file left in
    OUT.parts/ during the run (another output, say) was deleted with the folder at the end."""
    a, _ = a_and_b
    out = tmp_path / "out.h5"
    (tmp_path / "out.h5.tmp").write_text("a draft\n")
    run = cli("--input", a, "--output", out, "--seconds-per-record", "0.002", wait=False)
    while not rows_written(out):
        assert run.poll() is None
        time.sleep(0.05)
    (tmp_path / "out.h5.parts" / "mine.txt").write_text("put here while it ran\n")
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    assert "kept, for the 1 file(s) in it that gpufeed did not write" in stderr
    assert (tmp_path / "out.h5.tmp").read_text() == "a draft\n"
    assert sorted(p.name for p in (tmp_path / "out.h5.parts").iterdir()) == ["mine.txt"]
    assert read_output(out)["ids"].tolist() == list(range(1500))


def test_an_output_through_a_link_is_its_target_locked_and_resumed(tmp_path, a_and_b):
    a, _ = a_and_b
    (tmp_path / "big disk").mkdir()
    target = tmp_path / "big disk" / "out.h5"
    link = tmp_path / "link.h5"
    link.symlink_to(target)
    assert ownership.output_path(link) == target.resolve()
    refused = []
    with owning(target):
        thread = threading.Thread(target=lambda: refused.append(_try_owning(link)))
        thread.start()
        thread.join()
    assert "is being written by another run" in refused[0]
    assert cli("--input", a, "--output", link, "--limit", "700").returncode == 0
    done = cli("--input", a, "--output", link, "--resume")
    assert done.returncode == 0, done.stderr
    assert "holds 700 ids" in done.stderr  # (it saw none through the link)
    assert link.is_symlink() and read_output(target)["ids"].tolist() == list(range(1500))


def test_an_in_place_overwrite_keeps_another_name_of_the_old_file(tmp_path, a_and_b):
    a, b = a_and_b
    out = tmp_path / "out.h5"
    assert cli("--input", a, "--output", out, "--limit", "300").returncode == 0
    os.link(out, tmp_path / "backup.h5")
    done = cli("--input", b, "--output", out, "--overwrite", "--in-place")
    assert done.returncode == 0 and "FutureWarning: durable=False (--in-place) is deprecated" \
        in done.stderr  # (it writes parts now, as any run: its flag still runs)
    assert len(read_output(tmp_path / "backup.h5")["ids"]) == 300  # not truncated through it
    assert "B.jsonl" in read_output(out)["attrs"]["source"]


def test_a_refused_run_leaves_no_folder_it_made_and_a_too_long_name_is_refused(tmp_path, a_and_b):
    a, _ = a_and_b
    done = cli("--input", tmp_path / "missing.jsonl", "--output", tmp_path / "new" / "o.h5")
    assert done.returncode == 2 and not (tmp_path / "new").exists()
    long = tmp_path / ("x" * 245 + ".h5")
    done = cli("--input", a, "--output", long)
    assert done.returncode == 2 and "is too long" in done.stderr and not list(
        tmp_path.glob("xxx*"))


def test_a_binning_table_is_never_written_over_a_file_a_binning_run_did_not_write(tmp_path):
    import argparse

    from helpers.cli import _table_path
    from helpers.workloads.binning.table import CSV_COLUMNS

    (tmp_path / "notes.csv").write_text("my,own,spreadsheet\n")
    for flags in ({}, {"resume": True}, {"overwrite": True}):
        args = argparse.Namespace(**{"output": str(tmp_path / "notes.h5"), "resume": False,
                                     "overwrite": False, **flags})
        with pytest.raises(OutputError, match="not a binning table gpufeed wrote"):
            _table_path(args)
    (tmp_path / "notes.csv").write_text(",".join(CSV_COLUMNS) + "\n1,a.png\n")
    args = argparse.Namespace(output=str(tmp_path / "notes.h5"), resume=False, overwrite=False)
    with pytest.raises(OutputError, match="--overwrite replaces it"):
        _table_path(args)
    args.overwrite = True
    assert _table_path(args) == tmp_path / "notes.csv"


def test_without_flock_two_runs_breaking_a_dead_run_s_lock_never_both_hold_it(tmp_path,
                                                                               monkeypatch):
    import errno

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(ownership.fcntl, "flock", no_flock)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    stale = {"pid": int(gone.stdout), "host": os.uname().nodename, "started": 1.0,
             ownership.LOCK_MARK: True}
    for round_ in range(20):
        out = tmp_path / f"out-{round_}.h5"
        lock_path(out).write_text(json.dumps(stale))
        start, holders, results = threading.Barrier(2), [], []

        def contend():
            start.wait()
            try:
                with owning(out):
                    holders.append(1)
                    time.sleep(0.05)
                    results.append(len(holders))
                    holders.pop()
            except OutputLocked:
                results.append(0)

        threads = [threading.Thread(target=contend) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # each got it alone or was refused (one after the other, on a loaded machine: [1, 1]);
        # a refusal for another reason (the lock gone between two opens) raised, not appended
        assert max(results) == 1 and len(results) == 2, results


@pytest.mark.parametrize("name", ["emb.parquet", "emb.npy", "emb"])
def test_an_output_named_as_another_format_is_refused_naming_export(tmp_path, name):
    """Issue 44: ``--output emb.parquet`` wrote HDF5 under that name (exit 0)."""
    with pytest.raises(OutputError, match=r"a run writes HDF5, named \.h5 or \.hdf5; name it "
                                          r"'emb\.h5', then `python -m helpers export emb\.h5"):
        check_output(tmp_path / name, resume=False, overwrite=False)
    assert check_output(tmp_path / "emb.HDF5", resume=False, overwrite=False) == "new"
    assert not list(tmp_path.iterdir())
