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
import tempfile
from pathlib import Path

import pandas as pd

from helpers.engine.pipeline import run_pipeline
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
AUTO = "self-tuning"


def workload() -> SyntheticWorkload:
    return SyntheticWorkload(SECONDS_PER_RECORD, speed=CARDS, values="zeros",
                             seconds_per_workunit=SECONDS_PER_WORKUNIT, parallelism=PARALLELISM)


def ideal_seconds(records: int) -> float:
    """Records ÷ the sum of the cards' saturated rates, no per-workunit cost."""
    return records / sum(PARALLELISM * speed / SECONDS_PER_RECORD for speed in CARDS.values())


def configurations() -> list[tuple[int | str, int | str]]:
    return [(w, s) for w in WORKERS for s in SIZES] + [("auto", "auto")]


def one_run(records: int, workers: int | str, size: int | str, output: Path) -> dict:
    stats = run_pipeline([(i, i) for i in range(records)], workload(), list(CARDS), size, output,
                         workers_per_device=workers, progress=False, durable=False)
    final = {d["device"]: d["workers"] for d in stats.decisions if d["action"] != "add"}
    return {"layout": AUTO if workers == "auto" else "fixed", "workers_per_device": str(workers),
            "workunit_size": str(size), "records": stats.records, "wall_s": stats.wall_seconds,
            "spinup_s": stats.spinup_seconds, "records_per_s": stats.records_per_second,
            "ideal_s": ideal_seconds(records),
            "makespan_vs_ideal": stats.wall_seconds / ideal_seconds(records),
            "decisions": len(stats.decisions),
            "final_workers": ",".join(f"{d}={n}" for d, n in sorted(final.items()))}


def measure(records: int = RECORDS, repeats: int = 3) -> pd.DataFrame:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            order = configurations()
            order = order[repeat % len(order):] + order[:repeat % len(order)]
            sweep = [_row(repeat, "sweep", records, w, s, Path(tmp))
                     for w, s in (order if repeat % 2 == 0 else order[::-1])]
            best = max((r for r in sweep if r["layout"] == "fixed"),
                       key=lambda r: r["records_per_s"])
            pair = [("auto", "auto"), (int(best["workers_per_device"]), int(best["workunit_size"]))]
            rows += sweep + [_row(repeat, "longer", LONGER * records, w, s, Path(tmp))
                             for w, s in (pair if repeat % 2 == 0 else pair[::-1])]
    return pd.DataFrame(rows)


def _row(repeat: int, job: str, records: int, workers: int | str, size: int | str,
         folder: Path) -> dict:
    row = {"repeat": repeat, "job": job, **one_run(records, workers, size, folder / "out.h5")}
    print(f"repeat {repeat} {job} workers {workers} size {size}: {row['records_per_s']:.0f} "
          f"records/s", flush=True)
    return row


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
            ratios.append(group[group.layout == AUTO].records_per_s.iloc[0] / fixed)
        auto = rows[rows.layout == AUTO]
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
