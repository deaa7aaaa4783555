"""CUDA graphs of the torch card's pass (helpers.workloads.embedding.cards.graphs), faked: CI has
no GPU. The fake capture refuses a sync, as CUDA does, and its replay computes from the bucket's
static buffers, so the rows say whether the buffers were filled right."""
import threading
import time

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


@pytest.fixture
def model(st_model, monkeypatch):
    """The embedded MiniLM reading at most 64 tokens: its longest bucket a quarter of its own
    256's cost here, the sample's longer paragraphs cut at it."""
    monkeypatch.setattr(st_model, "max_seq_length", 64)
    return st_model


@pytest.fixture(scope="module")
def varied():
    """The sample's paragraphs cut to 1 to 60 words, of every length up to ``model``'s 64
    tokens and past it, in two runs' worth: 32 and 19."""
    from helpers.study.paths import sample_texts

    cut = [" ".join(text.split()[:1 + 7 * i % 60]) for i, text in enumerate(sample_texts(51))]
    return cut[:32], cut[32:51]


def run(card, model, texts, batch_size=8):
    rust = RustTokenizer.of(model.tokenizer, model.max_seq_length)
    return Feeder(rust, card, 1).run(texts, batch_size, None)


@pytest.mark.usefixtures("on_the_card")
def test_graphs_give_the_eager_card_s_rows_capturing_each_bucket_once(model, varied):
    """Batches of every length and a short last one: each bucket captured once (after a warm-up
    on the side stream), every batch replayed, the rows the eager card's; a second run of other
    texts replays the same graphs (rows of an earlier batch left in a bucket change nothing),
    and the tokens the card computed count the buckets' padding."""
    first, second = varied
    cuda = FakeCuda()
    card = TorchCard(model, "cuda:0", cuda=cuda, graphs=True, batch_size=8)
    eager = TorchCard(model, "cpu")
    assert card.label == "torch on cuda:0 (CUDA graphs)"
    for texts in (first, second):
        rows, launched = run(card, model, texts)
        expected, plain = run(eager, model, texts)
        np.testing.assert_allclose(rows, expected, rtol=0, atol=2e-6)
        counts = launched.counts
        assert plain.counts.tokens_computed < counts.tokens_computed  # (the buckets' padding)
        assert counts.tokens_computed <= 1.5 * plain.counts.tokens_computed
    begun = cuda.calls.index(("wait_stream", "copies-2", "compute"))  # (copies-1: the card's)
    assert cuda.calls[begun:begun + 7] == [
        ("wait_stream", "copies-2", "compute"),  # the side stream after the buffers' writes
        ("enter", "copies-2"), ("leave", "copies-2"),  # the warm-up on it
        ("capture", "pool", "copies-2"), ("enter", "copies-2"), ("leave", "copies-2"),
        ("wait_stream", "compute", "copies-2")]  # the forward's stream after the capture
    replayed = cuda.calls.index(("replay",), begun)
    assert cuda.calls[replayed + 1] == ("record", "compute") and not cuda.entered
    made = card.graphs.counts
    captures = [call for call in cuda.calls if call[0] == "capture"]
    assert made.captured == len(captures) >= 3
    assert {(pool, stream) for _, pool, stream in captures} == {("pool", "copies-2")}
    assert made.replayed == 4 + 3  # (19 texts: a last batch of 3)
    assert made.eager == 0 and made.capture_s > 0
    replays = made.replayed
    run(card, model, second)  # its buckets again: nothing captured
    assert (made.captured, made.replayed) == (len(captures), replays + 3)


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
def test_an_out_of_memory_in_a_capture_is_raised_as_it_is(st_model):
    """The worker backs off and splits a workunit on an out-of-memory error, which it knows by
    its type: a capture's is not wrapped."""
    import torch

    card = TorchCard(st_model, "cuda:0", cuda=FakeCuda(trace=False), graphs=True, batch_size=8)
    passes, forward = [], card.graphs.forward

    def short_of_memory(ids, mask):
        passes.append(1)
        if len(passes) == 2:  # (the warm-up passes; the capture's pass does not)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(ids, mask)

    card.graphs.forward = short_of_memory
    with pytest.raises(torch.cuda.OutOfMemoryError, match="Tried to allocate"):
        run(card, st_model, ["a short text"])
    assert card.graphs.graphs == {}
    rows, _ = run(card, st_model, ["a short text"])  # (captured at the next batch)
    assert rows.shape == (1, 384) and card.graphs.counts.captured == 1


def test_a_capture_begins_and_ends_on_its_stream_without_a_device_wide_sync(monkeypatch):
    """CudaCalls.capture with torch's calls faked: begun in thread-local mode on the side stream
    with the pool, ended after the pass; no synchronize or cache flush (torch.cuda.graph's, which
    would stall every worker's batches); an error in the pass ends the capture and is raised."""
    import contextlib

    import torch

    from helpers.workloads.embedding.cards.torch_card import CudaCalls

    calls = []

    @contextlib.contextmanager
    def stream(which):
        calls.append(("enter", which))
        try:
            yield
        finally:
            calls.append(("leave", which))

    monkeypatch.setattr(torch.cuda, "stream", stream)
    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, name=name: calls.append(name))

    class Graph:
        def capture_begin(self, pool=None, capture_error_mode="global"):
            calls.append(("begin", pool, capture_error_mode))

        def capture_end(self):
            calls.append("end")
            if "broken" in calls:
                raise RuntimeError("operation failed due to a previous error during capture")

    cuda = CudaCalls("cuda:0")
    assert cuda.capture(Graph(), lambda: calls.append("pass") or "rows", "pool", "side") == "rows"
    assert calls == [("enter", "side"), ("begin", "pool", "thread_local"), "pass", "end",
                     ("leave", "side")]
    calls.clear()

    def broken():
        calls.append("broken")
        raise ValueError("the pass's own error")

    with pytest.raises(ValueError, match="the pass's own error"):
        cuda.capture(Graph(), broken, "pool", "side")
    assert calls == [("enter", "side"), ("begin", "pool", "thread_local"), "broken", "end",
                     ("leave", "side")]


@pytest.mark.usefixtures("on_the_card")
def test_past_the_most_graphs_a_card_captures_batches_run_eager(model, varied,
                                                                  monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 1)
    card = TorchCard(model, "cuda:0", cuda=FakeCuda(trace=False), graphs=True, batch_size=8)
    texts = varied[0]
    rows, launched = run(card, model, texts)
    expected, _ = run(TorchCard(model, "cpu"), model, texts)
    np.testing.assert_allclose(rows, expected, rtol=0, atol=2e-6)
    made = card.graphs.counts
    assert made.captured == 1 and made.eager >= 1 and made.replayed + made.eager == 4


@pytest.mark.usefixtures("on_the_card")
def test_threads_feeding_one_card_share_its_graphs_one_capture_at_a_time(model, varied):
    """The thread backend's workers share one model: their batches go through the card's graphs,
    each bucket captured once, never two captures at once (the fake refuses a second under way:
    torch allows one in a process), and each thread's rows are its own."""
    texts = varied[0][:16]
    card = TorchCard(model, "cuda:0", cuda=FakeCuda(trace=False), graphs=True, batch_size=8)
    expected, _ = run(TorchCard(model, "cpu"), model, texts)
    got, failed = {}, []

    def feed(k):
        try:
            got[k] = run(card, model, texts if k == 0 else texts[::-1])[0]
        except Exception as exc:  # noqa: BLE001 (said below)
            failed.append(exc)

    threads = [threading.Thread(target=feed, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failed, failed
    np.testing.assert_allclose(got[0], expected, rtol=0, atol=2e-6)
    np.testing.assert_allclose(got[1], expected[::-1], rtol=0, atol=2e-6)
    single = TorchCard(model, "cuda:0", cuda=FakeCuda(trace=False), graphs=True,
                       batch_size=8)
    run(single, model, texts)
    assert card.graphs.counts.captured == single.graphs.counts.captured == len(card.graphs.graphs)
    assert card.graphs.counts.replayed == 2 * single.graphs.counts.replayed
    entered = {call[1] for call in card.cuda.calls if call[0] == "enter"}
    assert entered == {"copies-1", "copies-2"}  # every thread's copies on the card's one copy
    # stream, made with it; the captures on its side stream (torch's pool of 32 streams, handed
    # out in turn, would let a stream made per thread be the capture's)


def test_the_engine_empties_the_cache_only_between_captures(monkeypatch):
    """After an out-of-memory error in one worker of the thread backend, the engine empties
    torch's cache (release_memory); while another thread captures, that would trip torch's
    allocator: it waits for the capture's end (one process-wide lock)."""
    import torch

    from helpers.engine.workers.worker import release_memory

    order, capturing = [], threading.Event()

    class SlowCapture(FakeCuda):
        def capture(self, graph, forward, pool, stream):
            capturing.set()
            time.sleep(0.3)  # (the other thread asks to empty the cache meanwhile)
            out = super().capture(graph, forward, pool, stream)
            order.append("captured")
            return out

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("emptied"))
    card = graphs.CardGraphs(lambda ids, mask: (ids * mask).float().sum(1, keepdim=True), 8, 16,
                             0, SlowCapture(trace=False))
    ids = torch.ones((8, 16), dtype=torch.int64)
    capture = threading.Thread(target=card.run, args=(ids, torch.ones_like(ids)))
    capture.start()
    assert capturing.wait(10)
    release_memory("cuda:0")
    capture.join()
    assert order == ["captured", "emptied"]


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
    ({"cuda_graphs": "yes"}, r"cuda_graphs: expected True or False, got 'yes'"),
])
def test_graphs_with_an_option_that_has_none_are_refused(options, refused):
    with pytest.raises(ValueError, match=refused):
        EmbeddingWorkload(**{"cuda_graphs": True, **options})


@pytest.mark.usefixtures("on_the_card")
def test_every_pooling_is_captured_without_a_sync_and_pools_the_batch_s_tokens(model, varied):
    """sentence-transformers' poolings read the mask (the first token, the last, weights by
    position): all of them at once (their vectors side by side) are captured (no sync) and,
    with the buckets' padding, pool what the eager pass pools."""
    import copy

    model = copy.deepcopy(model)
    model[1].pooling_mode = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean",
                             "lasttoken")
    texts = varied[0][:11]
    card = TorchCard(model, "cuda:0", cuda=FakeCuda(), graphs=True, batch_size=8)
    rows, _ = run(card, model, texts)
    expected, _ = run(TorchCard(model, "cpu"), model, texts)
    assert rows.shape == (11, 6 * 384)
    np.testing.assert_allclose(rows, expected, rtol=0, atol=2e-6)
    assert card.graphs.counts.captured == 2


@pytest.mark.usefixtures("on_the_card")
def test_the_full_batches_buckets_are_captured_ahead_the_longest_first(st_model, monkeypatch):
    """In the worker's load: a bucket of ``batch_size`` rows for every length up to the model's
    (the longest first, so that the pool is sized once), none twice; a run of full batches then
    replays them and captures nothing (its last, short batch may)."""
    monkeypatch.setattr(st_model, "max_seq_length", 30)
    cuda = FakeCuda(trace=False)
    card = TorchCard(st_model, "cuda:0", cuda=cuda, graphs=True, batch_size=8)
    card.capture_ahead()
    assert list(card.graphs.graphs) == [(8, 30), (8, 24), (8, 16), (8, 8)]
    card.capture_ahead()
    assert card.graphs.counts.captured == 4
    from helpers.study.paths import sample_texts

    rows, _ = run(card, st_model, sample_texts(200)[:24])
    assert rows.shape == (24, 384) and card.graphs.counts.captured == 4
    assert card.graphs.counts.replayed == 3


@pytest.mark.usefixtures("on_the_card")
def test_a_batch_shorter_than_its_bucket_s_last_leaves_none_of_that_one_in_its_mask(model):
    """Two batches of one bucket (8 rows x 16 tokens), the second shorter: its rows are the
    eager pass's, none of the first's tokens past its own attended to."""
    import torch

    card = TorchCard(model, "cuda:0", cuda=FakeCuda(trace=False), graphs=True, batch_size=8)
    eager = TorchCard(model, "cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for tokens in (16, 10):
            ids = torch.randint(1000, 20000, (8, tokens), generator=generator)
            mask = torch.ones_like(ids)
            rows, computed = card.compute(ids, mask)
            torch.testing.assert_close(rows, eager.compute(ids, mask)[0], rtol=0, atol=2e-6)
            assert computed == 8 * 16
    assert card.graphs.counts.captured == 1
