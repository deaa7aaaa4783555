"""Result tables: tidy CSV files, each with a JSON sidecar saying where and how it was measured.

``data/results/<params>/<table>.csv`` holds one row per (configuration, replicate) with units in
the column names; ``<table>.json`` beside it records the git commit, the machine (CPU model and
cores, memory, GPUs with their memory and driver), package versions, the notebook and its
parameters. Plots and the summary read only these files.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from helpers.engine.contract.renamed import current
from helpers.engine.contract.versions import created, package_versions
from helpers.study.paths import ROOT
from helpers.study.provenance import git_commit, machine


def resolve(folder: str | Path) -> Path:
    """A folder parameter: relative paths are relative to the checkout, wherever the kernel runs."""
    path = Path(folder)
    return path if path.is_absolute() else ROOT / path


def save_table(frame: pd.DataFrame, name: str, results_dir: str | Path, notebook: str,
               parameters: dict[str, Any]) -> Path:
    """Write ``frame`` to ``<results_dir>/<name>.csv`` and its sidecar; return the CSV's path."""
    if frame.empty:
        raise ValueError(f"table {name!r} is empty: the experiment produced no rows")
    folder = resolve(results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.csv"
    frame.to_csv(path, index=False, float_format="%.6g")
    sidecar = {"table": name, "notebook": notebook, "rows": len(frame),
               "columns": list(frame.columns), "created": created(),
               "commit": git_commit(ROOT), "machine": machine(gpus=True),
               "packages": package_versions(), "parameters": parameters}
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2, default=str) + "\n",
                                         encoding="utf-8")
    return path


def load_table(name: str, results_dir: str | Path) -> pd.DataFrame:
    """A saved table; FileNotFoundError names the notebook to run if it is missing."""
    path = resolve(results_dir) / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such result table; run the notebook that writes "
                                f"{name!r} with the same results_dir first")
    return read_table(path)


def read_table(path: str | Path) -> pd.DataFrame:
    """A result table's CSV, its columns named as tables are named now: a column of MiB that a
    table written before 2026-11-28 calls ``*_mb`` (its sidecar keeps the name it was written
    with) reads as ``*_mib``."""
    frame = pd.read_csv(path)
    return frame.rename(columns=lambda c: current(c) if isinstance(c, str) else c)


def load_sidecar(name: str, results_dir: str | Path) -> dict[str, Any]:
    return json.loads((resolve(results_dir) / f"{name}.json").read_text(encoding="utf-8"))
