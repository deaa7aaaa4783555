"""The GPU check's faults: what the CPU tests only simulate, on the card.

This process first cuts the card's free memory to BALLAST_FREE_GIB with a tensor it holds
(another tenant of the card, as on a shared machine; it keeps the out-of-memory cheap: a batch far
over the whole card would take minutes to tokenize). Then, each while the section's time allows:

- ``fit``: a pool with ``workers_per_device="fit"`` (at most FIT_MAX). Each worker says when
  ready what it read of the card's free memory (``torch.cuda.mem_get_info``) and what its copy
  takes (``memory_allocated``); the check passes if the last one's reading is the card's real
  free memory, read here just after (FIT_TOLERANCE). Beside them, NVML's memory in use before and
  after the workers started: what a copy really takes (its CUDA context included), so how many
  copies "fit" would start uncapped, and what it would leave free for all their batches.
- ``killed``: on that pool, a worker SIGKILLed 40 % of the way through a job: its death seen, a
  replacement started, every id written once.
- ``out_of_memory``: a pool of one worker, given one workunit of OOM_RECORDS long texts (each cut
  at the model's 256 tokens) as one batch, far over what is free: CUDA's out-of-memory error, the
  scheduler's backoff (halves until one fits), every id written once and none in ``errors/``.
- ``threads``: the thread backend's THREAD_WORKERS workers sharing one loaded model on the card
  (its one copy stream; with CUDA graphs, captured and replayed under one lock), its rows stored
  in float16 (copied back from the card as half): every id once, the vectors float16. What the
  CPU tests run only against fakes of those CUDA calls.

Without a card (the dry run) nothing holds memory and the out-of-memory error is raised by
SimulatedOom above a size: the rows say so.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from helpers.workloads.embedding import EmbeddingWorkload

BALLAST_FREE_GIB = 6.0  # what the ballast leaves free on the card
OOM_RECORDS = 16384  # texts in the one workunit (and batch) that runs out of memory
FIT_MAX = 4  # workers "fit" may start (each start is seconds: the section's time)
FIT_TOLERANCE = (0.05, 256.0)  # a worker's free memory is the card's within 5 % or 256 MiB
KILL_AT = 0.4  # of the killed job's expected time
KILL_TRIES = 3  # a job that ended before its kill (faster than the rate it was sized from: a
# loaded machine's model side measured slow) runs again, twice as long
KILL_SECONDS = 8.0  # the killed job lasts about this long at the model's side's rate
LONG_CHARACTERS = 1500  # a long text: paragraphs joined up to this (past 256 tokens)
THREAD_WORKERS = 2  # the threads check's workers, one model between them


@dataclass(frozen=True)
class SimulatedOom(EmbeddingWorkload):
    """The embedding workload that raises CUDA's out-of-memory error for a workunit of more than
    ``oom_above`` records, as a card would for a batch too large (for the dry run on a CPU)."""

    oom_above: int = 0

    def process(self, model: Any, records: list[Any]) -> dict[str, Any]:
        if self.oom_above and len(records) > self.oom_above:
            import torch

            raise torch.cuda.OutOfMemoryError(f"simulated: {len(records)} records > "
                                              f"{self.oom_above} (a dry run has no card)")
        return super().process(model, records)


def long_texts(count: int) -> list[tuple[int, str]]:
    """``count`` (id, text) pairs of consecutive sample paragraphs joined to LONG_CHARACTERS."""
    from helpers.study.paths import sample_texts

    paragraphs, texts, current = sample_texts(), [], ""
    index = 0
    while len(texts) < count:
        current = f"{current} {paragraphs[index % len(paragraphs)]}".strip()
        index += 1
        if len(current) >= LONG_CHARACTERS:
            texts.append(current)
            current = ""
    return list(enumerate(texts))


def measure(workload: EmbeddingWorkload, device: str, oom_records: int, rate: float,
            kill_units: int, folder: Path, deadline: float, fit_max: int = FIT_MAX,
            kill_seconds: float = KILL_SECONDS) -> list[dict[str, Any]]:
    """Tidy rows, one per check (``check``: fit, killed, out_of_memory), each with ``passed``;
    a check the time left cannot hold (``deadline``) is a row that says so. ``rate``: texts a
    second one worker runs (the killed job is sized from it to last about ``kill_seconds`` at
    that rate, less where the pool's workers together run faster; one that ends before its
    kill runs again, twice as long)."""
    from helpers.engine.measure.telemetry import memory_in_use
    from helpers.engine.pipeline import WorkerPool

    card = device.startswith("cuda")
    shared = workload  # (the threads check's: its own batch size)
    workload = replace(workload, batch_size=oom_records)  # a workunit of oom_records: one batch
    if not card:
        given = {f.name: getattr(workload, f.name) for f in fields(workload) if f.init}
        workload = SimulatedOom(**given, oom_above=oom_records // 4)
    rows: list[dict[str, Any]] = []
    held: list[Any] = []  # the ballast, while the pools run
    try:
        if card:
            held.append(_ballast(device))
        before = memory_in_use(device)
        with WorkerPool(workload, [device], workers_per_device="fit",
                        max_workers_per_device=fit_max, progress=False) as pool:
            rows.append(_fit(pool, device, before))
            records = max(oom_records, int(rate * kill_seconds))  # (one worker's rate: the
            # workers share one card and the node's cores; a job that ends before its kill
            # runs again, twice as long. Sized by the workers, the first card's lasted 25 s)
            rows.append(_killed(pool, records, kill_units, KILL_AT * kill_seconds, folder)
                        if time.monotonic() + 2 * kill_seconds < deadline else
                        {"check": "killed", "passed": False, "detail": "skipped: budget"})
        if time.monotonic() + 4 * kill_seconds < deadline:
            with WorkerPool(workload, [device], progress=False) as pool:
                rows.append(_oom(pool, oom_records, folder, card))
        else:
            rows.append({"check": "out_of_memory", "passed": False, "detail": "skipped: budget"})
        held.clear()  # (the threads' pool is the card's only tenant)
        rows.append(_threads(shared, device, max(oom_records, int(rate * kill_seconds / 2)),
                             kill_units, folder)
                    if time.monotonic() + 2 * kill_seconds < deadline else
                    {"check": "threads", "passed": False, "detail": "skipped: budget"})
    except Exception as exc:  # what did not run is a failed row
        rows.append({"check": "pool", "passed": False,
                     "detail": f"{type(exc).__name__}: {exc}"[:300]})
    finally:
        held.clear()
        if card:
            import torch

            torch.cuda.empty_cache()
    return rows


def _ballast(device: str) -> Any:
    """A tensor taking all but BALLAST_FREE_GIB of the card's free memory (None if less is
    free)."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    take = int(free - BALLAST_FREE_GIB * 2 ** 30)
    ballast = torch.empty(take, dtype=torch.uint8, device=device) if take > 0 else None
    torch.cuda.synchronize(device)
    return ballast


def _fit(pool: Any, device: str, before: float | None) -> dict[str, Any]:
    """How many workers "fit" started, what each read of the device's free memory, whether
    the last one's reading is the device's (read here now), and what a copy really takes."""
    from helpers.engine.measure.telemetry import memory_in_use
    from helpers.engine.dispatch.growth import MEMORY_HEADROOM
    from helpers.engine.workers.worker import device_memory

    after = memory_in_use(device)
    ready = list(pool.ready.values())
    started = len(ready)
    free_now, _ = device_memory(None, None, device)  # (as a worker reads it)
    last = ready[-1].free_mib if ready else None
    reads_real = last is not None and \
        abs(last - free_now) <= max(FIT_TOLERANCE[0] * free_now, FIT_TOLERANCE[1])
    counted = ready[-1].model_mib if ready else None  # what "fit" takes a copy to be
    real = (after - before) / started if after is not None and before is not None and started \
        else None
    free_before = free_now + (real or 0.0) * started
    leaves = MEMORY_HEADROOM * counted if counted else None  # free, once "fit" stops
    return {"check": "fit", "passed": started >= 1 and reads_real, "workers": started,
            "worker_free_mib": " ".join(f"{r.free_mib:.0f}" for r in ready if r.free_mib),
            "free_now_mib": free_now, "copy_mib": counted, "copy_real_mib": real,
            "used_before_mib": before, "used_after_mib": after, "spinup_s": pool.spinup_s,
            "fit_leaves_free_mib": leaves,  # uncapped, for every worker's batches together
            "copies_fit_would_start": int((free_before - leaves) / real) + 1
            if real and leaves is not None else None,
            "detail": f"started {started} of at most {pool.settings.max_workers_per_device}; "
                      f"the last read {last or float('nan'):.0f} MiB free, the device has "
                      f"{free_now:.0f}; a copy counted {counted or float('nan'):.0f} MiB, "
                      f"takes {real or float('nan'):.0f}"}


def _threads(workload: EmbeddingWorkload, device: str, records: int, units: int,
             folder: Path) -> dict[str, Any]:
    """THREAD_WORKERS thread workers sharing one model on ``device`` (with CUDA graphs on a
    card), rows stored in float16: every id once, the vectors float16."""
    import h5py

    from helpers.bench.gpu.study import corpus
    from helpers.bench.scale import exactly_once
    from helpers.engine.pipeline import WorkerPool

    card = device.startswith("cuda")
    shared = replace(workload, cuda_graphs=card, stored="float16")
    output = folder / "faults-threads.h5"
    with WorkerPool(shared, [device], backend="thread", workers_per_device=THREAD_WORKERS,
                    progress=False) as pool:
        stats = pool.run(corpus(records), output, workunit_size=units, overwrite=True)
        said = pool.loaded.get(device, {})
    once = exactly_once(output, records)
    with h5py.File(output, "r") as f:
        dtype = str(f["embeddings"].dtype)
    return {"check": "threads", "passed": once and stats.failed_records == 0
            and dtype == "float16", "workers": THREAD_WORKERS, "records": records,
            "exactly_once": once, "failed_records": stats.failed_records,
            "wall_s": stats.wall_s,
            "detail": f"{THREAD_WORKERS} thread workers, one model ({said.get('path', '?')}), "
                      f"{dtype} rows: {stats.records_per_s:,.0f} texts/s"}


def _oom(pool: Any, records: int, folder: Path, card: bool) -> dict[str, Any]:
    """One workunit of ``records`` long texts, as one batch: backed off, every id once."""
    from helpers.bench.scale import exactly_once

    output = folder / "faults-oom.h5"
    pairs = long_texts(records)
    stats = pool.run(pairs, output, workunit_size=records, overwrite=True)
    once = exactly_once(output, records)
    backoffs = stats.recovery.get("oom_backoffs", 0)
    return {"check": "out_of_memory", "passed": once and backoffs >= 1
            and stats.failed_records == 0, "records": records, "exactly_once": once,
            "failed_records": stats.failed_records, "oom_backoffs": backoffs,
            "wall_s": stats.wall_s, "simulated": not card,
            "detail": f"{backoffs} backoffs; splits {stats.recovery.get('splits', 0)}"}


def _killed(pool: Any, records: int, units: int, after: float, folder: Path) -> dict[str, Any]:
    """A job with one worker SIGKILLed ``after`` seconds in: replaced, every id once. A job that
    ends before the kill (nothing killed: the pool is whole) is run again with twice the
    records, KILL_TRIES times at most."""
    from helpers.bench.failures import Deaths
    from helpers.bench.gpu.study import corpus
    from helpers.bench.scale import exactly_once

    output = folder / "faults-killed.h5"
    victim = next(iter(pool.pids.values()))
    for attempt in range(KILL_TRIES):
        deaths = Deaths()
        logging.getLogger("gpufeed").addHandler(deaths)
        killed_at: list[float] = []
        returned = threading.Event()  # the job returned: a kill due later never lands (one
        # landing as the job ends, its death unseen, says so in the row)

        def kill() -> None:
            if not returned.is_set():
                killed_at.append(time.time())
                os.kill(victim, signal.SIGKILL)

        timer = threading.Timer(after, kill)
        try:
            timer.start()
            stats = pool.run(corpus(records), output, workunit_size=units, overwrite=True)
        finally:
            returned.set()
            timer.cancel()
            timer.join()
            logging.getLogger("gpufeed").removeHandler(deaths)
        if killed_at or attempt == KILL_TRIES - 1:
            break
        records *= 2
    once = exactly_once(output, records)
    restarts = stats.recovery.get("restart_s") or []
    died = stats.recovery.get("deaths", 0)
    return {"check": "killed", "passed": bool(killed_at) and once and died >= 1,
            "records": records, "tries": attempt + 1, "exactly_once": once,
            "failed_records": stats.failed_records, "deaths": died,
            "detection_s": deaths.times[0] - killed_at[0] if deaths.times and killed_at
            else None, "restart_s": restarts[0] if restarts else None,
            "wall_s": stats.wall_s,
            "detail": ("killed mid-run" if died else "killed as the job ended: its death unseen")
            if killed_at else "the job ended before the kill"}
