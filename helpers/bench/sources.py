"""Corpora as users have them: Parquet, CSV and JSONL read alone, and Parquet end to end.

A corpus of short texts (``text``, ~22 characters) with a string key column (``doc``,
``doc-00000001``) is written in each format in a temporary folder, a million rows at a time;
Parquet in row groups of ROW_GROUP rows. Then:

- ``read``: each format's slices pulled with no workers (keys kept, as a run keeps them):
  rows/s and the reader's CPU seconds per million rows, the formats interleaved, ``repeats``
  times, medians;
- ``end_to_end``: ``python -m helpers run``'s pipeline over the Parquet file with the zero-cost
  synthetic model (8-d rows), process workers, each run a fresh process, with the keys kept and
  without (ids the row numbers): rows/s, and the driver's peak RSS for ``records`` rows against
  ``baseline_records`` rows. Flat memory means a growth below GOALS' bound; with keys, the check
  that no key comes twice holds 8 bytes a key on top (KEY_BYTES: 160 MB for 20 M keys), and the
  growth less that is compared with the bound too.

Rows are tidy and saved with provenance like the other benchmarks.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROW_GROUP = 131_072
GOALS = {"parquet_read_rows_per_s": 1_000_000, "csv_read_rows_per_s": 500_000,
         "jsonl_read_rows_per_s": 500_000, "end_to_end_rows_per_s": 250_000,
         "rss_growth_mib": 200}
FORMATS = ("parquet", "csv", "jsonl")
KEY_BYTES = 8  # the repeat check's hash of a key (helpers.engine.contract.id_ranges.SeenValues)


def write_corpus(folder: Path, rows: int, formats: tuple[str, ...] = FORMATS) -> dict[str, Path]:
    """The corpus (module docstring) as each of ``formats`` in ``folder``, a million rows at a
    time (bounded memory at any size)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    paths = {f: folder / f"corpus-{rows}.{f}" for f in formats}
    schema = pa.schema([("text", pa.string()), ("doc", pa.string())])
    writers = {}
    if "parquet" in formats:
        writers["parquet"] = pq.ParquetWriter(paths["parquet"], schema)
    if "csv" in formats:
        writers["csv"] = pacsv.CSVWriter(paths["csv"], schema)
    jsonl = open(paths["jsonl"], "w") if "jsonl" in formats else None
    try:
        for start in range(0, rows, 1_000_000):
            n = np.arange(start, min(rows, start + 1_000_000))
            texts = [f"a short text, number {i}" for i in n.tolist()]
            keys = [f"doc-{i:08d}" for i in n.tolist()]
            table = pa.table({"text": texts, "doc": keys}, schema=schema)
            if "parquet" in writers:
                writers["parquet"].write_table(table, row_group_size=ROW_GROUP)
            if "csv" in writers:
                writers["csv"].write_table(table)
            if jsonl is not None:
                jsonl.writelines(json.dumps({"text": t, "id": k}) + "\n"
                                 for t, k in zip(texts, keys))
    finally:
        for writer in writers.values():
            writer.close()
        if jsonl is not None:
            jsonl.close()
    return paths


def read_once(path: Path) -> dict[str, float]:
    """Every slice of ``path`` pulled as a run pulls them (keys held and let go): rows, seconds,
    CPU seconds."""
    from helpers.engine.contract.id_ranges import IdRanges
    from helpers.engine.inputs.carried import Carried
    from helpers.engine.inputs.sources import carried, open_source, read_slices

    source = open_source(path, id_column="doc" if path.suffix != ".jsonl" else None)
    held = Carried(carried(source))
    rows, wall, cpu = 0, time.perf_counter(), time.process_time()
    for ids, _ in read_slices(source, IdRanges(), carry=held.add):
        held.take(ids)
        rows += len(ids)
    return {"rows": rows, "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu}


def run_once(path: str, output: str, workers: int, workunit_size: int, keys: bool = True
             ) -> dict[str, Any]:
    """One end-to-end run in this process (``python -m helpers.bench sources-run``)."""
    from helpers.engine.pipeline import run_pipeline
    from helpers.workloads.synthetic import SyntheticWorkload

    stats = run_pipeline(path, SyntheticWorkload(0.0, dim=8, values="zeros"),
                         ("cpu",) * workers, workunit_size, output,
                         id_column="doc" if keys else None,
                         progress=False, overwrite=True)
    return {"records": stats.records, "wall_s": stats.wall_s,
            "records_per_s": stats.records_per_s, "parent_rss_mib": stats.parent_rss_mib,
            "longest_dispatch_gap_s": stats.longest_dispatch_gap_s,
            "spinup_s": stats.spinup_s}


def measure(read_records: int = 2_000_000, records: int = 2_000_000,
            baseline_records: int = 100_000, repeats: int = 3, workers: int = 2,
            workunit_size: int = 4096, folder: str | None = None) -> pd.DataFrame:
    """The runs of the module docstring; one tidy row per run."""
    from helpers.bench.scale import _child

    rows = []
    with tempfile.TemporaryDirectory(dir=folder, prefix="gpufeed-sources-") as tmp:
        corpus = write_corpus(Path(tmp), read_records)
        for repeat in range(repeats):
            for fmt in FORMATS:  # interleaved: a noisy minute hits every format alike
                got = read_once(corpus[fmt])
                rows.append({"run": "read", "format": fmt, "repeat": repeat, **got,
                             "rows_per_s": got["rows"] / got["wall_s"],
                             "cpu_s_per_million_rows": got["cpu_s"] / got["rows"] * 1e6})
        sizes = [("baseline", baseline_records)] if baseline_records else []
        paths = {read_records: corpus["parquet"]}
        for name, n in sizes + [("end_to_end", records)]:
            if n not in paths:
                paths[n] = write_corpus(Path(tmp), n, ("parquet",))["parquet"]
            for keys in (True, False):
                got = _child([sys.executable, "-m", "helpers.bench", "sources-run", "--input",
                              str(paths[n]), "--output", str(Path(tmp) / "out.h5"),
                              "--workers", str(workers), "--workunit-size", str(workunit_size),
                              *([] if keys else ["--no-keys"])])
                rows.append({"run": name, "format": "parquet", "keys": keys, "repeat": 0,
                             "rows": got["records"], "rows_per_s": got["records_per_s"], **got})
    return pd.DataFrame(rows).assign(workers=workers, workunit_size=workunit_size)


def report(table: pd.DataFrame) -> dict[str, float]:
    """Print the medians and each goal with its verdict; return the figures compared."""
    reads = table[table["run"] == "read"]
    summary = reads.groupby("format")[["rows_per_s", "cpu_s_per_million_rows"]].median()
    print(summary.to_string(float_format=lambda v: f"{v:,.2f}"))
    figures = {f"{fmt}_read_rows_per_s": summary.loc[fmt, "rows_per_s"] for fmt in FORMATS}
    runs = table[table["run"] != "read"].set_index(["run", "keys"])
    if "end_to_end" in runs.index:
        print(runs[["rows", "rows_per_s", "parent_rss_mib", "longest_dispatch_gap_s"]]
              .to_string(float_format=lambda v: f"{v:,.2f}"))
        figures["end_to_end_rows_per_s"] = runs.loc[("end_to_end", True), "rows_per_s"]
        figures["end_to_end_no_keys_rows_per_s"] = runs.loc[("end_to_end", False), "rows_per_s"]
    if "baseline" in runs.index:
        growth = runs.loc["end_to_end", "parent_rss_mib"] - runs.loc["baseline", "parent_rss_mib"]
        check_mib = KEY_BYTES * (runs.loc[("end_to_end", True), "rows"]
                                - runs.loc[("baseline", True), "rows"]) / 2**20
        figures["rss_growth_mib"] = growth[False]
        figures["rss_growth_keys_mib"] = growth[True]
        figures["rss_growth_keys_less_check_mib"] = growth[True] - check_mib
    for name, value in figures.items():
        goal = GOALS[name.replace("_no_keys", "").replace("_keys_less_check", "")
                     .replace("_keys", "")]
        at_most = name.startswith("rss_growth")
        met = value <= goal if at_most else value >= goal
        print(f"{name}: {value:,.1f} ({'<=' if at_most else '>='} {goal:,}: "
              f"{'met' if met else 'NOT met'})" if name != "rss_growth_keys_mib" else
              f"{name}: {value:,.1f} (of which the repeat check's {KEY_BYTES} bytes a key: "
              f"{check_mib:,.1f})")
    return figures


def main(read_records: int, records: int, baseline_records: int, repeats: int, workers: int,
         workunit_size: int, folder: str | None, results_dir: str) -> None:
    table = measure(read_records, records, baseline_records, repeats, workers, workunit_size,
                    folder)
    report(table)
    if results_dir:
        from helpers.study.results import save_table

        print(save_table(table, "sources_bench", results_dir, "python -m helpers.bench sources",
                         {"read_records": read_records, "records": records,
                          "baseline_records": baseline_records, "repeats": repeats,
                          "workers": workers, "workunit_size": workunit_size}))
