"""What the taker's joins buy: a window's short end joined to the next records, side by side.

With ``workunit_size="auto"`` and a workload that says what a record costs (a text's length:
``record_cost``), the reader orders the records a window at a time and never lets a take hold
records of two windows; the taker then joins a window's short end (and a cut's rest) to the
next records, up to its worker's size (``taker.JOINS``). Without the joins each window's end
goes as a workunit of its own, below its worker's size. Here: two process workers on
simulated cards that cost ``record_seconds`` a record and ``unit_seconds`` a workunit (a pool
for each of UNIT_SECONDS: a sync; a card's pipeline filled and drained), records of every
length ordered by it, the two settings alternating ``rounds`` times on each pool (``JOINS`` set
for each job, nothing else changed);
workunits sent, records a workunit, records per second and the workers' busy share, medians,
and the ratios with joins against without.

A window holds ``window`` records or the largest workunit a worker takes, if more: where every
worker takes the same size, a window is cut into whole workunits but its last. The default
layout is where the ends are shortest: two devices of different speeds (``speeds``, notebook
02's simulated layout), each worker's size a second of its own rate, above SORT_RECORDS (a
card's), the window the fast one's size, the slow one's take leaving the fast one a short end of
every window.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd

from helpers.workloads.synthetic import SyntheticWorkload

SETTINGS = (False, True)  # the taker's joins off, on


@dataclass(frozen=True)
class SortedSynthetic(SyntheticWorkload):
    """The synthetic workload with a record's cost: its length (the reader sorts by it, as it
    sorts texts by their tokens)."""

    def record_cost(self, record: Any) -> float:
        return float(len(record))


def corpus(records: int, seed: int = 0) -> list[tuple[int, str]]:
    """``records`` texts of 1 to 400 characters, in no order."""
    lengths = np.random.default_rng(seed).integers(1, 401, records)
    return [(i, "x" * int(n)) for i, n in enumerate(lengths)]


UNIT_SECONDS = (0.005, 0.05)  # a workunit's own cost: a sync; a card's pipeline filled and
# drained at each workunit (its first batch tokenized before the card starts, its last copied
# back after it stops: tens of ms for a batch of 1,024 texts)


def measure(rounds: int = 5, records: int = 600_000, record_seconds: float = 20e-6,
            unit_seconds: tuple[float, ...] = UNIT_SECONDS, window: int | None = None,
            speeds: tuple[float, ...] = (1.0, 0.35)) -> pd.DataFrame:
    """One tidy row per job: for each of ``unit_seconds``, one pool, ``rounds`` of each
    setting alternating."""
    from helpers.engine.dispatch import taker
    from helpers.engine.pipeline import WorkerPool
    from helpers.study.autotune import interleaved
    from helpers.study.experiments import simulated_devices

    devices, speed = simulated_devices(speeds)
    data = corpus(records)
    rows = []
    for fixed in unit_seconds:
        workload = SortedSynthetic(record_seconds, speed, seconds_per_workunit=fixed, dim=4,
                                   values="zeros")
        with tempfile.TemporaryDirectory(prefix="gpufeed-joins-") as tmp, \
                WorkerPool(workload, devices, "process", progress=False) as pool:
            pool.run(data[: records // 10], Path(tmp) / "warm.h5")  # (the workers' rates)
            for replicate in range(rounds):
                for joins in interleaved(SETTINGS, replicate):
                    with mock.patch.object(taker, "JOINS", joins):
                        stats = pool.run(data, Path(tmp) / f"out-{replicate}-{joins}.h5",
                                         sort_window=window)
                    units = sum(span.workunits for span in stats.timeline)
                    rows.append({"unit_seconds": fixed, "replicate": replicate, "joins": joins,
                                 "workunits": units,
                                 "records_per_workunit": stats.records / units,
                                 "records_per_s": stats.records / stats.wall_s,
                                 "busy": stats.efficiency, "wall_s": stats.wall_s})
    return pd.DataFrame(rows).assign(records=records, record_seconds=record_seconds,
                                     window=window, speeds=" ".join(map(str, speeds)),
                                     backend="process")


def report(table: pd.DataFrame) -> dict[float, dict[str, float]]:
    """Print, for each workunit cost, the medians of each setting and the ratios with joins
    against without; return the ratios by workunit cost."""
    columns = ["workunits", "records_per_workunit", "records_per_s", "busy"]
    found = {}
    for fixed, jobs in table.groupby("unit_seconds"):
        medians = jobs.groupby("joins")[columns].median()
        print(f"{fixed * 1e3:g} ms a workunit:")
        for joins, row in medians.iterrows():
            print(f"  joins {'on ' if joins else 'off'}: {row['workunits']:,.0f} workunits of "
                  f"{row['records_per_workunit']:,.0f} records, {row['records_per_s']:,.0f} "
                  f"records/s, workers busy {row['busy']:.3f} (medians of "
                  f"{int((jobs['joins'] == joins).sum())})")
        found[fixed] = {"workunits_on_over_off": medians.loc[True, "workunits"] /
                        medians.loc[False, "workunits"],
                        "rate_on_over_off": medians.loc[True, "records_per_s"] /
                        medians.loc[False, "records_per_s"]}
        print(f"  joins on against off: {found[fixed]['workunits_on_over_off']:.3f}x the "
              f"workunits, {found[fixed]['rate_on_over_off']:.3f}x the rate")
    return found


def main(rounds: int, records: int, record_seconds: float, unit_seconds: tuple[float, ...],
         window: int | None, results_dir: str | None) -> dict[float, dict[str, float]]:
    from helpers.study.results import save_table

    table = measure(rounds, records, record_seconds, unit_seconds, window)
    figures = report(table)
    if results_dir:
        path = save_table(table, "joins_bench", results_dir, "helpers.bench.joins",
                          {"rounds": rounds, "records": records,
                           "record_seconds": record_seconds,
                           "unit_seconds": list(unit_seconds),
                           "window": window})
        print(f"table: {path}")
    return figures
