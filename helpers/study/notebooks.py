"""Run the notebook suite headless with papermill, under one of the parameter sets.

``python -m helpers notebooks --params cpu`` (what ``make run`` calls) executes every notebook in
``notebooks/`` in order, injecting the set's parameters, and writes the executed copies (outputs
included) to the git-ignored ``notebooks/executed/<set>/``. The committed notebooks stay without
outputs; their figures and result tables are what people read.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

from helpers.study.figures import NOTE_ENV
from helpers.study.parameters import load_parameters
from helpers.study.paths import NOTEBOOKS, ROOT
from helpers.study.results import resolve

EXECUTED = NOTEBOOKS / "executed"
CELL_TIMEOUT_SECONDS = 1800  # one cell, one experiment: generous, but a hung run still ends


def suite() -> list[Path]:
    """The notebooks, in the order they run (the summary reads the others' tables, so it is last)."""
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def declared(notebook: Path, parameters: dict[str, Any], common: set[str]) -> dict[str, Any]:
    """The parameters ``notebook`` declares; one it does not declare is an error unless it came
    from the set's ``common`` section (shared by notebooks that may not all use it)."""
    import papermill

    names = set(papermill.inspect_notebook(str(notebook)))
    unknown = sorted(set(parameters) - names - common)
    if unknown:
        raise ValueError(f"{notebook.stem}: no parameter named {', '.join(unknown)}; "
                         f"it has {sorted(names)}")
    return {k: v for k, v in parameters.items() if k in names}


def _common(params: str | Path) -> set[str]:
    return set(load_parameters(params, "common"))


def run_notebooks(params: str | Path = "cpu", only: list[str] | None = None,
                  executed_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                  timeout: float = CELL_TIMEOUT_SECONDS, log=print) -> list[Path]:
    """Execute the suite (or the notebooks whose stem starts with one of ``only``) under ``params``;
    return the executed copies. Raises papermill's PapermillExecutionError on a failed cell."""
    name = Path(params).stem
    out = Path(executed_dir) if executed_dir else EXECUTED / name
    out.mkdir(parents=True, exist_ok=True)
    notebooks = [nb for nb in suite() if not only or any(nb.stem.startswith(o) for o in only)]
    if not notebooks:
        raise ValueError(f"only: no notebook matches {only!r}; have {[nb.stem for nb in suite()]}")
    synthetic = load_parameters(params, "common").get("workload") == "synthetic"
    note = {NOTE_ENV: f"{name} run (synthetic workload, tiny samples): not a measurement"} \
        if synthetic else {}  # (a smoke set's figures look like real ones: their titles say so)
    with mock.patch.dict(os.environ, note):
        executed = [_run_one(notebook, params, name, out, overrides, timeout, log)
                    for notebook in notebooks]
    log(f"executed copies: {out}")
    return executed


def _run_one(notebook: Path, params: str | Path, name: str, out: Path,
             overrides: dict[str, Any] | None, timeout: float, log: Any) -> Path:
    import papermill

    parameters = declared(notebook, {**load_parameters(params, notebook.stem),
                                     **(overrides or {})}, common=_common(params))
    started = time.monotonic()
    log(f"running {notebook.name} with {name} parameters ...")
    papermill.execute_notebook(str(notebook), str(out / notebook.name), parameters=parameters,
                               cwd=str(ROOT), kernel_name="python3", progress_bar=False,
                               execution_timeout=timeout)
    log(f"  done in {time.monotonic() - started:.0f} s: tables in "
        f"{resolve(parameters['results_dir'])}, figures in "
        f"{resolve(parameters['figures_dir']) / notebook.stem}")
    return out / notebook.name
