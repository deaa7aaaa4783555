"""The GPU check (helpers.bench.gpu): its dry run goes through every section on this CPU, its
report draws the figures from the tables alone, a call fits what the device tool carries, and the
few card calls it makes are faked where a card is needed."""
import json
import subprocess
import tarfile
import time

import numpy as np
import pandas as pd
import psutil
import pytest

from helpers.bench.gpu import (card, check, faults, figures, plan, report, simulated, study,
                               tables, weights)
from helpers.engine.contract.devices import available_cores
from helpers.study.paths import ROOT
from helpers.study.provenance import git_commit

pytestmark = pytest.mark.timeout(240)  # reached only on deadlock


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return weights.prepare(tmp_path_factory.mktemp("prepared"))


@pytest.mark.slow
def test_the_dry_run_measures_every_section_and_its_report_draws_both_figures(
        tmp_path, prepared, capsys):
    out = check.run(tmp_path / "out", dry_run=True, prepared=prepared)
    printed = capsys.readouterr().out
    assert printed.index("faults:") < printed.index("the study (") < printed.index("tables:")
    sizes = check.DRY
    meta = json.loads((out / "gpu_model.json").read_text())
    assert meta["commit"] == git_commit(ROOT) and meta["parameters"]["dry_run"] is True
    assert meta["parameters"]["weights"] == weights.WEIGHTS

    ceilings = pd.read_csv(out / "gpu_card.csv").set_index("ceiling")
    assert set(ceilings.index) == {"matmul_bf16", "matmul_fp32", "copy"}
    assert (ceilings["value"] > 0).all()

    model = pd.read_csv(out / "gpu_model.csv")
    timed = model[model["skipped"].isna()]
    forward = timed[timed["mode"] == "forward"]
    flag = forward["unpadded"].astype(bool)
    unpadded = forward[flag]  # (the feed precision, fp32 on a CPU, unpadded)
    assert sorted(forward["batch_size"]) == sorted(sizes.batch_sizes * 2)  # fp32 alone: a CPU
    assert (unpadded["tokens_computed"] == unpadded["tokens_needed"]).all()
    padded = forward[~flag]
    assert (padded["tokens_computed"] > padded["tokens_needed"]).all() and len(unpadded) == len(
        padded)
    assert (timed["texts_per_s"] > 0).all() and (timed["card_share"] > 0).all()
    for share, ceiling in (("card_share", "matmul_bf16"), ("own_share", "matmul_fp32")):
        assert np.allclose(timed[share] * ceilings.loc[ceiling, "value"], timed["tflop_per_s"],
                           rtol=1e-4)  # (each of the three kept to 6 significant digits)
    assert (timed["tokens_computed"] >= timed["tokens_needed"]).all()
    encode = timed[timed["mode"] == "encode"]
    feeds = set(zip(encode["tokenize_ahead"], encode["pin_memory"]))
    assert feeds == set(model_feeds()) and (encode["cpu_s"] > 0).all()
    assert dict(zip(encode["tokenize_ahead"], encode["path"])) == {
        False: "feeder -> torch on cpu", True: "encode"}  # (tokenize-ahead: encode's path)
    assert (forward["cpu_s"] > 0).all()  # (the launching thread's: a CPU computes there)
    assert set(encode["batch_size"]) == {256, *sizes.batch_sizes}
    assert model[model["compile"] & model["skipped"].notna()].shape[0] == 1  # said, not silent
    graphed = model[model["cuda_graphs"]]
    assert list(graphed["mode"]) == ["load"] and list(graphed["skipped"]) == [
        "CUDA graphs replay CUDA kernels; this device is cpu"]  # (fp32: the dry run's one)
    assert "skipped: load fp32 graphs: CUDA graphs replay CUDA kernels; this device is cpu" \
        in printed

    checks = pd.read_csv(out / "gpu_faults.csv").set_index("check")
    assert list(checks.index) == ["fit", "killed", "out_of_memory", "threads"]
    assert checks["passed"].all() and checks.loc["threads", "exactly_once"]
    assert checks.loc["threads", "detail"].startswith(  # (no graphs: a CPU)
        "2 thread workers, one model (feeder -> torch on cpu), float16 rows")
    assert checks.loc["fit", "workers"] == sizes.fit_max  # (a CPU's memory: no stop before)
    assert checks.loc["out_of_memory", "simulated"] and checks.loc["out_of_memory",
                                                                    "oom_backoffs"] >= 1
    assert checks.loc["killed", "deaths"] >= 1 and checks.loc["killed", "exactly_once"]

    fed = pd.read_csv(out / "gpu_simulated.csv")
    assert [tuple(r) for r in fed[["workers", "tokenize_threads", "tokenize_processes"]]
            .to_numpy()] == simulated.layouts(available_cores())
    assert simulated.layouts(16)[0] == (1, 1, 8)  # (a real card's default on the H200's node)
    assert fed["skipped"].isna().all() and (fed["card_busy_share"] > 0).all()
    assert (fed["records"] == sizes.simulated_records).all() and fed["card_cores"].isna().all()
    assert printed.index("faults:") < printed.index("the simulated card (") < printed.index(
        "the study (")

    runs = pd.read_csv(out / "gpu_study.csv")
    default = runs[runs["layout"] == "default"]
    assert sorted(zip(default["workers"], default["workunit_size"])) == sorted(
        (w, str(s)) for w in sizes.worker_counts for s in sizes.workunit_sizes)
    assert runs["exactly_once"].all() and (runs["records"] == sizes.study_records).all()
    assert (default["tokenize_threads"] == 1).all() and (default["tokenize_processes"] == 0).all()
    # (the default on a CPU: the worker's own thread; on a card, processes on its share)
    layout, = runs[runs["layout"] != "default"].to_dict("records")  # (DRY's one: 2 threads)
    firsts = default[default["workunit_size"] == "auto"]
    assert layout["layout"] == "tokenize_threads=2" and layout["tokenize_threads"] == 2
    assert (layout["workunit_size"], layout["workers"]) == (
        "auto", firsts.loc[firsts["texts_per_s"].idxmax(), "workers"])  # (the fastest count)
    assert list(runs["run"]).index(layout["run"]) == len(sizes.worker_counts)  # (between sizes)
    assert (runs["cpu_s"] > 0).all() and (runs["cpu_ms_per_text"] > 0).all()
    assert set(pd.read_csv(out / "gpu_study_samples.csv")["run"]) == set(runs["run"])

    with tarfile.open(tmp_path / "gpu-check.tgz", "w:gz") as archive:  # as the call brings it
        archive.add(out, arcname=".")
    results = report.ingest(tmp_path / "gpu-check.tgz", tmp_path / "results",
                            tmp_path / "figures")
    assert sorted(p.name for p in results.glob("*.csv")) == sorted(f"{t}.csv"
                                                                   for t in tables.TABLES)
    drawn = sorted((tmp_path / "figures" / tables.FIGURES).glob("*.png"))
    assert [p.stem for p in drawn] == ["model-texts_per_s-vs-batch_size",
                                       "simulated-card_busy-vs-workers",
                                       "study-texts_per_s-vs-workers"]
    finding = json.loads(drawn[2].with_suffix(".json").read_text())["finding"]
    assert "workers per GPU" in finding and "texts/s" in finding
    assert "Tokenizing, " in finding and "2 threads" in finding and "(the default)" in finding
    finding = json.loads(drawn[1].with_suffix(".json").read_text())["finding"]
    assert finding.startswith("the simulated h100 was busiest at")


def model_feeds():
    from helpers.bench.gpu.model_side import FEEDS

    return FEEDS


def test_a_killed_job_that_ends_before_its_kill_runs_again_longer_and_kills_nothing_late(
        tmp_path):
    """The killed check sizes its job from a rate measured before (on a loaded machine, slower
    than the pool then ran): a job that ended first is run again with twice the records, and a
    kill due after its job never lands on the pool's idle worker."""
    from helpers.engine.pipeline import WorkerPool
    from helpers.workloads.synthetic import SyntheticWorkload

    with WorkerPool(SyntheticWorkload(0.001), ["cpu"], "process", progress=False) as pool:
        pids = dict(pool.pids)
        row = faults._killed(pool, 2, 1, 3.0, tmp_path)
        time.sleep(0.2)
        assert pool.pids == pids and all(psutil.pid_exists(p) for p in pids.values())
    assert (row["passed"], row["tries"], row["records"], row["deaths"]) == \
        (False, faults.KILL_TRIES, 2 * 2 ** (faults.KILL_TRIES - 1), 0)
    assert row["detail"] == "the job ended before the kill" and row["exactly_once"]


def test_a_run_without_a_card_is_refused_and_only_a_dry_run_uses_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device.*--dry-run"):
        check.check_device(dry_run=False)
    assert check.check_device(dry_run=True) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert check.check_device(dry_run=True) == "cuda:0"


def test_minilm_costs_22_mflop_a_token_at_128_tokens(prepared):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(prepared)
    assert card.flops(config, 1, 128) / 128 == pytest.approx(22.4e6, rel=0.01)  # ANCHORS.md
    assert card.flops(config, 2, 256) / (2 * 256) > card.flops(config, 1, 128) / 128  # quadratic


def test_the_prepared_model_leaves_its_weights_behind_and_seeded_weights_repeat(
        tmp_path, prepared):
    from safetensors.numpy import load_file

    files = [p for p in prepared.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".safetensors", ".bin")]
    assert sum(p.stat().st_size for p in files) < 2 * 2 ** 20
    one = weights.build(prepared, tmp_path / "one", seed=1, layers=1)
    two = weights.build(prepared, tmp_path / "two", seed=1, layers=1)
    other = weights.build(prepared, tmp_path / "other", seed=2, layers=1)
    a, b, c = (load_file(f / "model.safetensors") for f in (one, two, other))
    key = next(k for k in a if k.endswith("query.weight"))
    assert np.array_equal(a[key], b[key]) and not np.array_equal(a[key], c[key])
    assert a[key].std() == pytest.approx(0.02, rel=0.1)  # BERT's initialisation, not zeros
    assert (one / "1_Pooling" / "config.json").is_file() and (one / "tokenizer.json").is_file()


def test_the_plan_prepares_what_a_call_carries_fits_it_and_sends_the_commit():
    text = plan.plan()  # (prepares build/gpu/model, git-ignored, as make builds its venv)
    found = plan.sizes()
    assert sum(found.values()) < plan.LIMIT_BYTES and found["carried"] > 0
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    command = plan.command(head)
    assert f"GPUFEED_COMMIT={head}" in command and "--out" in command and len(command) < 2000
    assert "$OUT/gpu-check.tgz" in command
    call = json.loads(text[text.index("{"):text.index("}") + 1])
    assert "fits" in text and call["timeout_s"] == plan.timeout_s()
    retry = json.loads(text[text.index("{", text.index("second try")):text.rindex("}") + 1])
    assert f"--budget {plan.RETRY_BUDGET_S}" in retry["command"] and "--budget" not in command
    assert plan.START_SECONDS + call["timeout_s"] + retry["timeout_s"] <= plan.DEVICE_SECONDS
    assert f"timeout {int(plan.RETRY_BUDGET_S + plan.OVER_BUDGET_S)} " in retry["command"]
    assert call["carry"] == ["build/gpu/model"] and (ROOT / "build/gpu/model/config.json").is_file()


def test_a_copy_without_git_names_the_commit_it_was_sent(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFEED_COMMIT", "abc123")
    assert git_commit(tmp_path) == "abc123"
    monkeypatch.delenv("GPUFEED_COMMIT")
    assert git_commit(tmp_path) == "unknown"


def test_the_cards_idle_stretch_is_read_between_its_first_and_last_busy_reading():
    def readings(values):
        return [{"seconds": i * study.SAMPLE_SECONDS, "utilization": v, "source": "nvml",
                 "worker": None, "memory_mib": 1.0} for i, v in enumerate(values)]

    use = study.card_use(readings([0, 0, 0, 50, 0, 0, 0, 80, 0, 100, 0, 0, 0, 0]))
    assert use["longest_card_idle_s"] == pytest.approx(3 * study.SAMPLE_SECONDS)  # not the ends
    assert use["busy_share"] == pytest.approx(230 / 14 / 100) and use["busy_source"] == "nvml"
    assert study.card_use(readings([0, 0]))["longest_card_idle_s"] == 0.0
    cpu = study.card_use([{"seconds": 0.0, "utilization": 90.0, "source": "psutil"},
                          {"seconds": 0.0, "utilization": 70.0, "source": "psutil"}])
    assert cpu["busy_share"] == pytest.approx(1.6) and np.isnan(cpu["longest_card_idle_s"])


def test_the_ballast_leaves_what_the_check_asks_free_on_the_card(monkeypatch):
    import torch

    taken = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * 2 ** 30, 80 * 2 ** 30))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: None)
    monkeypatch.setattr(torch, "empty", lambda n, **kw: taken.append((n, kw)) or "ballast")
    assert faults._ballast("cuda:0") == "ballast"
    assert taken == [(int((10 - faults.BALLAST_FREE_GIB) * 2 ** 30),
                      {"dtype": torch.uint8, "device": "cuda:0"})]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 ** 30, 80 * 2 ** 30))
    assert faults._ballast("cuda:0") is None and len(taken) == 1  # less free: nothing taken


def test_long_texts_pass_the_models_length():
    texts = faults.long_texts(5)
    assert [i for i, _ in texts] == list(range(5))
    assert all(len(t) >= faults.LONG_CHARACTERS for _, t in texts)


def test_the_card_alone_with_graphs_is_timed_through_the_card_s_graphs():
    """A graphed variant's forward-alone rows time the card's own path (each batch copied into
    its bucket's graph and replayed), not the modules called eager; faked card and batches."""
    import torch

    from helpers.bench.gpu import model_side

    batches = [{"input_ids": torch.ones((2, 5), dtype=torch.int64),
                "attention_mask": torch.ones((2, 5), dtype=torch.int64)} for _ in range(3)]

    class Card:
        calls = []

        def compute(self, ids, mask, host_mask=None):
            self.calls.append(tuple(ids.shape))
            if len(self.calls) == 1:  # (a bucket's capture: CPU the warm-up pays, not cpu_s)
                end = time.thread_time() + 0.2
                while time.thread_time() < end:
                    pass
            return ids.float(), ids.numel()

    class Shapes:
        def features(self, size):
            return batches

        def figures(self, size, unpadded=False):
            return {"tokens_needed": 30.0, "tokens_computed": 30.0, "flop": 1e6}

    class Fed:  # (a FedModel: its card)
        card = Card()

        def __call__(self, features):
            raise AssertionError("the modules were called eager")

    fed = Fed()
    fed.model = fed
    item = model_side.Loaded("fp16", False, False, True, None, fed, 1.0, {}, graphs=True)
    rows = model_side._forward(item, "cpu", ["t"] * 6, 2, Shapes(), repeats=2,
                               ceilings={"bf16": 1.0, "fp32": 1.0})
    assert [row["repeat"] for row in rows] == [0, 1] and rows[0]["cuda_graphs"] is True
    assert Card.calls == [(2, 5)] * 3 * (1 + 2)  # (a warm-up pass, then two timed)
    assert all(row["texts_per_s"] > 0 and not row["skipped"] for row in rows)
    assert rows[0]["cpu_s"] < 0.05  # (the capture's 0.2 s left out)


def test_a_graphed_variant_is_named_so_in_the_summary_read_back_from_its_csv(tmp_path):
    """The report reads the tables back from CSV: a graphed row's variant says 'graphs' (a bool
    column comes back as NumPy's bool), beside the eager one of the same precision."""
    base = {"mode": "forward", "precision": "fp16", "compile": False, "tokenize_ahead": False,
            "pin_memory": True, "batch_size": 256, "skipped": "", "texts_per_s": 1.0,
            "card_share": 0.1, "texts": 10, "cpu_s": 0.1, "guard_min_cosine": 1.0}
    frame = pd.DataFrame([{**base, "cuda_graphs": False},
                          {**base, "cuda_graphs": True, "texts_per_s": 2.0},
                          {**base, "compile": True, "cuda_graphs": True, "texts_per_s": 3.0}])
    frame.to_csv(tmp_path / "gpu_model.csv", index=False)
    read = pd.read_csv(tmp_path / "gpu_model.csv")
    assert list(report.model_summary(read)["variant"]) == ["fp16", "fp16 graphs",
                                                           "fp16 compiled graphs"]
    from helpers.bench.gpu.figures import model_figure

    _, finding = model_figure(read, "cuda:0")
    assert finding.startswith("The card alone peaks at 3 texts/s (fp16 compiled graphs, batch")


def test_the_study_runs_its_tokenizing_layouts_between_the_sizes_at_the_fastest_count():
    """Issue 58: which tokenizing keeps a real card busiest is measured on the card: each layout
    the tuner would try, at the first size, with the count of workers that ran it fastest (read
    as the runs fill the rates), then the second size in reverse."""
    rates = {}
    runs = study._runs((1, 2, 3), ("auto", 1024), [{"tokenize_threads": 1}], rates)
    first = [next(runs) for _ in range(3)]
    assert first == [(1, "auto", {}), (2, "auto", {}), (3, "auto", {})]
    rates.update({1: 10.0, 2: 30.0, 3: 20.0})
    assert list(runs) == [(2, "auto", {"tokenize_threads": 1}), (3, 1024, {}), (2, 1024, {}),
                          (1, 1024, {})]
    assert list(study._runs((1, 2), ("auto",), [{"tokenize_threads": 4}], {})) == [
        (1, "auto", {}), (2, "auto", {}), (1, "auto", {"tokenize_threads": 4})]  # (none ran)


def test_a_study_run_past_its_deadline_is_cut_and_thread_workers_cpu_is_not_guessed(tmp_path):
    """A run slower than guessed stops dispatching at the study's deadline: its row says cut,
    and asks nothing of ids it never wrote; thread workers' CPU is their process's (NaN)."""
    import time

    from helpers.engine.pipeline import WorkerPool
    from helpers.workloads.synthetic import SyntheticWorkload

    pairs = study.corpus(64)
    with WorkerPool(SyntheticWorkload(0.0), ["cpu"], "thread", progress=False) as pool:
        row, _ = study._run(pool, pairs, "cpu", 8, tmp_path / "cut.h5", time.monotonic() - 1)
        whole, _ = study._run(pool, pairs, "cpu", 8, tmp_path / "whole.h5", None)
    assert row["cut"] and row["records"] < 64 and row["exactly_once"] is None
    assert not whole["cut"] and whole["exactly_once"] and whole["records"] == 64
    assert np.isnan(whole["cpu_s"]) and np.isnan(whole["cpu_ms_per_text"])


def test_the_study_s_summary_and_figure_read_a_table_from_before_its_layouts(tmp_path):
    """The first card's table (no layout, no CPU columns) still reads: every run the default."""
    runs = pd.DataFrame({"run": ["1-auto", "2-auto"], "workers": [1, 2],
                         "workunit_size": ["auto", "auto"], "skipped": ["", ""],
                         "texts_per_s": [3000.0, 5000.0], "busy_share": [0.1, 0.2],
                         "busy_source": ["nvml", "nvml"], "exactly_once": [True, True]})
    summary = report.study_summary(runs)
    assert list(summary["tokenizing"]) == ["", ""] and "cpu_ms_per_text" not in summary
    fig, finding = figures.study_figure(runs)
    assert finding.startswith("2 workers per GPU (workunit auto) ran 5,000 texts/s, 1.67x 1")
    assert "Tokenizing" not in finding


def test_the_study_runs_graphs_only_where_the_model_side_found_them_faster():
    """The study's variant: the feed variant with CUDA graphs where the whole path (encode rows,
    batch 256, the study's feed) ran faster with them, eager otherwise or where either was not
    measured; the first guess of a worker's rate is the chosen variant's."""
    from helpers.bench.gpu import model_side

    def rows(eager, graphed):
        base = {"mode": "encode", "precision": "fp16", "compile": False, "tokenize_ahead": False,
                "pin_memory": True, "batch_size": model_side.ENCODE_BATCH, "skipped": ""}
        return pd.DataFrame([{**base, "cuda_graphs": g, "texts_per_s": rate}
                             for g, rates in ((False, eager), (True, graphed)) for rate in rates])

    assert check._graphs_faster(rows([100, 110], [150, 160]), "cuda:0")
    assert not check._graphs_faster(rows([100, 110], [90, 95]), "cuda:0")
    assert not check._graphs_faster(rows([100], []), "cuda:0")
    assert check._worker_rate(rows([100, 120], [150, 170]), "cuda:0", True) == 160
    assert check._worker_rate(rows([100, 120], [150, 170]), "cuda:0") == 110
    assert check._worker_rate(pd.DataFrame(), "cuda:0") == 1.0
    old = rows([100, 120], []).drop(columns="cuda_graphs")  # (a table from before graphs)
    assert check._worker_rate(old, "cuda:0") == 110 and not check._graphs_faster(old, "cuda:0")


def test_a_section_that_fails_costs_the_check_none_of_the_others(tmp_path, prepared,
                                                                 monkeypatch, capsys):
    """On a card's first contact: the ceilings and the model's side raise, and the faults,
    the simulated card and the study still run (from what they would have had: a worker's rate
    of one text a second), each failure's error in the log and its name in the summary."""
    def fails(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    ran = []

    def faults_ran(workload, device, oom_records, rate, *rest):
        ran.append(("faults", rate))
        return [{"check": "fit", "passed": True}]

    def study_ran(workload, device, records, counts, sizes, deadline, folder, rate, keep,
                  layouts):
        ran.append(("study", rate))
        return [], []

    def measured_one(*args):
        args[-1].append({"mode": "load", "precision": "fp32", "compile": False,
                         "cuda_graphs": False, "tokenize_ahead": True, "pin_memory": True,
                         "skipped": "measured first"})
        fails()

    monkeypatch.setattr(check, "_ceilings", fails)
    monkeypatch.setattr(check.model_side, "measure", measured_one)
    monkeypatch.setattr(check.faults, "measure", faults_ran)
    monkeypatch.setattr(check.simulated, "measure", fails)
    monkeypatch.setattr(check.study, "measure", study_ran)
    out = check.run(tmp_path / "out", dry_run=True, prepared=prepared)
    printed = capsys.readouterr()
    assert ran == [("faults", 1.0), ("study", 1.0)]
    assert "the model's side failed: RuntimeError: CUDA error" in printed.out
    assert "Traceback" in printed.err
    assert "failed (their errors above): the card's ceilings, the model's side, the simulated " \
           "card" in printed.out
    assert sorted(p.name for p in out.glob("*.csv")) == ["gpu_faults.csv", "gpu_model.csv"]
    assert list(pd.read_csv(out / "gpu_model.csv")["skipped"]) == ["measured first"]
    results = report.ingest(out, tmp_path / "results", tmp_path / "figures")  # (no gpu_card:
    assert "GPU check: no GPU" in capsys.readouterr().out  # the others' sidecars name the call)
    assert (results / "gpu_faults.csv").is_file() and not (results / "gpu_card.csv").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="none of gpu_card, gpu_model"):
        report.ingest(tmp_path / "empty", tmp_path / "r2", tmp_path / "f2")
