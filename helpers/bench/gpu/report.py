"""What a GPU check measured, read back from its tables only: the summary it prints last, and
the tables' move into the results folder with their figures drawn (``python -m helpers.bench gpu
--report``).
"""
from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from helpers.bench.gpu.model_side import ENCODE_BATCH, FEEDS
from helpers.bench.gpu.tables import (TABLES, VARIANT, measured, read, sidecar, skipped,
                                      study_runs, variant)

RESULTS_DIR = "data/results/gpu"
FIGURES_DIR = "figures/gpu"


def model_summary(model: pd.DataFrame) -> pd.DataFrame:
    """Per variant: the forward pass's best rate over batch sizes (median of its repeats), and
    encode's at ENCODE_BATCH with the study's feed, with its CPU per text and the guard."""
    done = measured(model)
    ahead, pin = FEEDS[0]
    forward = done[done["mode"] == "forward"].groupby(
        [*VARIANT, "batch_size"], sort=False)[["texts_per_s", "card_share"]] \
        .median().reset_index()
    encode = done[(done["mode"] == "encode") & (done["batch_size"] == ENCODE_BATCH)
                  & (done["tokenize_ahead"] == ahead) & (done["pin_memory"] == pin)]
    rows = []
    for key, group in forward.groupby(VARIANT, sort=False):
        best = group.loc[group["texts_per_s"].idxmax()]
        mine = encode[(encode[VARIANT] == pd.Series(key, index=VARIANT)).all(axis=1)]
        rows.append({"variant": variant(best), "forward_texts_per_s": best["texts_per_s"],
                     "at_batch": int(best["batch_size"]), "card_share": best["card_share"],
                     "encode_texts_per_s": mine["texts_per_s"].median(),
                     "encode_card_share": mine["card_share"].median(),
                     "cpu_ms_per_1k_texts": (mine["cpu_s"] / mine["texts"]).median() * 1e6,
                     "guard_min_cosine": mine["guard_min_cosine"].min()})
    return pd.DataFrame(rows)


def feed_summary(model: pd.DataFrame) -> pd.DataFrame:
    """Encode's rate for the feed variant by (tokenize-ahead, pinned memory) and batch size."""
    done = measured(model)
    encode = done[(done["mode"] == "encode") & ~done["compile"].astype(bool)
                  & ~done["cuda_graphs"].astype(bool) & ~done["unpadded"].astype(bool)]
    return encode.groupby(["precision", "tokenize_ahead", "pin_memory", "batch_size"])[
        "texts_per_s"].median().reset_index()


def study_summary(runs: pd.DataFrame) -> pd.DataFrame:
    done = study_runs(runs)
    columns = [c for c in ("workers", "workunit_size", "tokenizing", "texts_per_s",
                           "busy_share", "cpu_ms_per_text",
                           "longest_card_idle_s", "longest_worker_wait_s", "exactly_once",
                           "cut")
               if c in done]
    return done[columns].sort_values(["workers", "workunit_size", "tokenizing"]) \
        if len(done) else done


def summary(folder: str | Path) -> str:
    """The check's findings in a few short tables (what the call prints last)."""
    tables, meta = read(folder), sidecar(folder)
    machine = meta.get("machine", {})
    gpus = ", ".join(sorted({g["name"] for g in machine.get("gpus", [])})) or "no GPU"
    packages = meta.get("packages", {})
    lines = [f"GPU check: {gpus} (driver {machine.get('driver')}, CUDA {machine.get('cuda')}, "
             f"torch {packages.get('torch')}, {machine.get('cores')} cores); commit "
             f"{meta.get('commit')}; weights {meta.get('parameters', {}).get('weights')}"]
    with pd.option_context("display.width", 160, "display.max_columns", 20,
                           "display.float_format", lambda v: f"{v:,.3g}"):
        for name, section in (("gpu_card", _card_lines), ("gpu_model", _model_lines),
                              ("gpu_faults", _fault_lines), ("gpu_simulated", _simulated_lines),
                              ("gpu_study", _study_lines)):
            if name in tables:
                try:
                    lines += section(tables[name])
                except Exception as exc:  # a table cut short by the budget still prints
                    lines.append(f"{name}: not summarised ({type(exc).__name__}: {exc})")
    return "\n".join(lines)


def _card_lines(card: pd.DataFrame) -> list[str]:
    return [f"{r.ceiling}: {r.value:,.3g} {r.unit} ({r.low:,.3g}-{r.high:,.3g})"
            for r in card.itertuples()]


def _model_lines(model: pd.DataFrame) -> list[str]:
    lines = []
    if "texts_per_s" in model:
        lines += ["", "the model's side (forward: the card alone; encode: a worker's path, "
                      f"batch {ENCODE_BATCH}):", model_summary(model).to_string(index=False),
                  "", "encode by feed options and batch size:",
                  feed_summary(model).to_string(index=False)]
    said = model[skipped(model)]
    said = said.drop_duplicates(["mode", *(c for c in VARIANT if c in said)])
    return lines + [f"skipped: {r['mode']} {variant(r)}: {r['skipped'][:100]}"
                    for _, r in said.iterrows()]


def _fault_lines(checks: pd.DataFrame) -> list[str]:
    return ["", "faults:"] + [
        f"  {r['check']}: {'passed' if r['passed'] else 'FAILED'}: {r['detail']}"
        for _, r in checks.iterrows()]


def _simulated_lines(fed: pd.DataFrame) -> list[str]:
    from helpers.study.feeding import tokenizing

    fed = fed.assign(tokenizing=tokenizing(fed))
    done = measured(fed)
    lines = ["", f"the simulated card ({done['card'].iloc[0] if len(done) else 'none run'} at "
                 f"full speed, fed by this machine's {int(fed['cores'].iloc[0])} cores):"]
    lines += [f"  {int(r['workers'])} worker(s) x {r['tokenizing']} tokenizing: card busy "
              f"{r['card_busy_share']:.0%} ({r['tokens_per_s'] / 1e6:.1f} M "
              f"tokens/s, {r['cpu_s_per_m_tokens']:.2f} CPU s per M tokens; every core: "
              f"{r['card_busy_limit']:.0%})" for _, r in done.iterrows()]
    return lines + [f"skipped: {int(r['workers'])} x {r['tokenizing']}: "
                    f"{r['skipped'][:100]}" for _, r in fed[skipped(fed)].iterrows()]


def _study_lines(runs: pd.DataFrame) -> list[str]:
    graphed = "cuda_graphs" in runs and runs["cuda_graphs"].astype(bool).any()
    lines = ["", f"the study (workers per GPU, workunit sizes"
                 f"{'; with CUDA graphs, faster in the model side' if graphed else ''}):"]
    if "texts_per_s" in runs:
        lines.append(study_summary(runs).to_string(index=False))
    return lines + [f"skipped: {r['workers']} workers {r.get('workunit_size', '')}"
                    f"{_layout(r)}: {r['skipped'][:100]}"
                    for _, r in runs[skipped(runs)].iterrows()]


def _layout(run: Any) -> str:
    """' tokenize_threads=1' for a run of a tokenizing layout, '' for the default's."""
    layout = run.get("layout")
    return f" {layout}" if isinstance(layout, str) and layout != "default" else ""


def unpack(path: str | Path, into: Path) -> Path:
    """The folder of tables at ``path``: itself, or a .tgz the device call brought back,
    unpacked into ``into``."""
    path = Path(path)
    if path.is_dir():
        return path
    with tarfile.open(path) as archive:
        archive.extractall(into, filter="data")
    return into


def ingest(path: str | Path, results_dir: str | Path = RESULTS_DIR,
           figures_dir: str | Path = FIGURES_DIR) -> Path:
    """The check's tables at ``path`` (a folder, or the call's .tgz) copied into
    ``results_dir``, its figures drawn into ``figures_dir``; print the summary; return the
    results folder."""
    from helpers.bench.gpu.figures import draw
    from helpers.study.results import resolve

    target = resolve(results_dir)
    with tempfile.TemporaryDirectory() as scratch:
        folder = unpack(path, Path(scratch))
        if not any((folder / f"{name}.csv").is_file() for name in TABLES):
            raise FileNotFoundError(f"{path}: none of {', '.join(TABLES)} (.csv); expected "
                                    f"the tables of `python -m helpers.bench gpu --out DIR`")
        target.mkdir(parents=True, exist_ok=True)
        for name in TABLES:
            for suffix in (".csv", ".json"):
                if (folder / f"{name}{suffix}").is_file():
                    shutil.copyfile(folder / f"{name}{suffix}", target / f"{name}{suffix}")
    draw(target, figures_dir)
    print(summary(target))
    return target
