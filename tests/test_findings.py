"""Findings are computed from the tables: check them on hand-made numbers."""
import pandas as pd
import pytest

from helpers.study import findings


def workers_table():
    rows = []
    for strategy, rates in (("queue", {1: [10, 12], 2: [20, 22], 4: [18, 18]}),
                            ("static", {1: [9, 9], 2: [15, 17], 4: [12, 14]})):
        for workers, values in rates.items():
            rows += [{"strategy": strategy, "workers": workers, "replicate": r,
                      "records_per_s": v, "devices": ",".join(["cpu"] * workers)}
                     for r, v in enumerate(values)]
    return pd.DataFrame(rows)


def test_mean_sd_orders_best_first():
    stats = findings.mean_sd(workers_table(), ["strategy", "workers"])
    assert stats.iloc[0][["strategy", "workers", "mean", "count"]].tolist() == ["queue", 2, 21, 2]
    assert stats.iloc[0]["std"] == pytest.approx(1.4142, abs=1e-3)


def test_workers_finding_names_the_best_count_its_gain_and_the_days():
    text = findings.workers_per_device(workers_table(), 21 * 86_400)
    assert "queue-fed: 2 workers best at 21.0 ± 1.4 records/s (1: 0.52×, 4: 0.86×)" in text
    assert "static split: 2 workers best at 16.0 ± 1.4 records/s (1: 0.56×, 4: 0.81×)" in text
    assert "1.0 days at the best rate" in text


def test_workers_finding_names_the_workunit_sizes_and_warns_of_too_few():
    table = workers_table().assign(records=80, workunit_size=lambda t: 80 // (8 * t["workers"]))
    text = findings.workers_per_device(table, 86_400)
    assert "queue-fed workunits of 10, 5, 2 records for 1, 2, 4 workers" in text
    assert "fewer than" not in text  # 80 / 2 / 4 = 10 workunits each
    few = table.assign(workunit_size=20)
    assert findings.few_workunits(few) == ("; fewer than 8 workunits per worker, so the job's end "
                                           "weighs on the rate: 1 worker × 20 records: 4.0, "
                                           "2 workers × 20 records: 2.0, 4 workers × 20 records: 1.0")


def test_few_workunits_ignores_static_rows_and_tables_without_sizes():
    table = pd.DataFrame({"strategy": ["static", "queue"], "records": [100, 100],
                          "workunit_size": [50, 5], "workers": [2, 2]})
    assert findings.few_workunits(table) == ""  # the static row's "2 workunits" is not one
    assert findings.few_workunits(table.drop(columns="workunit_size")) == ""


def test_days():
    assert findings.days(86_400 * 10, 5.0) == pytest.approx(2.0)
    assert findings.days(10, 0.0) == float("inf")


def test_layouts_and_backends_compare_the_right_rows():
    layouts = pd.DataFrame({"strategy": ["queue", "static"] * 2, "records_per_s": [17, 10, 17, 10],
                            "efficiency": [0.95, 0.6, 0.95, 0.6]})
    assert "queue-fed 17.0 records/s vs static split 10.0 (1.70×); workers busy 95% vs 60%" in \
        findings.layouts(layouts, "sim")
    backends = pd.DataFrame({"backend": ["thread", "process"] * 2, "workers": [1, 1, 2, 2],
                             "records_per_s": [10, 10, 12, 18], "peak_rss_mib": [500, 500, 520, 900]})
    text = findings.backends(backends)
    assert text.startswith("at 2 workers: processes reach 18.0 records/s at 900 MiB")
    assert "(1.50× the throughput for 1.73× the memory)" in text


def test_best_configurations_per_experiment_and_device_set():
    best = findings.best_configurations({"workers": workers_table()}, 86_400)
    assert len(best) == 3  # one per device set: cpu, cpu,cpu, cpu x4
    top = best.iloc[0]
    assert (top["devices"], top["configuration"], top["records_per_s"]) == \
        ("cpu,cpu", "strategy=queue, workers=2", 21)
    assert top["estimated_days"] == pytest.approx(1 / 21)


def test_workunit_size_finding_ranks_sizes():
    table = pd.DataFrame({"workunit_size": [1, 1, 10, 10, 100, 100], "devices": ["cpu"] * 6,
                          "records_per_s": [5, 5, 20, 20, 10, 10]})
    assert findings.workunit_sizes(table) == \
        "on cpu: workunit size 10 best at 20.0 ± 0.0 records/s (1: 0.25×, 100: 0.50×)"


def side_by_side_table():
    return pd.DataFrame([
        {"backend": b, "replicate": r, "records_per_s": v, "spinup_s": s, "cluster_start_s": c}
        for r, (p, q) in enumerate([(40.0, 38.0), (42.0, 42.0), (41.0, 37.0)])
        for b, v, s, c in (("process", p, 6.0, 0.0), ("ray", q, 7.5, 12.0))])


def test_scale_out_finding_gives_ray_s_median_ratio_and_both_spin_ups():
    text = findings.scale_out(side_by_side_table())
    # ratios per replicate 0.95, 1.0, 0.902: the median is 0.95
    assert "ray at 0.95× the process backend (median ratio over 3 interleaved replicates)" in text
    assert "spin-up: ray 19.5 s (Ray's own start 12.0 s, then its actors 7.5 s), process 6.0 s" \
        in text


def test_a_finding_of_one_run_each_does_not_call_it_a_median():
    """One replicate (make run's notebooks 8 and 9 here): said as one run each; runs here move
    10-20 %, and a single ratio is no median."""
    one = side_by_side_table().query("replicate == 0")
    text = findings.scale_out(one)
    assert "ray at 0.95× the process backend (ratio of one run each, no median)" in text
    table = pd.DataFrame([{"backend": b, "replicate": 0, "rows_per_s": v, "dim": 384}
                          for b, v in (("process", 100_000), ("writer alone", 150_000))])
    assert "(one run each, no median)" in findings.driver_limit(table)


def test_driver_limit_finding_ranks_the_backends_and_gives_the_writer_alone():
    table = pd.DataFrame([{"backend": b, "replicate": r, "rows_per_s": v * (1 + r / 10), "dim": 384}
                          for r in range(3) for b, v in (("process", 100_000), ("ray", 80_000),
                                                         ("writer alone", 150_000))])
    assert findings.driver_limit(table) == (
        "the driver's writer takes from process workers 110,000, from ray workers 88,000 rows/s "
        "of 384-d float32 (medians of 3); the writer alone 165,000")


def test_cluster_finding_says_what_a_lost_node_cost():
    table = pd.DataFrame([
        {"job": "whole", "nodes": 2, "records_per_s": 50.0, "lost_at_s": float("nan"),
         "deaths": 0, "exactly_once": True},
        {"job": "a node lost", "nodes": 2, "records_per_s": 30.0, "lost_at_s": 2.0, "deaths": 1,
         "exactly_once": True}])
    assert findings.simulated_cluster(table, 1) == (
        "2 simulated nodes × 1 actor: 50.0 records/s; with the last node lost at 2 s: 30.0 "
        "records/s (0.60× whole: the simulated nodes share this machine's cores), 1 actor died "
        "and its workunits were redone on the others; every id once: True")


def test_the_binning_finding_gives_each_worker_count_its_speed_up_over_one():
    from helpers.study.binning import speedup

    table = pd.DataFrame({"workers": [1, 1, 2, 2, 1, 2], "replicate": [0, 1, 0, 1, 0, 0],
                          "strategy": ["queue", "queue", "queue", "queue", "static", "static"],
                          "records_per_s": [1.0, 1.2, 2.0, 2.2, 1.0, 1.5], "device": "cpu",
                          "workunit_size": 4})
    table = table.assign(speedup=speedup(table))
    assert table["speedup"].round(3).tolist() == [0.909, 1.091, 1.818, 2.0, 1.0, 1.5]
    assert findings.binning_layouts(table).startswith(
        "on cpu: 1 worker: queue-fed 1.10 images/s vs static 1.00 (1.10×); 2 workers: queue-fed "
        "2.10 images/s, 1.91× 1 worker vs static 1.50 (1.40×)")


def test_a_single_run_is_said_without_a_spread():
    """Issue 44: figures/README.md printed "± 0.0" for results of one run each."""
    table = pd.DataFrame({"workunit_size": [1, 10, 100], "devices": ["cpu"] * 3,
                          "records_per_s": [5, 20, 10]})
    assert findings.workunit_sizes(table) == \
        "on cpu: workunit size 10 best at 20.0 records/s (one run) (1: 0.25×, 100: 0.50×)"


def test_card_feeding_names_the_busiest_layout_and_the_cores_one_card_needs():
    rows = [{"workers": w, "tokenizing": f"{t} thread{'s' * (t > 1)}", "replicate": r,
             "card_busy_share": busy + r / 100,
             "cpu_s_per_m_tokens": cpu, "card": "simulated h100", "cores": 2, "card_cores": 16,
             "card_tokens_per_s": 17.5e6, "workunit_size": 256, "backend": "process"}
            for w, t, busy, cpu in ((1, 1, 0.20, 3.0), (2, 1, 0.30, 4.0), (1, 2, 0.25, 3.5))
            for r in (0, 1)]
    said = findings.card_feeding(pd.DataFrame(rows))
    assert said.startswith("the simulated h100, scaled to 2 of 16 cores was busiest at 30% ± 1% "
                           "with 2 workers × 1 thread tokenizing")
    assert "1×2 threads: 26%, 1×1 thread: 20%" in said and "the card waits for its CPU" in said
    assert "one real card needs 52 of these cores" in said  # 3.0 CPU s / M tokens × 17.5 M/s
    fed = pd.DataFrame(rows).assign(card_busy_share=0.9)
    assert "the card is fed" in findings.card_feeding(fed)


def test_card_busy_says_what_every_core_here_could_do_and_reads_an_unscaled_card():
    rows = pd.DataFrame([{"workunit_size": size, "card_busy_share": busy, "card_busy_limit": limit,
                          "card": "simulated h100", "cores": 2, "card_cores": None}
                         for size, busy, limit in ((64, 0.2, 0.3), (256, 0.25, 0.3))])
    said = findings.card_busy(rows, ["workunit_size"])
    assert said.startswith("the simulated h100 was busiest at 25% with 256 record workunits "
                           "(workunit size: 64: 20%)")
    assert said.endswith("(every core here would keep it 30% busy at these runs' CPU per token)")
    assert "could feed 2.5 such cards" in findings.card_busy(
        rows.assign(card_busy_limit=2.5), ["workunit_size"])


def test_card_feeding_names_a_layout_that_tokenized_in_processes_as_such():
    """A default layout beside a card tokenizes in processes (tokenize_threads 1): its runs
    are named by their processes, not as one tokenizing thread (notebook 03's legend said
    '1 tokenizing thread' for a worker with a tokenizing process)."""
    from helpers.study.feeding import tokenizing

    table = pd.DataFrame([{"workers": w, "tokenize_threads": 1, "tokenize_processes": p,
                           "replicate": 0, "card_busy_share": busy, "cpu_s_per_m_tokens": 3.0,
                           "card": "simulated h200", "cores": 2, "card_cores": 16,
                           "card_tokens_per_s": 17.5e6, "workunit_size": 256,
                           "backend": "process"}
                          for w, p, busy in ((1, 1, 0.8), (2, 0, 0.9))])
    said = findings.card_feeding(table.assign(tokenizing=tokenizing(table)))
    assert "with 2 workers × 1 thread tokenizing (workers × tokenizing: 1×1 process: 80%)" in said


def test_card_feeding_says_what_the_default_tokenized_on_at_each_count_of_workers():
    """The default's processes change with the workers (each worker's share of the cores): the
    figure draws it as one line ("default"), the finding names its count at each."""
    table = pd.DataFrame([{"workers": w, "tokenizing": words, "tokenizing_asked": asked,
                           "replicate": 0, "card_busy_share": 0.5 + w / 10,
                           "cpu_s_per_m_tokens": 3.0, "card": "simulated h200", "cores": 16,
                           "card_cores": 16, "card_tokens_per_s": 17.5e6,
                           "workunit_size": 256, "backend": "process"}
                          for w, words, asked in ((1, "8 processes", "default"),
                                                  (2, "7 processes", "default"),
                                                  (1, "1 thread", "1 thread"))])
    said = findings.card_feeding(table)
    assert said.endswith("; the default tokenized on 8 processes at 1 worker, 7 processes at 2 "
                         "workers")
    named = table[table["tokenizing_asked"] != "default"]
    assert "the default" not in findings.card_feeding(named)
    assert "the default" not in findings.card_feeding(table.drop(columns="tokenizing_asked"))
