"""Notebook 09's experiments: gpufeed beside what a user would pick instead, on the same texts,
devices and batch size: bare ``model.encode`` in one process (the floor), sentence-transformers'
multi-process pool (its default torch threads, and an even share of the cores), Ray Data's
``map_batches`` on an actor pool, and gpufeed's process, thread and ray backends.

Each run is a fresh ``python -m helpers.study.peers`` process (``run_system``), so that imports,
model loads and memory start from nothing for every system alike; the process prints its own
spin-up (until every model copy is loaded and warm) and steady-state seconds, and the ids it got
back, and this side times it end to end and samples the memory of its whole process tree (Ray's
raylet and actors included; proportional set sizes, ``tree_pss_mib``) for the peak. ``peers`` runs
every system once per replicate, the order turning (helpers.study.autotune.interleaved).

``faults`` runs each system again and, once it is in its steady state, SIGKILLs one of its model
processes (bare: the process itself), then waits up to a time limit: who finishes, who fails,
who hangs, and how many rows come back lost or twice. A thread cannot be killed alone, so the
thread backend's row says so (``fault="none possible"``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil

from helpers.engine.workers.backends import is_fork_server
from helpers.study.autotune import interleaved
from helpers.study.experiments import sample_records

FAMILIES = {"bare": "bare encode", "st_pool": "sentence-transformers",
            "st_pool_shared": "sentence-transformers", "ray_data": "Ray Data",
            "gpufeed_process": "gpufeed", "gpufeed_thread": "gpufeed", "gpufeed_ray": "gpufeed"}
SYSTEMS = ("bare", "st_pool", "st_pool_shared", "ray_data", "gpufeed_process", "gpufeed_thread",
           "gpufeed_ray")
LABELS = {"bare": "bare model.encode", "st_pool": "sentence-transformers pool",
          "st_pool_shared": "sentence-transformers pool (threads shared)",
          "ray_data": "Ray Data map_batches", "gpufeed_process": "gpufeed (processes)",
          "gpufeed_thread": "gpufeed (threads)", "gpufeed_ray": "gpufeed (Ray actors)"}
STEADY = "gpufeed-peers: steady"  # what a run prints when its models are loaded and its work starts
SAMPLE_SECONDS = 0.2  # how often the process tree's memory is read


def _cores() -> int:
    from helpers.engine.contract.devices import available_cores

    return available_cores()


def _warm_model(device: str, threads: int) -> Any:
    """The embedded model on ``device``, its first forward pass paid (as a gpufeed worker's)."""
    from helpers.workloads.embedding import WARMUP_TEXT, load_sentence_transformer

    model = load_sentence_transformer(None, device, threads)
    model.encode([WARMUP_TEXT], batch_size=1, show_progress_bar=False)
    return model


def _announce_steady() -> float:
    print(STEADY, flush=True)
    return time.perf_counter()


# ---- one system, in its own process -------------------------------------------------------------

def _bare(texts: list[str], device: str, batch_size: int, workers: int, threads: int,
          workunit_size: int) -> tuple[float, float, list[int]]:
    started = time.perf_counter()
    model = _warm_model(device, _cores())
    steady = _announce_steady()
    model.encode(texts, batch_size=batch_size, show_progress_bar=False)
    return steady - started, time.perf_counter() - steady, list(range(len(texts)))


def _st_pool(texts: list[str], device: str, batch_size: int, workers: int, threads: int | None,
             workunit_size: int) -> tuple[float, float, list[int]]:
    """sentence-transformers' own pool; ``threads``: None keeps torch's default in each process
    (every core), else OMP_NUM_THREADS for the processes it spawns."""
    from helpers.workloads.embedding import WARMUP_TEXT, load_sentence_transformer

    started = time.perf_counter()
    model = load_sentence_transformer(None, "cpu", _cores())
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # read by torch in each spawned process
    pool = model.start_multi_process_pool([device] * workers)
    try:
        warm = [WARMUP_TEXT] * (workers * batch_size)  # a chunk for each process, most likely
        _pool_encode(model, warm, pool, batch_size, batch_size)
        steady = _announce_steady()
        embeddings = _pool_encode(model, texts, pool, batch_size, None)
        assert len(embeddings) == len(texts)
        return steady - started, time.perf_counter() - steady, list(range(len(texts)))
    finally:
        model.stop_multi_process_pool(pool)


def _pool_encode(model: Any, texts: list[str], pool: Any, batch_size: int,
                 chunk_size: int | None) -> Any:
    try:  # sentence-transformers 5+: encode takes the pool
        return model.encode(texts, pool=pool, batch_size=batch_size, chunk_size=chunk_size,
                            show_progress_bar=False)
    except TypeError:  # before: a method of its own
        return model.encode_multi_process(texts, pool, batch_size=batch_size,
                                          chunk_size=chunk_size)


class _RayDataEmbed:
    """Ray Data's actor: loads the model once, embeds each batch, stamps when it was ready."""

    def __init__(self, device: str, threads: int, batch_size: int) -> None:
        # Ray gives an actor its share of a card as cuda:0 (CUDA_VISIBLE_DEVICES)
        self.model = _warm_model("cuda:0" if device.startswith("cuda") else device, threads)
        self.batch_size, self.ready = batch_size, time.time()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        embeddings = self.model.encode(list(batch["text"]), batch_size=self.batch_size,
                                       show_progress_bar=False)
        n = len(batch["id"])
        return {"id": batch["id"], "embedding": list(embeddings),
                "ready": np.full(n, self.ready), "ended": np.full(n, time.time())}


def _ray_data(texts: list[str], device: str, batch_size: int, workers: int, threads: int,
              workunit_size: int) -> tuple[float, float, list[int]]:
    """``map_batches`` with an actor pool of ``workers``; batches of ``workunit_size`` rows.
    Ray Data is lazy, so spin-up ends when the last actor is ready (its own stamp) and the
    steady state runs from then to the last batch's end."""
    import ray

    from helpers.engine.workers.ray_backend import cluster_address, local_system

    wall_started = time.time()
    ray.init(num_cpus=max(_cores(), workers * threads), include_dashboard=False,
             _system_config=None if cluster_address() else local_system(),
             # (a local Ray's workers at gpufeed_ray's niceness; a cluster keeps its own)
             log_to_driver=False, logging_level="ERROR")
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        dataset = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
        _announce_steady()  # the work is submitted here; the actors load as it starts
        result = dataset.map_batches(
            _RayDataEmbed, fn_constructor_args=(device, threads, batch_size),
            batch_size=workunit_size, concurrency=workers, num_cpus=threads,
            num_gpus=1 / workers if device.startswith("cuda") else 0,
        ).select_columns(["id", "ready", "ended"])
        frame = result.to_pandas()
        ready, ended = frame["ready"].max(), frame["ended"].max()
        return ready - wall_started, ended - ready, frame["id"].tolist()
    finally:
        ray.shutdown()


def _gpufeed(backend: str) -> Any:
    def run(texts: list[str], device: str, batch_size: int, workers: int, threads: int,
            workunit_size: int) -> tuple[float, float, list[int]]:
        from helpers.engine.outputs.hdf5_sink import read_output
        from helpers.engine.pipeline import WorkerPool
        from helpers.workloads.embedding import EmbeddingWorkload

        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp, \
                WorkerPool(EmbeddingWorkload(batch_size=batch_size), [device] * workers, backend,
                           threads_per_worker=threads, progress=False) as pool:
            steady = _announce_steady()
            stats = pool.run(list(enumerate(texts)), Path(tmp) / "out.h5",
                             workunit_size=workunit_size)
            ids = read_output(Path(tmp) / "out.h5")["ids"].tolist()
            return steady - started, stats.wall_s, ids
    return run


RUNNERS = {"bare": _bare, "st_pool": _st_pool, "st_pool_shared": _st_pool,
           "ray_data": _ray_data, "gpufeed_process": _gpufeed("process"),
           "gpufeed_thread": _gpufeed("thread"), "gpufeed_ray": _gpufeed("ray")}


def threads_for(system: str, workers: int) -> int | None:
    """Torch threads in each model copy: every core for bare, torch's default (None) for the
    default pool, else an even share of the cores (at least one)."""
    if system == "bare":
        return _cores()
    if system == "st_pool":
        return None
    return max(1, _cores() // workers)


def run_here(system: str, device: str, records: int, batch_size: int, workers: int,
             workunit_size: int, ids_path: str | None, seed: int = 0) -> dict[str, Any]:
    """Run ``system`` in this process (``python -m helpers.study.peers``); writes the ids it got
    back to ``ids_path`` (.npy) and returns its spin-up and steady seconds."""
    from helpers.study.paths import sample_texts

    texts = [t for _, t in sample_records(sample_texts(), records, seed)]
    threads = threads_for(system, workers)
    spinup, steady, ids = RUNNERS[system](texts, device, batch_size, workers, threads,
                                          workunit_size)
    if ids_path:
        np.save(ids_path, np.asarray(ids, dtype=np.int64))
    return {"spinup_s": spinup, "steady_s": steady, "threads": threads or _cores()}


# ---- this side: start a run, watch it, kill into it --------------------------------------------

def _tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss_mib(root: psutil.Process) -> float:
    """The RSS of ``root`` and all its descendants, MiB (those gone meanwhile count nothing)."""
    return _tree_memory_mib(root, lambda p: p.memory_info().rss)


def tree_pss_mib(root: psutil.Process) -> float:
    """The memory ``root`` and all its descendants hold, MiB: their proportional set sizes (a page
    that n of them share counts 1/n in each), so that processes forked with their libraries
    loaded, sharing those pages, count them once, as the machine does (the RSS sum counts them
    in each)."""
    return _tree_memory_mib(root, lambda p: p.memory_full_info().pss)


def _tree_memory_mib(root: psutil.Process, size: Callable[[psutil.Process], int]) -> float:
    total = 0
    for p in _tree(root):
        try:
            total += size(p)
        except psutil.Error:  # gone meanwhile: counts nothing
            pass
    return total / 2**20


def victim(system: str, root: psutil.Process) -> psutil.Process | None:
    """The model process a fault kills: bare's own; a pool's worker process; a Ray actor."""
    if system == "bare":
        return root
    for p in _tree(root)[1:]:
        try:
            line, parent = " ".join(p.cmdline()), " ".join(p.parent().cmdline())
        except (psutil.Error, AttributeError):  # gone meanwhile (its parent None, or gone)
            continue
        if system.startswith(("ray_data", "gpufeed_ray")):
            if line.startswith("ray::") and ("Worker" in line or "Map" in line) \
                    and "IDLE" not in line:
                return p
        elif "multiprocessing" in line and "resource_tracker" not in line and \
                not is_fork_server(line, parent):
            return p  # (a worker the fork server forked, never the server)
    return None


def run_system(system: str, device: str, records: int, batch_size: int, workers: int,
               workunit_size: int, seed: int = 0, kill_after_seconds: float | None = None,
               limit_seconds: float = 600.0) -> dict[str, Any]:
    """Run ``system`` in a fresh process and measure it; ``kill_after_seconds``: into its steady
    state to SIGKILL one of its model processes (``victim``). Returns a row: outcome ("finished",
    "failed" or "hung" past ``limit_seconds``), seconds, peak memory of the process tree, and the
    rows it returned: written, unique, lost, duplicated."""
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = str(Path(tmp) / "ids.npy")
        command = [sys.executable, "-m", "helpers.study.peers", system, "--device", device,
                   "--records", str(records),
                   "--batch-size", str(batch_size), "--workers", str(workers),
                   "--workunit-size", str(workunit_size), "--seed", str(seed), "--ids", ids_path]
        # files, not pipes: a full pipe would stall the run, and a pipe a grandchild (Ray's,
        # a resource tracker) still holds open never ends
        out_path, err_path = Path(tmp) / "stdout.txt", Path(tmp) / "stderr.txt"
        started = time.perf_counter()
        with open(out_path, "w") as out, open(err_path, "w") as err:
            child = subprocess.Popen(command, stdout=out, stderr=err, text=True,
                                     start_new_session=True)
        root = psutil.Process(child.pid)
        peak, steady_at, killed = 0.0, None, None
        reader = _Lines(out_path)
        while child.poll() is None and time.perf_counter() - started < limit_seconds:
            peak = max(peak, tree_pss_mib(root))
            if steady_at is None and STEADY in reader.new():
                steady_at = time.perf_counter()
            if kill_after_seconds is not None and killed is None and steady_at is not None \
                    and time.perf_counter() - steady_at >= kill_after_seconds:
                target = victim(system, root)
                if target is not None:
                    killed = target.pid
                    target.send_signal(signal.SIGKILL)
            time.sleep(SAMPLE_SECONDS)
        hung = child.poll() is None
        if hung:
            _kill_tree(root, child)
        end_to_end = time.perf_counter() - started
        child.wait()
        result = next((json.loads(line) for line in out_path.read_text().splitlines()
                       if line.startswith("{")), {})
        err = err_path.read_text(errors="replace")
        ids = np.load(ids_path) if os.path.exists(ids_path) else np.empty(0, np.int64)
    unique = len(np.unique(ids))
    outcome = "hung" if hung else "finished" if child.returncode == 0 else "failed"
    return {"system": system, "label": LABELS[system], "family": FAMILIES[system],
            "outcome": outcome,
            "returncode": None if hung else child.returncode, "records": records,
            "device": device, "workers": workers, "batch_size": batch_size, "workunit_size": workunit_size,
            "threads": result.get("threads", np.nan), "spinup_s": result.get("spinup_s", np.nan),
            "steady_s": result.get("steady_s", np.nan), "end_to_end_s": end_to_end,
            "records_per_s": records / result["steady_s"] if result.get("steady_s") else np.nan,
            "peak_pss_mib": peak, "killed_pid": killed, "rows_written": len(ids),
            "rows_unique": unique, "rows_lost": records - unique,
            "rows_duplicated": len(ids) - unique,
            "error": "" if outcome == "finished" else f"killed by signal {-child.returncode}"
            if not hung and child.returncode < 0 else _last_error(err)}


class _Lines:
    """The whole lines a growing text file has gained since the last look."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new(self) -> list[str]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        return [line.strip() for line in whole.decode(errors="replace").splitlines()]


def _kill_tree(root: psutil.Process, child: subprocess.Popen) -> None:
    for p in reversed(_tree(root)):
        try:
            p.kill()
        except psutil.Error:
            pass
    child.wait(30)


def _last_error(stderr: str) -> str:
    lines = [line for line in (stderr or "").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or [""])[-1][:300]


def peers(systems: Sequence[str], device: str, records: int, batch_size: int, workers: int,
          workunit_size: int, replicates: int, seed: int = 0) -> pd.DataFrame:
    """Each system once per replicate on the same records, the order turning; a row per run."""
    _check(systems)
    rows = []
    for replicate in range(replicates):
        for system in interleaved(list(systems), replicate):
            rows.append({**run_system(system, device, records, batch_size, workers,
                                      workunit_size, seed), "replicate": replicate})
    return pd.DataFrame(rows)


def faults(systems: Sequence[str], device: str, records: int, batch_size: int, workers: int,
           workunit_size: int, kill_after_seconds: float, limit_seconds: float,
           seed: int = 0) -> pd.DataFrame:
    """Each system once more, one model process SIGKILLed ``kill_after_seconds`` into its steady
    state, ``limit_seconds`` to finish: a row per system (the thread backend's: no fault
    possible)."""
    _check(systems)
    rows = []
    for system in systems:
        if system == "gpufeed_thread":
            row = run_system(system, device, records, batch_size, workers, workunit_size, seed,
                             limit_seconds=limit_seconds)
            rows.append({**row, "fault": "none possible: a thread cannot be killed alone"})
            continue
        row = run_system(system, device, records, batch_size, workers, workunit_size, seed,
                         kill_after_seconds=kill_after_seconds, limit_seconds=limit_seconds)
        what = "the process itself" if system == "bare" else "one model process"
        rows.append({**row, "fault": f"SIGKILL {what}" if row["killed_pid"] else
                     "none: it ended before the kill"})
    return pd.DataFrame(rows)


def _check(systems: Sequence[str]) -> None:
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"systems: expected some of {SYSTEMS}, got {list(systems)!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.study.peers",
                                     description="one peers run (notebook 09), JSON at the end")
    parser.add_argument("system", choices=SYSTEMS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--records", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workunit-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ids", help="where to save the ids that came back (.npy)")
    args = parser.parse_args(argv)
    print(json.dumps(run_here(args.system, args.device, args.records, args.batch_size,
                              args.workers, args.workunit_size, args.ids, args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
