"""Self-tuning against a full sweep: simulated cards [1.0, 0.35, 0.35], each running two workunits
at once (so two workers per card is best, a third adds nothing) with a fixed cost per workunit
(so the size matters).

Every fixed configuration of the sweep (workers per device × workunit size) and the self-tuning
run (``workers_per_device="auto"``, ``workunit_size="auto"``, no prior tuning: a fresh pool with
one worker per card) run the same records, interleaved (the order turns every repeat). Reported:
the self-tuning run's records/s ÷ the best fixed configuration's (per repeat, then the median),
and its makespan ÷ the ideal one (records ÷ the sum of the cards' saturated rates, with no
per-workunit cost at all: a bound no run reaches). Growth spends its first seconds measuring
(one worker per card, then two, then three), a fixed cost that a longer job spreads thinner; so
each repeat then runs LONGER × the records with the self-tuning run and the sweep's best, side by
side.
"""
from __future__ import annotations

import statistics

import pandas as pd

from helpers.engine.contract.settings import AUTO
from helpers.study.autotune import SELF_TUNING, configurations, interleaved, sweep
from helpers.study.results import save_table
from helpers.workloads.synthetic import SyntheticWorkload

CARDS = {"cuda:0": 1.0, "cuda:1": 0.35, "cuda:2": 0.35}
SECONDS_PER_RECORD = 0.0002  # on the fast card: 5,000 records/s per workunit it runs
SECONDS_PER_WORKUNIT = 0.02  # on the fast card (÷ speed on the others)
PARALLELISM = 2  # workunits a card runs at once
WORKERS = (1, 2, 3)
SIZES = (250, 1000, 4000)
RECORDS = 340_000  # about 20 s at the ideal rate
LONGER = 3  # the second comparison's records, × RECORDS


def workload() -> SyntheticWorkload:
    return SyntheticWorkload(SECONDS_PER_RECORD, speed=CARDS, values="zeros",
                             seconds_per_workunit=SECONDS_PER_WORKUNIT, parallelism=PARALLELISM)


def measure(records: int = RECORDS, repeats: int = 3) -> pd.DataFrame:
    """Per repeat: the sweep (helpers.study.autotune.sweep), then the longer job with the
    self-tuning run and that repeat's best fixed configuration."""
    frames = []
    for repeat in range(repeats):
        swept = sweep(workload(), list(CARDS), interleaved(configurations(WORKERS, SIZES), repeat),
                      records, 1).table
        best = swept[swept.layout == "fixed"].sort_values("records_per_s").iloc[-1]
        pair = [(AUTO, AUTO), (int(best.workers_per_device), int(best.workunit_size))]
        longer = sweep(workload(), list(CARDS), pair if repeat % 2 == 0 else pair[::-1],
                       LONGER * records, 1, job="longer").table
        frames += [frame.assign(repeat=repeat) for frame in (swept, longer)]
        for row in pd.concat([swept, longer]).itertuples():
            print(f"repeat {repeat} {row.job} {row.configuration}: {row.records_per_s:.0f} "
                  f"records/s", flush=True)
    return pd.concat(frames, ignore_index=True)


def report(frame: pd.DataFrame) -> dict[str, float]:
    """Print the sweep and, per job length, the two ratios; return them."""
    sweep = frame[frame.job == "sweep"]
    by_config = sweep.groupby(["layout", "workers_per_device", "workunit_size"]).records_per_s
    print(by_config.median().round(0).to_string())
    summary = {}
    for job, rows in frame.groupby("job", sort=False):
        ratios = []
        for _, group in rows.groupby("repeat"):
            fixed = group[group.layout == "fixed"].records_per_s.max()
            ratios.append(group[group.layout == SELF_TUNING].records_per_s.iloc[0] / fixed)
        auto = rows[rows.layout == SELF_TUNING]
        summary[f"{job} self_tuning_vs_best_fixed"] = statistics.median(ratios)
        summary[f"{job} makespan_vs_ideal"] = auto.makespan_vs_ideal.median()
        print(f"{job} job ({int(auto.records.iloc[0]):,} records, ideal "
              f"{auto.ideal_s.iloc[0]:.0f} s): self-tuning ÷ best fixed, records/s: median "
              f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
              f"{len(ratios)} repeats); makespan ÷ ideal {auto.makespan_vs_ideal.median():.3f}; "
              f"final workers {auto.final_workers.iloc[0]}")
    return summary


def main(records: int, repeats: int, results_dir: str | None) -> None:
    frame = measure(records, repeats)
    report(frame)
    if results_dir:
        path = save_table(frame, "autotune_bench", results_dir, "helpers.bench.autotune",
                          {"records": records, "repeats": repeats})
        print(f"table: {path}")
