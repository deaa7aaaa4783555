"""The GPU check's study: the study's question on the card.

How many workers should feed one GPU, and should their workunits be sized from their rates or
fixed? Each count of WORKER_COUNTS is a pool of its own (process backend, the feed variant of the
model's side: fp16, batch 256, the feeder's path with pinned memory, with CUDA graphs where the
model side's whole path ran faster with them: each row says), started when first needed
and kept until the section ends; each runs the same corpus (the sample's paragraphs repeated,
100,000 on a card) once per workunit size of SIZES: the first size over every count, ascending,
then the second, descending. So a run the section's time cuts (a row says so) is one of the
second size at the fewest workers, the longest; and the first size alone answers how many
workers. A run is started only if it should end in time, guessed no faster than the run of the
most workers up to its own measured so far (at first, one worker's rate in the model's side).
Between the two sizes, each tokenizing layout the tuner would try on a card (the workload's
``tokenizing_variants``: one thread, half the cores, every core) runs once at the first size,
on a pool of its own closed after it, with the count of workers whose default (processes on
each worker's share) ran fastest: which keeps the card busiest, and at what CPU a text (each
row's ``cpu_s``: its workers' and their tokenizing processes'). A layout's run is guessed no
faster than the slowest count; every run stops dispatching at the section's end (``cut``).

Through each run the card is sampled every SAMPLE_SECONDS (helpers.engine.measure.telemetry; NVML on
a card): its busy share (NVML's utilisation: the share of its sample period, 1/6 s to 1 s, in
which any kernel ran; a card at 100 % may still be far from its FLOP limit) and the longest
stretch it read 0 % while the job ran (a gap shorter than NVML's period is not seen); beside
them the workers' longest wait for work and whether every id was written once, and how each
worker tokenized (the workload's default: processes on its share of the node's cores, so more
workers mean fewer processes each).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

WORKER_COUNTS = (1, 2, 3, 4)  # the first size runs them in this order, the second in reverse
SIZES = ("auto", 1024)  # workunit sizes: from each worker's rate, and fixed (gpu.yaml's ~1,000)
SAMPLE_SECONDS = 0.1
SPINUP_GUESS = 20.0  # seconds a pool may take to start, before one is measured


def corpus(records: int) -> list[tuple[int, str]]:
    """``records`` (id, text) pairs: the sample's paragraphs, repeated."""
    from helpers.study.paths import sample_texts

    texts = sample_texts()
    return [(i, texts[i % len(texts)]) for i in range(records)]


def measure(workload: Any, device: str, records: int, worker_counts: tuple[int, ...],
            sizes: tuple[int | str, ...], deadline: float, folder: Path, rate: float,
            keep: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None] | None = None,
            layouts: Sequence[dict[str, Any]] | None = None
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows: one per run or run skipped, samples: the card's use through each run); ``keep``
    is handed both after every run (the tables saved as they grow: a call cut short keeps
    them). ``rate``: texts a second one worker ran in the model's side, the first guess of a
    run's length (no faster than that, whatever its workers). ``layouts``: the tokenizing
    layouts run between the sizes (None: the workload's ``tokenizing_variants`` on ``device``;
    the workload as given, ``{}``, is every other run's)."""
    from helpers.engine.pipeline import WorkerPool
    from helpers.workloads.embedding.runtimes import variant_label

    if layouts is None:
        offered = getattr(workload, "tokenizing_variants", None)
        layouts = offered([device]) if offered is not None else []
    pairs = corpus(records)
    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    rates: dict[int, float] = {}  # texts/s measured by the workload as given, by workers
    spinup = SPINUP_GUESS

    def expected(workers: int, layout: dict[str, Any]) -> float:  # on the safe side
        if layout:  # no faster than the slowest count ran (one thread may feed a card far
            known = sorted(rates.values())[:1]  # slower than the default's processes)
        else:  # no faster than fewer workers ran
            known = [r for w, r in sorted(rates.items()) if w <= workers][-1:]
        return records / max(known[0] if known else rate, 1e-9)

    with contextlib.ExitStack() as stack:
        pools: dict[int, Any] = {}  # the workload as given, by workers
        for workers, size, layout in _runs(worker_counts, sizes, [x for x in layouts if x],
                                           rates):
            said = variant_label(layout) or "default"
            run = f"{workers}-{size}" + (f"-{said.replace(' ', '-')}" if layout else "")
            base = {"run": run, "workers": workers, "workunit_size": str(size),
                    "layout": said, "skipped": ""}
            start = 0.0 if workers in pools and not layout else spinup
            if not _fits(deadline, start + expected(workers, layout)):
                rows.append({**base, "skipped": "budget"})
                continue
            output = folder / f"study-{run}.h5"
            try:
                if layout:  # (run once: its pool closed after it, the card's memory freed)
                    with WorkerPool(dataclasses.replace(workload, **layout), [device],
                                    workers_per_device=workers, progress=False) as pool:
                        row, seen = _run(pool, pairs, device, size, output, deadline)
                else:
                    if workers not in pools:
                        pools[workers] = stack.enter_context(WorkerPool(
                            workload, [device], workers_per_device=workers, progress=False))
                    pool = pools[workers]
                    row, seen = _run(pool, pairs, device, size, output, deadline)
                spinup = pool.spinup_s
            except Exception as exc:  # a run that fails is a row; the next still runs
                rows.append({**base, "skipped": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            rows.append({**base, "spinup_s": pool.spinup_s, **row})
            samples += [{"run": run, **one} for one in seen]
            if not layout:
                rates[workers] = max(rates.get(workers, 0.0), row["texts_per_s"])
            if keep is not None:
                keep(rows, samples)
    return rows, samples


def _runs(worker_counts: tuple[int, ...], sizes: tuple[int | str, ...],
          layouts: list[dict[str, Any]], rates: dict[int, float]
          ) -> Iterator[tuple[int, int | str, dict[str, Any]]]:
    """(workers, workunit size, tokenizing layout) of each run in turn: the first size over
    every count, each layout at that size with the count fastest so far (``rates``, read as
    the runs fill it; none yet: the fewest), then the next size in reverse, and so on."""
    for turn, size in enumerate(sizes):
        for workers in worker_counts if turn % 2 == 0 else tuple(reversed(worker_counts)):
            yield workers, size, {}
        if turn == 0:
            fastest = max(rates, key=rates.__getitem__) if rates else min(worker_counts)
            for layout in layouts:
                yield fastest, size, layout


def _fits(deadline: float, seconds: float) -> bool:
    return time.monotonic() + seconds <= deadline


def _run(pool: Any, pairs: list[tuple[int, str]], device: str, size: int | str,
         output: Path, deadline: float | None = None
         ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One job, the card sampled through it, no workunit dispatched past ``deadline`` (a run
    slower than guessed is ``cut``: its rate stands, whether every id was written once is not
    asked); the output removed once checked."""
    from helpers.bench.scale import exactly_once, remove_output
    from helpers.engine.measure.telemetry import Telemetry

    clock = time.monotonic()
    sampler = Telemetry(lambda: {slot: (device, pid) for slot, pid in pool.pids.items()},
                        clock, interval=SAMPLE_SECONDS)
    sampler.start()
    try:
        stats = pool.run(pairs, output, workunit_size=size, stop_at=deadline)
    finally:
        sampler.stop()
    cut = stats.records + stats.failed_records < len(pairs)
    once = None if cut else exactly_once(output, len(pairs))
    remove_output(output)
    seen = [{"seconds": s.seconds, "worker": s.worker, "utilization": s.utilization,
             "memory_mib": s.memory_mib, "source": s.source} for s in sampler.samples]
    counts, phases = stats.counts, stats.phases
    gpu = [w.peak_gpu_mib for w in stats.workers if w.peak_gpu_mib is not None]
    cpu = float("nan") if stats.worker_cpu_s is None else \
        stats.worker_cpu_s + counts.get("tokenize_outside_us", 0) / 1e6  # (the tokenizing
    # processes' CPU is in no worker's own figure; thread workers' is their process's: unknown)
    return {"records": stats.records, "failed_records": stats.failed_records,
            "exactly_once": once, "cut": cut, "wall_s": stats.wall_s,
            "texts_per_s": stats.records_per_s,
            "tokens_needed": counts.get("tokens_needed"),
            "tokens_computed": counts.get("tokens_computed"),
            "tokens_per_s": counts.get("tokens_needed", 0) / stats.wall_s,
            **card_use(seen), "longest_worker_wait_s": stats.longest_idle_s,
            "efficiency": stats.efficiency, "cpu_s": cpu,
            "cpu_ms_per_text": cpu / stats.records * 1e3 if stats.records else float("nan"),
            **{f"{phase}_s": s for phase, s in phases.items()},
            "peak_gpu_mib": max(gpu) if gpu else None,
            "worker_cores": os.cpu_count(), **tokenizing_layout(pool.loaded.get(device, {})),
            **{k: v for k, v in stats.recovery.items() if k != "restart_s"}}, seen


def tokenizing_layout(report: dict[str, Any]) -> dict[str, int | None]:
    """A worker's tokenizing layout, as its load said it (``report``: the workload's; the
    default on a card: processes on the worker's share of the node's cores); None for both on
    encode's path (which tokenizes in its own way)."""
    if "tokenize_threads" not in report:
        return {"tokenize_threads": None, "tokenize_processes": None}
    return {"tokenize_threads": report["tokenize_threads"],
            "tokenize_processes": report.get("tokenize_processes", 0)}


def card_use(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The card's busy share over a run (NVML: the mean of its readings; elsewhere the workers'
    mean CPU use, in cores), and its longest stretch read as idle (0 %) between its first and
    last busy reading: ``longest_card_idle_s`` (NaN off NVML: a CPU's idle says nothing)."""
    nvml = [s for s in samples if s["source"] == "nvml"]
    if not nvml:
        by_time: dict[float, float] = {}
        for s in samples:
            by_time[s["seconds"]] = by_time.get(s["seconds"], 0.0) + s["utilization"] / 100
        return {"busy_source": "psutil", "busy_share": sum(by_time.values()) / len(by_time)
                if by_time else float("nan"), "longest_card_idle_s": float("nan")}
    busy = [i for i, s in enumerate(nvml) if s["utilization"] > 0]
    longest, since = 0.0, None
    for s in nvml[busy[0]:busy[-1] + 1] if busy else []:
        if s["utilization"] > 0:
            since = None
        else:
            since = s["seconds"] if since is None else since
            longest = max(longest, s["seconds"] - since + SAMPLE_SECONDS)
    return {"busy_source": "nvml",
            "busy_share": sum(s["utilization"] for s in nvml) / len(nvml) / 100,
            "longest_card_idle_s": longest}
