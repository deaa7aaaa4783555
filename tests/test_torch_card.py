"""The torch card (helpers.workloads.embedding.cards.torch_card): encode's vectors from the
feeder's batches, with every option of encode's; the models it leaves to encode, and why; its
CUDA transfers (faked: CI has no GPU)."""
import numpy as np
import pytest

from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.embedding.cards.torch_card import STAGING_SLOTS, TorchCard, unsupported
from helpers.workloads.embedding.feeder import FedModel
from helpers.workloads.embedding.runtimes import cosines
from helpers.workloads.embedding.stored import stored_form

from fake_cuda import FakeCuda


@pytest.fixture(scope="module")
def texts():
    from helpers.study.paths import sample_texts

    chosen = sample_texts(2000)
    longest = sorted(chosen, key=len)[-4:]  # (past max_seq_length: truncated)
    return chosen[:150:5] + longest + ["Ünïcödé — ‘quotes’ 日本語", "a", "[MASK] me"]


def linked_copy(folder, change=None):
    """The embedded model's folder, its files linked, not copied; ``change(name, text)`` gives
    a JSON file's new text (or None: linked as it is)."""
    import os

    from helpers.workloads.embedding import default_model_path

    source = default_model_path()
    for root, _, files in os.walk(source):
        for name in files:
            path = os.path.join(root, name)
            target = folder / os.path.relpath(path, source)
            target.parent.mkdir(parents=True, exist_ok=True)
            text = change(name, open(path).read()) if change and name.endswith(".json") else None
            if text is None:
                target.symlink_to(path)
            else:
                target.write_text(text)
    return folder


@pytest.fixture(scope="module")
def unnormalized(tmp_path_factory):
    """MiniLM without its Normalize module (so that ``normalize`` changes the vectors), and
    sentence-transformers' own load of it."""
    import json

    from sentence_transformers import SentenceTransformer

    folder = linked_copy(tmp_path_factory.mktemp("minilm") / "unnormalized", lambda name, text: (
        json.dumps(json.loads(text)[:2]) if name == "modules.json" else None))
    return str(folder), SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def encoded(unnormalized, texts):
    """sentence-transformers' ``encode`` of ``texts`` by the unnormalized model, with
    ``max_seq_length`` and encode's options: each made once for the cases that ask for it."""
    _, st_model = unnormalized
    made = {}

    def encode(max_seq_length, **options):
        key = (max_seq_length, tuple(sorted(options.items())))
        if key not in made:
            length = st_model.max_seq_length
            try:
                st_model.max_seq_length = max_seq_length
                made[key] = st_model.encode(texts, batch_size=8, **options)  # (less padded)
            finally:
                st_model.max_seq_length = length
        return made[key]

    return encode


@pytest.mark.parametrize("options, encode_options", [
    ({}, {}),
    ({"normalize": True, "batch_size": 7}, {"normalize_embeddings": True}),
    ({"prompt": "query: "}, {"prompt": "query: "}),
    ({"max_seq_length": 24}, {}),
    ({"truncate_dim": 96, "normalize": True}, {"truncate_dim": 96, "normalize_embeddings": True}),
    ({"stored": "float16", "word_cache": False}, {}),
    ({"batch_tokens": 512, "tokenize_threads": 2}, {}),
])
def test_the_fed_path_gives_encode_s_vectors_with_the_same_options(unnormalized, encoded, texts,
                                                                   options, encode_options):
    folder, st_model = unnormalized
    workload = EmbeddingWorkload(model=folder, **options)
    model = workload.load("cpu", 2)
    assert isinstance(model, FedModel) and workload.report(model)["path"] == \
        "feeder -> torch on cpu"
    got = workload.process(model, texts)["embeddings"]
    expected = encoded(options.get("max_seq_length", st_model.max_seq_length), **encode_options)
    expected = stored_form(expected, workload.stored)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    found = cosines(expected.astype(np.float32), got.astype(np.float32))
    assert found.min() >= 0.9999, found.min()
    scale = np.abs(expected.astype(np.float32)).max()
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=0,
                               atol=scale * (1e-3 if workload.stored == "float16" else 1e-5))
    norms = np.linalg.norm(got.astype(np.float32), axis=1)
    assert np.allclose(norms, 1, atol=1e-3) == workload.normalize  # (the model's own: not 1)
    counts = workload.counts(model)
    assert counts["tokens_needed"] > len(texts) and "card_busy_us" not in counts
    assert (counts["texts_fast"] > 0.9 * len(texts)) == options.get("word_cache", True)


def test_a_prompt_the_model_names_is_the_one_fed(tmp_path, st_model, texts):
    """``prompt_name`` and ``task`` resolve to the model's own prompts (its
    config_sentence_transformers.json), put before every text by the feeder."""
    import json

    folder = linked_copy(tmp_path / "with-prompts", lambda name, text: json.dumps(
        {**json.loads(text), "prompts": {"query": "query: ", "document": "passage: "}})
        if name == "config_sentence_transformers.json" else None)
    for options, prompt in (({"prompt_name": "query"}, "query: "),
                            ({"task": "document"}, "passage: ")):
        workload = EmbeddingWorkload(model=str(folder), **options)
        model = workload.load("cpu", 2)
        assert workload.report(model)["prompt"] == prompt
        got = workload.process(model, texts[:20])["embeddings"]
        assert cosines(st_model.encode(texts[:20], prompt=prompt), got).min() >= 0.9999
        assert cosines(st_model.encode(texts[:20]), got).min() < 0.999  # (the prompt counts)


class Pooling:
    include_prompt = False


class Router:
    pass


class Transformer:
    modality_config = {"text": {}}


class Normalize:
    pass


class Model(list):
    tokenizer = type("Fast", (), {"backend_tokenizer": object()})()


@pytest.fixture
def fake_types(monkeypatch):
    """The fake modules below stand for sentence-transformers' own classes (unsupported() asks
    for those exactly); the tests that load real models keep the real classes."""
    from helpers.workloads.embedding.cards import torch_card

    monkeypatch.setattr(torch_card, "known_types", lambda: {
        "Transformer": Transformer, "Pooling": Pooling, "Normalize": Normalize})


@pytest.mark.usefixtures("fake_types")
@pytest.mark.parametrize("modules, prompt, task, reason", [
    ([Transformer(), Router()], None, "query", "include ['Router'], which the feeder does not run"
                                               " (it routes by task)"),
    ([Transformer(), Pooling()], "query: ", None, "leaves the prompt's tokens out"),
    ([Normalize(), Transformer()], None, None, "its first module is Normalize"),
])
def test_a_model_the_card_does_not_know_is_left_to_encode_with_the_reason(modules, prompt, task,
                                                                         reason):
    assert reason in unsupported(Model(modules), prompt, task)


@pytest.mark.usefixtures("fake_types")
def test_a_model_the_card_knows_is_not_left_to_encode():
    assert unsupported(Model([Transformer(), Pooling(), Normalize()]), None, None) is None
    images = Transformer()
    images.modality_config = {"text": {}, "image": {}}
    assert "not text alone" in unsupported(Model([images]), None, None)
    slow = Model([Transformer()])
    slow.tokenizer = object()
    assert "no Rust tokenizer" in unsupported(slow, None, None)


@pytest.mark.usefixtures("fake_types")
@pytest.mark.parametrize("setting, task, reason", [
    ({"processing_kwargs": {"text": {"max_length": 128}}}, None, "sets its tokenizer's"),
    ({"query_length": 32}, "query", "tokenizes by task ('query'"),
    ({"transformer_task": "text-generation"}, None, "'text-generation', not feature"),
])
def test_a_transformer_whose_tokenizing_sentence_transformers_changes_is_left_to_encode(
        setting, task, reason):
    """Settings sentence-transformers 6 applies in its own preprocess, which the feeder does
    not: encode runs such a model (a query_length without a task changes nothing)."""
    first = Transformer()
    for name, value in setting.items():
        setattr(first, name, value)
    assert reason in unsupported(Model([first, Pooling()]), None, task)
    if task is not None:
        assert unsupported(Model([first, Pooling()]), None, None) is None


def test_a_subclass_of_a_known_module_is_not_known(st_model):
    """A module that only shares a known module's name or class may compute otherwise: only
    sentence-transformers' own classes are run by the card."""
    from sentence_transformers import models

    class Pooling(models.Pooling):  # (its forward may differ)
        pass

    custom = Pooling(384)
    assert "include ['Pooling']" in unsupported(Model([st_model[0], custom]), None, None)
    assert unsupported(Model([st_model[0], st_model[1]]), None, None) is None


def test_sentence_transformers_before_6_strips_and_lowers_the_texts_fed(st_model):
    """sentence-transformers 5 stripped each text (prompt first), and lower-cased it where its
    transformer said do_lower_case, in Python; the fed path does the same for it."""
    workload = EmbeddingWorkload(prompt=" Query: ")
    fed = type("Fed", (FedModel,), {"__init__": lambda self: None})()
    fed.gpufeed_prompt, fed.strip_texts, fed.lower_texts = " Query: ", True, True
    assert workload._prompted(fed, ["  Hello World  "]) == ["query:   hello world"]
    fed.strip_texts = False  # (6: as given)
    assert workload._prompted(fed, ["  Hello World  "]) == [" Query:   Hello World  "]


def test_a_length_transformers_calls_very_large_is_no_length(st_model):
    """A tokenizer that says no length (transformers' 10**30) is not cut, not a crash."""
    from helpers.workloads.embedding.rust_tokenizer import UNBOUNDED, RustTokenizer

    rust = RustTokenizer.of(st_model.tokenizer, int(1e30))
    assert rust.max_length == UNBOUNDED
    assert len(rust.encode(["word " * 600])[0]) == 602


@pytest.mark.slow
def test_a_real_model_with_a_module_the_card_does_not_know_runs_through_encode(tmp_path, texts,
                                                                             st_model):
    """MiniLM with a LayerNorm module at its end: encode runs it, and the worker says why."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import LayerNorm

    folder = tmp_path / "with-layer-norm"
    extended = SentenceTransformer(modules=[*st_model, LayerNorm(384)], device="cpu")
    extended.save(str(folder))
    workload = EmbeddingWorkload(model=str(folder))
    model = workload.load("cpu", 2)
    assert not isinstance(model, FedModel)
    said = workload.report(model)["path"]
    assert said.startswith("encode (") and "LayerNorm" in said
    got = workload.process(model, texts[:30])["embeddings"]
    assert cosines(extended.encode(texts[:30]), got).min() >= 0.9999


def test_on_cuda_each_batch_is_copied_on_its_own_stream_and_collected_by_its_event(
        st_model, texts, monkeypatch):
    """Faked CUDA (the model stays on the CPU): the ids and mask are collated into pinned
    staging slots, copied without blocking inside the copy stream, the forward's stream waits
    for the copy's event, a slot is reused only after its copy's event, the rows come back
    into pinned memory and collect waits for their event; the rows are the CPU card's."""
    import torch

    cuda = FakeCuda()
    copies = []
    real_to = torch.Tensor.to

    def fake_to(self, *args, **kwargs):
        if args and str(args[0]).startswith("cuda"):
            copies.append((tuple(self.shape), kwargs.get("non_blocking"), list(cuda.entered)))
            return self
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    on_cuda = TorchCard(st_model, "cuda:0", cuda=cuda)
    on_cpu = TorchCard(st_model, "cpu")
    assert on_cuda.asynchronous and not on_cpu.asynchronous
    from helpers.workloads.embedding.feeder import Feeder
    from helpers.workloads.embedding.rust_tokenizer import RustTokenizer

    rust = RustTokenizer.of(st_model.tokenizer, st_model.max_seq_length)
    batches = STAGING_SLOTS + 3  # (the ring turns over)
    chosen = (texts * 2)[:8 * batches]
    rows, launched = Feeder(rust, on_cuda, 1).run(chosen, 8, None)
    expected, _ = Feeder(rust, on_cpu, 1).run(chosen, 8, None)
    np.testing.assert_allclose(rows, expected, atol=1e-6)
    assert len(copies) == 2 * batches  # ids and mask, each batch
    assert all(blocking is True and entered == ["copies-1"] for _, blocking, entered in copies)
    waits = [call for call in cuda.calls if call[0] == "wait"]
    assert waits == [("wait", "copies-1")] * batches  # the forward after its copy's event
    reused = [call for call in cuda.calls if call == ("synchronize", "copies-1")]
    assert len(reused) == batches - STAGING_SLOTS  # a slot waits for its last copy
    collected = [call for call in cuda.calls if call[0] == "synchronize" and call[1] == "compute"]
    assert len(collected) == batches  # collect waited for every batch's rows
    staged = [call for call in cuda.calls if call[0] == "pinned"]
    assert len(staged) >= 2 * STAGING_SLOTS + batches  # slots (ids, mask), rows back
    assert {dtype for _, _, dtype in staged} == {torch.int64, torch.float32}
    assert "card_busy_us" not in launched.counts.as_dict()
    half = FakeCuda()
    rows, _ = Feeder(rust, TorchCard(st_model, "cuda:0", cuda=half, half_rows=True), 1).run(
        chosen[:16], 8, None)
    assert rows.dtype == np.float16 and float16_back(half) == 2  # half the bytes, each batch
    np.testing.assert_allclose(rows.astype(np.float32), expected[:16], atol=1e-3)


def float16_back(cuda):
    import torch

    return sum(1 for call in cuda.calls if call[0] == "pinned" and call[2] == torch.float16)


def test_on_cuda_without_pinned_memory_the_copies_block(st_model, texts, monkeypatch):
    import torch

    copies = []
    real_to = torch.Tensor.to

    def fake_to(self, *args, **kwargs):
        if args and str(args[0]).startswith("cuda"):
            copies.append(kwargs.get("non_blocking", False))
            return self
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    cuda = FakeCuda()
    card = TorchCard(st_model, "cuda:0", pinned=False, cuda=cuda)
    ids, mask = card.staging(2, 5)
    assert not any(call[0] == "pinned" for call in cuda.calls)
    ids[:], mask[:] = 101, 1
    card.collect([card.submit(ids, mask)])
    assert copies == [False, False]


class _Graph:
    """A CUDA graph whose capture ends as told (``fails``: CUDA's error at its end)."""

    def __init__(self, fails: bool = False) -> None:
        self.fails, self.ended = fails, False

    def capture_begin(self, pool, capture_error_mode):
        assert capture_error_mode == "thread_local"

    def capture_end(self):
        self.ended = True
        if self.fails:
            raise RuntimeError("CUDA error: operation failed due to a previous error during "
                               "capture")


def _calls(ended, refuses=False):
    """The real CudaCalls of cuda:1 over a stand-in for the few torch calls a capture makes."""
    import contextlib
    from types import SimpleNamespace

    import torch

    from helpers.workloads.embedding.cards.torch_card import CudaCalls

    def end(index, pool):
        ended.append((index, pool))
        if refuses:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    calls = CudaCalls(torch.device("cuda:1"))
    calls.torch = SimpleNamespace(
        _C=SimpleNamespace(_cuda_endAllocateToPool=end),
        cuda=SimpleNamespace(stream=lambda stream: contextlib.nullcontext(),
                             Event=lambda **options: options))
    return calls


def test_a_failed_capture_leaves_the_allocator_routing_nothing_to_its_pool():
    """A forward that fails in a capture (a sync CUDA refuses), or a capture whose end fails:
    the allocator is told the capture into the pool is over (torch releases that raise at
    capture_end before telling it leave every later empty_cache() tripping an assertion); a
    capture that succeeds is not touched, and an allocator that was told already is ignored."""
    ended = []

    def sync():
        raise RuntimeError("operation not permitted when stream is capturing")

    graph = _Graph(fails=True)
    with pytest.raises(RuntimeError, match="not permitted"):
        _calls(ended).capture(graph, sync, (0, 7), "side")
    assert graph.ended and ended == [(1, (0, 7))]
    ended.clear()
    with pytest.raises(RuntimeError, match="previous error"):
        _calls(ended).capture(_Graph(fails=True), lambda: "rows", (0, 8), "side")
    assert ended == [(1, (0, 8))]
    ended.clear()
    assert _calls(ended).capture(_Graph(), lambda: "rows", (0, 9), "side") == "rows"
    assert ended == []
    with pytest.raises(RuntimeError, match="not permitted"):  # (told already: refused, ignored)
        _calls(ended, refuses=True).capture(_Graph(fails=True), sync, (0, 10), "side")
    assert ended == [(1, (0, 10))]


def test_the_card_s_events_sleep_while_a_worker_waits():
    """cudaEventBlockingSync: a default event's synchronize spins a core, one a worker's
    tokenizing processes need."""
    assert _calls([]).event() == {"blocking": True}
