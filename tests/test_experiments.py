"""The study's experiments on the synthetic workload: tables, timelines and the layouts' ranking."""
import pytest

from helpers.study import experiments
from helpers.workloads import make_workload

pytestmark = pytest.mark.timeout(180)  # reached only on deadlock

TEXTS = [f"text {i}" for i in range(500)]


def test_on_uneven_devices_the_queue_beats_static_rounds():
    devices, speeds = experiments.simulated_devices([1.0, 0.35, 0.35])
    assert devices == ["cuda:0", "cuda:1", "cuda:2"] and speeds["cuda:1"] == 0.35
    workload = make_workload("synthetic", seconds_per_record=0.008, speed=speeds)
    table, spans = experiments.compare_layouts(workload, devices, 150, 2, TEXTS, workunit_size=5,
                                         backend="thread")
    assert sorted(table["strategy"]) == ["queue", "queue", "static", "static"]
    assert (table["records"] == 150).all() and (table["spinup_s"] > 0).all()
    rate = table.groupby("strategy")["records_per_s"].mean()
    # ideal: static is held to 3 x 0.35 of a fast card's rate, the queue gets 1 + 0.35 + 0.35
    # (1.62x); the cost per record keeps the fixed cost of a job (opening, writing) small beside
    # that
    assert rate["queue"] > 1.25 * rate["static"]
    static = spans[(spans["strategy"] == "static") & (spans["replicate"] == 0)]
    assert sorted(static["worker"]) == [0, 1, 2] and (static["records"] == 50).all()
    queued = spans[(spans["strategy"] == "queue") & (spans["replicate"] == 0)]
    assert queued["records"].sum() == 150 and len(queued) == 30
    fast = queued[queued["worker"] == 0]["records"].sum()
    assert fast > 50  # the fast card took more than its static share


def test_static_rounds_follow_one_another_on_the_timeline():
    workload = make_workload("synthetic", seconds_per_record=0.001)
    rounds, spans = experiments.static_rounds(workload, ["cpu", "cpu"], 40, 3, TEXTS, backend="thread")
    assert rounds["round"].tolist() == [0, 1, 2] and (rounds["records"] == 40).all()
    assert len(spans) == 6 and (spans["records"] == 20).all()
    ends = spans.groupby("round")["round_end_s"].first().tolist()
    for number in (1, 2):
        assert (spans[spans["round"] == number]["start_s"] >= ends[number - 1]).all()
    assert ((0 < rounds["efficiency"]) & (rounds["efficiency"] <= 1)).all()


def test_workunit_sizes_one_row_per_size_and_replicate():
    workload = make_workload("synthetic", seconds_per_record=0.0)
    table = experiments.workunit_sizes(workload, ["cpu"], [1, 10, 100], 30, 2, TEXTS, backend="thread")
    assert sorted(zip(table["replicate"], table["workunit_size"])) == \
        [(r, s) for r in (0, 1) for s in (1, 10, 100)]
    assert (table["records"] == 30).all() and (table["wall_s"] > 0).all()


def test_samples_have_unique_ids_even_beyond_the_corpus():
    pairs = experiments.sample_records(TEXTS[:10], 25, seed=1)
    assert [i for i, _ in pairs] == list(range(25)) and {t for _, t in pairs} <= set(TEXTS[:10])
    assert experiments.sample_records(TEXTS, 5, seed=1) == experiments.sample_records(TEXTS, 5, seed=1)


def test_fair_workunit_size_gives_every_worker_eight_workunits():
    assert experiments.fair_workunit_size(100, 300, 2) == 18  # 300 / (8 x 2) = 18.75
    assert experiments.fair_workunit_size(10, 300, 2) == 10  # already small enough
    assert experiments.fair_workunit_size(100, 10, 4) == 1  # never below one record


def test_workers_per_device_gives_each_count_its_fair_workunit_size():
    workload = make_workload("synthetic", seconds_per_record=0.0)
    table = experiments.workers_per_device(workload, "cpu", [1, 2], 48, 1, TEXTS, workunit_size=100)
    sizes = table.groupby("workers")["workunit_size"].first().to_dict()
    assert sizes == {1: 6, 2: 3}  # 48 records: 8 workunits for 1 worker, 16 for 2
    assert (table["records"] == 48).all()


def test_a_timeline_row_carries_the_span_s_phases_and_padding():
    from helpers.engine.measure.stats import WorkunitSpan
    from helpers.study.experiments import span_row

    span = WorkunitSpan(0, "cpu", 3, 64, 1.0, 2.0, phases={"forward": 0.75},
                        counts={"tokens_computed": 130, "tokens_needed": 100})
    assert span_row(span) == {"worker": 0, "device": "cpu", "workunit": 3, "records": 64,
                              "start_s": 1.0, "end_s": 2.0, "forward_s": 0.75, "padding": 1.3}
    assert "padding" not in span_row(WorkunitSpan(0, "cpu", 3, 64, 1.0, 2.0))  # (nothing counted)
