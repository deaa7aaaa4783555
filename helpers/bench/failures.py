"""What failures cost: the time a crash, a hang or a poison record takes from a run.

(Until 2026-11-28 it also timed crash-safe writes against writes in place: 0.99x for the writer
alone, no difference on the embedding model, in failure_costs.csv made at db32ad6; so writing in
place was deprecated: helpers.engine.contract.settings.IN_PLACE_GONE.)

- ``crash``: a worker is killed with SIGKILL mid-run; detection latency is the time from the kill
  to the scheduler's log line, restart time is spawn to Ready of the replacement, and the run's
  wall time is compared with the same run undisturbed just before (the kill comes 40 % of the way).
- ``poison``: one record that kills its worker, among good ones: what isolating it costs.
Rows are tidy (units in column names) and saved with provenance under data/results/<params>/.
"""
from __future__ import annotations

import logging
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from helpers.engine.pipeline import WorkerPool
from helpers.study.paths import sample_texts
from helpers.study.results import save_table
from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.synthetic import SyntheticWorkload


class Deaths(logging.Handler):
    """Notes when the scheduler logs a worker's death."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if " died (" in record.getMessage():
            self.times.append(record.created)


def crash_rows(workload_name: str, records: int, repeats: int) -> list[dict]:
    """Per repeat, an undisturbed run, then the same run with one worker SIGKILLed 40 % of the
    way through: the extra wall time, detection latency and restart time."""
    if workload_name == "embedding":
        workload, pairs = EmbeddingWorkload(), list(enumerate(sample_texts(records)))
    else:
        workload, pairs = SyntheticWorkload(0.01), [(i, f"r{i}") for i in range(records)]
    deaths = Deaths()
    logging.getLogger("gpufeed").addHandler(deaths)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp, \
                WorkerPool(workload, ["cpu", "cpu"], progress=False) as pool:
            for repeat in range(repeats):
                calm = None
                for killed in (False, True):
                    deaths.times.clear()
                    pid = list(pool.pids.values())[0]
                    timer = threading.Timer(KILL_AT * calm, kill, (pid,)) if killed else None
                    if timer:
                        timer.start()
                    stats = pool.run(pairs, Path(tmp) / f"crash-{repeat}-{killed}.h5",
                                     workunit_size=10)
                    if timer:
                        timer.cancel()
                    calm = calm or stats.wall_s
                    restarts = stats.recovery["restart_s"]
                    rows.append({"experiment": "crash", "workload": workload_name,
                                 "killed": killed, "repeat": repeat, "records": stats.records,
                                 "wall_s": stats.wall_s,
                                 "detection_s": deaths.times[0] - KILLED_AT[0] if deaths.times
                                 else None, "restart_s": restarts[0] if restarts else None})
    finally:
        logging.getLogger("gpufeed").removeHandler(deaths)
    return rows


KILL_AT = 0.4  # of the undisturbed run's wall time: mid-run, with work on both sides of it
KILLED_AT = [0.0]  # unix time of the last kill: log records carry unix time


def kill(pid: int) -> None:
    KILLED_AT[0] = time.time()
    os.kill(pid, signal.SIGKILL)


def poison_rows(records: int, workunit_size: int) -> list[dict]:
    """One record that kills its worker vs none, on a synthetic workload: wall time and work."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for poisoned in (False, True):
            workload = SyntheticWorkload(0.002, exit_on_records={f"r{records // 2}"} if poisoned
                                         else frozenset())
            with WorkerPool(workload, ["cpu", "cpu"], progress=False) as pool:
                stats = pool.run([(i, f"r{i}") for i in range(records)],
                                 Path(tmp) / f"poison-{poisoned}.h5", workunit_size=workunit_size)
            rec = stats.recovery
            rows.append({"experiment": "poison", "workload": "synthetic", "poisoned": poisoned,
                         "records": stats.records, "failed_records": stats.failed_records,
                         "wall_s": stats.wall_s, "deaths": rec["deaths"],
                         "splits": rec["splits"], "restart_s": statistics.fmean(
                             rec["restart_s"]) if rec["restart_s"] else None})
    return rows


def measure(records: int = 600, repeats: int = 3) -> pd.DataFrame:
    rows = crash_rows("synthetic", 400, repeats) + crash_rows("embedding", records, 1)
    rows += poison_rows(2000, 100)
    return pd.DataFrame(rows)


def report(frame: pd.DataFrame) -> dict[str, float]:
    """Print the rows and the ratios; return them."""
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    summary = {}
    experiments = set(frame.experiment)
    crash = frame[frame.experiment == "crash"]
    crash = crash.astype({"killed": bool}) if "crash" in experiments else crash
    for name, group in crash.groupby("workload"):
        killed, calm = group[group.killed], group[~group.killed]
        extra = killed.wall_s.median() - calm.wall_s.median()
        summary[f"crash {name} detection_s"] = killed.detection_s.median()
        print(f"one SIGKILL, {name}: detected in {killed.detection_s.median() * 1000:.1f} ms, "
              f"replacement ready in {killed.restart_s.median():.2f} s, run {extra:+.2f} s "
              f"({calm.wall_s.median():.2f} s undisturbed)")
    if "poison" in experiments:
        poison = frame[frame.experiment == "poison"].astype({"poisoned": bool}).set_index("poisoned")
        print(f"a record that kills its worker, among {int(poison.loc[False, 'records'])}: "
              f"{int(poison.loc[True, 'deaths'])} deaths, {int(poison.loc[True, 'splits'])} "
              f"splits, run {poison.loc[True, 'wall_s'] - poison.loc[False, 'wall_s']:+.2f} s")
    return summary


def main(records: int, repeats: int, results_dir: str | None) -> None:
    frame = measure(records, repeats)
    report(frame)
    if results_dir:
        path = save_table(frame, "failure_costs", results_dir, "helpers.bench.failures",
                          {"records": records, "repeats": repeats})
        print(f"table: {path}")
