"""What the pipeline costs: bare ``model.encode`` in one process vs the pipeline with one worker.

Same records, same batch size, same CPU threads; the two are interleaved over repeats (bare first on
even repeats, pipeline first on odd ones) so that drift on a shared machine hits both alike. Bare
throughput is timed after a warm-up encode; the pipeline's is its steady state (``records_per_second``:
from every worker ready to the last record written, spin-up excluded).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from helpers.engine.devices import available_cores
from helpers.engine.pipeline import run_pipeline
from helpers.study.paths import sample_texts
from helpers.workloads.embedding import EmbeddingWorkload, load_sentence_transformer

TARGET = 0.95  # pipeline ÷ bare, steady state


def measure(records: int = 1000, repeats: int = 3, batch_size: int = 32,
            workunit_size: int = 100, threads: int | None = None) -> list[dict]:
    """Tidy rows: one per (repeat, method) with ``records_per_s`` and ``seconds``."""
    threads = threads or available_cores()
    texts = sample_texts(records)
    model = load_sentence_transformer(None, "cpu", threads)
    model.encode(texts[:batch_size], batch_size=batch_size)  # warm-up, as the worker's load does
    workload = EmbeddingWorkload(batch_size=batch_size)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            methods = ("bare", "pipeline", "pipeline_unsorted")
            for method in methods if repeat % 2 == 0 else reversed(methods):
                if method == "bare":
                    started = time.perf_counter()
                    model.encode(texts, batch_size=batch_size, show_progress_bar=False)
                    seconds = time.perf_counter() - started
                else:
                    window = 0 if method == "pipeline_unsorted" else None  # None: the default
                    stats = run_pipeline(list(enumerate(texts)), workload, ["cpu"], workunit_size,
                                         Path(tmp) / f"overhead-{repeat}.h5", "process",
                                         threads_per_worker=threads, progress=False,
                                         sort_window=window)
                    seconds = stats.wall_seconds
                rows.append({"repeat": repeat, "method": method, "records": len(texts),
                             "batch_size": batch_size, "workunit_size": workunit_size,
                             "threads": threads, "seconds": seconds,
                             "records_per_s": len(texts) / seconds})
    return rows


def report(rows: list[dict]) -> float:
    """Print the rows and the median ratio pipeline ÷ bare; return that ratio."""
    print(f"{'repeat':>6} {'method':>17} {'records':>7} {'seconds':>8} {'records/s':>10}")
    for row in rows:
        print(f"{row['repeat']:>6} {row['method']:>17} {row['records']:>7} {row['seconds']:>8.2f} "
              f"{row['records_per_s']:>10.1f}")
    by_repeat: dict[int, dict[str, float]] = {}
    for row in rows:
        by_repeat.setdefault(row["repeat"], {})[row["method"]] = row["records_per_s"]
    for method in ("pipeline_unsorted", "pipeline"):
        ratios = [r[method] / r["bare"] for r in by_repeat.values()]
        ratio = statistics.median(ratios)
        print(f"steady-state throughput ratio {method} / bare: median {ratio:.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} repeats")
    verdict = "met" if ratio >= TARGET else "NOT met"
    print(f"target: pipeline (default settings) / bare >= {TARGET}: {verdict}")
    return ratio
