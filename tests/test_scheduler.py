"""Recovery, chaos-style: workers killed at random, poison records, hangs, out of memory, adaptive
spawning. Each test checks the output holds every good record exactly once, and (conftest) that no
worker process is left behind."""
import logging
import os
import queue
import random
import signal
import threading
import time

import numpy as np
import pytest

from conftest import live_children
from helpers import PipelineError, SyntheticWorkload, WorkerPool, read_output, run_pipeline
from helpers.workloads.synthetic import record_vector

pytestmark = pytest.mark.timeout(300)  # reached only on deadlock

KILL_SEEDS = range(12)  # moments a worker is killed at (20 took 11 s more of the suite's 15 minutes)


def records(n):
    return [(i, f"r{i}") for i in range(n)]


def assert_exactly_once(path, n, missing=()):
    """Every id in range(n) but ``missing`` once, with the synthetic vector of its record; no
    part of a worker's left beside it (committed into the file, or removed)."""
    data = read_output(path)
    assert not path.with_name(path.name + ".parts").exists()
    expected = [i for i in range(n) if i not in set(missing)]
    assert data["ids"].tolist() == expected
    np.testing.assert_array_equal(data["values"], np.stack([record_vector(f"r{i}", 8)
                                                            for i in expected]))
    return data


def worker_pids():
    return [c.pid for c in live_children()]


class Killer(threading.Thread):
    """Kills one worker process with SIGKILL ``delay`` seconds after the first one appears."""

    def __init__(self, seed: int, window: float) -> None:
        super().__init__(daemon=True)
        self.rng, self.window, self.killed = random.Random(seed), window, None

    def run(self) -> None:
        deadline = time.monotonic() + 30
        while not (pids := worker_pids()) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(self.rng.uniform(0, self.window))
        pids = worker_pids()
        if pids:
            self.killed = self.rng.choice(pids)
            os.kill(self.killed, signal.SIGKILL)


@pytest.mark.parametrize("seed, writes", [(seed, "driver") for seed in KILL_SEEDS] +
                         [(seed, "workers") for seed in KILL_SEEDS[:8]])
def test_a_worker_killed_at_a_random_moment_costs_nothing(tmp_path, seed, writes):
    killer = Killer(seed, window=1.2)
    killer.start()
    stats = run_pipeline(records(600), SyntheticWorkload(0.004), ["cpu", "cpu"], 10,
                         tmp_path / "out.h5", progress=False,
                         writes=writes)  # 1.2 s of work after spin-up
    killer.join()
    assert killer.killed is not None and stats.recovery["deaths"] >= 1
    assert stats.recovery["restarts"] == stats.recovery["deaths"]
    assert_exactly_once(tmp_path / "out.h5", 600)
    assert stats.records == 600 and not stats.partial


@pytest.mark.parametrize("fault, writes, per_message", [
    (fault, writes, 1) for fault in ("fail_on_records", "exit_on_records")
    for writes in ("driver", "workers")] + [  # four workunits a message: the same errors
    ("exit_on_records", "driver", 4), ("exit_on_records", "workers", 4),
    ("fail_on_records", "driver", 4)])
def test_a_poison_record_among_1000_is_isolated(tmp_path, fault, writes, per_message, caplog):
    workload = SyntheticWorkload(0.0002, **{fault: {"r500"}})
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        stats = run_pipeline(records(1000), workload, ["cpu", "cpu"], 50, tmp_path / "out.h5",
                             progress=False, writes=writes, units_per_message=per_message)
    data = assert_exactly_once(tmp_path / "out.h5", 1000, missing={500})
    assert [e["id"] for e in data["errors"]] == [500]
    expected = "InjectedFailure" if fault == "fail_on_records" else "WorkerDied"
    assert data["errors"][0]["type"] == expected and stats.partial
    assert stats.records == 999 and stats.failed_records == 1
    assert stats.recovery["splits"] >= 5  # 50 -> 25 -> 13 -> 7 -> 4 -> 2 -> 1
    assert "splitting it" in caplog.text and "record 500 failed" in caplog.text


@pytest.mark.parametrize("writes", ["driver", "workers"])
def test_a_workunit_that_hangs_once_costs_one_timeout(tmp_path, writes):
    workload = SyntheticWorkload(0.001, hang_on_records={"r150"}, transient=str(tmp_path))
    timeout = 2.0
    started = time.monotonic()
    stats = run_pipeline(records(300), workload, ["cpu", "cpu"], 10, tmp_path / "out.h5",
                         workunit_timeout=timeout, progress=False, writes=writes)
    # the issue asks for timeout + a few seconds: here 2 workers' spin-up, the timeout, one
    # restart, with room for a loaded CI machine (a hang waited out would end at 300 s)
    assert time.monotonic() - started < timeout + 12
    assert stats.recovery["timeouts"] == 1 and stats.recovery["restarts"] == 1
    assert_exactly_once(tmp_path / "out.h5", 300)


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_a_record_that_always_hangs_ends_in_errors(tmp_path, backend):
    workload = SyntheticWorkload(0.0, hang_on_records={"r5"})
    stats = run_pipeline(records(20), workload, ["cpu", "cpu"], 1, tmp_path / "out.h5",
                         backend, workunit_timeout=2.0, retries=0, progress=False)
    data = assert_exactly_once(tmp_path / "out.h5", 20, missing={5})
    assert [(e["id"], e["type"]) for e in data["errors"]] == [(5, "WorkunitTimeout")]
    assert "workunit_timeout" in data["errors"][0]["message"] and stats.partial


@pytest.mark.parametrize("backend, writes", [("process", "driver"), ("thread", "driver"),
                                             ("process", "workers")])
def test_out_of_memory_halves_the_workunit_and_keeps_the_smaller_size(tmp_path, backend, writes,
                                                                      caplog):
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        stats = run_pipeline(records(200), SyntheticWorkload(0.0, oom_above=8), ["cpu"], 32,
                             tmp_path / "out.h5", backend, progress=False, writes=writes)
    assert_exactly_once(tmp_path / "out.h5", 200)
    assert "out of memory on workunit" in caplog.text
    assert "at most 16 records" in caplog.text and "at most 8 records" in caplog.text
    # 32 -> 16 -> 8; the workunit waiting behind a failed one was sent before the cap came down
    # and fails once more, so at most two backoffs per step, then every workunit fits
    assert 2 <= stats.recovery["oom_backoffs"] <= 4
    assert max(s.records for s in stats.timeline) == 8


def test_a_record_too_big_for_memory_alone_ends_in_errors(tmp_path):
    stats = run_pipeline([(0, "r0")], SyntheticWorkload(0.0, oom_above=0), ["cpu"], 1,
                         tmp_path / "out.h5", "thread", progress=False)
    errors = read_output(tmp_path / "out.h5")["errors"]
    assert [(e["id"], e["type"]) for e in errors] == [(0, "MemoryError")] and stats.partial


def test_without_restarts_left_the_run_fails_naming_the_last_worker(tmp_path):
    started = time.monotonic()
    with pytest.raises(PipelineError, match=r"every worker is gone: the last, worker \d on cpu, "
                                            r"died \(exit code 70\)"):
        run_pipeline(records(100), SyntheticWorkload(0.0, exit_on_records={"r50"}),
                     ["cpu", "cpu"], 10, tmp_path / "out.h5", max_restarts=0, progress=False)
    assert time.monotonic() - started < 15


def test_a_worker_killed_while_loading_is_replaced(tmp_path):
    killer = Killer(0, window=0.0)  # at once: the worker is still importing
    killer.start()
    stats = run_pipeline(records(50), SyntheticWorkload(0.0), ["cpu", "cpu"], 5,
                         tmp_path / "out.h5", progress=False)
    killer.join()
    assert killer.killed is not None and stats.recovery["restarts"] == 1
    assert_exactly_once(tmp_path / "out.h5", 50)


def test_adaptive_spawn_adds_workers_while_the_device_has_memory(tmp_path, monkeypatch, caplog):
    import helpers.engine.dispatch.growth

    # 350 MiB devices, 100 MiB copies: after 3 copies 50 MiB are left, less than one copy
    workload = SyntheticWorkload(0.0, device_memory_mib={"cuda:0": 350, "cuda:1": 150},
                                 model_mib=100)
    with WorkerPool(workload, ["cuda:0", "cuda:1"], adaptive=True, progress=False) as pool:
        assert pool.stable_workers == {"cuda:0": 3, "cuda:1": 1}
        stats = pool.run(records(60), tmp_path / "out.h5", workunit_size=5)
    assert len(stats.workers) == 4
    assert_exactly_once(tmp_path / "out.h5", 60)
    # with no headroom asked, it adds copies until one fails to load: the 4th on cuda:0
    monkeypatch.setattr(helpers.engine.dispatch.growth, "MEMORY_HEADROOM", 0.0)
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        with WorkerPool(workload, ["cuda:0"], workers_per_device="fit",  # (adaptive's new name)
                        max_workers_per_device=6) as pool:
            assert pool.stable_workers == {"cuda:0": 3}
    assert "worker 4 on cuda:0 failed to start" in caplog.text and "MemoryError" in caplog.text


class FakeBackend:
    """Records what the scheduler sends; no worker runs."""

    name = "process"
    recyclable = True

    def __init__(self, answers_together=False):
        self.sent, self.killed = [], []  # (slot, the indexes of one message's workunits)
        self.events = queue.Queue()
        self.answers_together = answers_together

    def send(self, slot, units):
        self.sent.append((slot, [unit.index for unit in units]))

    def kill(self, slot):
        self.killed.append(slot)

    def spawn(self, info):
        pass

    def shutdown(self, clean):
        pass


class Queued:
    """A feed of the given workunits, taken from the end, each up to the size asked (the rest
    of a longer one stays first); the sizes asked are kept."""

    def __init__(self, units=()):
        self.units, self.asked, self.expected, self.wake_asked = list(units), [], [], []
        self.records_put = sum(map(len, self.units))

    def expect(self, n):
        self.expected.append(n)

    def wake_on_more(self, mark):
        self.wake_asked.append(mark)

    def take(self, n):
        assert n <= max(self.expected, default=0), "a take larger than the taker said it expects"
        self.asked.append(n)
        if not self.units:
            return None
        unit = self.units.pop()
        if len(unit) > n:
            from dataclasses import replace
            self.units.append(replace(unit, ids=unit.ids[n:], records=unit.records[n:]))
            unit = replace(unit, ids=unit.ids[:n], records=unit.records[:n])
        return unit

    def backlog(self, n):
        return sum(-(-len(unit) // n) for unit in self.units)

    def remaining(self):
        return None


def ready_scheduler(backend, workers, **settings):
    from helpers.engine.contract.settings import PoolSettings
    from helpers.engine.dispatch.scheduler import Scheduler
    from helpers.engine.dispatch.slots import State

    scheduler = Scheduler(backend, workers, PoolSettings(**settings))
    scheduler.taker.new_job(size=1)  # (a job of fixed sizes, as the pool sets it)
    for slot in scheduler.slots.values():
        slot.state = State.READY
    return scheduler


def test_with_auto_sizes_the_scheduler_asks_the_feed_for_each_workers_size():
    """A workunit's size is the scheduler's alone (its Sizing): it takes each worker's target
    from the feed (a fast worker's larger), joining what a window's end left short up to it, and
    a retried workunit larger than a worker's target is cut to it, the rest waiting first."""
    from helpers.engine.contract.messages import WorkerInfo, Workunit
    from helpers.engine.measure.sizing import Sizing

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1), WorkerInfo(1, "cpu", 1)])
    sizing = Sizing(1.0)
    sizing.observe(0, 100, 0.1)  # 1,000 records/s: 400 at most (four times the last)
    sizing.observe(1, 100, 1.0)  # 100 records/s: 100
    scheduler.taker.new_job(sizing)
    scheduler.new_job(1)
    queued = Queued([Workunit(0, np.arange(n, n + 50), [f"r{i}" for i in range(n, n + 50)])
                     for n in reversed(range(0, 5000, 50))])  # windows of 50
    scheduler.dispatch(queued)
    fast, slow = scheduler.slots[0], scheduler.slots[1]
    assert [len(u) for u in fast.in_flight] == [400, 400]
    assert [len(u) for u in slow.in_flight] == [100, 100]
    assert queued.asked[:3] == [400, 350, 300]  # (joined up to the target)
    sent = sorted(np.concatenate([u.ids for s in (fast, slow) for u in s.in_flight]).tolist())
    assert sent == list(range(1000))  # each once
    retried = scheduler.taker.number(Workunit(0, np.arange(9000, 9300), ["x"] * 300, attempts=1))
    scheduler.taker.waiting.append(retried)
    slow.in_flight.clear()
    slow.messages.clear()
    scheduler.dispatch(queued)
    assert [u.ids[0] for u in slow.in_flight] == [9000, 9100]
    assert [len(u) for u in slow.in_flight] == [100, 100]
    assert [len(unit) for unit in scheduler.taker.waiting] == [100]  # the rest of the retried one


def test_a_dispatch_that_leaves_a_worker_short_asks_the_feed_to_wake_it_at_the_next_records():
    """Issue 60: the reader used to take a look (a take refused, a backlog asked) as a wish to
    be woken. The scheduler now asks, once, after a dispatch that left a ready worker without
    its two messages, with the mark taken before it looked (records put while it looked wake it
    at once); a dispatch that filled every worker asks nothing."""
    from helpers.engine.contract.messages import WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1), WorkerInfo(1, "cpu", 1)])
    scheduler.new_job(1)
    three = Queued([Workunit(0, np.arange(n, n + 1), ["r"]) for n in range(3)])
    scheduler.dispatch(three)
    assert [len(s.messages) for s in scheduler.slots.values()] == [1, 1]  # (one left: the
    # last go one a worker)
    assert three.wake_asked == [3]  # woken when more come; the mark: records put before it looked
    plenty = Queued([Workunit(0, np.arange(n, n + 1), ["r"]) for n in range(10)])
    scheduler.dispatch(plenty)  # the short worker gets its second; every worker holds two
    assert [len(s.messages) for s in scheduler.slots.values()] == [2, 2]
    assert plenty.wake_asked == [] and set(plenty.expected) == {1}


def test_a_static_split_s_slice_goes_whole_unless_its_worker_is_capped():
    """A static split's job has no workunit size: each slice goes to its worker as it is, and
    only a worker's out-of-memory cap cuts it (the rest stays its own)."""
    from helpers.engine.contract.messages import WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1), WorkerInfo(1, "cpu", 1)])
    scheduler.taker.new_job()
    scheduler.new_job(per_message=1)
    for i in (0, 1):
        scheduler.taker.waiting.append(scheduler.taker.number(
            Workunit(0, np.arange(i * 100, i * 100 + 100), ["r"] * 100, pinned=i)))
    scheduler.taker.cap(1, 30)  # (an out-of-memory in an earlier job)
    scheduler.dispatch(Queued())
    assert [len(u) for u in scheduler.slots[0].in_flight] == [100]
    assert [len(u) for u in scheduler.slots[1].in_flight] == [30]
    assert [(len(u), u.pinned) for u in scheduler.taker.waiting] == [(70, 1)]


def test_the_last_workunits_go_one_per_idle_worker_not_two_to_one():
    from helpers.engine.contract.messages import WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cuda:0", 1), WorkerInfo(1, "cuda:1", 1)])
    for n in range(3):
        scheduler.taker.waiting.append(scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"])))
    scheduler.dispatch(Queued())
    assert [slot for slot, _ in backend.sent] == [0, 1]  # one each; the third waits for the first
    assert len(scheduler.taker.waiting) == 1                      # worker free, not behind a busy one
    for n in range(4):
        scheduler.taker.waiting.append(scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"s{n}"])))
    scheduler.dispatch(Queued())  # five left for two workers: enough to queue behind each
    assert [slot for slot, _ in backend.sent] == [0, 1, 0, 1]
    backend.sent.clear()
    for slot in scheduler.slots.values():
        slot.in_flight.clear()
        slot.messages.clear()
    scheduler.taker.waiting.clear()
    queued = Queued(scheduler.taker.number(Workunit(0, np.arange(1), ["y"])) for _ in range(3))
    scheduler.dispatch(queued)
    assert [slot for slot, _ in backend.sent] == [0, 1] and len(queued.units) == 1


def test_a_worker_whose_model_breaks_is_recycled_and_only_the_bad_record_is_lost(tmp_path, caplog):
    """A record that breaks its worker for good (a CUDA device-side assert does): without
    recycling, every later workunit of that worker would fail and end in errors."""
    workload = SyntheticWorkload(0.001, break_on_records={"r100"})
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        stats = run_pipeline(records(300), workload, ["cpu", "cpu"], 10, tmp_path / "out.h5",
                             progress=False)
    data = assert_exactly_once(tmp_path / "out.h5", 300, missing={100})
    assert [e["id"] for e in data["errors"]] == [100]
    assert stats.recovery["recycles"] >= 1 and "failed in a row" in caplog.text


def test_a_message_holds_several_workunits_and_the_last_go_one_per_idle_worker():
    """units_per_message=4: each worker gets four in a message, and a second message to wait
    behind it; the next goes out once a whole message's answers are back; near the end a message
    takes a second workunit only while a message's worth is left for every worker."""
    from helpers.engine.contract.messages import Result, WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cuda:0", 1), WorkerInfo(1, "cuda:1", 1)])
    scheduler.new_job(4)
    queued = Queued([scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"]))
                     for n in reversed(range(24))])
    scheduler.dispatch(queued)
    assert [(slot, len(units)) for slot, units in backend.sent] == [(0, 4), (1, 4), (0, 4), (1, 4)]
    assert len(queued.units) == 8
    first = backend.sent[0][1]
    for done, index in enumerate(first[:3]):  # three answers of four back: no message yet
        unit = scheduler.slots[0].in_flight[0]
        scheduler.handle(0, Result(0, index, unit.ids, {}, [], 0.0, 0.0))
        scheduler.dispatch(queued)
        assert len(backend.sent) == 4, done
    scheduler.handle(0, Result(0, first[3], np.arange(1), {}, [], 0.0, 0.0))
    scheduler.dispatch(queued)  # 8 left, two workers: still a message's worth for each
    assert [(slot, len(units)) for slot, units in backend.sent[4:]] == [(0, 4)]
    assert len(queued.units) == 4
    for index in backend.sent[2][1]:  # slot 0's second message answered: 4 left, one a message
        scheduler.handle(0, Result(0, index, np.arange(1), {}, [], 0.0, 0.0))
    scheduler.dispatch(queued)
    assert [(slot, len(units)) for slot, units in backend.sent[5:]] == [(0, 1)]
    assert len(queued.units) == 3


def test_a_worker_holds_two_messages_however_small_they_are_at_the_end_of_a_job():
    """The tail cuts messages to one workunit; a worker still holds two messages at most, the
    rest waiting for whichever worker is free first (counting workunits, a slot passed the
    second message's check again and again and held five of the last ten)."""
    from helpers.engine.contract.messages import WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1), WorkerInfo(1, "cpu", 1)])
    scheduler.new_job(4)
    queued = Queued([scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"]))
                     for n in reversed(range(10))])
    for _ in range(5):  # (each pass as after an event that answers nothing)
        scheduler.dispatch(queued)
    assert [len(slot.messages) for slot in scheduler.slots.values()] == [2, 2]
    assert len(backend.sent) == 4 and len(queued.units) == 10 - sum(
        len(units) for _, units in backend.sent) > 0


def test_a_message_never_holds_more_than_units_per_message():
    """A worker that got a workunit alone (the reader had only one queued) still gets messages
    of four at most, and so a call's timeout covers four."""
    from helpers.engine.contract.messages import WorkerInfo, Workunit

    backend = FakeBackend(answers_together=True)
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1)])
    scheduler.new_job(4)
    units = [scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"])) for n in range(20)]
    scheduler.dispatch(Queued(units[:1]))
    scheduler.dispatch(Queued(list(reversed(units[1:]))))
    assert [len(message) for _, message in backend.sent] == [1, 4]
    assert max(map(len, scheduler.slots[0].messages)) == 4  # (a call timed as four)


def test_where_messages_grow_a_worker_with_short_workunits_gets_more_a_message():
    """growing_messages: once a worker's workunits are measured (read, run and written) under
    MESSAGE_SECONDS, its messages grow, twice its last at most, to about that much of its work and
    MAX_UNITS_PER_MESSAGE; a worker with long workunits keeps per_message, and one long workunit
    shrinks them at once; a workunit whose records were all rejected says nothing; a call's
    timeout covers its workunits; the end
    of a job still cuts messages to one; auto sizes and a new job start from per_message."""
    from helpers.engine.contract.messages import Result, WorkerInfo, Workunit
    from helpers.engine.contract.settings import MAX_UNITS_PER_MESSAGE, MESSAGE_SECONDS
    from helpers.engine.measure.sizing import Sizing

    backend = FakeBackend(answers_together=True)
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1), WorkerInfo(1, "cpu", 1)],
                                workunit_timeout=1.0)
    scheduler.taker.new_job(size=1)
    scheduler.new_job(2, growing_messages=True)
    queued = Queued([scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"]))
                     for n in reversed(range(400))])
    scheduler.dispatch(queued)
    assert [len(units) for _, units in backend.sent] == [2, 2, 2, 2]  # nothing measured yet
    slot = scheduler.slots[0]

    def answer(index, seconds, rejected=False):  # the running message's answers
        for unit in sorted(scheduler.slots[index].messages[0]):
            ids = np.arange(0) if rejected else np.arange(1)
            scheduler.handle(index, Result(index, unit, ids, {}, [(1, "E", "", 0.0)] * rejected,
                                           10.0, 10 + seconds))

    def sent_to_0():
        backend.sent.clear()
        scheduler.dispatch(queued)
        return [len(units) for index, units in backend.sent if index == 0]

    answer(1, MESSAGE_SECONDS)  # slot 1's workunits are long: per_message stays
    answer(0, MESSAGE_SECONDS / 100)  # slot 0's are short: 4, 8, 16, 16 (not 100)
    sizes = sent_to_0()
    for _ in range(3):
        answer(0, MESSAGE_SECONDS / 100)
        sizes += sent_to_0()
    assert sizes == [4, 8, MAX_UNITS_PER_MESSAGE, MAX_UNITS_PER_MESSAGE]
    assert [len(units) for index, units in backend.sent if index == 1] == []  # (holds two)
    slot.head_since = time.monotonic() - MAX_UNITS_PER_MESSAGE + 1  # a call of 16 of 1 s each
    scheduler.check_timeouts()
    assert backend.killed == []
    answer(0, MESSAGE_SECONDS, rejected=True)  # nothing kept (a long time): not counted
    assert scheduler.message_size(slot) == MAX_UNITS_PER_MESSAGE
    answer(0, MESSAGE_SECONDS)  # one long workunit: back to per_message at once
    assert scheduler.message_size(slot) == 2
    assert sent_to_0() == [2, 2]
    answer(0, MESSAGE_SECONDS / 100)  # then down slowly: a moving average (0.2 of the new)
    assert scheduler.message_size(slot) == 2 and slot.unit_s > MESSAGE_SECONDS / 2
    scheduler.taker.new_job(Sizing(1.0))  # workunit_size="auto": each about a second already
    assert scheduler.message_size(slot) == 2
    scheduler.taker.new_job(size=1)
    queued.units = queued.units[-3:]  # the end of the job: one workunit, not three
    assert sent_to_0() == [1] and len(queued.units) == 2
    scheduler.new_job(2, growing_messages=True)  # the next job's workunits may be long
    assert scheduler.message_size(slot) == 2


def test_grown_messages_hold_no_more_records_than_message_records_the_driver_read():
    """Records the driver read itself (texts, queued and in flight in its memory) cap a grown
    message at MESSAGE_RECORDS, however short the workunits; positions each worker reads
    itself (Rows) do not."""
    from helpers.engine.contract.messages import Result, WorkerInfo, Workunit
    from helpers.engine.contract.protocol import Rows
    from helpers.engine.contract.settings import MAX_UNITS_PER_MESSAGE, MESSAGE_RECORDS

    size = MESSAGE_RECORDS // 3  # three a message at most

    def sizes(records):
        backend = FakeBackend()
        scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1)])
        scheduler.taker.new_job(size=size)
        scheduler.new_job(1, growing_messages=True)
        queued = Queued([scheduler.taker.number(Workunit(0, np.arange(n, n + size), records(n)))
                         for n in reversed(range(0, 200 * size, size))])
        sent = []
        for _ in range(6):
            backend.sent.clear()
            scheduler.dispatch(queued)
            sent += [len(units) for _, units in backend.sent]
            for index in sorted(scheduler.slots[0].messages[0]):
                scheduler.handle(0, Result(0, index, np.arange(size), {}, [], 10.0, 10.001))
        return sent

    assert max(sizes(lambda n: [f"r{i}" for i in range(n, n + size)])) == 3
    assert max(sizes(lambda n: Rows("opener", np.arange(n, n + size)))) == MAX_UNITS_PER_MESSAGE


def test_a_death_or_hang_where_answers_come_back_together_sends_each_workunit_alone():
    """On Ray a call's answers come back when it returns, and a death can lose those of a call
    finished just before it: a timeout in a call of several workunits, or a death while an actor
    holds several, cannot tell which one did it, so none is charged and each goes again alone
    (nothing else in flight on its worker); a death then charges that workunit. The timeout of a
    call is its workunits' together."""
    from helpers.engine.contract.messages import Died, Result, WorkerInfo, Workunit

    backend = FakeBackend(answers_together=True)
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1)], retries=1,
                                workunit_timeout=10.0)
    scheduler.new_job(3)
    queued = Queued([scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"]))
                     for n in reversed(range(8))])  # (two left for later)
    scheduler.dispatch(queued)
    slot = scheduler.slots[0]
    assert [len(units) for _, units in backend.sent] == [3, 3]
    slot.head_since = time.monotonic() - 25  # 25 s into a call of 3 workunits of 10 s each
    scheduler.check_timeouts()
    assert backend.killed == []
    slot.head_since = time.monotonic() - 31
    scheduler.check_timeouts()
    assert backend.killed == [0] and scheduler.recovery.timeouts == 1
    assert scheduler.handle(0, Died(0, None, "killed by the pool (ray.kill)")) == ([], [])
    assert [(int(u.ids[0]), u.attempts, u.alone) for u in scheduler.taker.waiting] == [
        (n, 0, True) for n in range(6)]
    assert scheduler.recovery.failed_workunits == 0 and scheduler.recovery.restarts == 1
    backend.sent.clear()
    slot.state = slot.state.READY
    scheduler.dispatch(Queued())
    assert backend.sent == [(0, [slot.in_flight[0].index])]  # alone: nothing behind it
    scheduler.handle(0, Result(0, slot.in_flight[0].index, slot.in_flight[0].ids, {}, [], 0, 0))
    scheduler.dispatch(Queued())
    assert len(backend.sent) == 2 and len(slot.in_flight) == 1
    assert scheduler.handle(0, Died(0, None, "Ray actor died: segfault")) == ([], [])
    assert [(int(u.ids[0]), u.attempts) for u in scheduler.taker.waiting][:2] == [(1, 1), (2, 0)]
    assert scheduler.recovery.failed_workunits == 1  # the one it held alone: charged


def test_a_workunit_to_be_sent_alone_waits_uncut_for_a_worker_holding_nothing():
    """A busy worker leaves it first in line as it is: cutting it to that worker's size (an
    out-of-memory cap of 1, here) would have the idle workers run it record by record."""
    from helpers.engine.contract.messages import WorkerInfo, Workunit

    backend = FakeBackend(answers_together=True)
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1), WorkerInfo(1, "cpu", 1)])
    busy, idle = scheduler.slots[0], scheduler.slots[1]
    scheduler.taker.cap(busy.info.index, 1)
    busy.in_flight.append(scheduler.taker.number(Workunit(0, np.arange(1), ["a"])))
    alone = scheduler.taker.number(Workunit(0, np.arange(1, 101), [f"r{n}" for n in range(100)],
                                      alone=True))
    scheduler.taker.waiting.append(alone)
    idle.state = idle.state.LOADING
    scheduler.dispatch(Queued())
    assert backend.sent == [] and list(scheduler.taker.waiting) == [alone]
    idle.state = idle.state.READY
    scheduler.dispatch(Queued())
    assert backend.sent == [(1, [alone.index])] and len(idle.in_flight[0]) == 100


@pytest.mark.parametrize("together, overlaps", [(False, False), (True, False), (False, True)])
def test_a_death_holding_two_calls_charges_the_first_only_where_its_answer_cannot_be_lost(
        together, overlaps):
    """One workunit a call, two in flight: a process worker's answer to the first is sent before
    it starts the second, so its death charges the one running; a Ray actor's may be lost with
    it, and a worker that overlaps workunits (Ready.overlaps) may have died in the second, so
    both go back alone, charged nothing."""
    from helpers.engine.contract.messages import Died, Ready, WorkerInfo, Workunit

    backend = FakeBackend(answers_together=together)
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1)])
    scheduler.slots[0].ready = Ready(0, 1, 0.0, {}, overlaps=overlaps)
    scheduler.dispatch(Queued([scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"]))
                               for n in reversed(range(2))]))
    assert [len(units) for _, units in backend.sent] == [1, 1]
    scheduler.handle(0, Died(0, -11))
    unknown = together or overlaps
    assert [(u.attempts, u.alone) for u in scheduler.taker.waiting] == (
        [(0, True), (0, True)] if unknown else [(1, False), (0, False)])
    assert scheduler.recovery.failed_workunits == (0 if unknown else 1)


def test_an_overlapping_worker_s_death_suspects_the_two_workunits_it_had_started_only():
    """Two messages of two workunits in flight: the worker had started at most the first two,
    which go back alone, charged nothing; the others go back as they were."""
    from helpers.engine.contract.messages import Died, Ready, WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1)])
    scheduler.slots[0].ready = Ready(0, 1, 0.0, {}, overlaps=True)
    scheduler.new_job(2)
    scheduler.dispatch(Queued([scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"]))
                               for n in reversed(range(8))]))
    assert [len(units) for _, units in backend.sent] == [2, 2]
    scheduler.handle(0, Died(0, -11))
    assert [(int(u.ids[0]), u.attempts, u.alone) for u in scheduler.taker.waiting] == [
        (0, 0, True), (1, 0, True), (2, 0, False), (3, 0, False)]
    assert scheduler.recovery.failed_workunits == 0


def test_a_workunit_failing_on_a_worker_already_being_recycled_is_not_charged():
    """The workunit queued behind the one that triggers recycling can fail before the kill lands:
    it is requeued as it was, not retried, split or given up on (the CI flake of the test above)."""
    from helpers.engine.contract.messages import Failed, WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cuda:0", 1)], retries=0)
    slot = scheduler.slots[0]
    units = [scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"])) for n in range(3)]
    slot.in_flight.extend(units)

    def fail(unit):
        return scheduler.handle(0, Failed(0, "cuda:0", unit.index, "workunit", "RuntimeError",
                                          "CUDA error: device-side assert triggered", ""))

    assert fail(units[0]) == ([], [(0, "RuntimeError", "CUDA error: device-side assert triggered",
                                    pytest.approx(time.time(), abs=60))])
    assert fail(units[1]) == ([], []) and backend.killed == [0]  # second in a row: recycled
    assert fail(units[2]) == ([], []) and backend.killed == [0]  # behind it: not charged
    assert [(list(u.ids), u.attempts) for u in scheduler.taker.waiting] == [([2], 0), ([1], 0)]


def test_a_workunit_that_finishes_before_its_timeout_kill_lands_leaves_the_next_uncharged():
    """The kill is about the workunit that ran too long; if its result arrives first, the workunit
    behind it had only just started and goes back as it was."""
    from helpers.engine.contract.messages import Died, Result, WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cuda:0", 1)], retries=0,
                                workunit_timeout=0.001)
    slot = scheduler.slots[0]
    units = [scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"])) for n in range(2)]
    slot.in_flight.extend(units)
    scheduler.check_timeouts()
    assert backend.killed == [0] and scheduler.recovery.timeouts == 1
    results, _ = scheduler.handle(0, Result(0, units[0].index, units[0].ids, {}, [], 0.0, 0.0))
    assert len(results) == 1
    assert scheduler.handle(0, Died(0, -9)) == ([], [])
    assert [(list(u.ids), u.attempts) for u in scheduler.taker.waiting] == [([1], 0)]
    assert scheduler.recovery.failed_workunits == 0 and scheduler.recovery.restarts == 1


@pytest.mark.parametrize("lost", [False, True])
def test_a_worker_whose_machine_is_lost_leaves_its_workunits_uncharged(lost):
    """A Ray node lost takes its actors' workunits with it through no fault of theirs: each goes
    back as it was; any other death charges the one that was running."""
    from helpers.engine.contract.messages import Died, WorkerInfo, Workunit

    backend = FakeBackend()
    scheduler = ready_scheduler(backend, [WorkerInfo(0, "cpu", 1), WorkerInfo(1, "cpu", 1)],
                                retries=1)
    units = [scheduler.taker.number(Workunit(0, np.arange(n, n + 1), [f"r{n}"])) for n in range(2)]
    scheduler.slots[0].in_flight.extend(units)
    died = Died(0, None, "its Ray node was lost", lost) if lost else Died(0, -11)
    assert scheduler.handle(0, died) == ([], [])
    assert [u.attempts for u in scheduler.taker.waiting] == [0 if lost else 1, 0]
    assert scheduler.recovery.failed_workunits == (0 if lost else 1)
    assert scheduler.recovery.deaths == 1 and scheduler.recovery.restarts == 1


def after_the_start(monkeypatch, owner, name, failing, calls=3):
    """``owner.name`` as it is for its first ``calls`` calls (the start's check among them:
    helpers.engine.dispatch.probe), then ``failing(real, *args)``."""
    real, count = getattr(owner, name), iter(range(calls))

    def wrapped(*args, **kwargs):
        if next(count, None) is not None:
            return real(*args, **kwargs)
        return failing(real, *args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def test_a_worker_that_cannot_write_its_part_stops_the_run_naming_it(tmp_path, monkeypatch):
    """writes="workers": a disk that fills, or storage the worker loses, half-way is no record's
    fault: the run stops at once, naming the worker, its machine and the folder (no retry, no
    split)."""
    import errno

    from helpers.engine.outputs import checkpoint

    def full(real, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    after_the_start(monkeypatch, checkpoint, "write_worker_part", full)
    started = time.monotonic()
    with pytest.raises(PipelineError, match=r"worker \d on cpu failed in workunit .*"
                                            r"OutputUnwritable: worker \d on .* cannot write its "
                                            r"part in .*out\.h5\.parts: .*No space left"):
        run_pipeline(records(200), SyntheticWorkload(0.0), ["cpu"], 10, tmp_path / "out.h5",
                     "thread", progress=False, writes="workers")
    assert time.monotonic() - started < 10
    assert read_output(tmp_path / "out.h5")["ids"].tolist() == list(range(20))


@pytest.mark.parametrize("error, said", [
    (OSError(5, "Input/output error"), r"OSError: .*Input/output error"),
    (ValueError("Parquet magic bytes not found in footer"), r"ValueError: Parquet magic bytes"),
    (StopIteration(), r"StopIteration: "),  # (a row group shorter than its footer said)
], ids=["OSError", "ArrowInvalid", "StopIteration"])
def test_an_input_a_worker_loses_half_way_stops_the_run_and_files_no_record(tmp_path, monkeypatch,
                                                                             error, said):
    """Workers read the input themselves: whatever reading it raises is the input's fault (gone,
    cut short, changed), not the records' (a record it cannot decode is a BadRecord): no
    bisection down to an error row per record."""
    import h5py

    from helpers.engine.inputs.sources import HDF5Rows

    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("batches/0", data=np.array([f"r{i}".encode() for i in range(200)],
                                                    dtype=object), dtype=h5py.string_dtype())

    def gone(real, self, ids):
        raise error

    after_the_start(monkeypatch, HDF5Rows, "read", gone)
    with pytest.raises(PipelineError, match=r"worker \d on cpu failed in workunit .*"
                                            r"InputUnreadable: worker \d on .* cannot read the "
                                            r"input: " + said):
        run_pipeline(tmp_path / "in.h5", SyntheticWorkload(0.0), ["cpu"], 10, tmp_path / "out.h5",
                     "thread", progress=False, writes="workers")
    partial = read_output(tmp_path / "out.h5")
    assert partial["ids"].tolist() == list(range(20)) and not partial["errors"]


def test_a_part_the_driver_cannot_see_stops_the_run_saying_where_the_output_must_be(
        tmp_path, monkeypatch):
    """A worker whose storage went its own way half-way (the start's check passed) wrote a part
    on its machine's own disk: the driver says so at that part's commit, not at the end."""
    from helpers.engine.outputs import checkpoint

    def elsewhere(real, *args, **kwargs):
        part = real(*args, **kwargs)
        os.unlink(part.path)  # as if on another machine's disk
        return part

    after_the_start(monkeypatch, checkpoint, "write_worker_part", elsewhere)
    with pytest.raises(RuntimeError, match=r"worker \d on .* wrote a part this process cannot "
                                           r"see in .*out\.h5\.parts: .*storage every worker "
                                           r"and the driver share"):
        run_pipeline(records(200), SyntheticWorkload(0.0), ["cpu"], 10, tmp_path / "out.h5",
                     "thread", progress=False, writes="workers")
