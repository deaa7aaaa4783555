"""How many workunits one driver hands out and commits per second: the dispatch ceiling.

Workunits that carry next to nothing (WORKUNIT_ROWS rows of 1-d float32 from a model that costs
nothing, the records the sample paragraphs as ids the workers read themselves, or the texts
when the driver reads) go through two process workers (or Ray actors: ``backend="ray"``, a
local Ray each run), ``units`` of them a run, each run a fresh process. Measured over the job's
dispatch loop only, from its first read to the last result handed to the writer (a finished
output's index or merge comes after it, once per run): the workunits per second, and the
driver's CPU per workunit (every thread of the driver process), whose inverse is how many
workunits one driver core can hand out and commit — the ceiling, when the workers are fast
enough. ``writes="driver"`` (the driver reads and writes) and
``"workers"`` (they read and write; the driver commits parts), each with one workunit a message
and with ``units_per_message="auto"`` (PER_MESSAGE: here, workunits that take a worker a few ms,
sixteen a message once their time is measured), alternate, ``repeats`` times; medians. Here the
workers' own part writes (a file per workunit) may be slower than the driver, and then the rate
is theirs, not the ceiling. On Ray the driver's CPU includes Ray's threads in it (its core
worker), not the raylet's or the object store's processes beside it.
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

WORKUNIT_ROWS = 16
GOALS = {"ceiling_units_per_s": 5_000}
WRITES = ("driver", "workers")
PER_MESSAGE = (1, "auto")  # workunits a message to a worker


def run_once(units: int, writes: str, output: str, per_message: int | str = 1,
             backend: str = "process") -> dict[str, Any]:
    """One run in this process (``python -m helpers.bench dispatch-run``): its measurements."""
    from helpers.bench.scale import CycledTexts, _sample_texts
    from helpers.engine import job as jobs
    from helpers.engine.contract.settings import JobSettings, PoolSettings
    from helpers.engine.pipeline import WorkerPool
    from helpers.workloads.synthetic import SyntheticWorkload

    loop: dict[str, float] = {}
    drive = jobs.Job.drive

    def timed(job: Any, *args: Any) -> None:  # the dispatch loop alone, its wall and CPU
        cpu, wall = time.process_time(), time.monotonic()
        try:
            drive(job, *args)
        finally:
            loop["cpu_s"], loop["wall_s"] = time.process_time() - cpu, time.monotonic() - wall
            loop["messages"] = job.scheduler.dispatches.messages

    jobs.Job.drive = timed
    settings = PoolSettings(("cpu",) * 2, backend, units_per_message=per_message)
    job = JobSettings(WORKUNIT_ROWS, progress=False, writes=writes)
    with WorkerPool.from_settings(SyntheticWorkload(0.0, dim=1, values="zeros"), settings,
                                  job) as pool:
        stats = pool.run(CycledTexts(units * WORKUNIT_ROWS, _sample_texts()), output)
    return {"units": units, "rows": stats.records, "loop_s": loop["wall_s"],
            "units_per_s": units / loop["wall_s"],
            "driver_cpu_ms_per_unit": loop["cpu_s"] / units * 1e3,
            "ceiling_units_per_s": units / loop["cpu_s"], "job_s": stats.wall_s,
            "units_a_message": units / loop["messages"]}


def measure(units: int = 20_000, repeats: int = 3, folder: str | None = None,
            backend: str = "process") -> pd.DataFrame:
    """``repeats`` rounds of one run per WRITES and PER_MESSAGE, each a fresh process; one tidy
    row per run."""
    rows = []
    with tempfile.TemporaryDirectory(dir=folder, prefix="gpufeed-dispatch-") as tmp:
        for replicate in range(repeats):
            for writes, per in itertools.product(WRITES, PER_MESSAGE):
                output = Path(tmp) / f"out-{replicate}-{writes}-{per}.h5"
                run = subprocess.run([sys.executable, "-m", "helpers.bench", "dispatch-run",
                                      "--units", str(units), "--writes", writes,
                                      "--units-per-message", str(per), "--backend", backend,
                                      "--output", str(output)], capture_output=True, text=True)
                if run.returncode != 0:
                    raise RuntimeError(f"dispatch-run --writes {writes} exited "
                                       f"{run.returncode}:\n{run.stderr[-3000:]}")
                rows.append({"replicate": replicate, "writes": writes, "units_per_message": per,
                             **json.loads(run.stdout.strip().splitlines()[-1])})
    return pd.DataFrame(rows).assign(workunit_rows=WORKUNIT_ROWS, workers=2, backend=backend)


def report(table: pd.DataFrame) -> dict[str, float]:
    """Print the runs and the medians, each ceiling against its goal; return the medians."""
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    groups = table.groupby(["writes", "units_per_message"])
    medians = groups[["units_per_s", "driver_cpu_ms_per_unit", "ceiling_units_per_s",
                      "units_a_message"]].median()
    figures = {}
    for (writes, per), row in medians.iterrows():
        met = row["ceiling_units_per_s"] >= GOALS["ceiling_units_per_s"]
        print(f"writes={writes}, {per} a message ({row['units_a_message']:.1f} on average): "
              f"{row['units_per_s']:,.0f} workunits/s, driver "
              f"{row['driver_cpu_ms_per_unit']:.3f} CPU ms each: ceiling "
              f"{row['ceiling_units_per_s']:,.0f}/s (>= {GOALS['ceiling_units_per_s']:,}: "
              f"{'met' if met else 'NOT met'}; medians of {groups.size()[(writes, per)]})")
        figures[f"{writes}_{per}_ceiling_units_per_s"] = row["ceiling_units_per_s"]
    return figures


def main(units: int, repeats: int, results_dir: str | None, backend: str = "process") -> None:
    from helpers.study.results import save_table

    table = measure(units, repeats, backend=backend)
    report(table)
    if results_dir:
        name = "dispatch_bench" + ("" if backend == "process" else f"_{backend}")
        path = save_table(table, name, results_dir, "helpers.bench.dispatch",
                          {"units": units, "repeats": repeats, "workunit_rows": WORKUNIT_ROWS,
                           "backend": backend})
        print(f"table: {path}")
