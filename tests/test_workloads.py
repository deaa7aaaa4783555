import pickle

import numpy as np
import pytest

from helpers.workloads import EmbeddingWorkload, SyntheticWorkload, Workload
from helpers.workloads.synthetic import InjectedFailure


@pytest.mark.parametrize("workload", [EmbeddingWorkload(), SyntheticWorkload(speed={"a": 2.0})])
def test_workloads_follow_the_protocol_and_pickle(workload):
    assert isinstance(workload, Workload)
    assert pickle.loads(pickle.dumps(workload)) == workload


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"), ({"model": 3}, "model")])
def test_embedding_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EmbeddingWorkload(**kwargs)


def test_embedding_checks_records():
    workload = EmbeddingWorkload()
    workload.check_record("a text")
    for bad in (None, 3, b"bytes"):
        with pytest.raises(TypeError, match="expected a text string"):
            workload.check_record(bad)


def test_embedding_normalize_and_any_model_path(st_model):
    from helpers.workloads.embedding import default_model_path

    workload = EmbeddingWorkload(model=default_model_path(), normalize=True, batch_size=4)
    model = workload.load("cpu", 1)
    assert workload.outputs(model)["embeddings"].shape == (384,)
    out = workload.process(model, ["one text", "another, longer text"])["embeddings"]
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert workload.attrs()["model"] == default_model_path()


def test_tokenizing_ahead_gives_encode_s_embeddings_and_splits_the_phases(st_model, texts):
    workload = EmbeddingWorkload(batch_size=4, tokenize_ahead=True)
    model = workload.load("cpu", 1)
    out = workload.process(model, texts[:30])["embeddings"]
    np.testing.assert_allclose(out, st_model.encode(texts[:30], batch_size=4), atol=1e-5, rtol=0)
    phases = workload.phases(model)
    assert set(phases) == {"tokenize", "forward", "copy_out"} and phases["forward"] > 0
    assert workload.attrs()["tokenize_ahead"] is True
    with pytest.raises(ValueError, match="tokenize_ahead"):
        EmbeddingWorkload(tokenize_ahead="yes")


@pytest.mark.slow
def test_padding_is_counted_per_workunit_and_sorting_by_length_cuts_it(tmp_path):
    """The tokens each batch computes against those its texts need: mixed lengths in a
    workunit pad; the reader's length-sorted window pads less; the stats and the timeline say
    so."""
    from helpers import run_pipeline
    from helpers.study.paths import sample_texts

    workload = EmbeddingWorkload(batch_size=8)
    records = list(enumerate(sample_texts(96)))  # (in the corpus's order: lengths mixed)
    unsorted = run_pipeline(records, workload, ["cpu"], 32, tmp_path / "a.h5", "thread",
                            progress=False, sort_window=0)
    ordered = run_pipeline(records, workload, ["cpu"], 32, tmp_path / "b.h5", "thread",
                           progress=False)
    assert unsorted.counts["tokens_needed"] == ordered.counts["tokens_needed"] > 96
    assert 1.0 <= ordered.padding < unsorted.padding
    assert all(span.padding >= 1.0 for span in ordered.timeline)
    assert f"padding: {ordered.padding:.2f}x" in ordered.summary()
    assert ordered.to_dict()["padding"] == ordered.padding


@pytest.mark.slow
def test_batches_by_token_count_pad_less_and_give_encode_s_embeddings(st_model):
    """A workunit's texts batched by their token counts (TokenOrder), not their characters:
    the same embeddings as ``encode`` (in the records' order), fewer tokens computed."""
    from helpers.study.paths import sample_texts

    texts = sorted(sample_texts(400), key=len)[::5]  # 80 texts, sorted by characters
    workload = EmbeddingWorkload(batch_size=8, feeder=False)  # (encode's path)
    model = workload.load("cpu", 2)
    out = workload.process(model, texts)["embeddings"]
    by_tokens = workload.counts(model)
    np.testing.assert_allclose(out, st_model.encode(texts, batch_size=8), atol=1e-5, rtol=0)
    del model._input_length  # (encode's own sort: by characters)
    workload.process(model, texts)
    by_characters = workload.counts(model)
    assert by_tokens["tokens_needed"] == by_characters["tokens_needed"]
    assert by_tokens["tokens_computed"] < 0.9 * by_characters["tokens_computed"], \
        (by_tokens, by_characters)


def test_tokenize_ahead_runs_the_next_expected_batch_in_its_helper_and_never_answers_wrong():
    import threading

    from helpers.workloads.embedding import TokenizeAhead

    calls = []

    def tokenize(batch, prompt=None):
        calls.append((tuple(batch), prompt, threading.current_thread().name))
        return [f"{prompt}:{text}" for text in batch]

    ahead = TokenizeAhead(tokenize)
    ahead.expect([["a", "b"], ["c", "d"], ["e"]])
    assert ahead(["a", "b"], prompt="q") == ["q:a", "q:b"]  # the first: here and now
    assert ahead(["c", "d"], prompt="q") == ["q:c", "q:d"]  # tokenized while "a b" ran
    assert ahead(["x"], prompt="q") == ["q:x"]  # not expected: tokenized here, still right
    assert ahead(["e"], prompt="q") == ["q:e"]
    here = threading.current_thread().name
    assert {batch: where == here for batch, _, where in calls} == \
        {("a", "b"): True, ("c", "d"): False, ("e",): False, ("x",): True} and len(calls) == 4
    assert {prompt for _, prompt, _ in calls} == {"q"}


def test_synthetic_speed_factor_scales_cost():
    workload = SyntheticWorkload(0.01, speed={"cuda:1": 0.25})
    assert workload.load("cuda:1", 1)["cost"] == pytest.approx(0.04)
    assert workload.load("cuda:0", 1)["cost"] == pytest.approx(0.01)


@pytest.mark.parametrize("kwargs", [{"mode": "nap"}, {"speed": {"x": 0}},
                                    {"seconds_per_record": -1}])
def test_synthetic_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        SyntheticWorkload(**kwargs)


def test_synthetic_failure_injection():
    with pytest.raises(InjectedFailure):
        SyntheticWorkload(fail_on_load=True).load("cpu", 1)
    workload = SyntheticWorkload(0.0, fail_on_records={"bad"})
    model = workload.load("cpu", 1)
    assert workload.process(model, ["ok", "fine"])["values"].shape == (2, 8)
    with pytest.raises(InjectedFailure, match="'bad'"):
        workload.process(model, ["ok", "bad"])


# --- binning --------------------------------------------------------------------------------------

BINNING_SAMPLE = ("page_000.png", "chart_003.png", "collage_000.jpg", "photo_coffee.jpg",
                  "photo_object_detection_input.jpg", "photo_grass.jpg")


@pytest.fixture(scope="module")
def binning_model():
    from helpers.workloads.binning import BinningWorkload

    workload = BinningWorkload()
    return workload, workload.load("cpu", 1)


def test_binning_follows_the_protocol_and_rejects_bad_settings():
    from helpers.workloads.binning import BinningWorkload

    workload = BinningWorkload(thresholds={"object_count_threshold": 7})
    assert isinstance(workload, Workload) and workload.thresholds.object_count_threshold == 7
    assert pickle.loads(pickle.dumps(workload)) == workload
    for kwargs, message in (({"prompts": ()}, "prompts"), ({"threads": 0}, "threads"),
                            ({"score_threshold": 1.5}, "score_threshold")):
        with pytest.raises(ValueError, match=message):
            BinningWorkload(**kwargs)


@pytest.mark.slow
def test_binning_known_images_land_where_expected(binning_model):
    from helpers.study.paths import DATA

    workload, model = binning_model
    images = [workload.prepare(str(DATA / "images" / name)) for name in BINNING_SAMPLE]
    out = workload.process(model, images)
    specs = workload.outputs(model)
    for name, spec in specs.items():
        spec.check(name, out[name], len(images))
    by_name = dict(zip(BINNING_SAMPLE, range(len(BINNING_SAMPLE))))
    page = by_name["page_000.png"]
    assert out["bin"][page] == "A" and out["text_boxes"][page] >= 10 and out["text_area"][page] > 0.2
    assert "documentation" in out["text"][page].lower()
    photo = by_name["photo_object_detection_input.jpg"]
    assert {"person", "horse", "dog"} <= set(out["classes"][photo].split())
    assert out["caption"][photo].startswith("a photo of a person")
    assert out["bin"][by_name["collage_000.jpg"]] == "B"
    assert out["bin"][by_name["photo_grass.jpg"]] == "C" and out["similarity"][by_name["photo_grass.jpg"]] == 0
    assert (out["ocr_s"] > 0).all() and (out["detector_s"] > 0).all()


def test_binning_a_one_pixel_image_is_valid(binning_model, tmp_path):
    from PIL import Image

    workload, model = binning_model
    Image.new("RGB", (1, 1), "white").save(tmp_path / "dot.png")
    out = workload.process(model, [workload.prepare(str(tmp_path / "dot.png"))])
    assert out["bin"].tolist() == ["C"] and out["objects"].tolist() == [0]
    assert out["text_boxes"].tolist() == [0] and out["caption"].tolist() == ["a photo"]


def test_make_workload_builds_each_by_name_with_the_knobs_that_apply_to_it():
    from helpers.workloads import BinningWorkload, make_workload

    embedding = make_workload("embedding", None, 8, seconds_per_record=0.5, normalize=True)
    assert embedding == EmbeddingWorkload(batch_size=8, normalize=True)  # seconds: not its knob
    synthetic = make_workload("synthetic", "some/model", None, 0.25, {"cuda:0": 2.0})
    assert synthetic == SyntheticWorkload(0.25, {"cuda:0": 2.0})  # batch size None: its default
    binning = make_workload("binning", "some/model", prompts=("a cat",))
    assert isinstance(binning, BinningWorkload) and binning.similarity_model == "some/model"
    assert binning.prompts == ("a cat",)
    with pytest.raises(ValueError, match="workload: expected one of .'embedding', 'synthetic', "
                                         "'binning'., got 'llm'"):
        make_workload("llm")


def _time_copies(workload, copies, units=5):
    """Seconds for ``copies`` model copies on cuda:0, each running ``units`` workunits at once."""
    import threading
    import time

    models = [{**workload.load("cuda:0", 1), "copy": c} for c in range(copies)]
    threads = [threading.Thread(target=lambda m=m: [workload.process(m, ["r"])
                                                     for _ in range(units)]) for m in models]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def test_synthetic_devices_saturate_at_their_parallelism_and_pay_per_workunit():
    workload = SyntheticWorkload(0.0, seconds_per_workunit=0.04, parallelism={"cuda:0": 2})
    assert workload.device_parallelism("cuda:0") == 2 and workload.device_parallelism("cpu") is None
    one, two, four = (_time_copies(workload, k) for k in (1, 2, 4))
    assert two < 1.3 * one  # two at once: the device runs both
    assert four >= 2 * 5 * 0.04  # four: two wait while two run (each copy's 5 workunits,
    # two copies at a time: 0.4 s at least however loaded the machine; 0.2 s unlimited)
    free = SyntheticWorkload(0.0, seconds_per_workunit=0.04)  # no limit: every copy at once
    assert _time_copies(free, 4) < 1.3 * one
    assert pickle.loads(pickle.dumps(workload)).locks == workload.locks  # workers share them


@pytest.mark.parametrize("kwargs", [{"parallelism": 0}, {"parallelism": {"cuda:0": 1.5}},
                                    {"seconds_per_workunit": -1}])
def test_synthetic_rejects_bad_device_models(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SyntheticWorkload(**kwargs)


def _cosine_floor(got, want):
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    return float((got * want).sum(axis=1).min())


@pytest.mark.parametrize("options, encode_options", [
    ({"prompt": "query: "}, {"prompt": "query: "}),
    ({"prompt_name": "document"}, {"prompt_name": "document"}),
    ({"task": "query"}, {"task": "query"}),
    ({"truncate_dim": 64, "normalize": True},
     {"truncate_dim": 64, "normalize_embeddings": True}),
    ({"max_seq_length": 12}, {}),
])
def test_each_encode_option_gives_encode_s_vectors(st_model, texts, options, encode_options):
    """What a worker computes with each option equals ``model.encode`` given the same."""
    workload = EmbeddingWorkload(batch_size=8, **options)
    model = workload.load("cpu", 1)
    got = workload.process(model, texts)["embeddings"]
    plain = st_model.encode(texts, batch_size=8)
    length = st_model.max_seq_length
    st_model.max_seq_length = options.get("max_seq_length", length)
    try:
        want = st_model.encode(texts, batch_size=8, **encode_options)
    finally:
        st_model.max_seq_length = length
    assert got.shape == want.shape and got.dtype == np.float32
    assert _cosine_floor(got, want) >= 0.9999
    if "prompt" in options or "max_seq_length" in options:  # (the option did something)
        assert _cosine_floor(got, plain) < 0.999
    if "truncate_dim" in options:
        assert workload.outputs(model)["embeddings"].shape == (64,)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_stored_forms_are_encode_s_precision(st_model, texts):
    """binary and ubinary bit for bit; int8 and uint8 cut with the given ranges as
    quantize_embeddings cuts them: bit for bit from our own floats, a step apart at most from
    encode's (where a float differs in its last bits: how many depends on the CPU's kernels,
    1.06 % of them on one machine, under 1 % on others); float16 the float32 rounded."""
    from sentence_transformers.util.quantization import quantize_embeddings

    reference = st_model.encode(texts, batch_size=8)
    ranges = np.vstack((reference.min(0), reference.max(0)))
    plain = EmbeddingWorkload(batch_size=8)
    ours = plain.process(plain.load("cpu", 1), texts)["embeddings"]
    for stored in ("binary", "ubinary", "int8", "uint8", "float16"):
        workload = EmbeddingWorkload(batch_size=8, stored=stored,
                                     ranges=ranges if stored.endswith("int8") else None)
        model = workload.load("cpu", 1)
        got = workload.process(model, texts)["embeddings"]
        workload.outputs(model)["embeddings"].check("embeddings", got, len(texts))
        if stored.endswith("binary"):
            np.testing.assert_array_equal(got, st_model.encode(texts, batch_size=8,
                                                               precision=stored))
        elif stored.endswith("int8"):
            np.testing.assert_array_equal(got, quantize_embeddings(ours, stored, ranges=ranges))
            want = quantize_embeddings(reference, stored, ranges=ranges)
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
            assert (got == want).mean() >= 0.98
        else:
            np.testing.assert_allclose(got.astype(np.float32), reference, atol=2e-3)


@pytest.mark.parametrize("options, message", [
    ({"prompt": "a", "prompt_name": "query"}, "give one"),
    ({"task": "search"}, "task: expected one of query, document"),
    ({"max_seq_length": 0}, "max_seq_length: expected a positive integer"),
    ({"truncate_dim": 2.5}, "truncate_dim: expected a positive integer"),
    ({"stored": "int8"}, "needs the calibration ranges"),
    ({"stored": "int4"}, "stored: expected one of"),
    ({"stored": "int8", "ranges": np.zeros((2, 8)), "truncate_dim": 4}, "calibrate on"),
    ({"card": "h100", "stored": "binary"}, "computes no vectors"),
    ({"card": "h100", "task": "query"}, "give the prompt's text"),
])
def test_encode_options_are_checked_before_any_worker_starts(options, message):
    with pytest.raises(ValueError, match=message):
        EmbeddingWorkload(**options)


def test_a_prompt_name_the_model_lacks_is_refused_naming_its_prompts():
    from helpers.workloads.embedding import resolve_prompt

    class Model:
        prompts, default_prompt_name = {"query": "q: ", "document": "d: "}, "document"

    assert resolve_prompt(Model(), None, None, None) == "d: "  # (the model's default)
    assert resolve_prompt(Model(), None, None, "query") == "q: "
    assert resolve_prompt(Model(), "x: ", None, "query") == "x: "
    with pytest.raises(ValueError, match=r"no prompt of that name \(its prompts: "
                                         r"\['document', 'query'\]\)"):
        resolve_prompt(Model(), None, "passage", None)
    with pytest.raises(ValueError, match="truncate_dim=999: the model's embeddings have 384"):
        EmbeddingWorkload(truncate_dim=999).load("cpu", 1)


def test_each_option_that_changes_the_vectors_is_in_the_fingerprint():
    """A resume compares fingerprints field by field
    (helpers.engine.contract.fingerprint.differences): each option is a field of its own, set or
    not, so a change names it."""
    from helpers.engine.contract.fingerprint import differences, encode

    import json

    plain = json.loads(encode(EmbeddingWorkload().fingerprint()))
    ranges = np.array([[-1.0] * 8, [1.0] * 8])
    for options in ({"prompt": "query: "}, {"prompt_name": "query"}, {"task": "document"},
                    {"max_seq_length": 64}, {"truncate_dim": 8}, {"stored": "binary"},
                    {"stored": "int8", "ranges": ranges}):
        changed = EmbeddingWorkload(**options).fingerprint()
        assert set(options) <= set(differences(plain, changed)), options
    other = EmbeddingWorkload(stored="int8", ranges=ranges * 2).fingerprint()
    assert set(differences(json.loads(encode(EmbeddingWorkload(
        stored="int8", ranges=ranges).fingerprint())), other)) == {"ranges"}
    older = {k: v for k, v in plain.items()  # (an output from before these options)
             if k not in ("prompt", "prompt_name", "task", "max_seq_length", "truncate_dim",
                          "stored", "ranges", "unrecorded")}
    assert differences(older, EmbeddingWorkload().fingerprint()) == {}
    assert set(differences(older, EmbeddingWorkload(prompt="q: ", max_seq_length=8)
                           .fingerprint())) == {"prompt", "max_seq_length"}
    attrs = EmbeddingWorkload(stored="uint8", ranges=ranges, prompt="q: ").attrs()
    assert attrs["ranges"].dtype == np.float32 and attrs["ranges"].shape == (2, 8)
    assert attrs["prompt"] == "q: " and attrs["stored"] == "uint8"
