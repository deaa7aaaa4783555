"""Which way of running the embedding model is fastest on this machine, and still gives its embeddings.

Each precision and runtime a CPU runs, compiled or not (VARIANTS), is loaded as a worker loads it (the guard
first: its cosines to float32 PyTorch on the guard's texts), then all are timed on the same
sample paragraphs in interleaved rounds, each round in another order (the machine's drift falls
on every variant alike): texts per second, and the ratio to float32 PyTorch's rate in the same
round. Medians over the rounds, with their range. One more row: the guard's figures for
onnxruntime's default quantisation (which onnx-int8 does not use: it fails the guard).
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
GOALS = {"speedup": 1.5}  # the fastest variant that passes the guard, against fp32 torch


def measure(records: int = 512, repeats: int = 5, batch_size: int = 16,
            threads: int | None = None) -> pd.DataFrame:
    """One tidy row per variant and round (a variant the guard refuses: one row, refused)."""
    from helpers.study.paths import sample_texts
    from helpers.workloads.embedding import EmbeddingWorkload
    from helpers.workloads.runtimes import QualityRefused

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
    rows.append(_default_quantization(loaded["fp32", "torch", False][1], threads, batch_size))
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

    from helpers.workloads.runtimes import (GUARD_MEAN, GUARD_MIN, OnnxEncoder, cosines,
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


def main(records: int, repeats: int, batch_size: int, results_dir: str | None) -> None:
    from helpers.study.results import save_table

    table = measure(records, repeats, batch_size)
    report(table)
    if results_dir:
        path = save_table(table, "runtimes_bench", results_dir, "helpers.bench.runtimes",
                          {"records": records, "repeats": repeats, "batch_size": batch_size})
        print(f"table: {path}")
