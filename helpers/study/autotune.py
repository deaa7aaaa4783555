"""Notebook 7's experiments: a self-tuning run against a full sweep, and one configuration against
another on their own loaded pools. Each returns tidy tables (one row per run; units in names).

- ``sweep``: every fixed configuration (workers per device × workunit size) and the self-tuning
  run (``workers_per_device="auto"``, ``workunit_size="auto"``: a fresh pool with one worker per
  device and no prior tuning), each a fresh pool on the same records, interleaved (the order
  turns every replicate). The self-tuning run of the first replicate also gives its timeline,
  growth's decisions and its telemetry.
- ``side_by_side``: named configurations (a workload, its devices, a workunit size), each on its
  own pool, loaded once; their jobs alternate on the same sampled records, so that the machine's
  drift falls on all of them alike.
"""
from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers.engine.contract.devices import threads_in_words, workers_in_words
from helpers.engine.contract.settings import AUTO
from helpers.engine.measure.stats import PipelineStats
from helpers.engine.pipeline import WorkerPool, run_pipeline
from helpers.study.experiments import layout_row, sample_records, span_row
from helpers.study.results import load_sidecar, load_table
from helpers.workloads.embedding.runtimes import variant_label
from helpers.workloads.synthetic import SyntheticWorkload

SELF_TUNING = "self-tuning"
BUSY_STEP_S = 0.25  # the grain of busy_share's lane


@dataclass
class Runs:
    table: pd.DataFrame  # one row per run
    timeline: pd.DataFrame  # the first self-tuning run's workunits (span_row)
    decisions: pd.DataFrame  # its growth decisions (helpers.engine.dispatch.growth.Decision)
    telemetry: pd.DataFrame  # its telemetry samples (helpers.engine.measure.telemetry.Sample)


def configurations(worker_counts: Sequence[int], sizes: Sequence[int]) -> list[tuple[Any, Any]]:
    """Every (workers per device, workunit size) of the sweep, then the self-tuning one."""
    return [(w, s) for w in worker_counts for s in sizes] + [(AUTO, AUTO)]


def ideal_seconds(workload: SyntheticWorkload, devices: Sequence[str], records: int) -> float:
    """Records ÷ the sum of the simulated devices' saturated rates, with no per-workunit cost:
    a bound no run reaches."""
    rate = sum((workload.device_parallelism(d) or 1) * workload.speed.get(d, 1.0)
               for d in dict.fromkeys(devices)) / workload.seconds_per_record
    return records / rate


def sweep(workload: SyntheticWorkload, devices: Sequence[str], configs: Sequence[tuple[Any, Any]],
          records: int, replicates: int, job: str = "sweep") -> Runs:
    """Each configuration of ``configs`` on ``records`` records, ``replicates`` times."""
    rows: list[dict] = []
    kept: PipelineStats | None = None
    ideal = ideal_seconds(workload, devices, records)
    with tempfile.TemporaryDirectory() as tmp:
        for replicate in range(replicates):
            for workers, size in interleaved(configs, replicate):
                stats = run_pipeline([(i, i) for i in range(records)], workload, list(devices),
                                     size, Path(tmp) / "out.h5", workers_per_device=workers,
                                     progress=False, overwrite=True)
                start = {d: 1 if workers == AUTO else workers for d in devices}
                rows.append({**run_row(stats, workers, size, start), "job": job,
                             "replicate": replicate, "ideal_s": ideal,
                             "makespan_vs_ideal": stats.wall_s / ideal})
                if workers == AUTO and kept is None:
                    kept = stats
    return Runs(pd.DataFrame(rows), *_detail(kept))


def interleaved(configs: Sequence[Any], replicate: int) -> list[Any]:
    """The order replicate ``replicate`` runs ``configs`` in: turned by one each replicate, and
    backwards every second round of turns, so that each configuration takes every place and no
    configuration always follows the same one (a pair: ab, ba, ba, ab, ...)."""
    turn = replicate % len(configs)
    order = list(configs[turn:]) + list(configs[:turn])
    return order if (replicate // len(configs)) % 2 == 0 else order[::-1]


def run_row(stats: PipelineStats, workers: Any, size: Any, start: dict[str, int]) -> dict:
    """One run as a row: its configuration, rate, how evenly its devices finished, and the worker
    count each device ended with (``start``: each device's count at the start)."""
    last = dict(start)
    last.update({d["device"]: d["workers"] for d in stats.decisions})
    ends = pd.Series([s.end_s for s in stats.timeline]).groupby(
        [s.device for s in stats.timeline]).max()
    return {**layout_row(stats, "queue"), "layout": SELF_TUNING if workers == AUTO else "fixed",
            "configuration": SELF_TUNING if workers == AUTO == size else
            f"{workers} per device, workunits of {size}",
            "workers_per_device": str(workers), "workunit_size": str(size),
            "spinup_s": stats.spinup_s, "decisions": len(stats.decisions),
            "finish_spread_s": float(ends.max() - ends.min()) if len(ends) else np.nan,
            "final_workers": ",".join(f"{d}={n}" for d, n in last.items())}


def _detail(stats: PipelineStats | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    if stats is None:
        return pd.DataFrame(), pd.DataFrame(), pd.DataFrame()
    return (pd.DataFrame([span_row(s) for s in stats.timeline]), pd.DataFrame(stats.decisions),
            pd.DataFrame([asdict(s) for s in stats.telemetry]))


def busy_share(spans: pd.DataFrame, parallelism: int, step: float = BUSY_STEP_S) -> pd.DataFrame:
    """A simulated card's use over time, in telemetry's shape: the workunits at work on it (at
    most ``parallelism`` run at once) ÷ ``parallelism``, every ``step`` seconds. What NVML would
    report for a real card; a simulated one sleeps, so its processes show no CPU use."""
    times = np.arange(0.0, spans["end_s"].max() + step, step)
    rows = []
    for device, part in spans.groupby("device"):
        at_work = ((part["start_s"].to_numpy()[:, None] <= times)
                   & (times < part["end_s"].to_numpy()[:, None])).sum(axis=0)
        rows += [{"seconds": t, "device": device, "worker": None, "source": "simulated",
                  "utilization": 100.0 * min(n, parallelism) / parallelism, "memory_mib": np.nan}
                 for t, n in zip(times, at_work)]
    return pd.DataFrame(rows)


def side_by_side(configs: dict[str, tuple[Any, Sequence[str], Any, int | None]], records: int,
                 replicates: int, texts: list[str], seed: int = 0,
                 backend: str = "process") -> tuple[pd.DataFrame, dict[str, Runs]]:
    """``configs``: label -> (workload, devices, workunit size, CPU threads per worker or None
    for an even share). Each label's pool is loaded once; replicate r runs every label on the
    same ``records`` sampled texts, the order turning. Returns (one row per label × replicate,
    each label's first run in detail)."""
    rows, first = [], {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        pools = {label: stack.enter_context(WorkerPool(workload, list(devices), backend,
                                                       threads_per_worker=threads,
                                                       progress=False))
                 for label, (workload, devices, _, threads) in configs.items()}
        labels = list(configs)
        for replicate in range(replicates):
            pairs = sample_records(texts, records, seed + replicate)
            for label in labels[replicate % len(labels):] + labels[:replicate % len(labels)]:
                workload, devices, size, _ = configs[label]
                stats = pools[label].run(pairs, Path(tmp) / "out.h5", workunit_size=size,
                                         overwrite=True)  # a scratch file
                counts = Counter(devices)
                workers = ",".join(f"{d}={n}" for d, n in counts.items())
                rows.append({**run_row(stats, workers, size, counts), "configuration": label,
                             "replicate": replicate, "devices": ",".join(devices),
                             "batch_size": getattr(workload, "batch_size", None),
                             "threads_per_worker": max(
                                 (info.threads for info in pools[label].workers
                                  if info.device == "cpu"), default=None),
                             "spinup_s": pools[label].spinup_s})
                first.setdefault(label, Runs(pd.DataFrame(), *_detail(stats)))
    return pd.DataFrame(rows), first


def trials_table(trials: list[dict], picked: int | None) -> pd.DataFrame:
    """The tuner's trials (helpers.tuner.Tuned.trials), each labelled with its configuration
    (and its variant, where the tuner tried how the model runs: the guard's least cosine, or
    its refusal); ``picked``: the trial the tuner chose (Tuned.trial)."""
    table = pd.DataFrame(trials)
    variants = table.get("variant", pd.Series([""] * len(table)))
    tried = any(isinstance(v, str) and json.loads(v or "{}") for v in variants)
    table = table.assign(variant=[variant_label(json.loads(v)) or (
                                      "the workload as given" if tried else "")
                                  if isinstance(v, str) and v else "" for v in variants],
                         guard_min_cosine=[_guard_min(v) for v in table.get(
                             "loaded", pd.Series([None] * len(table)))])
    threads = "threads_per_worker" in table and table["threads_per_worker"].nunique() > 1
    return table.assign(picked=table["trial"] == picked, configuration=[
        f"{t.trial}: " + (f"{t.variant}, " if t.variant else "") + (
            "refused by the quality guard" if _said(getattr(t, "refused", "")) else
            (f"batch {int(t.batch_size)}, " if pd.notna(t.batch_size) else "")
            + ("skipped (out of time)" if _said(getattr(t, "skipped", "")) else
               f"{_workers(t)}{_threads(t) if threads else ''}, workunits of {t.workunit_size}")
            + (f" (trial {int(t.repeat_of)} again)" if pd.notna(getattr(t, "repeat_of", None))
               else ""))
        + (" (picked)" if t.trial == picked else "") for t in table.itertuples()])


def _said(value: Any) -> bool:
    """Whether a trial's ``refused`` or ``skipped`` holds a reason (not "", not a NaN)."""
    return isinstance(value, str) and bool(value)


def _threads(trial: Any) -> str:
    """', 2 threads each': said where the trials differ in it (the tuner's shared-cores round
    would otherwise read like the round before it)."""
    n = getattr(trial, "threads_per_worker", None)
    return f", {threads_in_words(int(n))}" if pd.notna(n) else ""


def _workers(trial: Any) -> str:
    """'2 workers on cpu, 1 worker on cuda:0': the trial's pool (its devices), else the
    workers that did records."""
    devices = getattr(trial, "devices", None)
    if not isinstance(devices, str) or not devices:
        return str(trial.workers_per_device)
    return workers_in_words(devices.split(","))


def _guard_min(loaded: Any) -> float | None:
    """The least of the guard's cosines a trial's workers reported (None: no guard ran)."""
    if not isinstance(loaded, str) or not loaded:
        return None
    found = [r["guard_min_cosine"] for r in json.loads(loaded).values()
             if "guard_min_cosine" in r]
    return min(found) if found else None


def best_workunit_size(results_dir: str | Path) -> dict[str, Any]:
    """Notebook 3's fastest configuration (its table and sidecar): devices, workunit size and
    batch size."""
    table = load_table("workunit_sizes", results_dir)
    devices, size = table.groupby(["devices", "workunit_size"])["records_per_s"].mean().idxmax()
    batch = load_sidecar("workunit_sizes", results_dir)["parameters"]["batch_size"]
    return {"devices": devices.split(","), "workunit_size": int(size), "batch_size": batch}
