from unittest import mock

import pytest

from helpers.bench import overhead

pytestmark = pytest.mark.timeout(240)  # reached only on deadlock


@pytest.mark.slow
def test_overhead_pairs_four_methods_per_round_and_the_worker_path_per_workunit(capsys,
                                                                              tiny_model):
    """(A one-layer model: what the bench pairs does not depend on the model's size; 41 s with
    MiniLM here, three copies loaded.)"""
    rows, units = overhead.measure(records=24, block=12, rounds=2, batch_size=4, workunit_size=4,
                                   threads=1, model_path=tiny_model)
    assert [r["method"] for r in rows[:4]] == list(overhead.METHODS)  # round 0: as listed
    assert [r["method"] for r in rows[4:]] == ["chunked", "spawned", "pipeline", "bare"]
    assert all(r["records_per_s"] > 0 and r["records"] == 12 for r in rows)
    assert 0 < rows[3]["busy"] <= 1 and rows[0]["busy"] != rows[0]["busy"]  # NaN off the pipeline
    assert [(u["round"], u["workunit"]) for u in units] == \
        [(r, k) for r in (0, 1) for k in range(3)]
    assert all(u["worker_s"] > 0 and u["in_process_s"] > 0 for u in units)
    summary = overhead.report(rows, units)
    assert summary["bare"]["median"] == 1.0 and summary["pipeline"]["n"] == 2
    assert summary["pipeline"]["ci_low"] <= summary["pipeline"]["median"] \
        <= summary["pipeline"]["ci_high"]
    out = capsys.readouterr().out
    assert "per workunit, this process's compute ÷ the worker's" in out and "target:" in out


def test_the_spread_of_a_ratio_is_its_median_quartiles_and_interval():
    summary = overhead.spread([0.9, 1.0, 1.1, 1.0, 1.0])
    assert summary["median"] == 1.0 and (summary["q1"], summary["q3"]) == (1.0, 1.0)
    assert 0.9 <= summary["ci_low"] <= 1.0 <= summary["ci_high"] <= 1.1 and summary["n"] == 5


def test_failure_costs_measure_a_crash(capsys):
    from helpers.bench import failures

    frame = failures.pd.DataFrame(failures.crash_rows("synthetic", 200, 1))
    killed = frame[(frame.experiment == "crash") & (frame.killed == True)]  # noqa: E712
    assert len(killed) == 1 and 0 <= killed.detection_s.iloc[0] < 1.0
    assert killed.restart_s.iloc[0] > 0
    summary = failures.report(frame)
    assert summary["crash synthetic detection_s"] == killed.detection_s.iloc[0]
    assert "one SIGKILL, synthetic: detected in" in capsys.readouterr().out


@pytest.mark.slow
def test_the_parents_memory_does_not_grow_with_the_records(tmp_path):
    """50 k vs 1 M records of 384-d float32 (1.5 GB written): were results kept until the end,
    the parent would grow by ~1.4 GB; it may grow by its buffers, not by the records."""
    from helpers.bench import scale

    table = scale.measure(1_000_000, workers=2, baseline_records=50_000, kill_at=None,
                          folder=str(tmp_path))
    runs = table.set_index("run")
    growth = runs.loc["full", "parent_rss_mib"] - runs.loc["baseline", "parent_rss_mib"]
    assert growth < 200, f"parent peak RSS grew by {growth:.0f} MiB"
    private = runs.loc["full", "parent_uss_mib"] - runs.loc["baseline", "parent_uss_mib"]
    assert private < 200, f"parent private memory grew by {private:.0f} MiB"
    # the tree (parent and its workers) holds more than the parent alone
    assert (runs["tree_rss_mib"] > runs["parent_uss_mib"]).all()
    assert runs["exactly_once"].all() and runs.loc["full", "records"] == 1_000_000
    assert 0.99 < runs.loc["full", "write_amplification"] < 1.05  # full parts: written once


@pytest.mark.slow
def test_scale_bench_kills_a_run_and_resumes_it_exactly_once(tmp_path, capsys):
    from helpers.bench import scale

    table = scale.measure(400_000, workers=2, workunit_size=2048, baseline_records=0,
                          kill_at=0.1, folder=str(tmp_path))  # (the index is rewritten at
    # a rate of its own cost, so more often while it is small: on a loaded machine 0.5 met the
    # last rewrite, every row written, and so did 0.25 once the suite ran faster; 45,056 rows
    # held at 0.1 here, 135,168-180,224 at 0.25)
    runs = table.set_index("run")
    assert 0 < runs.loc["killed", "records"] < 400_000
    resumed = runs.loc["resumed"]
    assert resumed["exactly_once"] and resumed["resumed_after"] >= runs.loc["killed", "records"]
    assert resumed["records"] == 400_000 - resumed["resumed_after"]
    assert 0 < resumed["resume_first_workunit_s"] < 10
    figures = scale.report(table)
    assert figures["records_per_s"] > 0 and "longest_gap_s" not in figures  # (not a stall)
    assert figures["longest_idle_s"] > 0  # (between two workunits a worker waits a little)
    assert (table["longest_dispatch_gap_s"].dropna() > 0).all()
    assert "resume_first_workunit_s" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("source", ["parquet", "jsonl", "csv"])
def test_scale_bench_on_a_file_the_workers_read_it_and_write_every_row_once(tmp_path, source):
    """writes="workers" on a corpus file: the workers read it (Parquet row group by row group,
    JSONL and CSV from the driver's line or row starts); the driver reads a few bytes per row, and
    a JSONL or CSV file once, unparsed (the driver reading the records would read the file, then every row through
    its pipes: over 100 % of the rows' bytes). (A kill and resume of workers reading them:
    tests/test_table_rows.py, tests/test_jsonl_rows.py.)"""
    import json

    from helpers.bench import scale
    from helpers.study.paths import sample_texts

    table = scale.measure(400_000, workers=2, workunit_size=2048, baseline_records=0,
                          kill_at=None, folder=str(tmp_path), writes="workers", source=source)
    full = table.set_index("run").loc["full"]
    assert full["exactly_once"] and full["records"] == 400_000 and full["source"] == source
    texts = sample_texts()
    line = {"jsonl": lambda t: len(json.dumps({"text": t})) + 1,
            "csv": lambda t: len(t.encode()) + t.count('"') + 3, "parquet": lambda t: 0}[source]
    scanned = sum(line(t) for t in texts) / len(texts) / (384 * 4 + 8)
    assert full["driver_read_fraction"] < scanned + 0.05
    assert 0 < full["fingerprint_read_fraction"] < max(scanned, 0.2) + 0.05  # (the file once,
    # as the run starts, for its content digest: issue 59)


@pytest.mark.slow
def test_dispatch_bench_times_the_dispatch_loop_of_both_write_paths_and_sizes(capsys):
    from helpers.bench import dispatch

    table = dispatch.measure(units=300, repeats=1)
    assert sorted(zip(table["writes"], table["units_per_message"].astype(str))) == [
        ("driver", "1"), ("driver", "auto"), ("workers", "1"), ("workers", "auto")]
    sent = table.set_index("units_per_message")["units_a_message"]
    assert (sent.loc[1] == 1).all() and (sent.loc["auto"] > 2).all()  # (short workunits: more)
    assert (table["rows"] == 300 * dispatch.WORKUNIT_ROWS).all()
    assert (table["loop_s"] <= table["job_s"]).all()
    assert (table["driver_cpu_ms_per_unit"] > 0).all()
    figures = dispatch.report(table)
    assert set(figures) == {f"{writes}_{per}_ceiling_units_per_s" for writes in ("driver", "workers")
                            for per in (1, "auto")}
    assert "auto a message" in capsys.readouterr().out


@pytest.mark.slow
def test_runtimes_bench_times_each_variant_against_fp32_in_the_same_round(tmp_path, monkeypatch,
                                                                          capsys):
    """Two variants (the bench's others load the same way; bf16's guard on MiniLM is
    test_runtimes', emulated on this CPU at a fifth of fp32's rate): one row per variant and
    round, the ratio taken against fp32 torch's own round; onnxruntime's default quantisation a
    row the guard refuses, with its numbers."""
    from helpers.bench import runtimes

    monkeypatch.setenv("GPUFEED_CACHE", str(tmp_path))
    monkeypatch.setattr(runtimes, "VARIANTS", (("fp32", "torch", False),
                                               ("fp32", "onnx-int8", False)))
    table = runtimes.measure(records=24, repeats=2, batch_size=8)
    default, = table[table.runtime.eq("onnx-int8 (onnxruntime defaults)")].itertuples()
    assert default.refused.startswith("mean cosine 0.") and default.guard_mean_cosine < 0.99
    timed = table[table.refused.eq("") & table.texts_per_s.notna()]
    assert sorted(zip(timed.replicate, timed.runtime)) == \
        [(0, "onnx-int8"), (0, "torch"), (1, "onnx-int8"), (1, "torch")]
    assert (timed[timed.runtime.eq("torch")]["speedup"] == 1.0).all()
    int8 = timed[timed.runtime.eq("onnx-int8")]  # (the guard's own figures: under 1, int8's)
    assert (int8["speedup"] > 0).all() and (int8["guard_min_cosine"] < 1.0).all()
    assert runtimes.report(table)["speedup"] >= 1.0
    assert "fastest that passes the guard" in capsys.readouterr().out


def test_autotune_bench_compares_self_tuning_with_the_sweep_s_best(monkeypatch, capsys):
    from helpers.bench import autotune

    monkeypatch.setattr(autotune, "WORKERS", (1,))
    monkeypatch.setattr(autotune, "SIZES", (500,))
    frame = autotune.measure(records=3000, repeats=1)
    assert frame.groupby("job")["layout"].apply(sorted).to_dict() == \
        {"longer": ["fixed", "self-tuning"], "sweep": ["fixed", "self-tuning"]}
    summary = autotune.report(frame)
    assert 0 < summary["sweep self_tuning_vs_best_fixed"] and summary["longer makespan_vs_ideal"] > 1
    assert "self-tuning ÷ best fixed" in capsys.readouterr().out


def test_ray_bench_reports_the_median_ratio_spin_ups_and_the_driver_limit(capsys):
    import pandas as pd

    from helpers.bench.ray_backend import report

    side = pd.DataFrame([{"backend": b, "replicate": r, "records_per_s": v, "spinup_s": s,
                          "cluster_start_s": c}
                         for r, (p, q) in enumerate([(40.0, 40.0), (40.0, 36.0), (50.0, 45.0)])
                         for b, v, s, c in (("process", p, 6.0, 0.0), ("ray", q, 7.0, 12.0))])
    limit = pd.DataFrame([{"backend": b, "replicate": 0, "rows_per_s": v}
                          for b, v in (("process", 1e5), ("ray", 8e4), ("writer alone", 2e5))])
    report(side, limit)
    out = capsys.readouterr().out
    assert "steady state: ray / process = 0.900 (median of 3 interleaved repeats" in out
    assert "spin-up: process 6.0 s; ray 7.0 s after Ray's own start of 12.0 s" in out
    assert "process 100,000, ray 80,000, writer alone 200,000" in out


@pytest.mark.slow
def test_sources_bench_reads_every_format_and_runs_parquet_end_to_end(tmp_path, capsys):
    from helpers.bench import sources

    table = sources.measure(read_records=30_000, records=60_000, baseline_records=20_000,
                            repeats=2, folder=str(tmp_path))
    reads = table[table["run"] == "read"]
    assert sorted(reads["format"].unique()) == ["csv", "jsonl", "parquet"]
    assert (reads["rows"] == 30_000).all() and (reads["cpu_s_per_million_rows"] > 0).all()
    runs = table[table["run"] != "read"].set_index(["run", "keys"])["rows"]
    assert runs.to_dict() == {("baseline", True): 20_000, ("baseline", False): 20_000,
                              ("end_to_end", True): 60_000, ("end_to_end", False): 60_000}
    figures = sources.report(table)
    assert set(sources.GOALS) < set(figures)
    assert figures["rss_growth_keys_mib"] - figures["rss_growth_keys_less_check_mib"] == \
        pytest.approx(40_000 * 8 / 2**20)
    out = capsys.readouterr().out
    assert "parquet_read_rows_per_s" in out and "the repeat check's 8 bytes a key" in out


def test_feed_bench_sets_a_real_model_s_feeding_cpu_against_the_bare_tokenizer_s(capsys,
                                                                                monkeypatch):
    """One round on both corpora: the bare methods, the paths in process, whole runs (two
    layouts here), each over the bare Rust tokenizer of its own round and corpus."""
    from helpers.bench import feed

    monkeypatch.setattr(feed, "LAYOUTS", ((1, False), (1, True)))
    monkeypatch.setattr(feed, "CARD_LAYOUTS", ((1, 1, 0, True, True), (1, 0, 2, True, False)))
    table = feed.measure(records=256, repeats=1, batch_size=32, workunit_size=64)
    assert sorted(table.groupby(["corpus", "kind"]).size().items()) == [
        (("paragraphs", "bare"), 3), (("paragraphs", "card"), 2),
        (("paragraphs", "in_process"), 3),
        (("paragraphs", "pipeline"), 2), (("tokens128", "bare"), 3),
        (("tokens128", "in_process"), 3), (("tokens128", "pipeline"), 2)]
    bare = table[table.kind.eq("bare")].set_index(["corpus", "method"])
    assert (bare.xs("rust", level="method")["over_bare"] == 1).all()
    assert (bare.xs("wrapper", level="method")["over_bare"] > 1).all()  # (its padding to tensors)
    assert (bare.xs("word_cache", level="method")["over_bare"] < 1).all()
    paths = table[table.kind.eq("in_process")]
    assert (paths["forward_cpu_s"] > 0).all() and (paths["around_forward_cpu_s"] > 0).all()
    runs = table[table.kind.eq("pipeline")]
    assert (runs["texts"] == 256).all() and (runs["tokens"] > 256 * 30).all()
    cut = table[table.corpus.eq("tokens128")]["tokens"]  # (128 each, but a cut that re-reads
    assert ((cut - 256 * 128).abs() <= 256 * 128 // 1000).all()  # as one token more, rarely)
    cached = runs[runs.method.str.contains("word cache")]
    assert (cached["texts_fast"] > 0.9 * 256).all()
    assert (runs[~runs.method.str.contains("word cache")]["texts_fast"] == 0).all()
    assert (runs["tokenize_cpu_s"] > 0).all() and (runs["launch_cpu_s"] > 0).all()
    assert runs["rate_over_bare"].between(0, 5).all() and (runs["records_per_s"] > 0).all()
    cards = table[table.kind.eq("card")].set_index("method")
    assert list(cards.index) == ["1 worker x 1 thread, word cache, CUDA graphs",
                                 "1 worker x 2 processes, word cache"]
    assert cards["card_busy_share"].between(0, 1, inclusive="right").all()
    assert (cards["card_busy_per_cpu_s"] > 0).all()
    assert cards["forward_cpu_s"].iloc[0] < cards["forward_cpu_s"].iloc[1] / 3  # (launching:
    # a graph's few calls against the simulated H200's CPU a kernel)
    assert cards.loc["1 worker x 2 processes, word cache", "tokenize_cpu_s"] > 0  # (the
    # children's CPU, which no process figure of the run holds)
    figures = feed.report(table)
    assert set(feed.GOALS) <= set(figures)
    out = capsys.readouterr().out
    assert "a worker around its forward, word cache, x bare" in out and "CPU ms per 1,000" in out
    assert "most card per CPU-second" in out


@pytest.mark.slow
def test_runtimes_bench_measures_each_length_and_stored_form(monkeypatch, capsys):
    """Each max_seq_length timed in each round against the model's own; each stored form run
    into an output: its bytes a row (float32 4 a dimension, binary an eighth of one), the
    neighbours it keeps (float32: all of them)."""
    from helpers.bench import runtimes

    monkeypatch.setattr(runtimes, "LENGTHS", (16, None))
    monkeypatch.setattr(runtimes, "STORED_FORMS", ("float32", "binary"))
    table = runtimes.encode_options(records=24, repeats=2, batch_size=8, threads=1)
    lengths = table[table.option.eq("max_seq_length")]
    assert sorted(zip(lengths.replicate, lengths.length)) == \
        [(0, "16"), (0, "own (256)"), (1, "16"), (1, "own (256)")]
    assert (lengths[lengths.own_length]["speedup"] == 1.0).all()
    assert (lengths.groupby("length")["tokens_per_text"].first()["16"]
            < lengths.groupby("length")["tokens_per_text"].first()["own (256)"])
    stored = table[table.option.eq("stored")].set_index("stored")
    assert stored.loc["float32", "bytes_per_row"] == 384 * 4
    assert stored.loc["binary", "bytes_per_row"] == 384 / 8
    assert stored.loc["float32", "neighbours_kept"] == 1.0
    assert 0 < stored.loc["binary", "neighbours_kept"] <= 1
    runtimes.report_options(table)
    assert "own (256)" in capsys.readouterr().out


def test_joins_bench_alternates_the_taker_s_joins_on_a_sorted_job_of_two_speeds(capsys):
    """What keeps the taker's joins (docs/architecture.md): the same sorted job with and without
    them, alternating, on one pool per workunit cost; the taker's JOINS is back as it was
    after (what the switch does: tests/test_taker.py; a job this short is too noisy to show the
    count of workunits fall)."""
    from helpers.bench import joins
    from helpers.engine.dispatch import taker

    joined, real = [], taker._joined

    def spied(unit, more):  # (the taker's one join, seen with the switch as it was)
        joined.append(taker.JOINS)
        return real(unit, more)

    with mock.patch.object(taker, "_joined", spied):
        table = joins.measure(rounds=2, records=20_000, record_seconds=20e-6,
                              unit_seconds=(0.001,), window=2000)
    assert table["joins"].tolist() == [False, True, True, False]
    assert (table["records_per_s"] > 0).all() and table["busy"].between(0, 1).all()
    assert joined and all(joined)  # joins in the jobs with them, none in those without
    found = joins.report(table)
    assert found[0.001]["rate_on_over_off"] > 0 and "joins on against off" in \
        capsys.readouterr().out
    assert taker.JOINS is True


def test_prefetch_bench_alternates_one_and_two_messages_a_worker_on_one_pool(capsys):
    """What keeps PREFETCH (docs/architecture.md): the same jobs at one and two messages in
    flight a worker, alternating; the scheduler's PREFETCH is back as it was after."""
    from helpers.bench import prefetch
    from helpers.engine.dispatch import scheduler

    table = prefetch.measure(rounds=2, records=2000, unit_records=50, unit_seconds=0.001)
    assert table["prefetch"].tolist() == [1, 2, 2, 1]
    assert (table["records_per_s"] > 0).all() and table["busy"].between(0, 1).all()
    figures = prefetch.report(table)
    assert figures["rate_2_over_1"] > 0 and "two a worker against one" in capsys.readouterr().out
    assert scheduler.PREFETCH == 2
