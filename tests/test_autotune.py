"""Notebook 7's experiments (helpers.study.autotune): the sweep against the self-tuning run, the
simulated cards' use, configurations side by side, and their findings and figure lanes."""
import pandas as pd
import pytest

from helpers.engine.contract.settings import AUTO
from helpers.study import autotune, findings, plots
from helpers.workloads.synthetic import SyntheticWorkload

pytestmark = pytest.mark.timeout(180)  # reached only on deadlock

CARDS = {"cuda:0": 1.0, "cuda:1": 0.5}


def cards(**options):
    return SyntheticWorkload(0.001, speed=CARDS, values="zeros", **options)


def test_configurations_are_the_sweep_then_self_tuning():
    assert autotune.configurations([1, 2], [10, 50]) == \
        [(1, 10), (1, 50), (2, 10), (2, 50), (AUTO, AUTO)]


def test_the_ideal_counts_each_card_s_parallelism_and_speed():
    # cuda:0: 2 x 1000 records/s, cuda:1: 2 x 500 -> 3000 records/s
    assert autotune.ideal_seconds(cards(parallelism=2), list(CARDS), 6000) == pytest.approx(2.0)
    assert autotune.ideal_seconds(cards(), list(CARDS), 1500) == pytest.approx(1.0)


def test_busy_share_is_workunits_at_work_over_parallelism():
    spans = pd.DataFrame({"device": ["cuda:0"] * 3, "worker": [0, 1, 2],
                          "start_s": [0.0, 0.0, 0.0], "end_s": [1.0, 2.0, 3.0]})
    share = autotune.busy_share(spans, parallelism=2, step=0.5).set_index("seconds")["utilization"]
    assert share[0.5] == 100.0  # three at work, two at a time
    assert share[1.5] == 100.0 and share[2.5] == 50.0 and share[3.0] == 0.0


def test_sweep_runs_every_configuration_on_the_same_records_and_keeps_the_self_tuning_detail():
    runs = autotune.sweep(cards(parallelism=1), list(CARDS), [(1, 20), (AUTO, AUTO)], 600, 1)
    table = runs.table.set_index("layout")
    assert sorted(table.index) == ["fixed", "self-tuning"]
    assert (table["records"] == 600).all() and (table["makespan_vs_ideal"] > 1.0).all()
    assert table.loc["fixed", "configuration"] == "1 per device, workunits of 20"
    assert table.loc["fixed", "final_workers"] == "cuda:0=1,cuda:1=1"
    assert runs.timeline["records"].sum() == 600  # the self-tuning run's workunits
    assert set(runs.timeline["device"]) == set(CARDS)


def test_side_by_side_alternates_configurations_on_loaded_pools():
    fast, slow = SyntheticWorkload(0.0005), SyntheticWorkload(0.002)
    table, first = autotune.side_by_side({"fast": (fast, ["cpu"], 10, 1),
                                          "slow": (slow, ["cpu"], 10, None)},
                                         records=40, replicates=2,
                                         texts=[f"t{i}" for i in range(50)], backend="thread")
    assert table["configuration"].tolist() == ["fast", "slow", "slow", "fast"]  # order turns
    assert (table["records"] == 40).all() and set(first) == {"fast", "slow"}
    assert table.groupby("configuration")["threads_per_worker"].first()["fast"] == 1
    rates = table.groupby("configuration")["records_per_s"].mean()
    assert rates["fast"] > rates["slow"]
    assert "median ratio" in findings.tuned_against(table, "fast", "slow", 12.0)


def test_self_tuning_finding_compares_with_the_best_fixed_configuration():
    runs = pd.DataFrame({
        "job": ["sweep"] * 3, "layout": ["fixed", "fixed", "self-tuning"],
        "workers_per_device": ["1", "2", "auto"], "workunit_size": ["10", "10", "auto"],
        "records_per_s": [50.0, 100.0, 90.0], "records": [1000] * 3, "ideal_s": [8.0] * 3,
        "makespan_vs_ideal": [2.5, 1.25, 1.39], "finish_spread_s": [0.1, 0.1, 0.05],
        "final_workers": ["", "", "cuda:0=2"]})
    text = findings.self_tuning(runs)
    assert "0.90× the best fixed configuration (2 per device, workunits of 10)" in text
    assert "makespan 1.39× the ideal" in text and "ending with cuda:0=2" in text


def test_the_timeline_draws_a_lane_per_view_asked_for():
    spans = pd.DataFrame({"worker": [0, 1, 2], "device": ["cuda:0", "cuda:1", "cuda:0"],
                          "records": [10, 5, 20], "start_s": [0.0, 0.0, 1.0],
                          "end_s": [1.0, 2.0, 2.0]})
    decisions = pd.DataFrame({"seconds": [0.8], "device": ["cuda:0"], "workers": [2]})
    fig = plots.timeline(spans, "t", sizes=True, decisions=decisions,
                         telemetry=autotune.busy_share(spans, 1))
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes[1:]] == \
        ["workunit", "workers", "card busy [%]"]
    assert len(plots.timeline(spans, "t").axes) == 1  # no lanes unless asked
    simulated = plots.timeline(spans, "the self-tuning run", simulated=True)
    assert simulated._suptitle.get_text() == "Simulated cards: the self-tuning run"
    assert [t.get_text() for t in simulated.axes[0].get_yticklabels()] == [
        f"worker {w} · {d} (simulated)" for w, d in ((0, "cuda:0"), (1, "cuda:1"), (2, "cuda:0"))]


@pytest.mark.parametrize("configs", [["a", "b"], ["a", "b", "c"]])
def test_interleaved_puts_each_configuration_in_every_place_and_after_every_other(configs):
    from helpers.study.autotune import interleaved

    orders = [interleaved(configs, r) for r in range(2 * len(configs))]
    assert all(sorted(order) == configs for order in orders)
    for config in configs:  # every place, equally often
        assert sorted(order.index(config) for order in orders) == \
            sorted(list(range(len(configs))) * 2)
    follows = {(order[i], order[i + 1]) for order in orders for i in range(len(configs) - 1)}
    assert len(follows) == len(configs) * (len(configs) - 1)  # every pair, both ways


def test_the_trials_table_names_each_variant_its_guard_and_a_refusal():
    """Phase 0's rows (helpers.tuner): labelled with their variant, the guard's least cosine
    from what the workers reported, a refused one said so; the finding names the pick's variant
    and how many were refused."""
    import json

    from helpers.study import findings
    from helpers.study.autotune import trials_table

    loaded = json.dumps({"cpu": {"precision": "bf16", "runtime": "torch",
                                 "guard_mean_cosine": 0.99999, "guard_min_cosine": 0.9999}})
    rows = [{"trial": 0, "phase": "variant", "variant": '{"precision": "fp32", "runtime": "torch"}',
             "batch_size": None, "workers_per_device": "cpu=1", "workunit_size": "auto",
             "records_per_s": 100.0, "loaded": "{}", "refused": ""},
            {"trial": 1, "phase": "variant",
             "variant": '{"compile": true, "precision": "bf16", "runtime": "torch"}',
             "batch_size": None, "workers_per_device": "cpu=2", "devices": "cpu,cpu",
             "workunit_size": "auto",
             "records_per_s": 280.0, "loaded": loaded, "refused": ""},
            {"trial": 2, "phase": "variant",
             "variant": '{"precision": "fp32", "runtime": "onnx-int8"}', "records_per_s": 0.0,
             "refused": "worker 0 on cpu failed in loading the model: QualityRefused: ..."}]
    table = trials_table(rows, picked=1)
    assert table["configuration"].tolist() == [
        "0: fp32 torch, cpu=1, workunits of auto",
        "1: bf16 torch compiled, 2 workers on cpu, workunits of auto (picked)",
        "2: fp32 onnx-int8, refused by the quality guard"]
    assert table["guard_min_cosine"].isna().tolist() == [True, False, True]
    assert table["guard_min_cosine"][1] == 0.9999
    finding = findings.trials(table)
    assert finding.startswith("3 trials (1 variant refused by the quality guard); picked: "
                              "bf16 torch compiled, 2 workers on cpu, workunits of auto at "
                              "280.0 records/s")
    assert "card" not in finding
    on_a_card = table.assign(card_busy_share=[0.2, 0.25, 0.3])
    assert findings.trials(on_a_card).endswith(
        "; the simulated card 25% busy there (the busiest trial 30%)")


def test_trials_that_differ_only_in_threads_per_worker_are_labelled_apart():
    """The tuner's last round runs the grown workers again sharing the cores: at 148 and 265
    records/s two trials read alike ("2 workers on cpu, workunits of auto") in the figure."""
    from helpers.study.autotune import trials_table

    rows = [{"trial": t, "phase": "workunit size", "batch_size": 64, "devices": "cpu,cpu",
             "workers_per_device": "cpu=2", "threads_per_worker": n, "workunit_size": "auto",
             "records_per_s": rate, "variant": "", "loaded": "{}", "refused": ""}
            for t, n, rate in [(0, 1, 148.0), (1, 2, 265.0)]]
    assert trials_table(rows, picked=1)["configuration"].tolist() == [
        "0: batch 64, 2 workers on cpu, 1 thread each, workunits of auto",
        "1: batch 64, 2 workers on cpu, 2 threads each, workunits of auto (picked)"]
    same = trials_table([{**rows[0], "threads_per_worker": 2}, rows[1]], picked=1)
    assert same["configuration"][0] == "0: batch 64, 2 workers on cpu, workunits of auto"


def test_the_workload_as_given_is_named_among_variants_tried():
    """A simulated card's phase 0 tries the workload as given (its default tokenizing) beside
    named threads: its rows read 'the workload as given', not nothing (notebook 07's figure
    showed '0: batch 128, ...' with no word of how it tokenized); where no variant was tried,
    rows name none."""
    from helpers.study.autotune import trials_table

    rows = [{"trial": t, "phase": "variant", "batch_size": 128, "devices": "cuda:0",
             "workers_per_device": "cuda:0=1", "workunit_size": "auto", "records_per_s": 1.0,
             "variant": v, "loaded": "{}", "refused": ""}
            for t, v in [(0, "{}"), (1, '{"tokenize_threads": 1}')]]
    assert trials_table(rows, picked=0)["configuration"].tolist() == [
        "0: the workload as given, batch 128, 1 worker on cuda:0, workunits of auto (picked)",
        "1: tokenize_threads=1, batch 128, 1 worker on cuda:0, workunits of auto"]
    alone = trials_table(rows[:1], picked=0)["configuration"][0]
    assert alone == "0: batch 128, 1 worker on cuda:0, workunits of auto (picked)"
