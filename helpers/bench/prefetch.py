"""What the second message a worker holds buys: one in flight against two (PREFETCH), side by side.

With one message a worker, a worker that finishes its workunit waits for the driver to take
its result and send the next (a round trip); with two, the next is already there. That wait is
a share of a workunit's time: large where workunits are short (a fast card, a small fixed
``workunit_size``), next to nothing with ``workunit_size="auto"`` (about a second each). Here:
two process workers on a simulated card that takes ``unit_seconds`` a workunit of
``unit_records`` records, one pool, the two settings alternating ``rounds`` times (the
scheduler's PREFETCH set for each job, nothing else changed); records per second and the
workers' busy share (``stats.efficiency``), medians, and the ratio two against one.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd

SETTINGS = (1, 2)  # messages in flight a worker


def measure(rounds: int = 5, records: int = 40_000, unit_records: int = 64,
            unit_seconds: float = 0.002) -> pd.DataFrame:
    """One tidy row per job: ``rounds`` of each setting, alternating, on one pool."""
    from helpers.engine.dispatch import scheduler
    from helpers.engine.pipeline import WorkerPool
    from helpers.study.autotune import interleaved
    from helpers.workloads.synthetic import SyntheticWorkload

    workload = SyntheticWorkload(0.0, seconds_per_workunit=unit_seconds, dim=4, values="zeros")
    data = [(i, "r") for i in range(records)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpufeed-prefetch-") as tmp, \
            WorkerPool(workload, ["cpu"] * 2, "process", progress=False) as pool:
        for replicate in range(rounds):
            for prefetch in interleaved(SETTINGS, replicate):
                with mock.patch.object(scheduler, "PREFETCH", prefetch):
                    stats = pool.run(data, Path(tmp) / f"out-{replicate}-{prefetch}.h5",
                                     workunit_size=unit_records)
                rows.append({"replicate": replicate, "prefetch": prefetch,
                             "records_per_s": stats.records / stats.wall_s,
                             "busy": stats.efficiency, "wall_s": stats.wall_s})
    return pd.DataFrame(rows).assign(records=records, unit_records=unit_records,
                                     unit_seconds=unit_seconds, workers=2, backend="process")


def report(table: pd.DataFrame) -> dict[str, float]:
    """Print the medians of each setting and the ratio two against one; return them."""
    medians = table.groupby("prefetch")[["records_per_s", "busy"]].median()
    for prefetch, row in medians.iterrows():
        print(f"{prefetch} message(s) a worker: {row['records_per_s']:,.0f} records/s, workers "
              f"busy {row['busy']:.3f} (medians of {int((table['prefetch'] == prefetch).sum())})")
    ratio = medians.loc[2, "records_per_s"] / medians.loc[1, "records_per_s"]
    print(f"two a worker against one: {ratio:.3f}x the rate")
    return {"rate_2_over_1": ratio, "busy_1": medians.loc[1, "busy"],
            "busy_2": medians.loc[2, "busy"]}


def main(rounds: int, records: int, unit_records: int, unit_seconds: float,
         results_dir: str | None) -> dict[str, Any]:
    from helpers.study.results import save_table

    table = measure(rounds, records, unit_records, unit_seconds)
    figures = report(table)
    if results_dir:
        path = save_table(table, "prefetch_bench", results_dir, "helpers.bench.prefetch",
                          {"rounds": rounds, "records": records, "unit_records": unit_records,
                           "unit_seconds": unit_seconds})
        print(f"table: {path}")
    return figures
