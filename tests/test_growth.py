"""A self-tuning worker count (workers_per_device="auto") on the synthetic device model: growth
stops where the device saturates (the worker that did not help is retired), where its memory
runs out, and where a copy fails to load; each decision is in the stats and the log, and every
record is written once."""
import logging

import pytest

from helpers import SyntheticWorkload, WorkerPool, read_output
from helpers.engine.dispatch.growth import GROWTH_MARGIN

pytestmark = pytest.mark.timeout(180)  # reached only on deadlock


def records(n):
    return [(i, f"r{i}") for i in range(n)]


def run(workload, devices, n, path, **options):
    with WorkerPool(workload, devices, workers_per_device="auto", progress=False,
                    **options) as pool:
        stats = pool.run(records(n), path, workunit_size="auto", workunit_seconds=0.25)
        assert read_output(path)["ids"].tolist() == list(range(n))
        return pool, stats


@pytest.mark.slow
def test_growth_stops_where_the_device_saturates(tmp_path, caplog):
    # two workunits at a time on cuda:0: a second worker doubles its rate, a third adds nothing
    workload = SyntheticWorkload(0.0005, seconds_per_workunit=0.005, parallelism=2, values="zeros")
    with caplog.at_level(logging.INFO, logger="gpufeed"):
        pool, stats = run(workload, ["cuda:0"], 30000, tmp_path / "out.h5")
    actions = [(d["action"], d["workers"]) for d in stats.decisions]
    assert actions == [("add", 2), ("add", 3), ("retire", 2)]
    assert pool.stable_workers == {"cuda:0": 2}
    retire = stats.decisions[-1]
    assert retire["rate_after"] < (1 + GROWTH_MARGIN) * retire["rate_before"]
    assert stats.decisions[1]["rate_after"] > 1.6 * stats.decisions[1]["rate_before"]
    assert "growth: cuda:0 retire -> 2 workers" in caplog.text
    assert {w.worker for w in stats.workers} == {0, 1, 2} and stats.devices == ("cuda:0",) * 3


def test_growth_stops_where_the_memory_runs_out(tmp_path):
    # 250 MiB, 100 MiB copies: with two loaded, 50 MiB are left, less than another copy needs
    workload = SyntheticWorkload(0.0005, seconds_per_workunit=0.005, parallelism=8,
                                 device_memory_mib={"cuda:0": 250}, model_mib=100, values="zeros")
    pool, stats = run(workload, ["cuda:0"], 12000, tmp_path / "out.h5")
    assert [(d["action"], d["workers"]) for d in stats.decisions] == [("add", 2), ("stop", 2)]
    assert "50 MiB free" in stats.decisions[-1]["reason"]
    assert pool.stable_workers == {"cuda:0": 2}


def test_a_copy_that_fails_to_load_ends_growth_and_the_run_goes_on(tmp_path, monkeypatch):
    import helpers.engine.dispatch.growth

    # try until one fails
    monkeypatch.setattr(helpers.engine.dispatch.growth, "MEMORY_HEADROOM", 0.0)
    workload = SyntheticWorkload(0.0005, seconds_per_workunit=0.005, parallelism=8,
                                 device_memory_mib={"cuda:0": 250}, model_mib=100, values="zeros")
    pool, stats = run(workload, ["cuda:0"], 16000, tmp_path / "out.h5")
    assert [(d["action"], d["workers"]) for d in stats.decisions] == \
        [("add", 2), ("add", 3), ("stop", 2)]
    assert stats.decisions[-1]["reason"] == "worker 3 failed to load"
    assert pool.stable_workers == {"cuda:0": 2} and stats.recovery["deaths"] == 0


@pytest.mark.slow
def test_devices_grow_independently_and_the_next_job_keeps_the_count(tmp_path):
    workload = SyntheticWorkload(0.0005, speed={"cuda:1": 0.5}, seconds_per_workunit=0.005,
                                 parallelism={"cuda:0": 2, "cuda:1": 1}, values="zeros")
    with WorkerPool(workload, ["cuda:0", "cuda:1"], workers_per_device="auto",
                    progress=False) as pool:
        first = pool.run(records(30000), tmp_path / "a.h5", workunit_size="auto",
                         workunit_seconds=0.25)
        second = pool.run(records(2000), tmp_path / "b.h5", workunit_size="auto",
                          workunit_seconds=0.25)
    final = {d["device"]: d["workers"] for d in first.decisions if d["action"] != "add"}
    assert final == {"cuda:0": 2, "cuda:1": 1}
    assert second.decisions == () and sorted(w.device for w in second.workers) == \
        ["cuda:0", "cuda:0", "cuda:1"]
    assert read_output(tmp_path / "b.h5")["ids"].tolist() == list(range(2000))


def test_only_the_workers_of_devices_still_deciding_get_short_workunits():
    from helpers.engine.contract.messages import WorkerInfo
    from helpers.engine.dispatch.growth import Growth
    from helpers.engine.measure.sizing import Sizing

    growth = Growth([WorkerInfo(0, "cuda:0", 1), WorkerInfo(1, "cuda:1", 1)], 4,
                    lambda index, device, copy: WorkerInfo.on(index, device, 1, copy))
    assert growth.deciding() == {0, 1}
    growth.devices["cuda:0"].done = True  # cuda:0's count decided
    assert growth.deciding() == {1}
    sizing = Sizing(seconds=1.0)
    sizing.explore(growth.deciding(), 0.25)
    for slot in (0, 1):
        sizing.observe(slot, 100, 0.1)  # both run 1,000 records/s
    assert (sizing.size(0), sizing.size(1)) == (400, 250)  # 400: at most 4x per result
    growth.hold(1.0)
    assert growth.deciding() == set()


def test_a_device_rate_counts_whole_workunits_whatever_the_workers_phases():
    from helpers.engine.dispatch.growth import _Device

    # two workers, 100 records a second each: one in 1 s workunits, one in 0.4 s workunits from
    # 0.9 s; each workunit's records spread from the end before it to its own
    device = _Device("cuda:0", [0, 1])
    device.units[0] = [(i - 1, i, 100) for i in range(1, 5)]
    device.units[1] = [(0.9 + 0.4 * (i - 1), 0.9 + 0.4 * i, 40) for i in range(1, 9)]
    assert device.measured() == pytest.approx(200.0)
    device.units[1] = device.units[1][:3]
    assert device.measured() is None  # the second has run three of the four workunits
    device.units[1] = [(3.0 + 0.4 * (i - 1), 3.0 + 0.4 * i, 40) for i in range(1, 5)]
    assert device.measured() is None  # it began late: 0.6 s in common of a 3 s measurement
    # two workers taking turns on one device, unevenly: 100 records in 1 s, whoever holds it
    # two workers taking turns on one device unevenly (0, 0, 1, 0, 1, 1, 0, 1), 100 records in
    # 1 s whoever holds it
    device.units = {0: [(0, 1, 100), (1, 2, 100), (2, 4, 100), (4, 7, 100)],
                    1: [(2, 3, 100), (3, 5, 100), (5, 6, 100), (7, 8, 100)]}
    assert device.measured() == pytest.approx(100.0)  # each worker in its own window: 110
