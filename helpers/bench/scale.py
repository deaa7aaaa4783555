"""The pipeline at its users' scale: the study's 20,648,877 records, 384-d float32, models free.

A model that costs nothing (``SyntheticWorkload(0, values="zeros")``) leaves only the machinery:
reader -> workers -> writer, with durable (crash-safe) writes. Each run is a fresh process, so its
peak RSS is its own and the kill is a real SIGKILL of the whole run (workers included):

- ``baseline``: ``baseline_records`` records: the driver's peak RSS to compare with;
- ``full``: every record: records/s, the driver's peak RSS, bytes written and write amplification,
  the longest a worker waited between two of its workunits (the worst stall, against its goal),
  and the longest time no workunit was dispatched (in the table: messages of several workunits
  go out further apart while their workers are busy);
- ``killed``: the same run, SIGKILLed once its output holds ``kill_at`` of the records;
- ``resumed``: ``resume=True`` on what the kill left: seconds until the first new workunit, and
  whether the final output holds every id exactly once.

``backend="ray"`` runs the same through Ray actors on a local Ray that each run starts (its start is
in the spin-up, not in the rate), or on the cluster at $RAY_ADDRESS. Beside the driver's peak RSS:
its peak private memory while its pool is up (``parent_uss_mib``: RSS counts the pages of Ray's
object store the driver has read results from, shared memory that Ray owns and bounds), and every
run's whole process tree sampled five times a second (``tree_rss_mib``: the driver, its workers or
Ray's raylet, object store and actors).

Records are the shipped sample paragraphs over and over (ids 0..n-1), read a slice at a time;
with ``source="parquet"``, ``"jsonl"`` or ``"csv"`` they are first written as one file (Parquet:
row groups of PARQUET_GROUP_ROWS, no dictionary, each text stored; JSON lines: ``{"text": ...}``,
ids the line numbers; CSV: a ``text`` column, quoted as pyarrow writes it, ids the row numbers),
which the runs read (each run the first ``n`` rows of it), by the driver or, with
``writes="workers"``, by the workers themselves.
Rows are tidy (units in column names) and saved with provenance like the other benchmarks.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import psutil

from helpers.engine.contract.fingerprint import source_fingerprint
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import positions
from helpers.engine.inputs.sources import READ_SLICE, open_source
from helpers.engine.outputs.checkpoint import WORKER_LEVEL
from helpers.engine.outputs.hdf5_sink import rows_written
from helpers.study.peers import tree_rss_mib

CORPUS = 20_648_877  # chunks in the study's corpus (notebook 01's days-for-the-corpus estimate)
PARQUET_GROUP_ROWS = 100_000  # rows per row group of the Parquet corpus (source="parquet")
GOALS = {"records_per_s": 200_000, "rss_growth_mib": 200, "uss_growth_mib": 200,
         "longest_idle_s": 1.0, "write_amplification": 2.0,
         "resume_first_workunit_s": 10.0,
         "driver_cpu_s_per_million": 0.3, "driver_read_fraction": 0.05}  # (the last two: one
# driver for a cluster, writes="workers")


class CycledTexts:
    """``n`` records, ids 0..n-1, the sample paragraphs over and over: a corpus of any size that
    costs nothing to read. ``slices`` skips done ranges before touching them, like HDF5 batches;
    ``rows`` lets workers read them (``writes="workers"``), as they read an HDF5 input."""

    def __init__(self, n: int, texts: list[str]) -> None:
        if len(texts) < READ_SLICE:
            raise ValueError(f"texts: need at least {READ_SLICE}, got {len(texts)}")
        self.n, self._texts, self._twice = n, texts, texts + texts

    def __len__(self) -> int:
        return self.n

    def describe(self) -> str:
        return f"cycled:{len(self._texts)}-texts:{self.n}"

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for ids, records in self.slices(IdRanges(), None):
            yield from zip(ids.tolist(), records)

    def rows(self, skip: IdRanges, limit: int | None) -> Iterator[tuple[np.ndarray, Any]]:
        return positions(_CycledRows(), self.n if limit is None else min(self.n, limit), skip)

    def slices(self, skip: IdRanges, limit: int | None) -> Iterator[tuple[np.ndarray, list]]:
        end = self.n if limit is None else min(self.n, limit)
        for start in range(0, end, READ_SLICE):
            stop = min(start + READ_SLICE, end)
            if skip.runs and skip.covers(start, stop):
                continue
            at = start % len(self._texts)
            ids, records = np.arange(start, stop, dtype=np.int64), self._twice[at:at + stop - start]
            if skip.runs:
                keep = ~skip.contains(ids)
                ids, records = ids[keep], [r for r, k in zip(records, keep) if k]
            yield ids, records


@dataclass(frozen=True)
class _CycledRows:
    """CycledTexts' records read by a worker: the sample paragraphs, cycled."""

    def read(self, ids: np.ndarray) -> list:
        texts = _sample_texts()
        return [texts[i % len(texts)] for i in ids.tolist()]


@functools.lru_cache(maxsize=1)
def _sample_texts() -> list[str]:
    from helpers.study.paths import sample_texts

    return sample_texts()


def write_parquet(path: Path, records: int) -> None:
    """The sample paragraphs over and over, ``records`` rows of a ``text`` column, as Parquet
    (written a row group at a time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = _sample_texts()
    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(path, schema, use_dictionary=False) as writer:
        for start in range(0, records, PARQUET_GROUP_ROWS):
            rows = range(start, min(start + PARQUET_GROUP_ROWS, records))
            writer.write_table(pa.table({"text": [texts[i % len(texts)] for i in rows]}, schema),
                               row_group_size=PARQUET_GROUP_ROWS)


def write_jsonl(path: Path, records: int) -> None:
    """The sample paragraphs over and over, ``records`` lines of ``{"text": ...}``."""
    texts = [json.dumps({"text": text}) + "\n" for text in _sample_texts()]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(texts[i % len(texts)] for i in range(records))


def write_csv(path: Path, records: int) -> None:
    """The sample paragraphs over and over, ``records`` rows of a ``text`` column, as CSV (each
    text quoted where it holds a comma or a quote, as pyarrow writes it)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    texts = _sample_texts()
    schema = pa.schema([("text", pa.string())])
    with pacsv.CSVWriter(path, schema) as writer:
        for start in range(0, records, PARQUET_GROUP_ROWS):
            rows = range(start, min(start + PARQUET_GROUP_ROWS, records))
            writer.write_table(pa.table({"text": [texts[i % len(texts)] for i in rows]}, schema))


WRITERS = {"parquet": write_parquet, "jsonl": write_jsonl, "csv": write_csv}  # the corpus as
# a file (``source``)


def run_once(records: int, output: str, workers: int, workunit_size: int, dim: int,
             resume: bool, backend: str = "process", writes: str = "driver",
             corpus: str | None = None, per_message: int | str = "auto") -> dict[str, Any]:
    """One run in this process (``python -m helpers.bench scale-run``): its measurements, with
    the driver's CPU seconds (not the memory sampler's beside it: its reads of smaps cost ~10 ms
    a second) and the bytes it read (``rchar``: pipes and files; Ray's object
    store is shared memory, which this does not count) while the job ran."""
    from helpers.engine.contract.settings import JobSettings, PoolSettings
    from helpers.engine.pipeline import WorkerPool
    from helpers.study.paths import sample_texts
    from helpers.workloads.synthetic import SyntheticWorkload

    settings = PoolSettings(("cpu",) * workers, backend, units_per_message=per_message)
    job = JobSettings(workunit_size, progress=False, resume=resume, writes=writes)
    with WorkerPool.from_settings(SyntheticWorkload(0.0, dim=dim, values="zeros"), settings,
                                  job) as pool, _PeakPrivate() as private:
        source = open_source(corpus) if corpus else CycledTexts(records, sample_texts())
        started, read = time.perf_counter(), _read_bytes()  # the input's fingerprint: its
        source_fingerprint(source)  # content read once as the run starts (kept on the source)
        fingerprint_s, fingerprint_read = time.perf_counter() - started, _read_bytes() - read
        cpu, read = time.process_time() - private.cpu_s(), _read_bytes()
        longer = corpus and (len(source) if hasattr(source, "__len__") else records + 1) > records
        stats = pool.run(source, output, limit=records if longer else None)  # (a corpus of these
        # rows alone is read without a limit: its run takes every byte's digest, as a user's does)
        cpu, read = time.process_time() - private.cpu_s() - cpu, _read_bytes() - read
    new = stats.records  # (this run's: a resumed run's skipped ones are not)
    return {"records": stats.records,
            "driver_cpu_s_per_million": cpu / new * 1e6 if new > 0 else None,
            "driver_read_fraction": read / (new * (dim * 4 + 8)) if new > 0 else None,
            "fingerprint_s": fingerprint_s,  # (before the run: its whole input's digest)
            "fingerprint_read_fraction": fingerprint_read / (new * (dim * 4 + 8))
            if new > 0 else None,
            "wall_s": stats.wall_s,
            "records_per_s": stats.records_per_s, "parent_rss_mib": stats.parent_rss_mib,
            "parent_uss_mib": private.peak_mib,
            "longest_dispatch_gap_s": stats.longest_dispatch_gap_s,
            "longest_idle_s": stats.longest_idle_s,
            "first_dispatch_s": stats.first_dispatch_s, "spinup_s": stats.spinup_s,
            "bytes_written": stats.bytes_written, "output_bytes": stats.output_bytes,
            "write_amplification": stats.write_amplification,
            "resumed_after": stats.resumed_after, "write_s": stats.stages["write"],
            "write_blocked_s": stats.stages["write_blocked"]}


def _read_bytes() -> int:
    """Bytes this process has read by system calls (pipes, sockets, files): /proc's rchar."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar"))


class _PeakPrivate:
    """This process's peak private memory (USS), sampled once a second while the block runs and
    at its end, so while the pool is up: once Ray stops, the pages of its object store the driver
    still maps count as private, though they were never the driver's."""

    def __init__(self) -> None:
        self.peak_mib, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self._take()
            if self._stop.wait(1.0):
                return

    def _take(self) -> None:
        self.peak_mib = max(self.peak_mib, psutil.Process().memory_full_info().uss / 2**20)

    def cpu_s(self) -> float:
        """The CPU the sampling thread has used so far (not the driver's work); 0 where the
        platform cannot tell (no pthread_getcpuclockid: macOS) or the thread has ended."""
        clock = getattr(time, "pthread_getcpuclockid", None)
        if clock is None or not self._thread.is_alive():
            return 0.0
        return time.clock_gettime(clock(self._thread.ident))

    def __enter__(self) -> _PeakPrivate:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()  # and at the end of the job, however short


def _command(records: int, output: Path, workers: int, workunit_size: int, dim: int,
             backend: str, writes: str = "driver", resume: bool = False,
             corpus: Path | None = None, per_message: int | str = "auto") -> list[str]:
    return [sys.executable, "-m", "helpers.bench", "scale-run", "--records", str(records),
            "--output", str(output), "--workers", str(workers), "--workunit-size",
            str(workunit_size), "--dim", str(dim), "--backend", backend, "--writes", writes,
            "--units-per-message", str(per_message)] + (
                ["--resume"] if resume else []) + (["--corpus", str(corpus)] if corpus else [])


def _child(command: list[str]) -> dict[str, Any]:
    """Run ``command``, sampling its process tree's RSS five times a second: its measurements, with
    the tree's peak as ``tree_rss_mib``."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        run = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        root, peak = psutil.Process(run.pid), 0.0
        while run.poll() is None:
            peak = max(peak, tree_rss_mib(root))
            time.sleep(0.2)
        out.seek(0), err.seek(0)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {run.returncode}:\n"
                               f"{err.read()[-3000:]}")
        return {**json.loads(out.read().strip().splitlines()[-1]), "tree_rss_mib": peak}


def _kill_when(command: list[str], output: Path, rows: int, part_rows: int = 0) -> float:
    """Start the run in its own process group; SIGKILL the group once ``output``'s index holds
    ``rows`` rows, or (``part_rows``: workers' parts of that many rows, which commit faster than
    the index is rewritten) once that many rows are in committed parts. Returns the seconds it
    ran; RuntimeError if it finished first."""
    started = time.monotonic()
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    parts = output.with_name(output.name + ".parts")
    while run.poll() is None and rows_written(output) < rows and \
            (not part_rows or _committed(parts) * part_rows < rows):
        time.sleep(0.05)
    if run.poll() is not None:
        raise RuntimeError(f"the run ended (exit {run.returncode}) before its output held {rows} "
                           f"rows: nothing to kill")
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    return time.monotonic() - started


def _committed(parts: Path) -> int:
    """Workers' parts committed into the output so far (helpers.engine.outputs.checkpoint's
    names)."""
    try:
        return sum(1 for p in os.scandir(parts) if p.name.startswith(f"part-L{WORKER_LEVEL}-"))
    except FileNotFoundError:
        return 0


def _held(output: Path) -> int:
    """The rows a killed run left: its index's, or more in workers' parts committed since the
    index was last rewritten."""
    parts = output.with_name(output.name + ".parts")
    committed = 0
    if parts.is_dir():
        for path in parts.glob(f"part-L{WORKER_LEVEL}-*.h5"):
            with h5py.File(path, "r") as f:
                committed += len(f["ids"])
    return max(rows_written(output), committed)


def exactly_once(output: Path, records: int) -> bool:
    """True if ``output`` holds ids 0..records-1, each once (read a million at a time)."""
    with h5py.File(output, "r") as f:
        ids = f["ids"]
        if len(ids) != records:
            return False
        seen = np.zeros(records, dtype=bool)
        for start in range(0, records, 1 << 20):
            chunk = ids[start:start + (1 << 20)]
            if chunk.min() < 0 or chunk.max() >= records or seen[chunk].any():
                return False
            seen[chunk] = True
        return bool(seen.all())


def remove_output(output: Path) -> None:
    """An output file and its parts folder, gone."""
    output.unlink(missing_ok=True)
    shutil.rmtree(output.with_name(output.name + ".parts"), ignore_errors=True)


def measure(records: int = CORPUS, workers: int = 2, workunit_size: int = 4096, dim: int = 384,
            baseline_records: int = 100_000, kill_at: float | None = 0.9,
            folder: str | None = None, backend: str = "process", writes: str = "driver",
            source: str = "cycled", per_message: int | str = "auto") -> pd.DataFrame:
    """The runs described in the module docstring; one tidy row per run. ``baseline_records=0``
    or ``kill_at=None`` leaves those runs out."""
    need = records * (dim * 4 + 8) * 1.1
    rows = []
    with tempfile.TemporaryDirectory(dir=folder, prefix="gpufeed-scale-") as tmp:
        free = shutil.disk_usage(tmp).free
        if free < need:
            raise RuntimeError(f"{tmp}: {free / 1e9:.1f} GB free, a run of {records:,} records of "
                               f"{dim}-d float32 needs {need / 1e9:.1f} GB (--folder elsewhere?)")
        output, corpus = Path(tmp) / "out.h5", None
        if source != "cycled":
            corpus = Path(tmp) / f"corpus.{source}"
            WRITERS[source](corpus, records)
        setting = dict(workers=workers, workunit_size=workunit_size, dim=dim, backend=backend,
                       writes=writes, corpus=corpus, per_message=per_message)
        runs = ([("baseline", baseline_records)] if baseline_records else []) + [("full", records)]
        for name, n in runs:
            row = _child(_command(n, output, **setting))
            rows.append({"run": name, **row, "exactly_once": exactly_once(output, n)})
            remove_output(output)
        if kill_at is not None:
            ran = _kill_when(_command(records, output, **setting), output, int(kill_at * records),
                             workunit_size if writes == "workers" else 0)
            rows.append({"run": "killed", "records": _held(output), "wall_s": ran})
            row = _child(_command(records, output, resume=True, **setting))
            rows.append({"run": "resumed", **row, "exactly_once": exactly_once(output, records)})
            remove_output(output)
    table = pd.DataFrame(rows).assign(source=source, backend=backend, writes=writes,
                                      workers=workers, units_per_message=str(per_message),
                                      workunit_size=workunit_size, dim=dim, total_records=records)
    table["resume_first_workunit_s"] = np.where(table["run"] == "resumed",
                                                table["spinup_s"] + table["first_dispatch_s"],
                                                np.nan)
    return table


def report(table: pd.DataFrame) -> dict[str, float]:
    """Print the table and each goal with its verdict; return the figures compared."""
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        shown = table.drop(columns=["source", "backend", "writes", "workers", "workunit_size",
                                    "dim", "units_per_message"])
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    runs = table.set_index("run")
    figures: dict[str, float] = {}
    full = runs.loc["full"]
    figures["records_per_s"] = full["records_per_s"]
    figures["longest_idle_s"] = full["longest_idle_s"]
    figures["write_amplification"] = full["write_amplification"]
    figures["driver_cpu_s_per_million"] = full["driver_cpu_s_per_million"]
    figures["driver_read_fraction"] = full["driver_read_fraction"]
    if "baseline" in runs.index:
        figures["rss_growth_mib"] = full["parent_rss_mib"] - runs.loc["baseline", "parent_rss_mib"]
        figures["uss_growth_mib"] = full["parent_uss_mib"] - runs.loc["baseline", "parent_uss_mib"]
    if "resumed" in runs.index:
        figures["resume_first_workunit_s"] = runs.loc["resumed", "resume_first_workunit_s"]
    at_most = {"rss_growth_mib", "uss_growth_mib", "longest_idle_s",
               "write_amplification", "resume_first_workunit_s", "driver_cpu_s_per_million",
               "driver_read_fraction"}
    for name, value in figures.items():
        goal = GOALS[name]
        met = value <= goal if name in at_most else value >= goal
        print(f"{name}: {value:,.3f} ({'<=' if name in at_most else '>='} {goal:,}: "
              f"{'met' if met else 'NOT met'})")
    if (table["backend"] == "ray").any():
        from helpers.engine.workers.ray_backend import cluster_address

        joined = cluster_address()
        print(f"ray: each run joined the cluster at {joined}" if joined else
              "ray: spin-up and resume_first_workunit_s include starting a local Ray ($RAY_ADDRESS "
              "joins a running cluster instead)", "; RSS includes the object store's shared pages",
              sep="")
    once = table["exactly_once"].dropna()
    print(f"every id exactly once in every finished output: {bool(once.all())}")
    return figures


def main(records: int, workers: int, workunit_size: int, dim: int, baseline_records: int,
         kill_at: float | None, folder: str | None, results_dir: str | None,
         backend: str = "process", writes: str = "driver", source: str = "cycled",
         per_message: int | str = "auto") -> None:
    from helpers.study.results import save_table

    table = measure(records, workers, workunit_size, dim, baseline_records, kill_at, folder,
                    backend, writes, source, per_message)
    report(table)
    if results_dir:
        name = ("scale" if backend == "process" else f"scale_{backend}") + (
            "_workers_write" if writes == "workers" else "") + (
            "" if source == "cycled" else f"_{source}")
        path = save_table(table, name, results_dir, "helpers.bench.scale",
                          {"records": records, "workers": workers, "workunit_size": workunit_size,
                           "dim": dim, "baseline_records": baseline_records, "kill_at": kill_at,
                           "backend": backend, "writes": writes, "source": source,
                           "units_per_message": per_message})
        print(f"table: {path}")
