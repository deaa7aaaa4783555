"""CUDA graphs of the torch card's pass (helpers.workloads.embedding.cards.graphs), faked: CI has
no GPU. The fake capture refuses a sync, as CUDA does, and its replay computes from the bucket's
static buffers, so the rows say whether the buffers were filled right."""
import threading

import numpy as np
import pytest

from fake_cuda import FakeCuda
from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.embedding.cards import graphs
from helpers.workloads.embedding.cards.graphs import bucket
from helpers.workloads.embedding.cards.torch_card import TorchCard
from helpers.workloads.embedding.feeder import Feeder
from helpers.workloads.embedding.rust_tokenizer import RustTokenizer


@pytest.mark.parametrize("texts, tokens, batch_size, longest, expected", [
    (3, 17, 256, 256, (8, 24)),  # a workunit's last batch: MIN_ROWS, the next 8
    (8, 16, 256, 256, (8, 16)),
    (9, 33, 256, 256, (16, 40)),
    (129, 1, 256, 256, (256, 8)),
    (256, 250, 256, 256, (256, 256)),
    (100, 250, 100, 250, (100, 250)),  # neither past the batch size nor the model's length
    (5, 20, 4, 512, (5, 24)),  # (a batch larger than the card was told: its own rows)
])
def test_a_batch_is_padded_to_its_bucket(texts, tokens, batch_size, longest, expected):
    assert bucket(texts, tokens, batch_size, longest) == expected


@pytest.fixture
def on_the_card(monkeypatch):
    """Copies to "cuda" stay where they are (the model runs on the CPU)."""
    import torch

    real_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: self if args and str(
        args[0]).startswith("cuda") else real_to(self, *args, **kwargs))
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)


@pytest.fixture(scope="module")
def varied():
    """The sample's paragraphs, of every length it has (up to max_seq_length and past it), in
    two runs' worth: 48 and 35."""
    from helpers.study.paths import sample_texts

    chosen = sample_texts(1000)[::12]
    return chosen[:48], chosen[48:83]


def run(card, st_model, texts, batch_size=8):
    rust = RustTokenizer.of(st_model.tokenizer, st_model.max_seq_length)
    return Feeder(rust, card, 1).run(texts, batch_size, None)


@pytest.mark.usefixtures("on_the_card")
def test_graphs_give_the_eager_card_s_rows_capturing_each_bucket_once(st_model, varied):
    """Batches of every length and a short last one: each bucket captured once (after a warm-up
    on the side stream), every batch replayed, the rows the eager card's; a second run of other
    texts replays the same graphs (rows of an earlier batch left in a bucket change nothing),
    and the tokens the card computed count the buckets' padding."""
    first, second = varied
    cuda = FakeCuda()
    card = TorchCard(st_model, "cuda:0", cuda=cuda, graphs=True, batch_size=8)
    eager = TorchCard(st_model, "cpu")
    assert card.label == "torch on cuda:0 (CUDA graphs)"
    for texts in (first, second):
        rows, launched = run(card, st_model, texts)
        expected, plain = run(eager, st_model, texts)
        np.testing.assert_allclose(rows, expected, rtol=0, atol=2e-6)
        counts = launched.counts
        assert plain.counts.tokens_computed < counts.tokens_computed  # (the buckets' padding)
        assert counts.tokens_computed <= 1.5 * plain.counts.tokens_computed
    made = card.graphs.counts
    captures = [call for call in cuda.calls if call[0] == "capture"]
    assert made.captured == len(captures) >= 3
    assert {(pool, stream) for _, pool, stream in captures} == {("pool", "copies-2")}
    assert made.replayed == 6 + 5  # (35 texts: a last batch of 3)
    assert made.eager == 0 and made.capture_s > 0
    replays = made.replayed
    run(card, st_model, first)  # the same buckets again: nothing captured
    assert (made.captured, made.replayed) == (len(captures), replays + 6)


@pytest.mark.usefixtures("on_the_card")
def test_a_sync_in_the_captured_pass_is_refused_naming_the_bucket(st_model, texts):
    """transformers builds the attention mask without its shortcut (``mask.all()``, a sync) only
    where torch says a stream captures; a card that did not say so would fail, as would any
    pass that syncs. The error names the bucket and says how to run without graphs."""
    card = TorchCard(st_model, "cuda:0", cuda=FakeCuda(tells_capturing=False), graphs=True,
                     batch_size=8)
    with pytest.raises(RuntimeError, match=r"cuda_graphs: capturing the forward pass of 8 rows "
                                           r"x 8 tokens failed \(RuntimeError: aten\.is_nonzero"
                                           r".*not permitted when stream is capturing\); run "
                                           r"without CUDA graphs"):
        run(card, st_model, ["a short text"])


@pytest.mark.usefixtures("on_the_card")
def test_past_the_most_graphs_a_thread_captures_batches_run_eager(st_model, varied,
                                                                  monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 1)
    card = TorchCard(st_model, "cuda:0", cuda=FakeCuda(), graphs=True, batch_size=8)
    texts = varied[0][:40]
    rows, launched = run(card, st_model, texts)
    expected, _ = run(TorchCard(st_model, "cpu"), st_model, texts)
    np.testing.assert_allclose(rows, expected, rtol=0, atol=2e-6)
    made = card.graphs.counts
    assert made.captured == 1 and made.eager >= 1 and made.replayed + made.eager == 5


@pytest.mark.usefixtures("on_the_card")
def test_each_thread_captures_and_replays_its_own_graphs(st_model, varied):
    """The thread backend's workers share one model: each thread's graphs are its own (a graph
    replays on its thread's stream, from its own static buffers)."""
    texts = varied[0][:24]
    cuda = FakeCuda()
    card = TorchCard(st_model, "cuda:0", cuda=cuda, graphs=True, batch_size=8)
    expected, _ = run(TorchCard(st_model, "cpu"), st_model, texts)
    got = {}
    threads = [threading.Thread(target=lambda k=k: got.setdefault(k, run(card, st_model,
                                                                         texts)[0]))
               for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for rows in got.values():
        np.testing.assert_allclose(rows, expected, rtol=0, atol=2e-6)
    alone = FakeCuda()
    single = TorchCard(st_model, "cuda:0", cuda=alone, graphs=True, batch_size=8)
    run(single, st_model, texts)
    assert card.graphs.counts.captured == 2 * single.graphs.counts.captured


def test_graphs_on_a_cpu_are_skipped_saying_why(tmp_path):
    """A CPU has no graphs: the worker runs eager, and its report says so; a card told to
    graph a CPU refuses."""
    from helpers.study.paths import sample_texts

    workload = EmbeddingWorkload(cuda_graphs=True)
    model = workload.load("cpu", 2)
    report = workload.report(model)
    assert report["cuda_graphs"] == \
        "skipped: CUDA graphs replay CUDA kernels; this device is cpu"
    assert report["path"] == "feeder -> torch on cpu" and "guard_min_cosine" not in report
    assert workload.process(model, sample_texts(3))["embeddings"].shape == (3, 384)
    assert workload.attrs()["cuda_graphs"] is True
    with pytest.raises(ValueError, match="graphs: CUDA graphs replay CUDA kernels; the device "
                                         "is cpu"):
        TorchCard(model.model, "cpu", graphs=True)


@pytest.mark.parametrize("options, refused", [
    ({"runtime": "onnx"}, r"cuda_graphs: the torch card's \(runtime='onnx' runs the model in "
                          r"onnxruntime\)"),
    ({"feeder": False}, r"cuda_graphs: the torch card's, on the feeder's path \(feeder=False "
                        r"runs the model through its own encode\)"),
    ({"tokenize_ahead": True}, r"tokenize_ahead=True runs the model through its own encode"),
    ({"card": "h200"}, r"card='h200': .*cuda_graphs"),
    ({"cuda_graphs": "yes"}, r"cuda_graphs: expected True or False, got 'yes'"),
])
def test_graphs_with_an_option_that_has_none_are_refused(options, refused):
    with pytest.raises(ValueError, match=refused):
        EmbeddingWorkload(**{"cuda_graphs": True, **options})


@pytest.mark.usefixtures("on_the_card")
@pytest.mark.parametrize("mode", ["cls", "max", "weightedmean", "lasttoken",
                                  ("mean", "mean_sqrt_len_tokens")])
def test_every_pooling_is_captured_without_a_sync_and_pools_the_batch_s_tokens(st_model, varied,
                                                                                 mode):
    """sentence-transformers' poolings read the mask (the first token, the last, weights by
    position): each is captured (no sync) and, with the bucket's padding, pools what the eager
    pass pools."""
    import copy

    model = copy.deepcopy(st_model)
    model[1].pooling_mode = mode
    texts = varied[0][:19]
    card = TorchCard(model, "cuda:0", cuda=FakeCuda(), graphs=True, batch_size=8)
    rows, _ = run(card, model, texts)
    expected, _ = run(TorchCard(model, "cpu"), model, texts)
    np.testing.assert_allclose(rows, expected, rtol=0, atol=2e-6)
    assert card.graphs.counts.captured >= 2
