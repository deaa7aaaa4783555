"""The ray backend against the process backend on this machine: steady state, spin-up, and the
driver's writer limit.

1. The same embedding job (the sample paragraphs, 2 CPU workers of one thread each, workunits of
   25) on a process pool and a ray pool, models loaded, a warm-up job each, then ``repeats`` jobs
   alternating (the order turns every repeat). Reported: ray's records/s ÷ process's per repeat,
   the median (the issue's bar: >= 0.95), and each backend's spin-up (Ray's own start apart).
2. Rows of 384-d float32 per second through the driver from models that cost nothing: from
   process workers, from Ray actors (through Ray's object store), and the durable writer alone.
   Past the slowest of these, one driver is the limit (docs/cluster.md).
"""
from __future__ import annotations

import pandas as pd

from helpers.study.paths import sample_texts
from helpers.study.results import save_table
from helpers.study.scale_out import backends_side_by_side, driver_limit
from helpers.workloads.embedding import EmbeddingWorkload

DEVICES = ("cpu", "cpu")
WORKUNIT_SIZE = 25
LIMIT_ROWS, LIMIT_DIM, LIMIT_WORKERS, LIMIT_WORKUNIT = 400_000, 384, 2, 4096


def main(records: int, repeats: int, results_dir: str) -> None:
    side, _ = backends_side_by_side(EmbeddingWorkload(), DEVICES, records, repeats,
                                    sample_texts(), WORKUNIT_SIZE)
    limit = driver_limit(LIMIT_ROWS, LIMIT_DIM, LIMIT_WORKERS, LIMIT_WORKUNIT, repeats)
    report(side, limit)
    if results_dir:
        parameters = {"records": records, "repeats": repeats, "devices": list(DEVICES),
                      "workunit_size": WORKUNIT_SIZE, "limit_rows": LIMIT_ROWS}
        for table, name in ((side, "ray_bench_backends"), (limit, "ray_bench_driver_limit")):
            saved = save_table(table, name, results_dir, "python -m helpers.bench ray", parameters)
            print(f"saved {saved}")


def report(side: pd.DataFrame, limit: pd.DataFrame) -> None:
    rates = side.pivot(index="replicate", columns="backend", values="records_per_s")
    ratios = rates["ray"] / rates["process"]
    print(rates.assign(ray_over_process=ratios).to_string(float_format=lambda v: f"{v:.2f}"))
    print(f"steady state: ray / process = {ratios.median():.3f} (median of {len(ratios)} "
          f"interleaved repeats; goal >= 0.95)")
    spin = side.groupby("backend")[["spinup_s", "cluster_start_s"]].first()
    print(f"spin-up: process {spin.loc['process', 'spinup_s']:.1f} s; ray "
          f"{spin.loc['ray', 'spinup_s']:.1f} s after Ray's own start of "
          f"{spin.loc['ray', 'cluster_start_s']:.1f} s")
    rows = limit.groupby("backend")["rows_per_s"].median()
    print("driver's writer limit, rows/s of 384-d float32 (median): "
          + ", ".join(f"{backend} {rate:,.0f}" for backend, rate in rows.items()))
