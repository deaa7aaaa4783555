"""Per-worker workunit sizes (workunit_size="auto"): from measured rates, converging where a fixed
cost per workunit makes the rate depend on the size, cut finer at the end of a job; and in a run,
larger for faster devices, with every record written once."""
import math

import pytest

from helpers import SyntheticWorkload, read_output, run_pipeline
from helpers.engine.measure.sizing import (FIRST_SIZE, FIXED_SAMPLES, FIXED_SHARE, GROWTH,
                                           MIN_SECONDS, TAIL_SHARE, Sizing)

pytestmark = pytest.mark.timeout(120)  # reached only on deadlock


def test_a_worker_starts_at_the_first_size_and_grows_at_most_by_the_growth_factor():
    sizing = Sizing(seconds=1.0)
    assert sizing.size(0) == FIRST_SIZE
    sizing.observe(0, FIRST_SIZE, 0.001)  # a very fast first measurement
    assert sizing.size(0) == GROWTH * FIRST_SIZE


def test_a_workload_that_costs_nothing_stops_at_the_largest_size():
    """A rate without bound (a model that costs nothing inside process) grew workunits to
    millions of records, GBs of results in the driver; MAX_SIZE stops them."""
    from helpers.engine.measure.sizing import MAX_SIZE

    sizing = Sizing(seconds=1.0)
    records = FIRST_SIZE
    for _ in range(20):
        sizing.observe(0, records, 1e-6)
        records = sizing.size(0)
    assert records == MAX_SIZE and sizing.largest() == MAX_SIZE


def test_sizes_follow_each_workers_rate():
    sizing = Sizing(seconds=0.5)
    for _ in range(20):
        sizing.observe(0, sizing.size(0), sizing.size(0) / 1000)  # 1000 records/s
        sizing.observe(1, sizing.size(1), sizing.size(1) / 350)  # 350 records/s
    assert sizing.size(0) == pytest.approx(500, rel=0.01)
    assert sizing.size(1) == pytest.approx(175, rel=0.01)
    assert sizing.largest() == sizing.size(0)


def test_with_a_fixed_cost_per_workunit_the_size_converges_to_the_set_seconds():
    fixed, per_record, seconds = 0.05, 0.001, 1.0
    sizing = Sizing(seconds)
    for _ in range(30):
        n = sizing.size(0)
        sizing.observe(0, n, fixed + n * per_record)
    assert fixed + sizing.size(0) * per_record == pytest.approx(seconds, rel=0.02)


def test_a_fixed_cost_above_the_set_seconds_does_not_shrink_workunits_to_one_record():
    fixed, per_record, seconds = 0.4, 0.02, 0.25  # a workunit can never take only 0.25 s
    sizing = Sizing(seconds)
    for _ in range(30):
        n = sizing.size(0)
        sizing.observe(0, n, fixed + n * per_record)
    assert sizing.fixed[0] == pytest.approx(fixed, rel=0.01)
    # the fixed cost a fifth of the workunit: (0.4 / 0.2 - 0.4) / 0.02 = 80 records
    assert sizing.size(0) == pytest.approx((fixed / FIXED_SHARE - fixed) / per_record, rel=0.02)
    # the tail cuts no workunit below the work of its fixed cost: 0.4 / 0.02 = 20 records
    assert sizing.size(0, remaining=5, slots=[0]) == pytest.approx(fixed / per_record, rel=0.05)


def _card_with_a_wait(sizing: Sizing, fixed: float, per_record: float, wait: float) -> None:
    """A worker growing its workunits on a card (as the first lent H200 measured): each takes
    ``fixed`` plus ``per_record`` each, and the first of 800 records or more waits ``wait``
    more (its pair's line then runs below zero)."""
    waited = False
    for _ in range(12):
        n = sizing.size(0)
        late = n >= 800 and not waited
        waited |= late
        sizing.observe(0, n, fixed + n * per_record + (wait if late else 0.0))
    assert waited  # (the wait happened while the fixed cost was being measured)


def test_a_wait_inside_one_workunit_does_not_erase_the_fixed_cost():
    fixed, per_record = 0.07, 0.00025
    sizing = Sizing(seconds=1.0)
    _card_with_a_wait(sizing, fixed, per_record, wait=0.6)
    assert sizing.fixed[0] == pytest.approx(fixed, rel=0.05)  # (the smallest estimate: 0)
    assert sizing.size(0) == pytest.approx((1.0 - fixed) / per_record, rel=0.05)


def test_the_tail_on_a_card_is_never_cut_below_the_work_of_its_fixed_cost():
    fixed, per_record = 0.07, 0.00025
    sizing = Sizing(seconds=1.0)
    _card_with_a_wait(sizing, fixed, per_record, wait=0.6)
    left, sizes = 2000, []
    while left:
        n = min(sizing.size(0, left, [0]), left)
        sizing.observe(0, n, fixed + n * per_record)
        sizes.append(n)
        left -= n
    assert min(sizes[:-1]) >= 0.9 * fixed / per_record  # 280 records: half of each is fixed cost
    assert len(sizes) <= 5  # the card measured 320 workunits for such a tail


def test_the_fixed_cost_is_the_median_of_its_latest_estimates():
    sizing = Sizing(seconds=1.0)
    for k in range(FIXED_SAMPLES + 4):  # 100 then 200 records, slower each time: each pair's
        sizing.observe(0, 100, 0.1 + 0.01 * k)  # estimate is larger than the last
        sizing.observe(0, 200, 0.2 + 0.01 * k)
    latest = sizing._fixes[0]
    assert len(latest) == FIXED_SAMPLES
    assert sizing.fixed[0] == pytest.approx(sorted(latest)[FIXED_SAMPLES // 2])
    sizing.forget(0)
    assert 0 not in sizing.fixed and 0 not in sizing._fixes


def test_the_tail_is_cut_by_speed_and_never_below_the_minimum():
    sizing = Sizing(seconds=1.0)
    for _ in range(10):
        sizing.observe(0, sizing.size(0), sizing.size(0) / 1000)
        sizing.observe(1, sizing.size(1), sizing.size(1) / 250)
    assert sizing.size(0, None, [0, 1]) == sizing.size(0)  # the end is not known yet: full size
    remaining = 1000  # fair parts: 800 and 200 records
    assert sizing.size(0, remaining, [0, 1]) == math.ceil(TAIL_SHARE * 800)
    assert sizing.size(1, remaining, [0, 1]) == math.ceil(TAIL_SHARE * 200)
    assert sizing.size(1, 3, [0, 1]) == math.ceil(250 * MIN_SECONDS)
    sizing.forget(1)  # retired: the tail is no longer shared with it
    assert sizing.size(0, remaining, [0]) == math.ceil(TAIL_SHARE * 1000)


def test_in_a_run_faster_devices_get_larger_workunits_and_every_record_lands_once(tmp_path):
    workload = SyntheticWorkload(0.0005, speed={"cuda:1": 0.25}, seconds_per_workunit=0.002)
    n = 6000
    stats = run_pipeline([(i, f"r{i}") for i in range(n)], workload, ["cuda:0", "cuda:1"],
                         workunit_size="auto", output=tmp_path / "out.h5", progress=False,
                         workunit_seconds=0.2)
    assert read_output(tmp_path / "out.h5")["ids"].tolist() == list(range(n))
    assert stats.workunit_size == "auto"
    sizes = {d: sorted(s.records for s in stats.timeline if s.device == d)
             for d in ("cuda:0", "cuda:1")}
    fast, slow = (sizes[d][len(sizes[d]) // 2:] for d in ("cuda:0", "cuda:1"))  # upper halves
    assert min(fast) > FIRST_SIZE and max(fast) > 2.5 * max(slow)
    assert max(fast) <= 0.2 / 0.0005 * 1.1  # about workunit_seconds of work, no more


def test_auto_sizes_keep_the_out_of_memory_cap(tmp_path):
    workload = SyntheticWorkload(0.0001, oom_above=40)
    stats = run_pipeline([(i, f"r{i}") for i in range(3000)], workload, ["cpu"],
                         workunit_size="auto", output=tmp_path / "out.h5", progress=False,
                         workunit_seconds=0.1)
    assert read_output(tmp_path / "out.h5")["ids"].tolist() == list(range(3000))
    assert stats.recovery["oom_backoffs"] >= 1
    later = [s.records for s in stats.timeline][-10:]
    assert max(later) <= 40
