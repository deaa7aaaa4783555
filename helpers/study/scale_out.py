"""Notebook 08's experiments: one job on the process and the ray backends, the driver's writer
limit, and the job on a Ray cluster of simulated nodes (``ray.cluster_utils.Cluster``: a raylet
per node, on this machine), one of them lost mid-run.

Ray is imported only inside these functions (helpers.engine.workers.ray_backend), so the rest of the
study never loads it. Every comparison is interleaved: both backends' pools stay loaded, and
replicate r runs each on the same records, the order turning.
"""
from __future__ import annotations

import io
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers.engine.contract.protocol import OutputSpec
from helpers.engine.measure.stats import PipelineStats
from helpers.engine.outputs.hdf5_sink import HDF5Sink, read_output
from helpers.engine.pipeline import WorkerPool
from helpers.study.autotune import interleaved
from helpers.study.experiments import fair_workunit_size, sample_records, span_row
from helpers.workloads.synthetic import SyntheticWorkload

BACKENDS_COMPARED = ("process", "ray")
WRITER_ALONE = "writer alone"  # the driver limit's third row: HDF5Sink with no workers at all
WARM_UP_RECORDS = 32  # a first job per pool, not measured: lazy initialisation off the clock
_session: Any = None  # start_ray's


@contextmanager
def ray_session(address: str | None = None) -> Iterator[float]:
    """Ray for the block, as a user's first run meets it: joins ``address`` or starts a local
    Ray (stopped at the end if this started it); yields the seconds that took (0 if this process
    had joined Ray already: ``start_ray``)."""
    import ray

    from helpers.engine.workers.ray_backend import connect

    started = time.monotonic()
    owns = connect(address)
    try:
        yield time.monotonic() - started
    finally:
        if owns:
            ray.shutdown()


def start_ray(address: str | None = None) -> float:
    """Join or start Ray for several experiments in a row (its start paid once); the seconds it
    took. ``stop_ray`` ends it."""
    global _session
    _session = ray_session(address)
    return _session.__enter__()


def stop_ray() -> None:
    global _session
    if _session is not None:
        _session.__exit__(None, None, None)
        _session = None


def run_row(stats: PipelineStats, backend: str, replicate: int, cluster_start_s: float) -> dict:
    return {"backend": backend, "replicate": replicate, "records": stats.records,
            "workers": len(stats.workers), "workunit_size": stats.workunit_size,
            "wall_s": stats.wall_s, "records_per_s": stats.records_per_s,
            "spinup_s": stats.spinup_s, "cluster_start_s": cluster_start_s,
            "parent_rss_mib": stats.parent_rss_mib,
            "longest_dispatch_gap_s": stats.longest_dispatch_gap_s,
            "deaths": stats.recovery.get("deaths", 0)}


def backends_side_by_side(workload: Any, devices: Sequence[str], records: int, replicates: int,
                          texts: list[str], workunit_size: int, seed: int = 0,
                          backends: Sequence[str] = BACKENDS_COMPARED,
                          ray_start_s: float | None = None
                          ) -> tuple[pd.DataFrame, dict[str, PipelineStats]]:
    """The same job on each backend's pool, models loaded once per pool (spin-up: ``spinup_s``,
    and for Ray its own start, ``cluster_start_s``: measured here, or ``ray_start_s`` when
    ``start_ray`` paid it), a warm-up job each, then ``replicates`` interleaved jobs on the same
    sampled records. Returns (one row per backend × replicate, each backend's first measured
    run)."""
    rows, first = [], {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        pools, starts = {}, {}
        for backend in backends:
            starts[backend] = 0.0
            if backend == "ray":
                joined = stack.enter_context(ray_session())
                starts[backend] = joined if ray_start_s is None else ray_start_s
            pools[backend] = stack.enter_context(WorkerPool(workload, list(devices), backend,
                                                            progress=False))
            pools[backend].run(sample_records(texts, WARM_UP_RECORDS, seed),
                               Path(tmp) / f"warm-{backend}.h5", workunit_size=workunit_size)
        for replicate in range(replicates):
            pairs = sample_records(texts, records, seed + replicate)
            for backend in interleaved(list(backends), replicate):
                stats = pools[backend].run(pairs, Path(tmp) / f"{backend}-{replicate}.h5",
                                           workunit_size=workunit_size)
                rows.append(run_row(stats, backend, replicate, starts[backend]))
                first.setdefault(backend, stats)
    return pd.DataFrame(rows), first


def driver_limit(records: int, dim: int, workers: int, workunit_size: int, replicates: int,
                 backends: Sequence[str] = BACKENDS_COMPARED) -> pd.DataFrame:
    """Rows of ``dim``-d float32 per second through the driver, from models that cost nothing
    (``SyntheticWorkload(0, values="zeros")``): each backend's transport into the one durable
    writer, and the writer alone (HDF5Sink fed arrays in this process). One row per backend ×
    replicate, interleaved."""
    workload = SyntheticWorkload(0.0, dim=dim, values="zeros")
    rows = []
    pairs = [(i, "") for i in range(records)]
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        pools = {}
        for backend in backends:
            if backend == "ray":
                stack.enter_context(ray_session())
            pools[backend] = stack.enter_context(WorkerPool(workload, ["cpu"] * workers, backend,
                                                            threads_per_worker=1,
                                                            progress=False))
        for replicate in range(replicates):
            for backend in interleaved([*backends, WRITER_ALONE], replicate):
                path = Path(tmp) / f"{backend}-{replicate}.h5"
                if backend == WRITER_ALONE:
                    seconds = writer_alone(path, records, dim, workunit_size)
                else:
                    seconds = pools[backend].run(pairs, path,
                                                 workunit_size=workunit_size).wall_s
                rows.append({"backend": backend, "replicate": replicate, "rows": records,
                             "dim": dim, "workers": 0 if backend == WRITER_ALONE else workers,
                             "workunit_size": workunit_size, "wall_s": seconds,
                             "rows_per_s": records / seconds,
                             "mb_per_s": records * dim * 4 / seconds / 2**20})
                path.unlink(missing_ok=True)
    return pd.DataFrame(rows)


def writer_alone(path: Path, records: int, dim: int, rows: int) -> float:
    """Seconds the durable writer takes for ``records`` rows of ``dim`` float32 handed to it
    ``rows`` at a time, as the driver hands it results (no workers, no transport)."""
    block = np.zeros((rows, dim), np.float32)
    started = time.monotonic()
    with HDF5Sink(path, {"values": OutputSpec((dim,), "float32")}) as sink:
        for start in range(0, records, rows):
            ids = np.arange(start, min(start + rows, records), dtype=np.int64)
            sink.append(ids, {"values": block[:len(ids)]})
            sink.poll()
    return time.monotonic() - started


@dataclass
class ClusterRuns:
    table: pd.DataFrame  # one row per job: "2 nodes" and "a node lost"
    timelines: pd.DataFrame  # every workunit, its node labelled "node 1 (head)", "node 2", ...


def simulated_cluster(workload: Any, nodes: int, workers_per_node: int, node_cpus: int,
                      records: int, texts: list[str], workunit_size: int, lose_at_seconds: float,
                      seed: int = 0) -> ClusterRuns:
    """The job on a Ray cluster of ``nodes`` simulated nodes (``node_cpus`` each) with
    ``workers_per_node`` one-thread actors on each: once whole, then again with the last node
    removed ``lose_at_seconds`` seconds into the job (its raylet killed, as a machine lost).
    Workunits are at most ``workunit_size``, fewer records where each worker would get under 8."""
    if nodes < 2:
        raise ValueError(f"nodes: expected at least 2 (the last is lost mid-run), got {nodes}")
    import ray
    from ray.cluster_utils import Cluster

    from helpers.engine.workers.ray_backend import local_system

    # (every node's workers at the driver's niceness, as a local Ray's: the head's system config)
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": node_cpus, "include_dashboard": False,
                                      "_system_config": local_system()})
    added = [cluster.add_node(num_cpus=node_cpus) for _ in range(nodes - 1)]
    rows, spans = [], []
    told = io.StringIO()  # Ray prints a lost raylet's last log lines: keep one line of each
    try:
        cluster.wait_for_nodes()
        started = time.monotonic()
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        joined = time.monotonic() - started
        names = {cluster.head_node.node_id[:6]: "node 1 (head)"}
        names.update({node.node_id[:6]: f"node {i + 2}" for i, node in enumerate(added)})
        pairs = sample_records(texts, records, seed)
        workunit_size = fair_workunit_size(workunit_size, records, nodes * workers_per_node)
        with WorkerPool(workload, ["cpu"] * (nodes * workers_per_node), "ray",
                        threads_per_worker=1, progress=False) as pool, \
                tempfile.TemporaryDirectory() as tmp:
            pool.run(sample_records(texts, WARM_UP_RECORDS, seed), Path(tmp) / "warm.h5",
                     workunit_size=workunit_size)
            for job, lose in (("whole", False), ("a node lost", True)):
                remover = threading.Timer(lose_at_seconds, cluster.remove_node, (added[-1],),
                                          {"allow_graceful": False}) if lose else None
                if remover is not None:
                    remover.start()
                with redirect_stdout(told):
                    stats = pool.run(pairs, Path(tmp) / f"{job}.h5", workunit_size=workunit_size)
                    if remover is not None:
                        remover.join()
                rows.append({**run_row(stats, "ray", 0, joined), "job": job, "nodes": nodes,
                             "lost_at_s": lose_at_seconds if lose else np.nan,
                             "exactly_once": _each_once(Path(tmp) / f"{job}.h5", records)})
                spans += [{**span_row(s), "job": job,
                           "node": names.get(s.node.rsplit("/", 1)[-1], s.node)}
                          for s in stats.timeline]
    finally:
        with redirect_stdout(told):
            ray.shutdown()
            cluster.shutdown()
        for line in told.getvalue().splitlines():
            if line and not line[0].isspace():
                print(line)
    return ClusterRuns(pd.DataFrame(rows), pd.DataFrame(spans))


def _each_once(path: Path, records: int) -> bool:
    ids = read_output(path)["ids"]
    return len(ids) == records and len(np.unique(ids)) == records
