"""The queue-fed pipeline: one reader, persistent workers on devices, one writer.

Data flow::

    source ──► Reader thread ──► taker ──────► scheduler ──► inbox 0 ─► worker 0 (cpu)    ─► outbox 0 ─┐
    (HDF5,     slices, or        (each         (main         inbox 1 ─► worker 1 (cuda:0) ─► outbox 1 ─┤
     JSONL,    windows sorted    worker's      thread)       inbox 2 ─► worker 2 (cuda:0) ─► outbox 2 ─┤
     images,   by cost; a        size, from      ▲                                                     │
     pairs)    bounded queue)    the queue)      └──── events (Ready, Result, Failed, Died) ◄──────────┘
                                                 │
                                                 └──► HDF5Sink buffer ──► write-ahead ──► writer thread
                                                      (main thread)       (bounded)       (parts, index)

Reader (helpers.engine.dispatch.reader): a thread of the driver process. It pulls ``(ids, records)``
slices lazily from the source (helpers.engine.inputs.sources.read_slices) and queues them, a
bounded number of records that follows what is taken, so memory stays flat whatever the input
size; the taker (helpers.engine.dispatch.taker) takes workunits of the sizes it decides, each
worker's, and the reader wakes the scheduler when records come that it looked for. Records it cannot use (not JSON, an unusable or duplicate id) go
straight to the writer's ``errors/``, never to a worker.

Scheduler (helpers.engine.dispatch.scheduler): the driver's main thread. It keeps every ready worker
supplied with up to two workunits (one running, one waiting), asking the taker for each (retried
ones first); it owns a workunit between the taker and the writer, so each is written once. It
replaces workers that die or hang and retries, splits or gives up on workunits that fail, until only
the bad records are left (helpers.engine.dispatch.failures). A job's loop is helpers.engine.job's,
the pool that runs jobs on workers started once helpers.engine.pool's.

Workers: one per entry of ``devices`` (or as many per device as fit: ``workers_per_device=
"fit"``), started by a WorkerPool through a backend (helpers.engine.workers.backends: a process,
forked by a fork server, with its own pipes per worker, or a thread sharing its device's model;
helpers.engine.workers.ray_backend: a Ray actor anywhere on a cluster, its messages through Ray's
object store). Each loads the workload's model once on its device, says Ready, then runs workunits
until the pool closes, answering each with a Result or a Failed message. Workers outlive a job,
so one pool runs many jobs on models loaded once.

Writer (helpers.engine.outputs.hdf5_sink): the output is claimed first
(helpers.engine.outputs.ownership: its lock held for the job, and refused unless it is this job's to
write, resume or overwrite), then the main thread buffers each Result's rows (and the records the
workload rejected, or that the scheduler gave up on, for ``errors/``) and hands them a part at a
time to the writer thread, which writes them while the scheduler goes on dispatching. The output
survives any crash (helpers.engine.outputs.checkpoint) and ``resume`` finishes an interrupted run,
skipping what is written before reading it.

Workers write (``writes="workers"``; "auto" chooses it on Ray when the workers can read the
source too)::

    source.rows() ──► Reader ──► scheduler ──► worker: reads its ids' records (Rows), runs the
    (ids + a way     (ids only)   (stamps each       model, writes a part file ──► Result names it
     to open it)                  workunit: where                                     │
                                  its part goes)  ◄───────────────────────────────────┘
                                       └──► HDF5Sink: commit = rename into the output's index

Before the first record each worker reads the input's first rows and writes an empty part that
the driver must see (helpers.engine.dispatch.probe): storage a worker cannot reach is named then.
The driver then handles no record and no row: its work per workunit is a few hundred bytes each
way and a rename. A part whose workunit was taken back is removed, never committed; one nobody
committed is swept (helpers.engine.outputs.checkpoint). A source without ``rows`` is read by the
driver as above and only the rows are written by the workers.

At any scale the driver holds nothing per record once it is written: a worker's figures are
running totals, the timeline is bounded (helpers.engine.measure.stats), and a resumed run's done ids
are ranges.

Self-tuning, each optional: ``workunit_size="auto"`` sizes each worker's workunits from its measured
rate (helpers.engine.measure.sizing: the taker takes each worker's size from the reader, and
finer at the end); ``workers_per_device="auto"`` adds workers to a device while they raise its
rate (helpers.engine.dispatch.growth, called from the main loop); a
telemetry thread samples each device's use twice a second (helpers.engine.measure.telemetry). The
sizes' loop, all of it in the main thread::

    Result (records, seconds) ──► Taker.observe ──► Sizing.observe ──► each worker's target
         ▲                                                               │
         │                                                               │
         └── worker ◄── dispatch ◄── Taker.next_for: feed.take(n) ◄──────┘ n = Sizing.size(worker)
                                                          (Sizing.explore: shorter while growth decides)

Static split (``WorkerPool.run_static``, helpers.engine.pool): the layout queue-fed workers replace. Every record is
read first; worker i gets the i-th of even contiguous slices (``static_split``), pinned to it, as
one workunit; the job lasts as long as its slowest worker.

Timing, the same for both layouts: spin-up (starting workers, imports, model loads; the first
process pool of a Python process also starts the fork server, which imports the workload's
libraries once for every later pool) runs until every worker is Ready and is reported apart
(``spinup_s``); a job's ``wall_s`` runs from its first
read to its output closed, every record written. Opening the output (a resume's scan) is in
neither: ``first_dispatch_s`` reports it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from helpers.engine.contract.fingerprint import as_attrs, input_paths, sampled_only
from helpers.engine.contract.protocol import Workload
from helpers.engine.contract.settings import JobSettings, PoolSettings, split_options
from helpers.engine.dispatch.scheduler import PipelineError, RemoteTraceback
from helpers.engine.inputs.sources import open_source, records_left, source_length
from helpers.engine.measure.stats import PipelineStats
from helpers.engine.outputs.ownership import Claim, check_output, claimed
from helpers.engine.pool import WorkerPool, static_split
from helpers.engine.workers.backends import pool_settings, refuse_in_a_starting_worker

__all__ = ["MIN_STATIC_SLICE", "STRATEGIES", "PipelineError", "RemoteTraceback", "WorkerPool",
           "run_pipeline", "static_split"]

STRATEGIES = ("queue", "static")
MIN_STATIC_SLICE = 4  # records per worker below which a static split runs on one worker


def run_pipeline(source: Any, workload: Workload,
                 devices: Iterable[str] | str = PoolSettings.devices,
                 workunit_size: int = JobSettings.workunit_size,
                 output: str | os.PathLike | Claim = "out.h5",
                 backend: str = PoolSettings.backend,
                 strategy: str = "queue", text_column: str = "text", id_column: str | None = None,
                 keep_columns: Sequence[str] = (), **options: Any) -> PipelineStats:
    """Run ``workload`` over every record of ``source`` and write the results to ``output``.

    ``source``: an ``.h5`` file (``batches/0, 1, ...``), a ``.jsonl`` file, Parquet, CSV or Arrow
    files (a file, a folder, a glob: helpers.engine.inputs.tables), an ImageFolderSource, any
    Source, or an iterable of ``(id, record)`` pairs. ``text_column``/``id_column``: a table's or a
    JSONL file's columns (an id column of strings is kept as the output's ``keys``);
    ``keep_columns``: a table's other columns to carry to the output, row-aligned with ``ids``.
    ``devices``: one entry per worker. ``strategy``: "queue" (workers pull workunits) or "static"
    (one even slice per worker; with fewer than MIN_STATIC_SLICE records per worker it falls back to
    one worker). ``options``: the other fields of PoolSettings (threads_per_worker, queue_depth,
    adaptive, max_workers_per_device, retries, max_restarts, workunit_timeout, load_timeout,
    ray_address) and of JobSettings (limit, sort_window, progress, resume, overwrite). An
    existing ``output`` is refused unless ``resume`` (carry on the job that made it) or
    ``overwrite`` (replace it); OutputError, before any worker starts. Workers that die or hang are
    replaced and bad records end up in the output's ``errors`` table (``stats.partial``);
    PipelineError if the run cannot go on. The output is claimed once, here (its lock held for the
    run: a second run on it is refused at once), unless ``output`` is the Claim of one the caller
    holds already (helpers.engine.outputs.ownership.owning, as the command line does).
    """
    refuse_in_a_starting_worker()
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
    pool_options, job_options = split_options(options)
    job = JobSettings(workunit_size, **job_options)  # (before the pool's "auto" devices, which
    settings = pool_settings(devices, backend, **pool_options)  # import torch or Ray): both
    # validated before any spawn
    records = open_source(source, text_column=text_column, id_column=id_column,
                          keep_columns=keep_columns)
    if strategy == "static":
        known = records_left(source_length(records), job.limit)
        if known is not None and known < MIN_STATIC_SLICE * len(settings.worker_devices):
            # slices this small cost more in model loads than they save
            settings = replace(settings, devices=settings.devices[:1], workers_per_device=1)
    with claimed(output) as output:  # a second run on it is refused now, not after spin-up
        with sampled_only(job.samples_only):
            attrs = as_attrs(records, workload)  # the outputs' shapes come with the workers
        check_output(output, resume=job.resume, overwrite=job.overwrite, inputs=input_paths(attrs),
                     fingerprints={k: json.loads(v) for k, v in attrs.items()})
        with WorkerPool.from_settings(workload, settings, job) as pool:
            if strategy == "static":
                return pool.run_static(records, output)
            return pool.run(records, output)
