"""A worker process never outlives its parent: SIGKILL the parent mid-workunit (the workunit hung
for an hour) and every worker (and the fork server that forked it) is gone within GONE_SECONDS, from
either the kernel's signal or the watchdog alone (helpers.engine.worker.watch_parent)."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers.engine.backends import FORK_SERVER, START_METHOD_ENV
from helpers.study.paths import ROOT

pytestmark = pytest.mark.timeout(120)  # reached only on deadlock

GONE_SECONDS = 2.0  # the bound: no worker alive this long after its parent's death
POOL = """
import sys, threading
from helpers.engine.pipeline import WorkerPool
from helpers.workloads.synthetic import SyntheticWorkload

class Spinning(SyntheticWorkload):
    def process(self, model, records):
        sum(range(10**13))  # a C loop holding the GIL for hours: no watchdog thread runs meanwhile

records = [(i, f"r{i}") for i in range(4)]
if sys.argv[3] == "sleep":
    workload = SyntheticWorkload(0.0, hang_on_records={r for _, r in records})  # an hour each
else:
    workload = Spinning(0.0)
def main():
    with WorkerPool(workload, ["cpu", "cpu"], "process", progress=False) as pool:
        print(" ".join(map(str, pool.pids.values())), flush=True)
        pool.run(records, sys.argv[1], workunit_size=1)
if __name__ == "__main__":
    if sys.argv[2] == "thread":
        thread = threading.Thread(target=main)
        thread.start()
        thread.join()
    else:
        main()
"""


@pytest.mark.parametrize("started_from, hang, method", [
    ("main", "sleep", "forkserver"), ("thread", "sleep", "forkserver"),
    ("main", "gil", "forkserver"), ("thread", "gil", "forkserver"),
    ("main", "sleep", "spawn"), ("thread", "sleep", "spawn"), ("main", "gil", "spawn")])
def test_workers_die_with_their_parent_even_mid_workunit(tmp_path, started_from, hang, method):
    """Forked by the fork server, a worker dies by the kernel's signal when the server ends, which
    it does with the pool's process (a worker holds none of the server's own pipe), even when the
    worker holds the GIL ("gil": its watchdog thread cannot run). Spawned from a thread, the
    kernel's signal is not asked for (it would fire when that thread ends): the watchdog alone
    does it, as long as it gets the GIL (so no spawned "gil" case from a thread)."""
    script = tmp_path / "pool.py"  # (a file: forked workers import its Spinning from it)
    script.write_text(POOL)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path / "out.h5"),
                               started_from, hang], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT), START_METHOD_ENV: method})
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    workers = [psutil.Process(pid) for pid in pids]
    helpers = [c for c in psutil.Process(parent.pid).children()  # multiprocessing's own
               if any(name in " ".join(c.cmdline())
                      for name in ("resource_tracker", FORK_SERVER))]
    time.sleep(1.0)  # each worker is inside its hung workunit by now
    assert len(workers) == 2 and all(w.is_running() for w in workers)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    killed = time.monotonic()
    while (alive := [w for w in workers if _running(w)]) and \
            time.monotonic() - killed < GONE_SECONDS:
        time.sleep(0.02)
    assert not alive, f"workers outlived their parent: {[p.pid for p in alive]}"
    while any(_running(h) for h in helpers) and time.monotonic() - killed < 5:
        time.sleep(0.05)  # ... and multiprocessing's tracker and fork server after them
    assert len(helpers) == (2 if method == "forkserver" else 1)
    assert not [h for h in helpers if _running(h)]


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (a dead worker whose new parent, init, has not reaped it yet)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
