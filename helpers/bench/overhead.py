"""What the pipeline costs: bare ``model.encode`` against the pipeline, and where they differ.

Four ways to embed the same block of texts with one model copy and every core's threads:

    bare      model.encode(block) in this process ................ the floor
    chunked   workload.process on the block cut into the pipeline's workunits, in this process
    spawned   the same chunked calls in a spawned process with its own model (timed there)
    pipeline  a job on a loaded WorkerPool: process backend, one worker (steady state)

The machine drifts by 10-20 % over minutes, as much as the effect to be measured, so the
comparison is paired and short: each round takes the next block (a few seconds of work) and runs
all four on it, in an order turned every round (helpers.study.autotune.interleaved); a method's
ratio to bare is taken within its round, seconds apart, and reported as the median over rounds
with its quartiles and a bootstrap 95 % interval of the median. The pipeline's rate is its job's
``wall_s`` (from the first read to the last record written: dispatch, the writer and the
per-job cost included). Per workunit, the worker's own compute time (its span) is paired with
the same ``workload.process`` call in this process (``chunked``): the worker's path alone, with
no dispatch in it.
"""
from __future__ import annotations

import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.devices import available_cores
from helpers.engine.pipeline import WorkerPool
from helpers.study.autotune import interleaved
from helpers.study.paths import sample_texts
from helpers.workloads.embedding import EmbeddingWorkload

TARGET = 0.97  # pipeline ÷ bare, median of the paired rounds
METHODS = ("bare", "chunked", "spawned", "pipeline")


def _spawned(connection: Any, workload: EmbeddingWorkload, threads: int) -> None:
    """The spawned method's process: load the model, then time each list of chunks it is sent."""
    model = workload.load("cpu", threads)
    connection.send("ready")
    while (chunks := connection.recv()) is not None:
        started = time.perf_counter()
        for chunk in chunks:
            workload.process(model, chunk)
        connection.send(time.perf_counter() - started)


def _chunks(block: list[str], size: int) -> list[list[str]]:
    return [block[i:i + size] for i in range(0, len(block), size)]


def measure(records: int = 1024, block: int = 128, rounds: int = 24, batch_size: int = 16,
            workunit_size: int = 64, threads: int | None = None,
            model_path: str | None = None) -> tuple[list[dict], list[dict]]:
    """``(rows, units)``: a tidy row per (round, method) with ``seconds`` and ``records_per_s``,
    and a row per (round, workunit) with the worker's compute seconds and this process's for the
    same call. Round r embeds block r mod (records ÷ block) of the sample texts, each block
    sorted by length (the pipeline's reader would sort it so; here it is cut with sort_window=0
    so that its workunits are exactly the chunked method's chunks). ``model_path``: the
    embedding workload's model (None: the embedded default)."""
    threads = threads or available_cores()
    texts = sample_texts(records)
    blocks = [texts[i:i + block] for i in range(0, len(texts) - block + 1, block)] or [texts]
    workload = EmbeddingWorkload(model=model_path, batch_size=batch_size)
    model = workload.load("cpu", threads)  # (the feeder's, as a worker holds it)
    bare = getattr(model, "model", None) or model  # (the SentenceTransformer beside it)
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    child = context.Process(target=_spawned, args=(there, workload, threads), daemon=True)
    child.start()
    rows: list[dict] = []
    units: list[dict] = []
    try:
        if here.recv() != "ready":
            raise RuntimeError("the spawned process did not load its model")
        with tempfile.TemporaryDirectory() as tmp, \
                WorkerPool(workload, ["cpu"], threads_per_worker=threads, progress=False,
                           sort_window=0) as pool:
            for round_ in range(rounds):
                texts_ = blocks[round_ % len(blocks)]
                ordered = sorted(texts_, key=len)
                chunk_seconds: list[float] = []
                spans: list[float] = []
                busy = np.nan
                for method in interleaved(METHODS, round_):
                    started = time.perf_counter()
                    if method == "bare":
                        bare.encode(texts_, batch_size=batch_size, show_progress_bar=False)
                        seconds = time.perf_counter() - started
                    elif method == "chunked":
                        for chunk in _chunks(ordered, workunit_size):
                            at = time.perf_counter()
                            workload.process(model, chunk)
                            chunk_seconds.append(time.perf_counter() - at)
                        seconds = time.perf_counter() - started
                    elif method == "spawned":
                        here.send(_chunks(ordered, workunit_size))
                        seconds = here.recv()
                    else:
                        stats = pool.run(list(enumerate(ordered)), Path(tmp) / f"{round_}.h5",
                                         workunit_size=workunit_size)
                        seconds = stats.wall_s
                        spans = [s.end_s - s.start_s
                                 for s in sorted(stats.timeline, key=lambda s: s.workunit)]
                        busy = stats.efficiency
                    rows.append({"round": round_, "method": method, "records": len(texts_),
                                 "batch_size": batch_size, "workunit_size": workunit_size,
                                 "threads": threads, "seconds": seconds,
                                 "records_per_s": len(texts_) / seconds,
                                 "busy": busy if method == "pipeline" else np.nan})
                units += [{"round": round_, "workunit": k, "worker_s": worker, "in_process_s": own}
                          for k, (worker, own) in enumerate(zip(spans, chunk_seconds))]
    finally:
        here.send(None)
        child.join(10)
        if child.is_alive():
            child.kill()
    return rows, units


def spread(ratios: list[float], draws: int = 2000, seed: int = 0) -> dict[str, float]:
    """Median, quartiles and a bootstrap 95 % interval of the median of ``ratios``."""
    values = np.asarray(ratios, dtype=float)
    medians = np.median(np.random.default_rng(seed).choice(values, (draws, len(values))), axis=1)
    low, high = np.quantile(medians, [0.025, 0.975])
    q1, q3 = np.quantile(values, [0.25, 0.75])
    return {"median": float(np.median(values)), "q1": float(q1), "q3": float(q3),
            "ci_low": float(low), "ci_high": float(high), "n": len(values)}


def report(rows: list[dict], units: list[dict]) -> dict[str, dict[str, float]]:
    """Print each method's rate and its paired ratio to bare, and the worker's compute time
    against the same calls in process; return those summaries by name."""
    rates: dict[str, list[float]] = {method: [] for method in METHODS}
    by_round: dict[int, dict[str, float]] = {}
    for row in rows:
        rates[row["method"]].append(row["records_per_s"])
        by_round.setdefault(row["round"], {})[row["method"]] = row["records_per_s"]
    first = rows[0]
    print(f"{len(by_round)} rounds of {first['records']} texts, batch {first['batch_size']}, "
          f"workunits of {first['workunit_size']}, {first['threads']} threads; ratios paired "
          f"within each round")
    print(f"{'method':>9} {'records/s':>10} {'÷ bare':>7} {'quartiles':>15} {'95% CI':>15}")
    summary = {}
    for method in METHODS:
        ratio = spread([r[method] / r["bare"] for r in by_round.values()])
        summary[method] = ratio
        print(f"{method:>9} {np.median(rates[method]):>10.1f} {ratio['median']:>7.3f} "
              f"{ratio['q1']:>7.3f}-{ratio['q3']:<7.3f} {ratio['ci_low']:>7.3f}-"
              f"{ratio['ci_high']:<7.3f}")
    if units:
        worker = spread([u["in_process_s"] / u["worker_s"] for u in units])
        summary["worker_path"] = worker
        print(f"per workunit, this process's compute ÷ the worker's (same call, same texts): "
              f"median {worker['median']:.3f}, quartiles {worker['q1']:.3f}-{worker['q3']:.3f}, "
              f"95% CI {worker['ci_low']:.3f}-{worker['ci_high']:.3f} over {worker['n']} "
              f"workunits")
    busy = [row["busy"] for row in rows if row["method"] == "pipeline"]
    summary["busy"] = spread(busy)
    print(f"the pipeline's worker was busy {np.median(busy):.1%} of its jobs' wall time "
          f"(median; min {min(busy):.1%}): the rest is dispatch and the last write")
    pipeline = summary["pipeline"]
    verdict = "met" if pipeline["ci_low"] >= TARGET else \
        "not shown (the interval reaches below it)" if pipeline["ci_high"] >= TARGET else "NOT met"
    print(f"target: pipeline / bare >= {TARGET} (the 95% interval above it): {verdict}")
    return summary
