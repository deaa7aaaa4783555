"""Which way of running the embedding model is fastest on this machine, and still gives its embeddings.

Each precision and runtime a CPU runs, compiled or not (VARIANTS), is loaded as a worker loads it (the guard
first: its cosines to float32 PyTorch on the guard's texts), then all are timed on the same
sample paragraphs in interleaved rounds, each round in another order (the machine's drift falls
on every variant alike): texts per second, and the ratio to float32 PyTorch's rate in the same
round. Medians over the rounds, with their range. One more row: the guard's figures for
onnxruntime's default quantisation (which onnx-int8 does not use: it fails the guard).

Then what encode's options cost and save (``encode_options``, its own table): texts per second
at each ``max_seq_length`` of LENGTHS (the model's own: None), interleaved likewise, the ratio
to the model's own length in the same round; and for each stored precision, a run of the sample
into an output: its bytes per row (the embeddings' dataset, and the whole file) and how well
the stored vectors keep float32's neighbours (each text's 10 nearest among the sample, the
share that are float32's own 10).
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

VARIANTS = (("fp32", "torch", False), ("bf16", "torch", False), ("fp32", "onnx", False),
            ("fp32", "onnx-int8", False), ("fp32", "torch", True), ("bf16", "torch", True))
# (precision, runtime, torch.compile)
LENGTHS = (128, 256, None)  # max_seq_length (None: the model's own)
NEIGHBOURS = 10
GOALS = {"speedup": 1.5}  # the fastest variant that passes the guard, against fp32 torch


def measure(records: int = 512, repeats: int = 5, batch_size: int = 16,
            threads: int | None = None) -> pd.DataFrame:
    """One tidy row per variant and round (a variant the guard refuses: one row, refused)."""
    from helpers.study.paths import sample_texts
    from helpers.workloads.embedding import EmbeddingWorkload
    from helpers.workloads.embedding.runtimes import QualityRefused

    threads = threads or os.cpu_count() or 1
    texts = sample_texts(records)
    loaded: dict[tuple[str, str, bool], tuple[Any, Any, float]] = {}
    rows: list[dict[str, Any]] = []
    for precision, runtime, compile in VARIANTS:
        workload = EmbeddingWorkload(batch_size=batch_size, precision=precision, runtime=runtime,
                                     compile=compile)
        started = time.perf_counter()
        try:
            model = workload.load("cpu", threads)
        except QualityRefused as exc:
            rows.append({"precision": precision, "runtime": runtime, "compile": compile,
                         "refused": str(exc)})
            continue
        loaded[precision, runtime, compile] = workload, model, time.perf_counter() - started
    fp32 = loaded["fp32", "torch", False][1]
    rows.append(_default_quantization(getattr(fp32, "model", None) or fp32, threads, batch_size))
    # (the SentenceTransformer itself: a fed model holds it beside its feeder)
    keys = list(loaded)
    for replicate in range(repeats):
        for key in keys[replicate % len(keys):] + keys[:replicate % len(keys)]:
            workload, model, load_s = loaded[key]
            started = time.perf_counter()
            workload.process(model, texts)
            seconds = time.perf_counter() - started
            report = workload.report(model)
            rows.append({"replicate": replicate, "precision": key[0], "runtime": key[1],
                         "compile": key[2], "seconds": seconds, "texts_per_s": len(texts) / seconds,
                         "load_s": load_s,
                         "guard_mean_cosine": report.get("guard_mean_cosine", 1.0),
                         "guard_min_cosine": report.get("guard_min_cosine", 1.0),
                         "refused": ""})
    table = pd.DataFrame(rows).assign(records=records, batch_size=batch_size, threads=threads)
    rate = table[table.precision.eq("fp32") & table.runtime.eq("torch") & ~table.compile.eq(True)] \
        .set_index("replicate")["texts_per_s"]
    table["speedup"] = table["texts_per_s"] / table["replicate"].map(rate)
    return table


def _default_quantization(model: Any, threads: int, batch_size: int) -> dict[str, Any]:
    """A row for what onnxruntime's dynamic quantisation does with its defaults (every operator
    it can, int8 weights per tensor): the guard's figures, and whether it passes (not a variant
    gpufeed runs: onnx-int8 quantises only the matrix products, per channel)."""
    from onnxruntime.quantization import quantize_dynamic

    from helpers.workloads.embedding.runtimes import (GUARD_MEAN, GUARD_MIN, OnnxEncoder, cosines,
                                            exported, guard_texts)

    texts = guard_texts()
    reference = model.encode(texts, batch_size=batch_size, show_progress_bar=False)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "default-int8.onnx"
        quantize_dynamic(str(exported(model, "onnx")), str(path))
        found = cosines(reference, OnnxEncoder(model, path, threads).encode(texts, batch_size))
    passes = found.mean() >= GUARD_MEAN and found.min() >= GUARD_MIN
    return {"precision": "fp32", "runtime": "onnx-int8 (onnxruntime defaults)", "compile": False,
            "guard_mean_cosine": float(found.mean()), "guard_min_cosine": float(found.min()),
            "refused": "" if passes else f"mean cosine {found.mean():.4f} (needs >= "
                                         f"{GUARD_MEAN}), least {found.min():.4f} (needs >= "
                                         f"{GUARD_MIN})"}


def report(table: pd.DataFrame) -> dict[str, float]:
    """Print each variant's medians and ranges, the fastest that passes the guard against the
    goal; return its speedup."""
    timed = table[table.refused.eq("") & table.texts_per_s.notna()]
    summary = timed.groupby(["precision", "runtime", "compile"], sort=False).agg(
        texts_per_s=("texts_per_s", "median"), speedup=("speedup", "median"),
        speedup_low=("speedup", "min"), speedup_high=("speedup", "max"),
        guard_mean=("guard_mean_cosine", "first"), guard_min=("guard_min_cosine", "first"),
        load_s=("load_s", "first"), rounds=("speedup", "size"))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.to_string(float_format=lambda v: f"{v:.4f}"))
    for _, row in table[table.refused.ne("")].iterrows():
        print(f"refused by the guard: {row['precision']} {row['runtime']}: {row['refused']}")
    best = summary["speedup"].idxmax()
    speedup = float(summary.loc[best, "speedup"])
    met = speedup >= GOALS["speedup"]
    print(f"fastest that passes the guard: {best[0]} {best[1]}"
          f"{' compiled' if best[2] else ''}, {speedup:.2f}x fp32 torch "
          f"(rounds {summary.loc[best, 'speedup_low']:.2f}-{summary.loc[best, 'speedup_high']:.2f}"
          f"; >= {GOALS['speedup']}: {'met' if met else 'NOT met'})")
    return {"speedup": speedup}


def encode_options(records: int = 512, repeats: int = 5, batch_size: int = 16,
                   threads: int | None = None) -> pd.DataFrame:
    """Tidy rows: ``option`` max_seq_length (one per length and round: texts/s, the ratio to
    the model's own length, tokens a text) and stored (one per precision: bytes a row,
    neighbours kept)."""
    from helpers.study.paths import sample_texts
    from helpers.workloads.embedding import EmbeddingWorkload
    from helpers.workloads.embedding.runtimes import token_lengths

    threads = threads or os.cpu_count() or 1
    texts = sample_texts(records)
    loaded = {}
    for length in LENGTHS:
        workload = EmbeddingWorkload(batch_size=batch_size, max_seq_length=length)
        loaded[length] = workload, workload.load("cpu", threads)
    rows: list[dict[str, Any]] = []
    for replicate in range(repeats):
        for length in LENGTHS[replicate % len(LENGTHS):] + LENGTHS[:replicate % len(LENGTHS)]:
            workload, model = loaded[length]
            started = time.perf_counter()
            workload.process(model, texts)
            seconds = time.perf_counter() - started
            st = getattr(model, "model", None) or model  # (a fed model holds it beside)
            rows.append({"option": "max_seq_length", "replicate": replicate,
                         "max_seq_length": int(st.max_seq_length),
                         "length": f"{length}" if length is not None
                         else f"own ({st.max_seq_length})", "own_length": length is None,
                         "seconds": seconds, "texts_per_s": len(texts) / seconds,
                         "tokens_per_text": float(sum(token_lengths(st, texts))) / len(texts)})
    table = pd.DataFrame(rows)
    own = table[table.own_length].set_index("replicate")["texts_per_s"]
    table["speedup"] = table["texts_per_s"] / table["replicate"].map(own)
    reference = loaded[None][0].process(loaded[None][1], texts)["embeddings"]
    stored = pd.DataFrame([_stored_row(form, texts, reference, batch_size)
                           for form in STORED_FORMS])
    return pd.concat([table, stored], ignore_index=True).assign(
        records=records, batch_size=batch_size, threads=threads)


STORED_FORMS = ("float32", "float16", "int8", "uint8", "binary", "ubinary")


def _stored_row(stored: str, texts: list[str], reference: Any, batch_size: int
                ) -> dict[str, Any]:
    """A run of ``texts`` storing ``stored`` (int8, uint8: calibrated on the float32
    ``reference``): bytes a row, and the neighbours it keeps."""
    import h5py
    import numpy as np

    from helpers.engine.pipeline import run_pipeline
    from helpers.workloads.embedding import EmbeddingWorkload
    from helpers.workloads.embedding.stored import calibration_ranges

    ranges = calibration_ranges(reference) if stored in ("int8", "uint8") else None
    workload = EmbeddingWorkload(batch_size=batch_size, stored=stored, ranges=ranges)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "out.h5"
        run_pipeline(list(enumerate(texts)), workload, ["cpu"], output=path, progress=False,
                     backend="thread")
        file_bytes = path.stat().st_size
        with h5py.File(path, "r") as f:
            order = np.argsort(f["ids"][...])
            values = f["embeddings"][...][order]
            dataset_bytes = f["embeddings"].id.get_storage_size()
    return {"option": "stored", "stored": stored, "bytes_per_row": dataset_bytes / len(texts),
            "file_bytes_per_row": file_bytes / len(texts),
            "neighbours_kept": _neighbours_kept(reference, values, stored, ranges)}


def _neighbours_kept(reference: Any, values: Any, stored: str, ranges: Any) -> float:
    """The share of each text's NEIGHBOURS nearest (float32 cosine) that the stored vectors
    also put nearest: dot products of the dequantized values (int8, uint8: the step's middle),
    agreeing bits for the binary forms."""
    import numpy as np

    def nearest(similar: np.ndarray) -> np.ndarray:
        np.fill_diagonal(similar, -np.inf)
        return np.argsort(-similar, axis=1, kind="stable")[:, :NEIGHBOURS]

    unit = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    if stored.endswith("binary"):
        bits = np.unpackbits(values.view(np.uint8) if stored == "ubinary"
                             else (values.astype(np.int16) + 128).astype(np.uint8), axis=1)
        signs = bits.astype(np.float32) * 2 - 1
        got = signs @ signs.T
    else:
        floats = values.astype(np.float32)
        if ranges is not None:
            steps = (ranges[1] - ranges[0]) / 255
            floats = ranges[0] + (floats + (128 if stored == "int8" else 0) + 0.5) * steps
        got = floats @ floats.T / np.outer(*[np.linalg.norm(floats, axis=1)] * 2)
    want, found = nearest(unit @ unit.T), nearest(got)
    return float(np.mean([len(set(a) & set(b)) / NEIGHBOURS for a, b in zip(want, found)]))


def report_options(table: pd.DataFrame) -> None:
    """Print what each length and each stored precision gives."""
    lengths = table[table.option.eq("max_seq_length")].groupby("length", sort=False).agg(
        texts_per_s=("texts_per_s", "median"), speedup=("speedup", "median"),
        speedup_low=("speedup", "min"), speedup_high=("speedup", "max"),
        tokens_per_text=("tokens_per_text", "first"), rounds=("speedup", "size"))
    stored = table[table.option.eq("stored")].set_index("stored")[
        ["bytes_per_row", "file_bytes_per_row", "neighbours_kept"]]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print("max_seq_length (speedup: against the model's own, the same round):")
        print(lengths.to_string(float_format=lambda v: f"{v:.3f}"))
        print(f"stored (neighbours_kept: of each text's {NEIGHBOURS} nearest by float32):")
        print(stored.to_string(float_format=lambda v: f"{v:.3f}"))


def main(records: int, repeats: int, batch_size: int, results_dir: str | None,
         only: str | None = None) -> None:
    from helpers.study.results import save_table

    tables = {}
    if only != "options":
        tables["runtimes_bench"] = measure(records, repeats, batch_size)
        report(tables["runtimes_bench"])
    if only != "variants":
        tables["encode_options_bench"] = encode_options(records, repeats, batch_size)
        report_options(tables["encode_options_bench"])
    settings = {"records": records, "repeats": repeats, "batch_size": batch_size}
    for name, frame in tables.items() if results_dir else ():
        path = save_table(frame, name, results_dir, "helpers.bench.runtimes", settings)
        print(f"table: {path}")
