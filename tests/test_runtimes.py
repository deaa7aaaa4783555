"""How the embedding model runs (helpers.workloads.embedding.runtimes): each variant's clear
refusal where it cannot run, the ONNX export made once and reused, and the quality guard that passes a faithful
variant and refuses one that is not (with its numbers)."""
import json
import threading
import time

import numpy as np
import pytest

from helpers import read_output, run_pipeline
from helpers.workloads.embedding import runtimes
from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.embedding.runtimes import check_variant

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("precision, runtime, device, said", [
    ("fp16", "torch", "cpu", "precision='fp16' runs on CUDA devices only"),
    ("fp32", "onnx", "cuda:0", "runtime='onnx' runs on CPU devices"),
    ("bf16", "onnx-int8", "cpu", "precision='bf16' is for runtime='torch'"),
    ("fp8", "torch", "cpu", "precision: expected one of fp32, bf16, fp16, got 'fp8'"),
    ("fp32", "tensorrt", "cpu", "runtime: expected one of torch, onnx, onnx-int8"),
])
def test_a_variant_that_cannot_run_on_its_device_is_named_before_anything_loads(
        precision, runtime, device, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        check_variant(precision, runtime, device)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_pool_on_a_device_its_variant_cannot_use_is_refused_before_any_worker(tmp_path,
                                                                              backend):
    """fp16 on a CPU: a bad argument (ValueError, exit 2), said by the driver; before, a worker
    spawned, loaded and died with a remote traceback (exit 1)."""
    with pytest.raises(ValueError, match="precision='fp16' runs on CUDA devices only"):
        run_pipeline([(0, "a text")], EmbeddingWorkload(precision="fp16"), ["cpu"],
                     output=tmp_path / "o.h5", backend=backend, progress=False)
    assert not list(tmp_path.iterdir())


def test_bf16_on_a_cuda_device_without_it_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match="cuda:1 does not support bfloat16"):
        check_variant("bf16", "torch", "cuda:1")
    with pytest.raises(ValueError, match="fp16"):
        EmbeddingWorkload(precision="fp16", runtime="onnx")
    with pytest.raises(ValueError, match="guard: expected"):
        EmbeddingWorkload(guard=(0.99, 1.5))


@pytest.fixture(scope="module")
def minilm():
    from helpers.workloads.embedding import load_sentence_transformer

    return load_sentence_transformer(None, "cpu", 2)


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    """One export cache for this file's runs of the onnx variants: MiniLM exported once and
    quantised once for all of them (an export and its reuse from a cache of its own:
    test_the_onnx_export_is_made_once_and_reused)."""
    return str(tmp_path_factory.mktemp("onnx-cache"))


def test_the_onnx_export_is_made_once_and_reused(tmp_path, monkeypatch, minilm):
    """Two workers asking at once: one exports (under the lock), the other waits and reuses the
    file; a second ask exports nothing."""
    made, real = [], runtimes._export
    monkeypatch.setattr(runtimes, "_export", lambda *args: made.append(1) or real(*args))
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(runtimes.exported(
        minilm, "onnx", tmp_path))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and paths[0] == paths[1] and paths[0].stat().st_size > 10 << 20
    assert runtimes.exported(minilm, "onnx", tmp_path) == paths[0] and len(made) == 1
    assert [p.name for p in paths[0].parent.iterdir() if p.suffix == ".onnx"] == ["onnx.onnx"]


def test_onnx_int8_is_quantised_again_where_its_settings_or_onnxruntime_change(
        tmp_path, monkeypatch, minilm):
    """The int8 file is named by what makes it besides the export: another onnxruntime or
    other settings make a file of their own (the export itself is reused), the same ones reuse
    theirs. (The export and the quantising are stubs: what is tested is which file is made.)"""
    import onnxruntime

    exported = tmp_path / f"onnx-{runtimes.weights_digest(minilm)}" / "onnx.onnx"
    exported.parent.mkdir()
    exported.write_bytes(b"exported")
    made = []
    monkeypatch.setattr(runtimes, "_quantized", lambda source, path: made.append(
        source) or path.write_bytes(b"quantised"))
    first = runtimes.exported(minilm, "onnx-int8", tmp_path)
    assert runtimes.exported(minilm, "onnx-int8", tmp_path) == first and len(made) == 1
    monkeypatch.setattr(runtimes, "QUANTIZED_EXCLUDE", ("/0/auto_model/pooler/",))
    excluded = runtimes.exported(minilm, "onnx-int8", tmp_path)
    monkeypatch.setattr(onnxruntime, "__version__", "0.0.1")
    upgraded = runtimes.exported(minilm, "onnx-int8", tmp_path)
    assert len({first, excluded, upgraded}) == 3 and made == [exported] * 3
    assert first.parent == excluded.parent == upgraded.parent
    assert sorted(p.name for p in first.parent.glob("*.onnx")) == sorted(
        ["onnx.onnx", first.name, excluded.name, upgraded.name])  # (exported once)


def test_the_export_cache_tells_apart_models_whose_weights_are_the_same(minilm):
    """Pooling and normalisation hold no weights: the key reads the modules and their settings
    too, or a model without Normalize would reuse this one's export (and its unit vectors)."""
    from sentence_transformers import SentenceTransformer

    unnormalised = SentenceTransformer(modules=[minilm[0], minilm[1]], device="cpu")
    assert runtimes.weights_digest(unnormalised) != runtimes.weights_digest(minilm)
    assert runtimes.weights_digest(minilm) == runtimes.weights_digest(minilm)


def test_measuring_tokens_in_one_thread_never_breaks_another_threads_encode(minilm):
    """A fast tokenizer keeps its padding on itself: measuring with the shared one switched it
    off under another thread's encode, which then failed to make its tensors."""
    texts = [("word " * (i % 37 + 1)).strip() for i in range(64)]
    stop, errors = time.monotonic() + 3, []

    def measure():
        while time.monotonic() < stop:
            runtimes.token_lengths(minilm, texts)

    def tokenize():
        while time.monotonic() < stop:
            try:
                minilm.tokenize(texts)
            except Exception as exc:  # noqa: BLE001 (what failed is the finding)
                errors.append(exc)

    threads = [threading.Thread(target=measure), threading.Thread(target=tokenize)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, f"{len(errors)} encode tokenizations failed: {errors[0]}"
    assert runtimes.token_lengths(minilm, ["one two three"]) == [5]  # [CLS] 3 words [SEP]


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnx", "onnx-int8"])
def test_an_onnx_variant_passes_the_guard_and_runs_in_the_pipeline(tmp_path, monkeypatch,
                                                                    onnx_cache, runtime):
    """The variant's embeddings of the run's texts are those of float32 PyTorch (cosine), and
    the output says which variant wrote them and what the guard measured."""
    from helpers.study.paths import sample_texts

    monkeypatch.setenv(runtimes.CACHE_ENV, onnx_cache)
    texts = sample_texts(48)
    reference = run_pipeline(list(enumerate(texts)), EmbeddingWorkload(), ["cpu"], 32,
                             tmp_path / "fp32.h5", "thread", progress=False)
    stats = run_pipeline(list(enumerate(texts)), EmbeddingWorkload(runtime=runtime), ["cpu"],
                         32, tmp_path / "variant.h5", "thread", progress=False)
    assert reference.records == stats.records == 48
    assert stats.padding >= 1.0 and stats.counts["tokens_needed"] == \
        reference.counts["tokens_needed"]  # (the model's own tokenizer: the same tokens)
    fp32, variant = read_output(tmp_path / "fp32.h5"), read_output(tmp_path / "variant.h5")
    found = runtimes.cosines(fp32["embeddings"], variant["embeddings"])
    assert found.min() > (0.9999 if runtime == "onnx" else 0.98)
    loaded = json.loads(variant["attrs"]["loaded"])["cpu"]
    assert loaded["runtime"] == runtime and loaded["guard_mean_cosine"] >= 0.99
    assert variant["attrs"]["runtime"] == runtime
    if runtime == "onnx":  # encode's options on the exported modules (the export reused)
        options = EmbeddingWorkload(runtime="onnx", prompt="query: ", truncate_dim=64,
                                    normalize=True, batch_size=16)
        model = options.load("cpu", 1)
        got = options.process(model, texts)["embeddings"]
        want = model.model.encode(texts, prompt="query: ", truncate_dim=64,
                                  normalize_embeddings=True)
        assert got.shape == (48, 64) and runtimes.cosines(want, got).min() > 0.9999
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_a_variant_that_fails_the_guard_is_refused_with_its_numbers(tmp_path, monkeypatch,
                                                                     onnx_cache):
    """int8 weights cannot give float32's embeddings to 5 nines: asked for that, the worker
    refuses to load the variant (no record is embedded by it) and says by how much."""
    from helpers import PipelineError

    monkeypatch.setenv(runtimes.CACHE_ENV, onnx_cache)
    strict = EmbeddingWorkload(runtime="onnx-int8", guard=(0.99999, 0.9999))
    with pytest.raises(PipelineError, match=r"QualityRefused: precision='fp32' "
                                            r"runtime='onnx-int8' on cpu: .* mean cosine "
                                            r"0\.\d+ \(needs >= 0\.99999\), least 0\.\d+ "
                                            r"\(needs >= 0\.9999\): refused"):
        run_pipeline([(0, "a text")], strict, ["cpu"], 8, tmp_path / "out.h5", "thread",
                     progress=False)


def test_a_resume_with_another_variant_is_refused(tmp_path, monkeypatch):
    """Embeddings of two variants must not mix in one output."""
    from helpers import OutputError

    monkeypatch.setenv(runtimes.CACHE_ENV, str(tmp_path / "cache"))
    records = [(i, f"text number {i}") for i in range(40)]
    run_pipeline(records, EmbeddingWorkload(), ["cpu"], 8, tmp_path / "out.h5", "thread",
                 progress=False, limit=16)
    with pytest.raises(OutputError, match="runtime"):
        run_pipeline(records, EmbeddingWorkload(runtime="onnx"), ["cpu"], 8,
                     tmp_path / "out.h5", "thread", progress=False, resume=True)
    assert len(read_output(tmp_path / "out.h5")["ids"]) == 16


@pytest.mark.slow
def test_bf16_on_cpu_passes_the_guard_and_is_not_float32(tmp_path, tiny_model):
    """The weights cast to bfloat16 (what a card or a CPU with bfloat16 instructions runs
    fastest; emulated on this one, at about a fifth of float32's rate): close to float32's
    embeddings, not equal to them, and said so in the output. The run embeds the guard's 16
    shortest texts (18 to 223 characters: the guard, in the load, embeds all 64 in both), so its
    least cosine is at least the guard's least. A one-layer model (the cast and the guard do not
    depend on its size: 47 s with MiniLM here; MiniLM's bf16 figures are the GPU check's and
    bench runtimes')."""
    texts = list(enumerate(sorted(runtimes.guard_texts(), key=len)[:16]))
    run_pipeline(texts, EmbeddingWorkload(model=tiny_model), ["cpu"], 16, tmp_path / "fp32.h5",
                 "thread", progress=False)
    run_pipeline(texts, EmbeddingWorkload(model=tiny_model, precision="bf16"), ["cpu"], 16,
                 tmp_path / "bf16.h5", "thread", progress=False)
    fp32, bf16 = read_output(tmp_path / "fp32.h5"), read_output(tmp_path / "bf16.h5")
    assert bf16["embeddings"].dtype == np.float32
    found = runtimes.cosines(fp32["embeddings"], bf16["embeddings"])
    assert 0.98 < found.min() and found.max() < 1.0 - 1e-7  # (close, and not float32 itself)
    loaded = json.loads(bf16["attrs"]["loaded"])["cpu"]
    assert loaded["precision"] == "bf16" and loaded["guard_s"] > 0
    assert 0.98 < loaded["guard_min_cosine"] <= found.min() + 1e-3 and \
        loaded["guard_min_cosine"] <= loaded["guard_mean_cosine"] < 1.0 - 1e-7


@pytest.mark.slow
def test_compile_runs_the_compiled_transformer_checked_by_the_guard_in_the_load(tmp_path,
                                                                               tiny_model):
    """torch.compile really compiles the transformer (a graph captured, not a silent eager
    fallback), in the worker's load, and its embeddings are float32 PyTorch's (a one-layer
    transformer: what compiling does not depend on the model's size; the GPU check compiles
    MiniLM's shape on a card)."""
    from torch._dynamo.utils import counters

    texts = [(i, text) for i, text in enumerate(runtimes.guard_texts()[:24])]
    run_pipeline(texts, EmbeddingWorkload(model=tiny_model), ["cpu"], 8, tmp_path / "eager.h5",
                 "thread", progress=False)
    counters.clear()
    run_pipeline(texts, EmbeddingWorkload(model=tiny_model, compile=True), ["cpu"], 8,
                 tmp_path / "compiled.h5", "thread", progress=False)
    assert counters["stats"]["unique_graphs"] >= 1 and counters["inductor"]
    eager, compiled = read_output(tmp_path / "eager.h5"), read_output(tmp_path / "compiled.h5")
    assert runtimes.cosines(eager["embeddings"], compiled["embeddings"]).min() > 0.9999
    loaded = json.loads(compiled["attrs"]["loaded"])["cpu"]
    assert loaded["compile"] is True and loaded["guard_s"] > 0 and \
        loaded["guard_min_cosine"] > 0.9999
    with pytest.raises(ValueError, match="compile: torch.compile is for runtime='torch'"):
        EmbeddingWorkload(compile=True, runtime="onnx")


def test_on_a_cuda_device_encode_s_batches_go_through_pinned_memory(monkeypatch):
    """Faked: the two torch calls the transfer makes (pin_memory, a non-blocking copy), on a
    model loaded for cuda:0 through encode (feeder=False; the torch card's own transfers:
    tests/test_torch_card.py) (its tensors stay on the CPU: the fake copy is a no-op); none on a
    CPU device or with pin_memory=False."""
    import torch

    calls = []
    real_to = torch.Tensor.to

    def fake_to(self, *args, **kwargs):
        if args and str(args[0]).startswith("cuda"):
            calls.append(("to", str(args[0]), kwargs.get("non_blocking")))
            return self
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin") or self)
    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    loaded = {}
    for device, pin in (("cuda:0", True), ("cpu", True), ("cuda:0", False)):
        model = EmbeddingWorkload(pin_memory=pin, feeder=False).load(device, 2)  # (moved)
        calls.clear()
        model.preprocess(["a text", "another text"])
        loaded[device, pin] = list(calls)
    assert loaded["cuda:0", True] == ["pin", ("to", "cuda:0", True)] * 3  # (ids, types, mask)
    assert loaded["cpu", True] == loaded["cuda:0", False] == []
    runtimes_pinned = runtimes.pinned(lambda texts: {"ids": torch.ones(2), "modality": "text"},
                                       "cuda:1")
    calls.clear()
    assert runtimes_pinned(["x"])["modality"] == "text" and calls == ["pin", ("to", "cuda:1", True)]


def test_onnx_refuses_the_options_its_exported_modules_cannot_follow():
    """A pooling that leaves the prompt's tokens out, a model that routes by task: both need
    sentence-transformers' own modules (runtime torch); refused, not quietly wrong."""
    from helpers.engine.contract.protocol import OptionRefused
    from helpers.workloads.embedding.loading import check_exportable

    class Pooling:
        include_prompt = False

    class Router:
        pass

    class Model(list):
        gpufeed_prompt = "Represent this sentence: "

    with pytest.raises(OptionRefused, match="leaves the prompt's tokens out"):
        check_exportable(EmbeddingWorkload(runtime="onnx"), Model([object(), Pooling()]))
    with pytest.raises(OptionRefused, match="routes each text by its task"):
        check_exportable(EmbeddingWorkload(runtime="onnx", task="query"), Model([Router()]))
    check_exportable(EmbeddingWorkload(runtime="onnx", task="query"), Model([object()]))
