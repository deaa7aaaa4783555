"""``python -m helpers tune``: a bounded search for the fastest configuration, on a sample of the
input, written to ``tuned.yaml`` for ``python -m helpers run --config tuned.yaml``.

Phases, in the order our users tune by hand, each reusing what it can::

    0. variant       how the model runs (the workload's ``variants(devices)``: its precisions
                     and runtimes these devices support): one worker per device, a pool per
                     variant, one job on the sample each; a variant whose workers refuse it
                     (the embedding workload's quality guard) is a row saying why, never picked;
                     then each of the workload's ``tokenizing_variants(devices)`` (a card's
                     tokenizing layouts) on the fastest; the later phases run the fastest
    1. batch size    one worker per device; a pool per candidate (the workload holds its batch
                     size), one job on the sample each (but the workload's own size, which
                     phase 0's pick ran already); workunits sized automatically
    2. workers       one pool with the best batch size and workers_per_device="auto": jobs on
                     the sample until growth has settled on every device
                     (helpers.engine.dispatch.growth; each job twice as long as the last, as growth
                     measures within one job), then the count is held
    3. workunits     the same pool, its workers loaded: one job per candidate size ("auto",
                     then fixed sizes around what "auto" chose); again on a fresh pool where
                     it shares the cores otherwise (``shared_otherwise``: a CPU's growing
                     workers run one thread each, threads_per_worker then part of the pick; a
                     card's, its device's share, which two or more workers divide: there on
                     the fresh pool alone, the layout a run takes)
    4. repeat        the LEADERS fastest configurations of phases 0, 1 and 3 measured once
                     more each (a pool per layout), in the budget's last REPEAT_SHARE

The budget holds (within about a trial's error): before each trial the tuner estimates how long
it will take (its records at the last job's rate, a pool's start where it needs one, a compiled
variant's compile) and skips a trial that would end past the budget. Phases 0 and 1 end by a
share of it (PHASE_ENDS: variants are cut first), so that a short budget still measures the
layout; a pick that no layout trial was measured against says so first in its reason. Every
value the user named and every step of a phase is tried, or is a row saying why not (refused by
the workers, or out of time). Every trial is a row
of a tidy table (phase, batch_size, workers_per_device, devices, threads_per_worker,
workunit_size, records, wall_s, records_per_s, refused, skipped, repeat_of, spinup_s: the
pool's start on its first trial, cut: read no further than the budget's end). A trial's reading
stops at the budget's end (a variant's speed is known only once it runs: bf16 on a CPU without
AVX-512 BF16 ran at a sixth of fp32's here), so a trial past it ends with its workunits in flight,
its rate measured on the records it did.

The pick is the fastest configuration of phases 0, 1, 3 and 4 by the median of its runs, all on
the same sample (phase 2's jobs change their worker count midway, so none is a configuration to
run): a lead smaller than a repeat's spread (the largest relative spread of a configuration
measured twice) is a tie, which the simpler configuration wins (fewer workers, fewer options its
variant asks for, its own batch size, workunits sized automatically). ``Tuned.reason`` says in
one line why.
The estimate for the whole input is its length ÷ the pick's rate (spin-up not included).
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

import numpy as np
import yaml

from helpers.engine.contract.devices import threads_in_words, workers_in_words
from helpers.engine.contract.protocol import Workload
from helpers.engine.contract.settings import AUTO, JobSettings, PoolSettings
from helpers.engine.contract.versions import created
from helpers.engine.dispatch.scheduler import PipelineError
from helpers.engine.inputs.sources import open_source, source_length
from helpers.engine.pipeline import WorkerPool
from helpers.engine.workers.backends import pool_settings
from helpers.workloads.embedding.runtimes import variant_label

log = logging.getLogger("gpufeed.tune")  # a line as each phase starts and each trial ends

SAMPLE = 2000  # records per trial
BUDGET_SECONDS = 300.0
SIZE_FACTORS = (0.5, 2.0)  # phase 3 also tries fixed sizes of these × the size "auto" settled on
REPEAT_SHARE = 0.15  # of the budget kept to measure the leading configurations again (once
# two are measured)
BUDGET_SLACK = 0.05  # of the budget a trial may be expected to end past it (the tune: ±10 %)
PHASE_ENDS = {"ways": 0.25, "variant": 0.35, "batch size": 0.55}  # a phase's trials end by
# this share of the budget: the layout's phases (workers, workunits) keep the rest, so a short
# budget measures the layout too (issue 59: a 150 s tune spent it all on variants, a compile
# trial alone took 70 s); "ways": phase 0's ways where tokenizing layouts follow them, which keep
# the rest of its share (a card's dozen ways, each a load and a guard, would leave them none)
COMPILE_SECONDS = 60.0  # a compiled variant's start beyond its pool's: torch.compile took 36-70 s
# on this CPU (notebook 07, issue 59); tried only where the budget holds it
LAYOUT_PHASES = ("batch size", "workers", "workunit size")
LEADERS = 3  # configurations measured again before the pick
CONFIG_FIELDS = {  # what tuned.yaml may set: field -> what it expects
    "workload": "a workload name", "model": "a model name or path", "devices": "a device list",
    "backend": "process or thread", "batch_size": "an integer >= 1",
    "workunit_size": "an integer >= 1 or 'auto'", "workunit_seconds": "seconds > 0",
    "threads_per_worker": "an integer >= 1", "precision": "fp32, bf16 or fp16",
    "runtime": "torch, onnx or onnx-int8", "compile": "true or false",
    "cuda_graphs": "true or false", "unpadded": "true or false",
    "text_column": "the input's text column", "id_column": "the input's id column",
    "keep_columns": "a list of the input's columns to carry",
    "card": "a simulated card's profile (h200, h200-compiled, h100, a100, l4)",
    "card_cores": "an integer >= 1", "tokenize_threads": "an integer >= 1",
    "tokenize_processes": "an integer >= 1", "word_cache": "true or false",
    "feeder": "true or false", "batch_tokens": "an integer >= 1",
    "prompt": "the text put before each record", "prompt_name": "one of the model's prompts",
    "task": "query or document", "max_seq_length": "an integer >= 1",
    "truncate_dim": "an integer >= 1",
    "stored": "float32, float16, int8, uint8, binary or ubinary",
    "records_per_s": "the tuned rate (informative)",
    "estimated_seconds": "the estimate for the whole input (informative)",
    "input": "the tuned input (informative)", "created": "when (informative)",
    "reason": "why the tuner chose it (informative)"}


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
    reason: str = ""  # one line: why this configuration

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
                **({"reason": self.reason} if self.reason else {}), "created": created()}


def tune(make: Callable[..., Workload], source: Any, devices: Any = "auto",
         backend: str = PoolSettings.backend, batch_sizes: Sequence[int] = (),
         budget_seconds: float = BUDGET_SECONDS, sample: int = SAMPLE,
         variants: Sequence[dict[str, Any]] | None = None,
         max_seq_lengths: Sequence[int] = (),
         tokenizing: Sequence[dict[str, Any]] | None = None) -> Tuned:
    """Search on the first ``sample`` records of ``source``; ``make(batch_size, **variant)``
    builds the workload (``batch_sizes`` empty: the workload's own, and phase 1 is skipped;
    ``variants`` None: those the workload offers, empty: none; ``tokenizing`` likewise, the
    workload's ``tokenizing_variants``: phase 0 tries them on the variant it picked).
    ``max_seq_lengths``: lengths the user accepts (each changes the vectors of longer texts,
    so never tried unasked): phase 0 tries each variant at each."""
    started = time.monotonic()
    distinct = list(dict.fromkeys(pool_settings(devices, backend).devices))
    trials: list[dict] = []
    if variants is None:
        offered = getattr(make(None), "variants", None)
        variants = offered(distinct) if offered is not None else []
    if tokenizing is None:
        offered = getattr(make(None), "tokenizing_variants", None)
        tokenizing = offered(distinct) if offered is not None else []
    if max_seq_lengths:
        variants = [{**variant, "max_seq_length": int(length)}
                    for variant in (variants or [{}]) for length in max_seq_lengths]
    with tempfile.TemporaryDirectory() as folder:
        job = _Trials(source, sample, Path(folder), trials, distinct, started, budget_seconds)
        job.variant = _variant(make, variants, tokenizing, distinct, backend, job)
        own_batch = getattr(make(None, **job.variant), "batch_size", None)
        unpicked, make = make, functools.partial(make, **job.variant)  # (a repeat of another
        # variant's trial is made with its own variant alone: two variants may name different
        # options, tokenize_threads and tokenize_processes, that do not combine)
        batch = _batch_size(make, batch_sizes, distinct, backend, job)
        workers = distinct
        again = shared_otherwise(workers, distinct, backend, make(batch))  # (grown: anew below)
        late = job.late(sample, new_pool=True, rate=_best_rate(trials))
        if late and _fixed(trials):  # (with no trial yet, one is run however late)
            job.skipped("workers", late, batch_size=batch, devices=",".join(distinct))
        else:
            log.info("phase 2, workers per device: starting a pool that grows while it pays")
            with WorkerPool(make(batch), distinct, backend, workers_per_device=AUTO,
                            progress=False) as pool:
                job.opened(pool)
                records = sample
                while True:  # growth measures within a job: a job too short, twice as long
                    done = job.run(pool, "workers", batch, AUTO, records)
                    if pool.settled or done < records or job.late(records * 2):
                        break  # (the input too short to settle: the count so far stands)
                    records *= 2
                pool.hold_workers()
                workers = sorted((info.device for info in pool.workers), key=distinct.index)
                again = shared_otherwise(workers, distinct, backend, make(batch))
                if not again or any(device.startswith("cpu") for device in workers):
                    _workunit_sizes(pool, job, batch)  # (a card's growing workers' share
                    # is no layout a run can be told to take: its sizes run on the pool below)
        if again:
            late = job.late(sample * (1 + len(SIZE_FACTORS) + 1), new_pool=True)
            if late:
                job.skipped("workunit size", late, batch_size=batch, devices=",".join(workers),
                            workunit_size="shared cores")
            else:
                log.info("phase 3 again: %s sharing the cores", workers_in_words(workers))
                with WorkerPool(make(batch), workers, backend, progress=False) as pool:
                    job.opened(pool)
                    _workunit_sizes(pool, job, batch)
        job.reserve = 0.0  # (the repeats' own share, now theirs)
        _repeat_leaders(unpicked, backend, job)
    best, reason = _pick(trials, own_batch)
    log.info("picked: %s", reason)
    total = source_length(open_source(source))
    devices = best["devices"].split(",")
    threads = best["threads_per_worker"] if "cpu" in devices else None
    rate = best["median_records_per_s"]
    return Tuned(devices, backend, best["batch_size"], best["workunit_size"], rate,
                 total / rate if total and rate else None, trials, best["trial"], threads,
                 json.loads(best.get("variant") or "{}"), reason)


def shared_otherwise(workers: list[str], distinct: list[str], backend: str,
                     workload: Workload) -> bool:
    """Whether a pool of ``workers`` started at once shares this machine's cores otherwise than
    phase 2's growing pool did (helpers.engine.contract.settings): a CPU worker grew with one
    thread; a card worker (process or Ray backend), with its device's share, which more workers
    than devices divide. Phase 3 then runs again on such a pool, the layout a run takes."""
    if any(device.startswith("cpu") for device in workers):
        return True
    return backend != "thread" and len(workers) > len(distinct) and \
        getattr(workload, "requires_hardware", True)


def _batch_size(make: Callable[..., Workload], batch_sizes: Sequence[int], devices: list[str],
                backend: str, job: _Trials) -> int | None:
    """Phase 1: a pool per batch size named (but the one phase 0's pick ran already), one job
    each; every size named is tried, or a row says why not. The fastest, else the workload's
    own."""
    if not batch_sizes:
        return None
    own = [t for t in _fastest(job.rows, "variant") if t["batch_size"] in batch_sizes]
    for size in batch_sizes:
        if own and size == own[0]["batch_size"]:
            log.info("phase 1, batch size %s: measured already (trial %d)", size,
                     own[0]["trial"])
            continue
        late = job.late(job.sample, new_pool=True, rate=_best_rate(job.rows), phase="batch size")
        if late:
            job.skipped("batch size", late, batch_size=size, devices=",".join(devices))
            continue
        log.info("phase 1, batch size %s: starting one worker per device", size)
        with WorkerPool(make(size), devices, backend, progress=False) as pool:
            job.opened(pool)
            job.run(pool, "batch size", size, AUTO)
    ran = _fastest(job.rows, "batch size") + own
    if ran:
        return max(ran, key=lambda t: t["records_per_s"])["batch_size"]
    batch = getattr(make(None), "batch_size", None)  # the budget went in phase 0
    log.info("phase 1: out of time before any batch size; the workload's own (%s) kept", batch)
    return batch


def _variant(make: Callable[..., Workload], variants: Sequence[dict[str, Any]],
             tokenizing: Sequence[dict[str, Any]], devices: list[str], backend: str,
             job: _Trials) -> dict[str, Any]:
    """Phase 0: a pool per variant, one job each, then each ``tokenizing`` layout on the
    fastest (what feeds a card, tried on the way it runs: a layout beside every way would
    multiply the trials; the layout the fastest ran, the workload as given, is not run twice);
    the fastest variant its workers accepted. Every variant is tried, or a row says why not
    (refused, or out of time)."""
    _try_variants(make, variants, devices, backend, job, "ways" if tokenizing else "variant")
    ran = _fastest(job.rows, "variant", tried=variants)
    way = json.loads(ran[0]["variant"]) if ran else {}
    layouts = [{**way, **layout} for layout in tokenizing if layout or not ran]
    _try_variants(make, layouts, devices, backend, job)
    ran = _fastest(job.rows, "variant", tried=layouts)
    return json.loads(ran[0]["variant"]) if ran else {}


def _try_variants(make: Callable[..., Workload], variants: Sequence[dict[str, Any]],
                  devices: list[str], backend: str, job: _Trials, ends: str = "variant") -> None:
    """A pool per variant, one job each, or a row saying why not (refused, or out of time:
    ``ends``, the share of the budget they end by, PHASE_ENDS)."""
    for variant in variants:
        rates = [t["records_per_s"] for t in job.rows if t["phase"] == "variant" and _ran(t)]
        late = job.late(job.sample, new_pool=True, rate=float(np.median(rates)),
                        phase=ends, extra=COMPILE_SECONDS * bool(variant.get("compile"))) \
            if rates else ""
        if late:
            job.skipped("variant", late, variant=variant, devices=",".join(devices))
            continue
        log.info("phase 0, %s: loading one worker per device (and the quality guard)",
                 _words(variant))
        try:
            workload = make(None, **variant)
        except ValueError as exc:  # another of the workload's options rules this variant out
            job.refused(variant, str(exc).splitlines()[0])
            continue
        try:
            with WorkerPool(workload, devices, backend, progress=False) as pool:
                job.opened(pool)
                job.run(pool, "variant", getattr(workload, "batch_size", None), AUTO,
                        variant=variant)
        except PipelineError as exc:  # its workers refused it (the guard), or could not load it
            job.refused(variant, str(exc).splitlines()[0])


def _fastest(trials: list[dict], phase: str, tried: Sequence[Any] = ()) -> list[dict]:
    """The fastest trial of ``phase`` that ran (a list of one, or empty); RuntimeError where
    values were ``tried`` and none of the phase's trials ran (every one refused)."""
    ran = [t for t in trials if t["phase"] == phase and _ran(t)]
    if tried and not ran:
        raise RuntimeError(f"tune: every {phase} was refused: " +
                           "; ".join(t["refused"] or t["skipped"] for t in trials))
    return [max(ran, key=lambda t: t["records_per_s"])] if ran else []


def _best_rate(trials: list[dict]) -> float | None:
    """The fastest rate measured so far (what the later phases refine runs about that fast)."""
    rates = [t["records_per_s"] for t in _fixed(trials)]
    return max(rates) if rates else None


def _ran(trial: dict) -> bool:
    return not trial.get("refused") and not trial.get("skipped")


def _fixed(trials: list[dict]) -> list[dict]:
    """The trials that ran one configuration from start to end (phase 2's jobs change their
    worker count midway: no configuration to run)."""
    return [t for t in trials if t["phase"] != "workers" and _ran(t)]


def configuration(trial: dict) -> tuple:
    """What a trial ran, as a key: two trials of one configuration are repeats."""
    return (trial.get("variant") or "{}", trial.get("batch_size"), trial["devices"],
            trial.get("threads_per_worker"), str(trial["workunit_size"]))


def _repeat_leaders(make: Callable[..., Workload], backend: str, job: _Trials) -> None:
    """The LEADERS fastest configurations measured again, once each, while the budget's last
    REPEAT_SHARE allows: a pool per layout (variant, batch size, workers, threads), each of its
    leaders' workunit sizes run on it; ``make`` builds each with its trial's own variant."""
    leaders: dict[tuple, dict] = {}
    for trial in sorted(_fixed(job.rows), key=lambda t: -t["records_per_s"]):
        leaders.setdefault(configuration(trial), trial)
        if len(leaders) == LEADERS:
            break
    if len(leaders) < 2:
        return
    pools: dict[tuple, list[dict]] = {}
    for key, trial in leaders.items():
        pools.setdefault(key[:4], []).append(trial)
    for (variant, batch, devices, threads), group in pools.items():
        late = job.late(job.sample * len(group), new_pool=True,
                        rate=min(t["records_per_s"] for t in group))
        if late:
            for trial in group:
                job.skipped("repeat", late, repeat_of=trial["trial"], **_config_of(trial))
            continue
        log.info("repeat: the leading %s measured again", "trials " + ", ".join(
            str(t["trial"]) for t in group) if len(group) > 1 else f"trial {group[0]['trial']}")
        options = {"threads_per_worker": int(threads)} if threads and "cpu" in devices else {}
        with WorkerPool(make(batch, **json.loads(variant)), devices.split(","), backend,
                        progress=False, **options) as pool:
            job.opened(pool)
            for trial in group:
                size = trial["workunit_size"]
                job.run(pool, "repeat", batch, size, variant=json.loads(variant),
                        repeat_of=trial["trial"])


def _config_of(trial: dict) -> dict[str, Any]:
    return {"batch_size": trial.get("batch_size"), "devices": trial["devices"],
            "workunit_size": trial["workunit_size"],
            "variant": json.loads(trial.get("variant") or "{}")}


def _pick(trials: list[dict], own_batch: int | None) -> tuple[dict, str]:
    """The configuration to run, and one line saying why: the fastest by the median of its runs;
    a lead smaller than a repeat's spread (the largest of the configurations measured twice) is
    a tie, which the simpler configuration wins (fewer workers, fewer options its variant asks
    for, its own batch size, workunits sized automatically). A pick no layout trial was
    measured against says so first (``_unmeasured``)."""
    fixed = _fixed(trials) or [t for t in trials if _ran(t)]
    runs: dict[tuple, list[dict]] = {}
    for trial in fixed:
        runs.setdefault(configuration(trial), []).append(trial)
    medians = {key: float(np.median([t["records_per_s"] for t in group]))
               for key, group in runs.items()}
    spreads = [(max(r) - min(r)) / float(np.median(r)) for r in
               ([t["records_per_s"] for t in group] for group in runs.values())
               if len(r) > 1 and np.median(r) > 0]
    spread = max(spreads) if spreads else None
    ranked = sorted(medians, key=lambda k: -medians[k])
    leader = ranked[0]
    tied = [k for k in ranked if spread is not None and medians[k] >= medians[leader] * (1 - spread)]
    chosen = min(tied, key=lambda k: (_simplicity(runs[k][0], own_batch), -medians[k])) \
        if len(tied) > 1 else leader
    best = {**runs[chosen][0], "median_records_per_s": medians[chosen]}
    said = f"trial {best['trial']} ({_configuration_words(best)}) at {medians[chosen]:.1f} " \
           f"records/s, " + (f"the median of {len(runs[chosen])} runs" if len(runs[chosen]) > 1
                             else "one run")
    if len(ranked) == 1:
        why = "the only configuration measured"
    elif spread is None:
        second = ranked[1]
        why = (f"the fastest; the next, trial {runs[second][0]['trial']}, at "
               f"{medians[second] / medians[chosen]:.2f}x (no configuration was measured twice, "
               f"so how far a repeat moves is not known)")
    elif chosen != leader:
        why = (f"within a repeat's spread ({spread:.0%}) of the fastest, trial "
               f"{runs[leader][0]['trial']} at {medians[leader]:.1f}: a tie, which the simpler "
               f"configuration wins")
    elif len(tied) > 1:
        why = (f"the fastest, and also the simplest of the {len(tied)} within a repeat's spread "
               f"({spread:.0%}) of it")
    else:
        second = ranked[1]
        why = (f"the fastest, ahead of trial {runs[second][0]['trial']} "
               f"({medians[second] / medians[chosen]:.2f}x) by more than a repeat's spread "
               f"({spread:.0%})")
    return best, f"{_unmeasured(trials)}{said}: {why}"


def _unmeasured(trials: list[dict]) -> str:
    """The start of the pick's reason where it was not measured against a layout: "not tuned"
    for each layout phase (LAYOUT_PHASES) that asked for trials and ran none (out of time)."""
    skipped = [phase for phase in LAYOUT_PHASES
               if any(t["phase"] == phase for t in trials)
               and not any(t["phase"] == phase and _ran(t) for t in trials)]
    if not skipped:
        return ""
    return (f"not tuned for {', '.join(skipped)}: every trial of "
            f"{'it' if len(skipped) == 1 else 'them'} was out of time (a longer --budget-seconds "
            f"measures them); so far, ")


def _ends_in_words(phase: str) -> str:
    """When ``phase`` (a key of PHASE_ENDS) ends, in words."""
    if phase == "ways":
        return (f"phase 'variant' ends its ways at {PHASE_ENDS['ways']:.0%} of the budget, its "
                f"tokenizing layouts at {PHASE_ENDS['variant']:.0%}")
    return f"phase {phase!r} ends at {PHASE_ENDS[phase]:.0%} of the budget"


def _asked(variant: dict[str, Any]) -> int:
    """The options ``variant`` asks for: those it names, but one it turns off (``compile``
    False: what a way that does not compile says); none for the workload as given; a way with
    CUDA graphs or compiled, one more than the eager way; a tokenizing layout on a way, one more
    than the way alone."""
    return sum(value is not False for value in variant.values())


def _simplicity(trial: dict, own_batch: int | None) -> tuple:
    """How much a configuration asks for, least first: workers, options its variant asks for
    (``_asked``), another batch size than its own, fixed workunit sizes."""
    return (len(trial["devices"].split(",")), _asked(json.loads(trial.get("variant") or "{}")),
            trial.get("batch_size") not in (None, own_batch), trial["workunit_size"] != AUTO)


def _configuration_words(trial: dict) -> str:
    said = [_words(json.loads(trial.get("variant") or "{}"))] if trial.get("variant") not in (
        None, "{}") else []
    if trial.get("batch_size") is not None:
        said.append(f"batch {trial['batch_size']}")
    said.append(workers_in_words(trial["devices"].split(",")))
    said.append(f"workunits {trial['workunit_size']}")
    return ", ".join(said)


class _Trials:
    """Runs one trial (a job on the sample) and keeps its row; says whether the next one would
    end past ``deadline`` (``late``), from the rates and spin-ups measured so far."""

    def __init__(self, source: Any, sample: int, folder: Path, rows: list[dict],
                 order: list[str], started: float, budget: float) -> None:
        self.source, self.sample, self.folder, self.rows = source, sample, folder, rows
        self.order = order  # the devices as given: a trial's worker devices in that order
        self.variant: dict[str, Any] = {}  # the phases after 0: the variant they run
        self.started, self.budget, self.deadline = started, budget, started + budget
        self.slack = budget * BUDGET_SLACK  # a trial may end this far past it (a trial's error)
        self.reserve = budget * REPEAT_SHARE  # kept for the repeats once there are two
        # configurations to repeat
        self._spinups: list[float] = []  # how long each pool took to start
        self._pool: WorkerPool | None = None  # the last trial's (its start is the first's)
        self._rate: float | None = None  # records/s of the last job
        self._overhead = 0.0  # a job's seconds beyond its records at its rate (its ends)

    def opened(self, pool: WorkerPool) -> None:
        self._spinups.append(pool.spinup_s)

    def end(self, phase: str) -> float:
        """When ``phase``'s trials must end: its share of the budget (PHASE_ENDS), else the
        budget's end."""
        return self.started + self.budget * PHASE_ENDS[phase] if phase in PHASE_ENDS \
            else self.deadline

    def late(self, records: int, new_pool: bool = False, rate: float | None = None,
             phase: str = "", extra: float = 0.0) -> str:
        """Why a job of ``records`` (on a new pool: its start too, the median of those so far;
        ``extra`` seconds more: a compile) at ``rate`` (default: the last job's, on the pool it
        ran on) would end past ``phase``'s end, or "" if it should not (or nothing has been
        measured to tell)."""
        reserve = self.reserve if len({configuration(t) for t in _fixed(self.rows)}) >= 2 else 0.0
        end = min(self.deadline - reserve, self.end(phase))
        left = end - time.monotonic()
        rate = rate or self._rate
        if not rate:
            return "" if left > 0 else "out of time before it"
        spinup = float(np.median(self._spinups)) if new_pool and self._spinups else 0.0
        expected = records / rate + self._overhead + spinup + extra
        if expected <= left + self.slack:
            return ""
        kept = f", {reserve:.0f} s more kept to measure the leaders again" if reserve else ""
        share = f" ({_ends_in_words(phase)}, the layout keeps the rest)" \
            if phase in PHASE_ENDS and end < self.deadline - reserve else ""
        return (f"out of time: it would take about {expected:.0f} s ("
                f"{'a pool started, then ' if new_pool else ''}"
                f"{f'a {extra:.0f} s compile, then ' if extra else ''}{records:,} records at "
                f"{rate:.1f}/s), {max(0.0, left):.0f} s of the budget left{share}{kept}")

    def run(self, pool: WorkerPool, phase: str, batch: int | None, size: int | str,
            records: int | None = None, variant: dict[str, Any] | None = None,
            repeat_of: int | None = None) -> int:
        """One job on the first ``records`` (default: the sample), its dispatching stopped at the
        budget's end (JobSettings.stop_at: a variant's speed is known only once it runs);
        returns the records written."""
        output = self.folder / f"trial-{len(self.rows)}.h5"
        wanted = records or self.sample
        end = self.end(phase) + self.slack if _fixed(self.rows) else float("inf")  # (the
        # first trial runs whole: a tune measures something)
        stats = pool.run(self.source, output, limit=wanted, workunit_size=size, stop_at=end)
        output.unlink(missing_ok=True)
        spinup, self._pool = (pool.spinup_s if pool is not self._pool else 0.0), pool
        if stats.records and stats.records_per_s:
            self._rate = stats.records_per_s
            self._overhead = max(0.0, stats.wall_s - stats.records / self._rate)
        counts = Counter(w.device for w in stats.workers if w.records)
        devices = sorted((info.device for info in pool.workers), key=self.order.index)
        self.rows.append({"trial": len(self.rows), "phase": phase, "batch_size": batch,
                          "workers_per_device": ",".join(f"{d}={n}" for d, n in counts.items()),
                          "devices": ",".join(devices),
                          "threads_per_worker": max((info.threads for info in pool.workers
                                                     if info.device == "cpu"), default=None),
                          "workunit_size": size, "records": stats.records,
                          "wall_s": stats.wall_s, "records_per_s": stats.records_per_s,
                          "decisions": len(stats.decisions),
                          "variant": json.dumps(variant or self.variant, sort_keys=True),
                          "loaded": json.dumps(pool.loaded, sort_keys=True), "refused": "",
                          "skipped": "", "repeat_of": repeat_of, "spinup_s": spinup,
                          "cut": stats.records + stats.failed_records < wanted and
                          time.monotonic() > end,
                          **({"card_busy_share": stats.card_busy_share}  # (a simulated card's)
                             if stats.card_busy_share is not None else {})})
        log.info("%s", describe(self.rows[-1]))
        return stats.records

    def refused(self, variant: dict[str, Any], why: str) -> None:
        """A variant's row whose workers refused to load it: no rate, the reason."""
        self.rows.append({"trial": len(self.rows), "phase": "variant",
                          "variant": json.dumps(variant, sort_keys=True),
                          "devices": ",".join(self.order), "records": 0, "records_per_s": 0.0,
                          "refused": why, "skipped": ""})
        log.info("%s", describe(self.rows[-1]))

    def skipped(self, phase: str, why: str, variant: dict[str, Any] | None = None,
                **config: Any) -> None:
        """A trial asked for (a value the user named, a phase) and not run: the reason."""
        self.rows.append({"trial": len(self.rows), "phase": phase,
                          "variant": json.dumps(variant if variant is not None else self.variant,
                                                sort_keys=True),
                          "devices": ",".join(self.order), "records": 0, "records_per_s": 0.0,
                          "refused": "", "skipped": why, **config})
        log.info("%s", describe(self.rows[-1]))


def _words(variant: dict[str, Any]) -> str:
    return variant_label(variant) or "the workload as given"


def describe(trial: dict[str, Any]) -> str:
    """A trial in words (its configuration, then its rate), for the log and the summary."""
    head = f"trial {trial['trial']} ({trial['phase']})"
    variant = json.loads(trial.get("variant") or "{}")
    if trial.get("refused"):
        return f"{head}: {_words(variant)}: refused: {trial['refused']}"
    said = [_words(variant)] if trial["phase"] in ("variant", "repeat") and (
        trial["phase"] == "variant" or variant) else []
    if trial.get("batch_size") is not None:
        said.append(f"batch {trial['batch_size']}")
    if trial.get("skipped"):
        if trial.get("workunit_size") is not None:
            said.append(f"workunits {trial['workunit_size']}")
        return f"{head}: {', '.join(said + [''])}skipped: {trial['skipped']}"
    said.append(workers_in_words(trial["devices"].split(",")))
    if trial.get("threads_per_worker"):
        said.append(threads_in_words(trial["threads_per_worker"]))
    said.append(f"workunits {trial['workunit_size']}")
    again = f" (trial {trial['repeat_of']} again)" if trial.get("repeat_of") is not None else ""
    return f"{head}{again}: {', '.join(said)}: {trial['records_per_s']:.1f} records/s"


def _workunit_sizes(pool: WorkerPool, job: _Trials, batch: int | None) -> None:
    """Phase 3: "auto", then fixed sizes of SIZE_FACTORS and 1× what "auto" gave the median
    worker (its rate × workunit_seconds); a size out of time is a row saying so."""
    log.info("phase 3, workunit sizes: on %s", workers_in_words([i.device for i in pool.workers]))
    job.run(pool, "workunit size", batch, AUTO)
    rates = sorted(pool.sizing.rates.values())
    middle = rates[len(rates) // 2] * pool.job.workunit_seconds if rates \
        else JobSettings.workunit_size
    devices = ",".join(sorted((i.device for i in pool.workers), key=job.order.index))
    for size in sorted({max(1, round(middle * f)) for f in (*SIZE_FACTORS, 1.0)}):
        late = job.late(job.sample)
        if late:
            job.skipped("workunit size", late, batch_size=batch, devices=devices,
                        workunit_size=size)
            continue
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
