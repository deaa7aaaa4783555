"""Files written whole or not at all: a failed write leaves the old file and no temporary one; a
full disk is an error line (or, at the final merge, an output left as its index), never a
segfault; Ctrl-C during a file's last write is held back, then delivered."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import helpers.engine.outputs.atomic as atomic
from helpers.engine.outputs.atomic import ensure_room, hdf5_replacing, uninterrupted
from helpers.study.paths import ROOT

pytestmark = pytest.mark.timeout(240)  # reached only on deadlock


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "out.h5"
    with hdf5_replacing(path) as f:
        f["x"] = np.arange(3)
    with pytest.raises(RuntimeError, match="midway"):
        with hdf5_replacing(path) as f:
            f["x"] = np.arange(10)
            raise RuntimeError("midway")
    with h5py.File(path) as f:
        assert f["x"][...].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.h5"]


def test_no_room_is_an_enospc_error_naming_the_folder_before_anything_is_written(
        tmp_path, monkeypatch):
    class Full:
        f_bavail, f_frsize = 100, 4096  # 400 KiB free

    monkeypatch.setattr(atomic.os, "statvfs", lambda path: Full())
    with pytest.raises(OSError, match=f"{tmp_path} has 0 MiB free") as caught:
        with hdf5_replacing(tmp_path / "out.h5", room=10 << 20):
            pass
    assert caught.value.errno == errno.ENOSPC and not list(tmp_path.iterdir())
    with pytest.raises(OSError):
        ensure_room(tmp_path, 0)  # the margin alone exceeds 400 KiB


@pytest.fixture
def interruptible():
    """SIGINT raising KeyboardInterrupt, as in a terminal (a job started in the background by a
    shell inherits SIGINT ignored, and a held signal is then rightly dropped)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_signals_wait_for_the_end_of_an_uninterrupted_block(interruptible):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with uninterrupted():
            # (raise_signal: delivered to this thread now; os.kill may be delivered to another
            # thread of the process, and so only after the block on a loaded machine)
            signal.raise_signal(signal.SIGINT)
            reached.append("after the signal")  # not interrupted here ...
    assert reached == ["after the signal"]  # ... but as the block ended
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- a real full disk: a small tmpfs in a mount namespace of our own ----------------------------

def _can_mount() -> bool:
    if not shutil.which("unshare"):
        return False
    done = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                          capture_output=True)
    return done.returncode == 0


needs_tmpfs = pytest.mark.skipif(not _can_mount(), reason="cannot mount a tmpfs here "
                                                          "(unshare -rm)")

SMALL = """
import sys
import helpers.engine.outputs.atomic, helpers.engine.outputs.checkpoint
import helpers.engine.outputs.hdf5_sink
from helpers.cli import main
# a disk of a few hundred KiB stands for a big one: parts of 4,096 rows, 64 KiB kept free
helpers.engine.outputs.atomic.ROOM_MARGIN = (64 << 10, 0.05)
helpers.engine.outputs.checkpoint.PART_ROWS = helpers.engine.outputs.hdf5_sink.PART_ROWS = 4096
sys.exit(main(sys.argv[1:]))
"""
CHECK = """
import json, sys
import numpy as np
from helpers.engine.outputs.hdf5_sink import read_output
data = read_output(sys.argv[1])
print(json.dumps({"rows": len(data["ids"]), "once": bool(np.array_equal(data["ids"],
                  np.arange(int(sys.argv[2])))), "complete": bool(data["attrs"]["complete"])}))
"""
RECORDS = 16_000  # four parts of ~160 KiB


def _in_tmpfs(tmp_path: Path, size: str, steps: str) -> list[dict]:
    """Run ``steps`` (shell, with $RUN, $COMPACT, $OUT and $CHECK) in a namespace with a tmpfs of
    ``size`` at $DISK; returns the JSON lines they printed."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"text": "r{i}"}}\n' for i in range(RECORDS)))
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "small.py").write_text(SMALL)
    (tmp_path / "check.py").write_text(CHECK)
    run = (f"{sys.executable} {tmp_path}/small.py run --input {source} --output {disk}/out.h5 "
           f"--workload synthetic --seconds-per-record 0 --devices cpu --backend thread "
           f"--workunit-size 1000 --no-progress")
    script = (f"mount -t tmpfs -o size={size} tmpfs {disk}\n"
              f"RUN='{run}'; OUT={disk}/out.h5; DISK={disk}\n"
              f"COMPACT='{sys.executable} {tmp_path}/small.py compact {disk}/out.h5'\n"
              f"CHECK='{sys.executable} {tmp_path}/check.py $OUT {RECORDS}'\n"
              f"{steps}\n")
    done = subprocess.run(["unshare", "-rm", "bash", "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@needs_tmpfs
def test_no_room_for_the_final_merge_leaves_the_output_complete_as_its_index(tmp_path):
    steps = ("$RUN > run.out 2> run.err; echo \"{\\\"exit\\\": $?}\"\n"
             "eval $CHECK\n"
             "grep -c 'no room to merge the parts' run.err | sed 's/.*/{\"warned\": &}/'\n"
             "$COMPACT 2> compact.err; echo \"{\\\"compact\\\": $?}\"\n"
             "grep -c 'error: .*No space left' compact.err | sed 's/.*/{\"said\": &}/'\n"
             "eval $CHECK")
    results = _in_tmpfs(tmp_path, "1200k", steps)
    merged = {k: v for line in results for k, v in line.items()}
    assert results[0] == {"exit": 0}, (tmp_path / "run.err").read_text()[-2000:]  # not -11
    assert results[1] == {"rows": RECORDS, "once": True, "complete": True}
    assert merged["warned"] == 1
    assert merged["compact"] == 1 and merged["said"] == 1  # no room to compact either: said so
    assert results[-1] == results[1]  # and the output is as it was


@needs_tmpfs
def test_a_disk_that_fills_mid_run_is_an_error_line_and_resume_finishes_once(tmp_path):
    steps = ("$RUN > run.out 2> run.err; echo \"{\\\"exit\\\": $?}\"\n"
             "grep -c '^error: .*No space left on device' run.err | "
             "sed 's/.*/{\"said\": &}/'\n"
             "mount -o remount,size=4m $DISK\n"
             "$RUN --resume > resume.out 2> resume.err; echo \"{\\\"resumed\\\": $?}\"\n"
             "eval $CHECK")
    results = _in_tmpfs(tmp_path, "500k", steps)
    assert results[0] == {"exit": 1}, (tmp_path / "run.err").read_text()[-2000:]  # not -11
    assert results[1] == {"said": 1}
    assert "Traceback" not in (tmp_path / "run.err").read_text()
    assert results[2] == {"resumed": 0}, (tmp_path / "resume.err").read_text()[-2000:]
    assert results[3] == {"rows": RECORDS, "once": True, "complete": True}


def test_attributes_keep_their_types(tmp_path):
    """Numbers stay numbers and lists arrays (a reader gets 32, not '32'); a mapping is JSON;
    None leaves the attribute out, an earlier value of it too."""
    with h5py.File(tmp_path / "a.h5", "w") as f:
        atomic.set_attrs(f, {"batch_size": 32, "normalize": False, "guard": [0.99, 0.98],
                             "devices": ["cpu", "cuda:0"], "speed": {"cuda:1": 0.35},
                             "model": "m", "parallelism": 2})
        atomic.set_attrs(f, {"parallelism": None})
        got = dict(f.attrs)
    assert got["batch_size"] == 32 and not isinstance(got["batch_size"], str)
    assert isinstance(got["normalize"], (bool, np.bool_)) and not got["normalize"]
    assert got["guard"].tolist() == [0.99, 0.98]
    assert [d.decode() if isinstance(d, bytes) else d for d in got["devices"]] == ["cpu", "cuda:0"]
    assert json.loads(got["speed"]) == {"cuda:1": 0.35} and "parallelism" not in got
