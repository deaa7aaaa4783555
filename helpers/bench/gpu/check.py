"""``python -m helpers.bench gpu --out DIR``: the whole GPU check, in one call, within its budget.

Sections, in this order (each writes its tables as soon as it ends, so a call cut short keeps
what it measured)::

    the card's ceilings ─► the model's side ─► faults ─► the simulated card ─► the study
    (matmul, copy)         (model_side.py)     (faults.py) (simulated.py)      (study.py)
    ─► the summary, printed last

The model's side has until MODEL_SHARE of the budget, the faults until FAULTS_SHARE (three
checks, about a minute), the simulated card (does this machine's CPU feed its card?) until
SIMULATED_SHARE, and the study fills what is left but RESERVE_SECONDS, a run it cannot finish
skipped and said so; its tables are saved after every run. A section that raises (a card's
first contact with code only its fakes ran) has its error and traceback in the log and its name
in the last lines ("failed (their errors above): ..."; the call still exits 0), what it measured
before saved, and the next section runs on what there is, or on fallbacks: a worker's rate of one
text a second (the study's first guesses), eager (no graphs), the simulated profile of the
card's name. The model is
all-MiniLM-L6-v2's configuration and tokenizer with seeded random weights
(helpers.bench.gpu.weights), built into a temporary folder first. ``--dry-run`` runs every
section on a CPU with tiny sizes (DRY), in under a minute: the test suite runs it, so the check
never reaches a card broken.
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from helpers.bench.gpu import faults, model_side, simulated, study
from helpers.bench.gpu.tables import TABLES, measured
from helpers.bench.gpu.weights import PREPARED, WEIGHTS, build, prepare

BUDGET_SECONDS = 330.0  # the check's own limit: its call ends within 7 minutes, so that a
# second try fits the session's device time (helpers.bench.gpu.plan; 400 s before 2026-12-07)
MODEL_SHARE = 0.35  # of the budget: the model's side ends by then (the feed variant compiled
# first, the others last while time allows)
FAULTS_SHARE = 0.55  # and a fault check starts only if it should end by then
SIMULATED_SHARE = 0.62  # and a run on the simulated card
SIMULATED_WORKUNIT = 1024  # records a workunit on the simulated card (gpu.yaml's ~1,000)
RESERVE_SECONDS = 15.0  # kept at the end: tables, the summary


@dataclass(frozen=True)
class Sizes:
    """How much each section does: CARD on a GPU, DRY for the dry run."""

    model_texts: int = 4096  # the sample's paragraphs the model's side times
    batch_sizes: tuple[int, ...] = (64, 128, 256, 512, 1024)
    repeats: int = 3  # passes of the forward alone timed
    rounds: int = 2  # rounds of encode
    precisions: tuple[str, ...] = model_side.PRECISIONS
    compiled: bool = True
    study_records: int = 100_000  # (200,000 on the first card, an H200: its study reached 3
    # workers of 4 and no fixed size in its time; at its rates half as many should reach 4)
    simulated_records: int = 100_000  # the sample's paragraphs a simulated card's run feeds
    worker_counts: tuple[int, ...] = study.WORKER_COUNTS
    workunit_sizes: tuple[int | str, ...] = study.SIZES
    tokenizing: tuple[dict[str, int], ...] | None = None  # the study's tokenizing layouts
    # beside the default (None: those the tuner tries on the card: study.measure)
    oom_records: int = faults.OOM_RECORDS
    fit_max: int = faults.FIT_MAX
    kill_units: int = 256  # workunit size of the killed job
    kill_seconds: float = faults.KILL_SECONDS  # how long the killed job should last
    matmul_size: int = 8192
    copy_bytes: int = 2 ** 31
    layers: int | None = None  # fewer transformer layers (None: the model's six)


CARD = Sizes()
DRY = Sizes(model_texts=32, batch_sizes=(16, 32), repeats=1, rounds=1, precisions=("fp32",),
            compiled=False, study_records=160, simulated_records=160, worker_counts=(1, 2),
            workunit_sizes=("auto", 32), tokenizing=({"tokenize_threads": 2},),
            oom_records=32, fit_max=2, kill_units=8, kill_seconds=3.0, matmul_size=256,
            copy_bytes=2 ** 22, layers=1)


def check_device(dry_run: bool) -> str:
    """cuda:0, or the CPU for a dry run; ValueError (a bad argument) for a real run without a
    card."""
    import torch

    if torch.cuda.is_available():
        return "cuda:0"
    if dry_run:
        return "cpu"
    raise ValueError("no CUDA device here: the GPU check runs on a card (`--dry-run` runs it on "
                     "this CPU with tiny sizes, to check the script)")


def run(out: str | Path, dry_run: bool = False, budget: float = BUDGET_SECONDS,
        prepared: Path = PREPARED) -> Path:
    """Every section into ``out``; print the summary last; return ``out``."""
    started = time.monotonic()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # (workers inherit it: nothing is fetched)
    device = check_device(dry_run)
    sizes = DRY if dry_run else CARD
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in TABLES:  # an older call's tables never pass for this one's
        for suffix in (".csv", ".json"):
            (out / f"{name}{suffix}").unlink(missing_ok=True)
    parameters = {**asdict(sizes), "device": device, "dry_run": dry_run, "budget_s": budget,
                  "weights": WEIGHTS}

    def say(what: str) -> None:  # progress, for the call's log
        print(f"[{time.monotonic() - started:5.0f} s] {what}", flush=True)

    failed: list[str] = []

    def section(name: str, work: Callable[[], Any], otherwise: Any = None) -> Any:
        """``work()``, or where it raises, ``otherwise``: its error and traceback in the log,
        its name in the summary, and the next section runs (on a card's first contact, a
        section's failure must not cost the others)."""
        try:
            return work()
        except Exception as exc:
            failed.append(name)
            say(f"{name} failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            return otherwise

    with tempfile.TemporaryDirectory(prefix="gpufeed-gpu-") as scratch:
        folder = Path(scratch)
        say(f"on {device}: building the model (weights {WEIGHTS})")
        if not (prepared / "config.json").is_file() and dry_run:
            prepare(prepared)  # (here, from the embedded model; a card's call carries it)
        model_dir = str(build(prepared, folder / "model", layers=sizes.layers))
        say("the card's ceilings")
        card = section("the card's ceilings", lambda: _save(
            pd.DataFrame(_ceilings(device, sizes)), "gpu_card", out, parameters),
            pd.DataFrame())
        ceilings = _matmul_rates(card)
        texts = [text for _, text in study.corpus(sizes.model_texts)]
        say("the model's side")
        measured_rows: list[dict[str, Any]] = []  # (what it measured before any error)
        section("the model's side", lambda: model_side.measure(
            model_dir, device, texts, sizes.batch_sizes, sizes.repeats, sizes.rounds,
            started + MODEL_SHARE * budget, ceilings, sizes.precisions, sizes.compiled,
            measured_rows))
        model = _save(pd.DataFrame(measured_rows), "gpu_model", out, parameters)
        section("releasing the model's memory", lambda: _release(device))  # (the workers
        # need the card's memory this process cached)
        workload = _study_workload(model_dir, device)
        rate = _worker_rate(model, device)
        say("faults")
        section("faults", lambda: _save(pd.DataFrame(faults.measure(
            workload, device, sizes.oom_records, rate, sizes.kill_units, folder,
            started + FAULTS_SHARE * budget, sizes.fit_max, sizes.kill_seconds)),
            "gpu_faults", out, parameters))
        say("the simulated card")
        texts = [text for _, text in study.corpus(sizes.simulated_records)]
        gpu = str(card["gpu"].iloc[0]) if "gpu" in card else _gpu_name(device)
        section("the simulated card", lambda: _save(pd.DataFrame(simulated.measure(
            model_dir, texts, simulated.card_for(gpu), model_side.ENCODE_BATCH,
            SIMULATED_WORKUNIT, started + SIMULATED_SHARE * budget)),
            "gpu_simulated", out, parameters))
        graphs = _graphs_faster(model, device)
        say(f"the study{' (with CUDA graphs: faster in the model side)' if graphs else ''}")
        workload = _study_workload(model_dir, device, graphs)

        def keep(runs: list[dict[str, Any]], samples: list[dict[str, Any]]) -> None:
            _save(pd.DataFrame(runs).assign(cuda_graphs=graphs), "gpu_study", out, parameters)
            _save(pd.DataFrame(samples), "gpu_study_samples", out, parameters)

        def the_study() -> None:
            runs, _ = study.measure(workload, device, sizes.study_records, sizes.worker_counts,
                                    sizes.workunit_sizes, started + budget - RESERVE_SECONDS,
                                    folder, _worker_rate(model, device, graphs), keep,
                                    sizes.tokenizing)
            _save(pd.DataFrame(runs).assign(cuda_graphs=graphs), "gpu_study", out,
                  parameters)  # (the runs cut, too)

        section("the study", the_study)
    from helpers.bench.gpu.report import summary

    print(summary(out))
    if failed:
        print(f"failed (their errors above): {', '.join(failed)}")
    print(f"tables: {out} ({time.monotonic() - started:.0f} s)")
    return out


def _gpu_name(device: str) -> str:
    """The card's name from torch ("" on a CPU), where its ceilings' table has none."""
    if not device.startswith("cuda"):
        return ""
    import torch

    return str(torch.cuda.get_device_name(device))


def _matmul_rates(card: pd.DataFrame) -> dict[str, float]:
    """The card's bf16 and fp32 matrix rates from its ceilings (NaN where they were not
    measured: the shares of them are NaN then)."""
    rates = card.set_index("ceiling")["value"] if "ceiling" in card else pd.Series(dtype=float)
    return {"bf16": float(rates.get("matmul_bf16", float("nan"))),
            "fp32": float(rates.get("matmul_fp32", float("nan")))}


def _release(device: str) -> None:
    """Give back what the model's side held: its models, compiled graphs and cached blocks."""
    import gc

    import torch

    gc.collect()
    torch.compiler.reset()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _ceilings(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    import torch

    from helpers.bench.gpu.card import ceilings

    rows = ceilings(device, sizes.matmul_size, sizes.copy_bytes)
    if device.startswith("cuda"):
        from helpers.engine.measure.telemetry import compute_mode

        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        facts = {"gpu": props.name, "multiprocessors": props.multi_processor_count,
                 "memory_gib": total / 2 ** 30, "free_gib": free / 2 ** 30,
                 "compute_mode": compute_mode(device)}
        if facts["compute_mode"] not in ("default", None):
            print(f"warning: {device}'s compute mode is {facts['compute_mode']}: workers cannot "
                  f"share it with this process, so the faults and the study will fail",
                  flush=True)
    else:
        facts = {"gpu": "none (a dry run on the CPU)"}
    from helpers.engine.contract.devices import available_cores

    return [{**row, **facts, "cores": available_cores()} for row in rows]


def _study_workload(model_dir: str, device: str, graphs: bool = False) -> Any:
    """The workload the study and the faults run: the feed variant, batch ENCODE_BATCH,
    tokenize-ahead and pinned memory on; ``graphs``: with CUDA graphs (the study, where the
    model side found them faster; the faults run eager)."""
    from helpers.workloads.embedding import EmbeddingWorkload

    ahead, pin = model_side.FEEDS[0]
    return EmbeddingWorkload(model=model_dir, batch_size=model_side.ENCODE_BATCH,
                             precision=model_side.feed_precision(device),
                             tokenize_ahead=ahead, pin_memory=pin, cuda_graphs=graphs)


def _feed_rate(model: pd.DataFrame, device: str, graphs: bool) -> float | None:
    """The median texts a second one worker ran the study's workload at in the model's side
    (its encode rows, eager or with graphs), None where none was measured."""
    ahead, pin = model_side.FEEDS[0]
    mine = measured(model)
    if mine.empty or "mode" not in mine:
        return None
    mine = mine[(mine["mode"] == "encode")
                & (mine["precision"] == model_side.feed_precision(device))
                & ~mine["compile"].astype(bool) & (mine["cuda_graphs"].astype(bool) == graphs)
                & ~mine["unpadded"].astype(bool)
                & (mine["tokenize_ahead"] == ahead) & (mine["pin_memory"] == pin)
                & (mine["batch_size"] == model_side.ENCODE_BATCH)]
    return float(mine["texts_per_s"].median()) if len(mine) else None


def _worker_rate(model: pd.DataFrame, device: str, graphs: bool = False) -> float:
    """Texts a second one worker ran the study's workload at in the model's side, or one a
    second where none was measured."""
    return _feed_rate(model, device, graphs) or 1.0


def _graphs_faster(model: pd.DataFrame, device: str) -> bool:
    """Whether the model side's whole path ran the feed variant faster with CUDA graphs than
    eager (both measured): then the study runs it so."""
    eager, graphed = _feed_rate(model, device, False), _feed_rate(model, device, True)
    return eager is not None and graphed is not None and graphed > eager


def _save(frame: pd.DataFrame, name: str, out: Path, parameters: dict[str, Any]) -> pd.DataFrame:
    from helpers.study.results import save_table

    if not frame.empty:
        save_table(frame, name, out, "helpers.bench.gpu", parameters)
    return frame
