"""``python -m helpers tune``: a bounded search for the fastest configuration, on a sample of the
input, written to ``tuned.yaml`` for ``python -m helpers run --config tuned.yaml``.

Phases, in the order our users tune by hand, each reusing what it can::

    0. variant       how the model runs (the workload's ``variants(devices)``: its precisions
                     and runtimes these devices support): one worker per device, a pool per
                     variant, one job on the sample each; a variant whose workers refuse it
                     (the embedding workload's quality guard) is a row saying why, never picked;
                     the later phases run the fastest
    1. batch size    one worker per device; a pool per candidate (the workload holds its batch
                     size), one job on the sample each (but the workload's own size, which
                     phase 0's pick ran already); workunits sized automatically
    2. workers       one pool with the best batch size and workers_per_device="auto": jobs on
                     the sample until growth has settled on every device (helpers.engine.growth;
                     each job twice as long as the last, as growth measures within one job),
                     then the count is held
    3. workunits     the same pool, its workers loaded: one job per candidate size ("auto",
                     then fixed sizes around what "auto" chose); on a CPU, whose growing
                     workers run one thread each, again on a fresh pool sharing the cores
                     (threads_per_worker is then part of the pick)

The budget is checked between trials: a phase that would start past it is skipped, and the best
configuration so far stands. Every trial is a row of a tidy table (phase, batch_size,
workers_per_device, devices, threads_per_worker, workunit_size, records, wall_s, records_per_s).
The pick is the fastest trial of phases 0, 1 and 3, all on the same sample (phase 2's jobs change
their worker count midway, so none is a configuration to run): where growth added a worker that
did not pay, one worker per device with the best batch size still wins. The estimate for the
whole input is its length ÷ the pick's rate (spin-up not included).
"""
from __future__ import annotations

import functools
import json
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from helpers.engine.backends import pool_settings
from helpers.engine.pipeline import WorkerPool
from helpers.engine.devices import threads_in_words, workers_in_words
from helpers.engine.protocol import Workload
from helpers.engine.scheduler import PipelineError
from helpers.engine.settings import AUTO, JobSettings, PoolSettings
from helpers.engine.sources import open_source, source_length
from helpers.engine.versions import created
from helpers.workloads.runtimes import variant_label

log = logging.getLogger("gpufeed.tune")  # a line as each phase starts and each trial ends

SAMPLE = 2000  # records per trial
BUDGET_SECONDS = 300.0
SIZE_FACTORS = (0.5, 2.0)  # phase 3 also tries fixed sizes of these × the size "auto" settled on
CONFIG_FIELDS = {  # what tuned.yaml may set: field -> what it expects
    "workload": "a workload name", "model": "a model name or path", "devices": "a device list",
    "backend": "process or thread", "batch_size": "an integer >= 1",
    "workunit_size": "an integer >= 1 or 'auto'", "workunit_seconds": "seconds > 0",
    "threads_per_worker": "an integer >= 1", "precision": "fp32, bf16 or fp16",
    "runtime": "torch, onnx or onnx-int8", "compile": "true or false",
    "text_column": "the input's text column", "id_column": "the input's id column",
    "keep_columns": "a list of the input's columns to carry",
    "records_per_s": "the tuned rate (informative)",
    "estimated_seconds": "the estimate for the whole input (informative)",
    "input": "the tuned input (informative)", "created": "when (informative)"}


@dataclass
class Tuned:
    """The best configuration found, and what it is expected to do."""

    devices: list[str]  # one entry per worker
    backend: str
    batch_size: int | None
    workunit_size: int | str
    records_per_s: float
    estimated_seconds: float | None  # the whole input at records_per_s
    trials: list[dict] = field(default_factory=list)
    trial: int | None = None  # the trial it comes from
    threads_per_worker: int | None = None  # CPU workers' threads (None: no CPU worker)
    variant: dict[str, Any] = field(default_factory=dict)  # the workload's options (phase 0)

    def config(self, **extra: Any) -> dict[str, Any]:
        """What tuned.yaml holds."""
        keep = {"devices": self.devices, "backend": self.backend,
                "workunit_size": self.workunit_size, "records_per_s": round(self.records_per_s, 2),
                "estimated_seconds": None if self.estimated_seconds is None
                else round(self.estimated_seconds, 1)}
        if self.batch_size is not None:
            keep["batch_size"] = self.batch_size
        if self.threads_per_worker is not None:
            keep["threads_per_worker"] = int(self.threads_per_worker)
        return {**extra, **self.variant, **keep,
                "created": created()}


def tune(make: Callable[..., Workload], source: Any, devices: Any = "auto",
         backend: str = PoolSettings.backend, batch_sizes: Sequence[int] = (),
         budget_seconds: float = BUDGET_SECONDS, sample: int = SAMPLE,
         variants: Sequence[dict[str, Any]] | None = None) -> Tuned:
    """Search on the first ``sample`` records of ``source``; ``make(batch_size, **variant)``
    builds the workload (``batch_sizes`` empty: the workload's own, and phase 1 is skipped;
    ``variants`` None: those the workload offers, empty: phase 0 is skipped)."""
    deadline = time.monotonic() + budget_seconds
    distinct = list(dict.fromkeys(pool_settings(devices, backend).devices))
    trials: list[dict] = []
    if variants is None:
        offered = getattr(make(None), "variants", None)
        variants = offered(distinct) if offered is not None else []
    with tempfile.TemporaryDirectory() as folder:
        job = _Trials(source, sample, Path(folder), trials, distinct)
        job.variant = _variant(make, variants, distinct, backend, job, deadline)
        make = functools.partial(make, **job.variant)
        batch = None
        if batch_sizes:
            # phase 0's pick ran the workload's own batch size on the same layout: not again
            own = [t for t in _fastest(trials, "variant") if t["batch_size"] in batch_sizes]
            for size in batch_sizes:
                if own and size == own[0]["batch_size"]:
                    log.info("phase 1, batch size %s: measured already (trial %d)", size,
                             own[0]["trial"])
                    continue
                if time.monotonic() > deadline and trials:
                    break
                log.info("phase 1, batch size %s: starting one worker per device", size)
                with WorkerPool(make(size), distinct, backend, progress=False) as pool:
                    job.run(pool, "batch size", size, AUTO)
            ran = _fastest(trials, "batch size") + own
            if ran:
                batch = max(ran, key=lambda t: t["records_per_s"])["batch_size"]
            else:  # the budget went in phase 0: the workload's own size, measured there
                batch = getattr(make(None), "batch_size", None)
                log.info("phase 1: out of time before any batch size; the workload's own (%s) "
                         "kept", batch)
        log.info("phase 2, workers per device: starting a pool that grows while it pays")
        with WorkerPool(make(batch), distinct, backend, workers_per_device=AUTO,
                        progress=False) as pool:
            records = sample
            while True:  # growth measures within a job: a job too short for it, twice as long
                done = job.run(pool, "workers", batch, AUTO, records)
                if pool.settled or time.monotonic() > deadline or done < records:
                    break  # (the whole input was too short to settle: the count so far stands)
                records *= 2
            pool.hold_workers()
            workers = sorted((info.device for info in pool.workers), key=distinct.index)
            _workunit_sizes(pool, job, batch, deadline)
        if any(device.startswith("cpu") for device in workers) and time.monotonic() < deadline:
            # growing CPU workers run a thread each (helpers.engine.settings): also try the cores
            # shared among them, as a run of that layout would by default
            log.info("phase 3 again: %s sharing the cores", workers_in_words(workers))
            with WorkerPool(make(batch), workers, backend, progress=False) as pool:
                _workunit_sizes(pool, job, batch, deadline)
    # every trial ran the same sample, spin-up apart; growth's own jobs changed their worker
    # count midway, so they are no configuration to run (unless there is nothing else)
    fixed = [t for t in trials if t["phase"] != "workers" and not t.get("refused")]
    best = max(fixed or trials, key=lambda t: t["records_per_s"])
    total = source_length(open_source(source))
    devices = best["devices"].split(",")
    threads = best["threads_per_worker"] if "cpu" in devices else None
    return Tuned(devices, backend, best["batch_size"], best["workunit_size"],
                 best["records_per_s"],
                 total / best["records_per_s"] if total and best["records_per_s"] else None, trials,
                 best["trial"], threads, json.loads(best.get("variant") or "{}"))


def _variant(make: Callable[..., Workload], variants: Sequence[dict[str, Any]],
             devices: list[str], backend: str, job: _Trials, deadline: float) -> dict[str, Any]:
    """Phase 0: a pool per variant, one job each; the fastest variant its workers accepted."""
    for variant in variants:
        if time.monotonic() > deadline and job.rows:
            break
        log.info("phase 0, %s: loading one worker per device (and the quality guard)",
                 _words(variant))
        try:
            workload = make(None, **variant)
        except ValueError as exc:  # another of the workload's options rules this variant out
            job.refused(variant, str(exc).splitlines()[0])
            continue
        try:
            with WorkerPool(workload, devices, backend, progress=False) as pool:
                job.run(pool, "variant", getattr(workload, "batch_size", None), AUTO,
                        variant=variant)
        except PipelineError as exc:  # its workers refused it (the guard), or could not load it
            job.refused(variant, str(exc).splitlines()[0])
    ran = _fastest(job.rows, "variant")
    if variants and not ran:
        raise RuntimeError("tune: every variant was refused: " +
                           "; ".join(t["refused"] for t in job.rows))
    return json.loads(ran[0]["variant"]) if ran else {}


def _fastest(trials: list[dict], phase: str) -> list[dict]:
    """The fastest trial of ``phase`` that ran (a list of one, or empty)."""
    ran = [t for t in trials if t["phase"] == phase and not t.get("refused")]
    return [max(ran, key=lambda t: t["records_per_s"])] if ran else []


class _Trials:
    """Runs one trial (a job on the sample) and keeps its row."""

    def __init__(self, source: Any, sample: int, folder: Path, rows: list[dict],
                 order: list[str]) -> None:
        self.source, self.sample, self.folder, self.rows = source, sample, folder, rows
        self.order = order  # the devices as given: a trial's worker devices in that order
        self.variant: dict[str, Any] = {}  # the phases after 0: the variant they run

    def run(self, pool: WorkerPool, phase: str, batch: int | None, size: int | str,
            records: int | None = None, variant: dict[str, Any] | None = None) -> int:
        """One job on the first ``records`` (default: the sample); returns the records written."""
        output = self.folder / f"trial-{len(self.rows)}.h5"
        stats = pool.run(self.source, output, limit=records or self.sample, workunit_size=size,
                         durable=False)
        output.unlink(missing_ok=True)
        counts = Counter(w.device for w in stats.workers if w.records)
        devices = sorted((info.device for info in pool.workers), key=self.order.index)
        self.rows.append({"trial": len(self.rows), "phase": phase, "batch_size": batch,
                          "workers_per_device": ",".join(f"{d}={n}" for d, n in counts.items()),
                          "devices": ",".join(devices),
                          "threads_per_worker": max(info.threads for info in pool.workers),
                          "workunit_size": size, "records": stats.records,
                          "wall_s": stats.wall_seconds, "records_per_s": stats.records_per_second,
                          "decisions": len(stats.decisions),
                          "variant": json.dumps(variant or self.variant, sort_keys=True),
                          "loaded": json.dumps(pool.loaded, sort_keys=True), "refused": ""})
        log.info("%s", describe(self.rows[-1]))
        return stats.records

    def refused(self, variant: dict[str, Any], why: str) -> None:
        """A variant's row whose workers refused to load it: no rate, the reason."""
        self.rows.append({"trial": len(self.rows), "phase": "variant",
                          "variant": json.dumps(variant, sort_keys=True),
                          "devices": ",".join(self.order), "records": 0, "records_per_s": 0.0,
                          "refused": why})
        log.info("%s", describe(self.rows[-1]))


def _words(variant: dict[str, Any]) -> str:
    return variant_label(variant) or "the workload as given"


def describe(trial: dict[str, Any]) -> str:
    """A trial in words (its configuration, then its rate), for the log and the summary."""
    head = f"trial {trial['trial']} ({trial['phase']})"
    variant = json.loads(trial.get("variant") or "{}")
    if trial.get("refused"):
        return f"{head}: {_words(variant)}: refused: {trial['refused']}"
    said = [_words(variant)] if trial["phase"] == "variant" else []
    if trial.get("batch_size") is not None:
        said.append(f"batch {trial['batch_size']}")
    said.append(workers_in_words(trial["devices"].split(",")))
    if trial.get("threads_per_worker"):
        said.append(threads_in_words(trial["threads_per_worker"]))
    said.append(f"workunits {trial['workunit_size']}")
    return f"{head}: {', '.join(said)}: {trial['records_per_s']:.1f} records/s"


def _workunit_sizes(pool: WorkerPool, job: _Trials, batch: int | None,
                    deadline: float) -> None:
    """Phase 3: "auto", then fixed sizes of SIZE_FACTORS and 1× what "auto" gave the median
    worker (its rate × workunit_seconds)."""
    log.info("phase 3, workunit sizes: on %s", workers_in_words([i.device for i in pool.workers]))
    job.run(pool, "workunit size", batch, AUTO)
    rates = sorted(pool.sizing.rates.values())
    middle = rates[len(rates) // 2] * pool.job.workunit_seconds if rates \
        else JobSettings.workunit_size
    for size in sorted({max(1, round(middle * f)) for f in (*SIZE_FACTORS, 1.0)}):
        if time.monotonic() > deadline:
            break
        job.run(pool, "workunit size", batch, size)


def read_config(path: str | Path) -> dict[str, Any]:
    """tuned.yaml's fields; ValueError naming a field this file may not set."""
    try:
        values = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"config: cannot read {path}: {exc}") from None
    if not isinstance(values, dict):
        raise ValueError(f"config: {path} should map fields to values, got {type(values).__name__}")
    unknown = sorted(set(values) - set(CONFIG_FIELDS))
    if unknown:
        raise ValueError(f"config: unknown field {', '.join(map(repr, unknown))} in {path}; "
                         f"it may set {', '.join(CONFIG_FIELDS)}")
    return values


def write_config(tuned: Tuned, path: str | Path, **extra: Any) -> Path:
    path = Path(path)
    path.write_text("# written by python -m helpers tune; run it with "
                    "`python -m helpers run --config " + path.name + " --input ... --output ...`"
                    "\n" + yaml.safe_dump(tuned.config(**extra), sort_keys=False),
                    encoding="utf-8")
    return path
