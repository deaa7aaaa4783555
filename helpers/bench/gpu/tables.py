"""The GPU check's tables: their names, and reading them back (what the summary and the figures
read; nothing else)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

TABLES = ("gpu_card", "gpu_model", "gpu_faults", "gpu_simulated", "gpu_study",
          "gpu_study_samples")
FIGURES = "check"  # the figures' folder under a figures folder
VARIANT = ["precision", "compile", "cuda_graphs", "unpadded"]  # what names a variant of the
# model's side


def read(folder: str | Path) -> dict[str, pd.DataFrame]:
    """Each table the check wrote into ``folder``, by name."""
    from helpers.study.results import read_table  # (older tables' MiB columns named as now)

    folder = Path(folder)
    return {name: read_table(folder / f"{name}.csv") for name in TABLES
            if (folder / f"{name}.csv").is_file()}


def sidecar(folder: str | Path, table: str | None = None) -> dict[str, Any]:
    """``table``'s sidecar in ``folder`` (the machine, packages, commit, the check's parameters:
    the same for every table of a call); None: the first table of TABLES that has one (a call
    whose first sections failed still has the later ones'); {} where none has."""
    names = [table] if table is not None else list(TABLES)
    path = next((Path(folder) / f"{name}.json" for name in names
                 if (Path(folder) / f"{name}.json").is_file()), None)
    return json.loads(path.read_text(encoding="utf-8")) if path is not None else {}


def skipped(frame: pd.DataFrame) -> pd.Series:
    """Which rows say why they were not measured (a CSV reads an empty reason as NaN)."""
    if "skipped" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["skipped"].notna() & frame["skipped"].astype(str).ne("")


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows that were measured (a model table from before CUDA graphs, or before unpadded
    attention: none graphed, none unpadded)."""
    for option in ("cuda_graphs", "unpadded"):
        if "precision" in frame and option not in frame:
            frame = frame.assign(**{option: False})
    return frame[~skipped(frame)]


def variant(row: Any) -> str:
    """A model-side row's variant in words: 'fp16', 'fp16 compiled', 'fp16 graphs',
    'fp16 unpadded'."""
    graphs = str(row.get("cuda_graphs", False)) == "True"  # (a bool, NumPy's, or a CSV's text)
    unpadded = str(row.get("unpadded", False)) == "True"
    return f"{row['precision']}{' compiled' if str(row['compile']) == 'True' else ''}" \
        f"{' graphs' if graphs else ''}{' unpadded' if unpadded else ''}"


def study_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The study's measured runs, each with its ``layout`` ('default' in a table from before
    the study tried tokenizing layouts) and its ``tokenizing`` in words where the workers said
    it ('8 processes', '1 thread'; '' on encode's path, or in an older table)."""
    from helpers.study.feeding import tokenizing

    done = measured(runs)
    done = done.assign(layout=done["layout"].fillna("default") if "layout" in done
                       else "default")
    said = done["tokenize_threads"].notna() if "tokenize_threads" in done else \
        pd.Series(False, index=done.index)
    words = pd.Series("", index=done.index)
    if said.any():
        words[said] = tokenizing(done[said])
    return done.assign(tokenizing=words)
