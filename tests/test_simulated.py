"""A run on a simulated card: everything real but the forward pass, and every output saying it
was simulated."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers.engine.outputs.hdf5_sink import read_output
from helpers.engine.pipeline import run_pipeline
from helpers.study.paths import ROOT, SAMPLE_TEXT
from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.embedding.cards.simulated import GRAPH_OPS


@pytest.fixture(scope="module")
def records():
    from helpers.study.paths import sample_texts

    return list(enumerate(sample_texts(600)))


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_a_run_on_a_simulated_card_writes_zeros_of_the_model_s_width_and_counts_its_feeding(
        tmp_path, records, backend):
    workload = EmbeddingWorkload(card="h100", card_cores=16, batch_size=64, tokenize_threads=2)
    stats = run_pipeline(records, workload, devices="cuda:0*2", workunit_size=128,
                         output=tmp_path / "out.h5", backend=backend, progress=False)
    data = read_output(tmp_path / "out.h5")
    assert data["ids"].tolist() == list(range(600))
    assert data["embeddings"].shape == (600, 384) and not data["embeddings"].any()
    assert data["attrs"]["card"] == "simulated h100"
    assert "simulated h100, scaled to" in data["attrs"]["loaded"]
    assert "simulated h100" in json.loads(data["attrs"]["workload_fingerprint"])["card"]
    assert stats.loaded["cuda:0"]["tokenize_threads"] == 2  # (the workers' report, in the stats)
    counts = stats.counts
    assert counts["tokens_needed"] > 600 * 30 and counts["tokens_computed"] >= counts["tokens_needed"]
    assert counts["card_busy_us"] > 0 and counts["tokenize_cpu_us"] > 0
    assert 0 < counts["card_busy_us"] / 1e6 / stats.wall_s <= 1.0  # one card, shared
    if backend == "process":
        assert stats.worker_cpu_s > counts["tokenize_cpu_us"] / 1e6
    else:
        assert stats.worker_cpu_s is None  # (threads: the driver's process's CPU)


def test_a_simulated_output_is_never_resumed_by_a_real_model(tmp_path, records):
    output = tmp_path / "out.h5"
    run_pipeline(records, EmbeddingWorkload(card="l4"), devices="cuda:0", workunit_size=200,
                 output=output, limit=200, progress=False)
    with pytest.raises(ValueError, match="card"):
        run_pipeline(records, EmbeddingWorkload(), devices="cpu", workunit_size=200,
                     output=output, resume=True, progress=False)


@pytest.mark.parametrize("options, message", [
    ({"card": "v100"}, "h100, a100, l4"),
    ({"card": "h100", "precision": "bf16"}, "a real model's options"),
    ({"card_cores": 16}, "an option of a simulated card"),
    ({"card": "h100", "tokenize_threads": 0}, "tokenize_threads: expected a positive"),
])
def test_card_options_are_checked_where_they_are_given(options, message):
    with pytest.raises(ValueError, match=message):
        EmbeddingWorkload(**options)


def test_the_command_line_runs_a_simulated_card(tmp_path):
    out = tmp_path / "out.h5"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "helpers", "run", "--input", str(SAMPLE_TEXT), "--output",
         str(out), "--card", "a100", "--card-cores", "16", "--devices", "cuda:0*2",
         "--batch-tokens", "4096", "--limit", "300", "--workunit-size", "100"],
        capture_output=True, text=True, env=env, timeout=150)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["records"] == 300 and stats["counts"]["card_busy_us"] > 0
    assert "simulated card: busy" in done.stderr and "the rows are zeros" in done.stderr
    attrs = read_output(out)["attrs"]
    assert attrs["card"] == "simulated a100" and attrs["batch_tokens"] == 4096
    assert np.isclose(stats["padding"], stats["counts"]["tokens_computed"]
                      / stats["counts"]["tokens_needed"])


def test_a_simulated_card_s_worker_overlaps_its_workunits_and_encode_s_does_not(records):
    """The simulated card's model launches (its batches run while the worker goes on), so its
    worker starts the next workunit before it finishes the last
    (helpers.engine.workers.worker.serve); a workunit's counts are there once it is finished, the
    same as ``process`` counts."""
    from helpers.engine.workers.worker import launches

    workload = EmbeddingWorkload(card="h100", batch_size=16, tokenize_threads=1)
    model = workload.load("cuda:0", 1)
    assert launches(workload, model)
    assert not launches(EmbeddingWorkload(), object())  # (encode's path: it waits)
    texts = [text for _, text in records[:40]]
    finish = workload.launch(model, texts)
    assert workload.counts(model) == {}  # nothing counted before the workunit is finished
    assert finish()["embeddings"].shape == (40, 384)
    launched = workload.counts(model)
    workload.process(model, texts)
    processed = workload.counts(model)
    assert launched["tokens_needed"] == processed["tokens_needed"] > 40
    assert launched["tokens_computed"] == processed["tokens_computed"]


def test_a_simulated_card_with_graphs_launches_in_a_few_calls_and_computes_its_buckets(
        records):
    """``cuda_graphs`` on a simulated card: its worker spends a few calls' CPU a batch launching
    instead of the profile's CPU a kernel (the model's launch; measured, a submit's own CPU
    beside it), and the card computes the batches' buckets (the tokens counted); the label says
    it."""
    texts = [text for _, text in records[:96]]
    counts, launch_s = {}, {}
    for graphs in (False, True):
        workload = EmbeddingWorkload(card="h200", batch_size=16, tokenize_threads=1,
                                     cuda_graphs=graphs)
        model = workload.load("cuda:0", 1)
        assert ("(CUDA graphs)" in workload.report(model)["card"]) == graphs
        assert workload.process(model, texts)["embeddings"].shape == (96, 384)
        counts[graphs] = workload.counts(model)
        launch_s[graphs] = model.card.queue.model.launch_s()
        kernels = model.card.queue.model.kernels
    eager, graphed = counts[False], counts[True]
    assert eager["tokens_needed"] == graphed["tokens_needed"]
    assert eager["tokens_computed"] < graphed["tokens_computed"] < 1.3 * eager["tokens_computed"]
    assert launch_s[True] == pytest.approx(launch_s[False] * GRAPH_OPS / kernels)  # (a call's
    # CPU the profile's, GRAPH_OPS calls a batch)
    # measured (a submit's own CPU beside the spin: its queue's calls, more on a busy machine;
    # 6 batches, 19 ms eager, 1-4 ms graphed here)
    assert graphed["launch_cpu_us"] < eager["launch_cpu_us"] / 3


def test_a_model_s_files_give_its_pad_token_and_no_length_where_none_is_said(tmp_path):
    """A pad token in special_tokens_map.json only (older models), and neither a
    model_max_length nor positions: no cap (transformers' "very large"), not a crash."""
    import shutil

    from helpers.workloads.embedding import default_model_path
    from helpers.workloads.embedding.model import UNBOUNDED, read_model

    shutil.copy(os.path.join(default_model_path(), "tokenizer.json"), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128}))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"pad_token": "[SEP]"}))
    config, tokenizer = read_model(str(tmp_path))
    assert config["hidden_size"] == 64
    assert tokenizer.pad_id == tokenizer.rust.token_to_id("[SEP]") == 102
    assert tokenizer.max_length == UNBOUNDED
    assert len(tokenizer.encode(["word " * 1000])[0]) > 1000  # nothing cut



def test_a_simulated_card_tokenizes_the_prompt_and_caps_the_length(records):
    """prompt= and max_seq_length= change what the card is fed: the prompt's tokens on every
    text, no text past the cap."""
    texts = [text for _, text in records[:64]]

    def tokens(**options):
        workload = EmbeddingWorkload(card="h100", tokenize_threads=1, batch_size=16, **options)
        model = workload.load("cuda:0", 1)
        workload.process(model, texts)
        return workload.counts(model)["tokens_needed"]

    plain = tokens()
    assert tokens(prompt="query: ") == plain + 2 * len(texts)  # ("query" and ":" on
    # MiniLM's tokenizer; these texts are all under its cap)
    assert tokens(max_seq_length=16) == 16 * len(texts) < plain
