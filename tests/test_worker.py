"""A worker process never outlives its parent: SIGKILL the parent mid-workunit (the workunit hung
for an hour) and every worker (and the fork server that forked it) is gone within GONE_SECONDS, from
either the kernel's signal or the watchdog alone (helpers.engine.workers.worker.watch_parent)."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from helpers.engine.workers.backends import FORK_SERVER, START_METHOD_ENV
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


class Launching:
    """A workload whose work runs on a card (``launches``): each step is logged."""

    name = "launching"

    def __init__(self, log, launches=True, fail=(), seconds=0.0):
        self.log, self._launches, self.fail, self.seconds = log, launches, fail, seconds

    def check_record(self, record):
        pass

    def launches(self, model):
        return self._launches

    def launch(self, model, records):
        if ("launch", records[0]) in self.fail:
            raise RuntimeError(f"launch {records[0]}")
        self.log.append(("launch", records[0]))
        time.sleep(self.seconds)

        def finish():
            if ("finish", records[0]) in self.fail:
                raise RuntimeError(f"finish {records[0]}")
            self.log.append(("finish", records[0]))
            time.sleep(self.seconds)
            return {"out": np.zeros((len(records), 1), dtype=np.float32)}
        return finish

    def process(self, model, records):
        self.log.append(("process", records[0]))
        return {"out": np.zeros((len(records), 1), dtype=np.float32)}


def serve_all(workload, messages, log, overlap=True):
    """``serve`` over ``messages`` (then END_OF_WORK); a message counts as arrived once the
    worker has finished with the one before (what ``waiting`` says)."""
    from helpers.engine.contract.messages import END_OF_WORK, Failed, Result, WorkerInfo
    from helpers.engine.contract.protocol import OutputSpec
    from helpers.engine.workers.worker import serve

    left = list(messages) + [END_OF_WORK]

    def receive():
        log.append("receive")
        return left.pop(0)

    def send(message):
        assert isinstance(message, (Result, Failed))
        log.append(("sent", message.workunit, type(message).__name__))
        answers.append(message)
        return True

    answers = []

    serve(WorkerInfo(0, "cuda:0", 1), workload, None, {"out": OutputSpec((1,), "float32")},
          receive, send, waiting=(lambda seconds: bool(left)) if overlap else None)
    return answers


def units(*starts, alone=()):
    from helpers.engine.contract.messages import Workunit

    return [Workunit(n, np.arange(n, n + 1), [f"r{n}"], alone=n in alone) for n in starts]


def test_a_worker_starts_its_next_workunit_before_it_finishes_the_last():
    """A workload that launches (a card computes while the worker goes on): workunit 1 is
    handed to the card before 0 is finished and answered, within a message and across
    messages; the last is finished when END_OF_WORK comes."""
    log = []
    serve_all(Launching(log), [units(0, 1), units(2)[0]], log)
    assert log == ["receive", ("launch", "r0"), ("launch", "r1"), ("finish", "r0"),
                   ("sent", 0, "Result"), "receive", ("launch", "r2"), ("finish", "r1"),
                   ("sent", 1, "Result"), "receive", ("finish", "r2"), ("sent", 2, "Result")]


def test_with_nothing_waiting_a_worker_finishes_before_it_waits_and_others_never_overlap():
    """With no message waiting (``waiting`` False), the started workunit is finished and
    answered before the worker blocks on its inbox; a workload that does not launch, and a
    backend that cannot say what waits, run each workunit whole, in turn."""
    log = []
    serve_all(Launching(log), [units(0)[0], units(1)[0]], log, overlap=False)
    assert log == ["receive", ("launch", "r0"), ("finish", "r0"), ("sent", 0, "Result"),
                   "receive", ("launch", "r1"), ("finish", "r1"), ("sent", 1, "Result"),
                   "receive"]
    log.clear()
    serve_all(Launching(log, launches=False), [units(0, 1)], log)
    assert log == ["receive", ("process", "r0"), ("sent", 0, "Result"), ("process", "r1"),
                   ("sent", 1, "Result"), "receive"]


def test_a_workunit_sent_alone_overlaps_nothing():
    """Sent alone (which workunit killed a worker is not known): the one before it is finished
    first, and it is finished before the next starts, so a death is its own."""
    log = []
    serve_all(Launching(log), [units(0, 1, 2, alone={1})], log)
    assert log == ["receive", ("launch", "r0"), ("finish", "r0"), ("sent", 0, "Result"),
                   ("launch", "r1"), ("finish", "r1"), ("sent", 1, "Result"),
                   ("launch", "r2"), "receive", ("finish", "r2"), ("sent", 2, "Result")]


@pytest.mark.parametrize("step", ["launch", "finish"])
def test_a_workunit_that_raises_while_overlapped_fails_alone(step):
    """Whether its launch or its finish raises, the Failed message names that workunit, and
    the ones around it are answered with their Results, in order."""
    log = []
    serve_all(Launching(log, fail={(step, "r1")}), [units(0, 1, 2)], log)
    assert [entry for entry in log if entry[0] == "sent"] == [
        ("sent", 0, "Result"), ("sent", 1, "Failed"), ("sent", 2, "Result")]


def test_an_overlapped_workunit_s_time_is_its_own_two_steps_not_the_next_one_s_start():
    """Its Result's ``ended - started`` is its launch and its finish, not also the next
    workunit's launch between them, so workers' busy seconds never pass the wall time."""
    log = []
    answers = serve_all(Launching(log, seconds=0.05), [units(0, 1, 2)], log)
    assert [a.workunit for a in answers] == [0, 1, 2]
    for answer in answers:
        assert 0.09 <= answer.ended - answer.started < 0.14  # 2 x 0.05 s (not 3)
    assert all(later.started >= earlier.started for earlier, later in zip(answers, answers[1:]))

