"""The embedding study's experiments, one function per question; each returns a tidy table.

Every table has one row per (configuration, replicate) and units in its column names
(``records_per_s``, ``wall_s``). Two layouts are compared throughout:

- ``static``: the study's original layout. Each round, every worker gets an even contiguous slice
  of randomly sampled records, all at once; the round lasts as long as its slowest worker.
- ``queue``: persistent workers pull workunits from the shared bounded queue.

Both are timed alike (helpers.engine.pipeline): ``wall_s`` runs from the job's first read to its
output written, every result included; spin-up is reported apart (``spinup_s``). ``efficiency`` is
the workers' busy share of that time (PipelineStats.efficiency). Workers are started once per
layout of devices and both layouts run on the same pool, so they compare the same loaded models on
the same records.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers.engine.measure.stats import PipelineStats, WorkunitSpan
from helpers.engine.pipeline import WorkerPool
from helpers.study.paths import SAMPLE_TEXT

SIMULATED = "synthetic heterogeneous"  # the label of runs on simulated cards
# Fewer workunits per worker than this and a queue-fed job's rate says more about its last
# workunits than about the layout (3 workunits for 2 workers: one waits while the other works).
MIN_WORKUNITS = 8


def fair_workunit_size(size: int, records: int, workers: int) -> int:
    """``size``, made smaller where ``records`` would give each of ``workers`` fewer than
    MIN_WORKUNITS workunits (never below one record)."""
    return max(1, min(size, records // (MIN_WORKUNITS * workers)))


def simulated_devices(speed_factors: Sequence[float]) -> tuple[list[str], dict[str, float]]:
    """Device labels ``cuda:0, cuda:1, ...`` and their speed factors, for the synthetic workload
    (its devices are labels only: a heterogeneous multi-GPU layout on any machine)."""
    devices = [f"cuda:{i}" for i in range(len(speed_factors))]
    return devices, dict(zip(devices, map(float, speed_factors)))


def sample_records(texts: list[str], n_records: int, seed: int) -> list[tuple[int, str]]:
    """``n_records`` random texts with ids 0..n-1; drawn with replacement only if the corpus is
    smaller than that (a GPU sweep may ask for more records than the sample holds)."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(texts), size=n_records, replace=n_records > len(texts))
    return [(position, texts[i]) for position, i in enumerate(picked)]


def layout_row(stats: PipelineStats, strategy: str) -> dict[str, Any]:
    """One job as a row of a layouts table: records handled (written or failed), wall time,
    throughput and efficiency."""
    return {"strategy": strategy, "records": stats.records + stats.failed_records,
            "wall_s": stats.wall_s, "records_per_s": stats.records_per_s,
            "efficiency": stats.efficiency}


def compare_layouts(workload: Any, devices: Sequence[str], records: int, replicates: int,
                    texts: list[str], workunit_size: int = 100, backend: str = "process",
                    seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Static rounds and queue-fed jobs on one pool over ``devices``, ``replicates`` each.

    Each replicate samples ``records`` texts (seeded); a static round gives each worker an even
    contiguous slice of them. Returns (one row per strategy × replicate, the timeline: one row per
    workunit).
    """
    rows, spans = [], []
    with WorkerPool(workload, list(devices), backend, progress=False) as pool, \
            tempfile.TemporaryDirectory() as tmp:
        for replicate in range(replicates):
            pairs = sample_records(texts, records, seed + replicate)
            static = pool.run_static(pairs, Path(tmp) / f"static-{replicate}.h5")
            queued = pool.run(pairs, Path(tmp) / f"queue-{replicate}.h5", workunit_size=workunit_size)
            for strategy, stats in (("static", static), ("queue", queued)):
                rows.append({**layout_row(stats, strategy), "replicate": replicate})
                spans += [{**span_row(s), "strategy": strategy, "replicate": replicate}
                          for s in stats.timeline]
        spinup = pool.spinup_s
    table = pd.DataFrame(rows).assign(workers=len(devices), devices=",".join(devices),
                                      workunit_size=workunit_size, backend=backend,
                                      spinup_s=spinup)
    return table, pd.DataFrame(spans)


def stack(tables: dict[str, pd.DataFrame], column: str) -> pd.DataFrame:
    """One table from several, each row labelled in ``column`` with its table's key."""
    return pd.concat([t.assign(**{column: key}) for key, t in tables.items()], ignore_index=True)


def measured(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a table that ran the notebook's workload, not the simulated cards."""
    return table[table["workload"] != SIMULATED] if "workload" in table else table


def span_row(span: WorkunitSpan) -> dict[str, Any]:
    return {"worker": span.worker, "device": span.device, "workunit": span.workunit,
            "records": span.records, "start_s": span.start_s, "end_s": span.end_s,
            **({"node": span.node} if span.node else {}),  # a Ray run's node
            **{f"{phase}_s": seconds for phase, seconds in (span.phases or {}).items()},
            **({"padding": span.padding} if span.padding is not None else {})}  # tokens


def workers_per_device(workload: Any, device: str, worker_counts: Sequence[int],
                       records: int, replicates: int, texts: list[str],
                       workunit_size: int = 100, seed: int = 0) -> pd.DataFrame:
    """Notebook 1: 1, 2, 4, ... workers on one device, static rounds and queue-fed, replicated;
    queue-fed workunits of ``workunit_size`` records or fewer (``fair_workunit_size``)."""
    tables = [compare_layouts(workload, [device] * n, records, replicates, texts,
                              fair_workunit_size(workunit_size, records, n), seed=seed)[0]
              for n in worker_counts]
    return pd.concat(tables, ignore_index=True)


def static_rounds(workload: Any, devices: Sequence[str], records: int, rounds: int,
                  texts: list[str], seed: int = 0,
                  backend: str = "process") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Notebook 2: one worker per device, static split in ``rounds`` rounds of ``records``.

    Returns (one row per round, the timeline: one row per worker per round, times from the
    start of the first round so that rounds follow one another on the plot).
    """
    rows, spans, offset = [], [], 0.0
    with WorkerPool(workload, list(devices), backend, progress=False) as pool, \
            tempfile.TemporaryDirectory() as tmp:
        for number in range(rounds):
            stats = pool.run_static(sample_records(texts, records, seed + number),
                                    Path(tmp) / f"round-{number}.h5")
            rows.append({**layout_row(stats, "static"), "round": number})
            for span in stats.timeline:
                row = span_row(span)
                spans.append({**row, "round": number, "start_s": row["start_s"] + offset,
                              "end_s": row["end_s"] + offset, "round_end_s": offset + stats.wall_s})
            offset += stats.wall_s
        spinup = pool.spinup_s
    table = pd.DataFrame(rows).assign(workers=len(devices), devices=",".join(devices),
                                      spinup_s=spinup)
    return table, pd.DataFrame(spans)


def workunit_sizes(workload: Any, devices: Sequence[str], sizes: Sequence[int], records: int,
                   replicates: int, texts: list[str], seed: int = 0,
                   backend: str = "process") -> pd.DataFrame:
    """Notebook 3: queue-fed jobs on one pool over ``devices``, for each workunit size."""
    rows = []
    with WorkerPool(workload, list(devices), backend, progress=False) as pool, \
            tempfile.TemporaryDirectory() as tmp:
        for replicate in range(replicates):
            pairs = sample_records(texts, records, seed + replicate)
            for size in sizes:
                stats = pool.run(pairs, Path(tmp) / f"size-{size}-{replicate}.h5",
                                 workunit_size=size)
                rows.append({**layout_row(stats, "queue"), "workunit_size": size,
                             "replicate": replicate})
        spinup = pool.spinup_s
    return pd.DataFrame(rows).assign(workers=len(devices), devices=",".join(devices),
                                     spinup_s=spinup)


def backends_memory(workload_name: str, device: str, worker_counts: Sequence[int],
                    backends: Sequence[str], records: int, replicates: int,
                    workunit_size: int = 10, **options: Any) -> pd.DataFrame:
    """Notebook 4: throughput and peak memory for each backend and worker count.

    Each run is a fresh ``python -m helpers run`` process, so its peak RSS is its own: the driver's
    high-water mark plus each worker process's (threads live in the driver). Workunits of
    ``workunit_size`` records or fewer (``fair_workunit_size``). ``options``: model, batch_size,
    seconds_per_record (see ``run_isolated``).
    """
    rows = []
    for replicate in range(replicates):
        for backend in backends:
            for n in worker_counts:
                size = fair_workunit_size(workunit_size, records, n)
                stats = run_isolated(workload_name, [device] * n, backend, records, size,
                                     **options)
                gpu = [w["peak_gpu_mib"] for w in stats["workers"] if w["peak_gpu_mib"] is not None]
                rows.append({"backend": backend, "workers": n, "devices": ",".join([device] * n),
                             "workunit_size": size, "replicate": replicate, "records": stats["records"],
                             "wall_s": stats["wall_s"], "spinup_s": stats["spinup_s"],
                             "records_per_s": stats["records_per_s"],
                             "peak_rss_mib": stats["peak_rss_mib"],
                             "peak_gpu_mib": _gpu_total(stats) if gpu else np.nan})
    return pd.DataFrame(rows)


def _gpu_total(stats: dict[str, Any]) -> float:
    """Peak GPU memory summed over processes (threads of one process report the same number)."""
    by_process = {(w["pid"], w["device"]): w["peak_gpu_mib"] for w in stats["workers"]}
    return float(sum(v for v in by_process.values() if v is not None))


def run_isolated(workload_name: str, devices: Sequence[str], backend: str, records: int,
                 workunit_size: int = 10, model: str | None = None, batch_size: int = 32,
                 seconds_per_record: float = 0.01) -> dict[str, Any]:
    """One run of the CLI in a fresh interpreter over the shipped corpus; its stats as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "helpers", "run", "--input", str(SAMPLE_TEXT),
                   "--output", str(Path(tmp) / "out.h5"), "--workload", workload_name,
                   "--devices", ",".join(devices), "--backend", backend, "--limit", str(records),
                   "--workunit-size", str(workunit_size), "--no-progress",
                   "--batch-size", str(batch_size), "--seconds-per-record", str(seconds_per_record)]
        command += ["--model", model] if model else []
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
