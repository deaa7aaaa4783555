"""Does this CPU side keep a card busy? Runs on a simulated card (``EmbeddingWorkload(card=...)``)
with their CPU by stage: what notebook 01's card section and ``python -m helpers.bench feed``
measure."""
from __future__ import annotations

import os
import resource
import tempfile
from collections.abc import Sequence
from typing import Any

import pandas as pd

from helpers.engine.contract.devices import available_cores, share_of_cores
from helpers.workloads.embedding.cards.simulated import CARDS

STAGES = ("tokenize", "collate", "launch", "worker_other", "driver")
LAYOUT = ("workers", "tokenizing", "workunit_size", "backend")  # what a run's row varies
AXES = {"workers": ("worker", "workers"),
        "workunit_size": ("record workunit", "workunit size"),
        "backend": ("backend", "backend"),
        "tokenizing": ("tokenizing", "tokenizing"),
        "tokenizing_asked": ("tokenizing", "tokenizing asked")}  # each: its noun in a layout's
# name, its axis' name ("tokenizing": a run's threads or processes in words, ``tokenizing``;
# "tokenizing_asked": the same, but "default" where the run named none, whose count of
# processes changes with the workers: one line of a figure, not a point for each count)


def tokenizing(table: pd.DataFrame) -> list[str]:
    """Each run's tokenizing in words: '8 processes' where it tokenized in processes, else
    '2 threads' (a table without ``tokenize_processes``: threads)."""
    processes = table.get("tokenize_processes", pd.Series(0, index=table.index)).fillna(0)
    return [f"{int(p)} process{'es' * (p > 1)}" if p else f"{int(t)} thread{'s' * (t > 1)}"
            for t, p in zip(table["tokenize_threads"], processes)]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def card_run(texts: list[str], workers: int, threads: int | None, card: str,
             card_cores: int | None, batch_size: int, workunit_size: int, folder: str,
             backend: str = "process", model: str | None = None,
             processes: int | None = None) -> dict[str, Any]:
    """One run of ``texts`` on the simulated ``card`` (``workers`` on it, ``threads``
    tokenizing in each, None: the workload's default, or ``processes``; on ``backend``):
    ``feed_run``'s figures. ``model``: whose tokenizer and configuration (None: the embedded
    MiniLM)."""
    from helpers.workloads.embedding import EmbeddingWorkload

    workload = EmbeddingWorkload(model=model, card=card, card_cores=card_cores,
                                 batch_size=batch_size, tokenize_threads=threads,
                                 tokenize_processes=processes)
    return feed_run(texts, workload, f"cuda:0*{workers}", workunit_size, folder, backend)


def feed_run(texts: list[str], workload: Any, devices: str, workunit_size: int, folder: str,
             backend: str = "process", **options: Any) -> dict[str, Any]:
    """One run of ``texts`` by ``workload`` (the feeder's path: a simulated card, or a model on
    its devices) on ``devices`` (``options``: run_pipeline's others): its rate, the card's busy
    share where the card knows it, and the CPU seconds of each stage (tokenize, collate and
    launch counted on the workers' threads: on a CPU, launching is the forward pass; the rest
    of the workers' CPU, from their Results; the driver's whole process, which, on the thread
    backend, is the workers' too). ``card_busy_limit``: the busy share this machine's every
    core would give the card at this run's CPU per token (what no layout of it passes; over 1:
    the cores here could feed more than one such card)."""
    from helpers.engine.pipeline import run_pipeline

    workers = int(devices.split("*")[1]) if "*" in devices else 1
    before = _cpu()
    stats = run_pipeline(list(enumerate(texts)), workload, devices=devices,
                         workunit_size=workunit_size, output=os.path.join(folder, "out.h5"),
                         overwrite=True, backend=backend, progress=False, **options)
    driver = _cpu() - before
    counts = stats.counts
    stage = {name: counts.get(f"{name}_cpu_us", 0) / 1e6
             for name in ("tokenize", "collate", "launch")}
    outside = counts.get("tokenize_outside_us", 0) / 1e6  # (tokenizing processes' CPU: in
    inside = sum(stage.values()) - outside  # no worker's or driver's own figure)
    if stats.worker_cpu_s is None:  # threads: their CPU is the driver's process's
        driver = max(0.0, driver - inside)
    stage["worker_other"] = max(0.0, (stats.worker_cpu_s or 0.0) - inside)
    stage["driver"] = driver
    tokens = int(counts.get("tokens_needed", 0))
    cpu = sum(stage.values())
    busy = stats.card_busy_share or 0.0
    said = next(iter(stats.loaded.values()), {})  # (the workers' tokenizing, as they loaded it)
    return {"workers": workers,
            "tokenize_threads": said.get("tokenize_threads", workload.tokenize_threads),
            "tokenize_processes": said.get("tokenize_processes", 0),
            "word_cache": workload.word_cache,
            "workunit_size": workunit_size,
            "backend": backend, "seconds": stats.wall_s,
            "spinup_s": stats.spinup_s, "records": stats.records, "tokens": tokens,
            "records_per_s": stats.records_per_s,
            "tokens_per_s": tokens / stats.wall_s if stats.wall_s > 0 else 0.0,
            "padding": stats.padding, "card_busy_share": busy,
            "card_busy_limit": (busy * stats.wall_s * available_cores() / cpu
                                if cpu else 0.0),
            "texts_fast": int(counts.get("texts_fast", 0)),
            **{f"{name}_cpu_s": value for name, value in stage.items()},
            "cpu_s": cpu, "cpu_s_per_m_tokens": cpu / tokens * 1e6 if tokens else float("nan")}


def layout_name(row: Any, by: Sequence[str], short: bool = False) -> str:
    """A run's layout by the columns ``by``: ``2 workers × 1 tokenizing thread``, ``256 record
    workunits``, ``thread backend``; ``short``: ``2×1``."""
    def one(column: str) -> str:
        value, noun = row[column], AXES[column][0]
        value = value if isinstance(value, str) else int(value)
        if short:
            return str(value)
        plural = "s" if not isinstance(value, str) and value > 1 else ""
        return f"{value} {noun}{plural}"
    return ("×" if short else " × ").join(one(column) for column in by)


def card_layouts(texts: list[str], layouts: Sequence[dict[str, Any]], card: str,
                 card_cores: int | None, records: int, replicates: int,
                 batch_size: int) -> pd.DataFrame:
    """Each layout (``card_run``'s workers, threads, workunit_size and backend) on the first
    ``records`` texts, ``replicates`` interleaved rounds (each in another order): one row a run,
    its ``tokenizing`` in words as the workers loaded it (a default layout: the processes a
    real card's worker takes), and its ``tokenizing_asked`` ("default" where the layout named
    neither threads nor processes)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpufeed-card-") as folder:
        for replicate in range(replicates):
            turn = replicate % len(layouts)
            for layout in list(layouts[turn:]) + list(layouts[:turn]):
                rows.append({"replicate": replicate, **card_run(
                    texts[:records], card=card, card_cores=card_cores, batch_size=batch_size,
                    folder=folder, **layout), "default": _named_none(layout)})
    table = pd.DataFrame(rows)
    words = tokenizing(table)
    return table.drop(columns="default").assign(
        tokenizing=words, tokenizing_asked=[
            "default" if default else said for default, said in zip(table["default"], words)],
        card=f"simulated {card}", card_cores=card_cores,
        cores=available_cores(),
        card_tokens_per_s=CARDS[card].tokens_per_second, batch_size=batch_size)


def _named_none(layout: dict[str, Any]) -> bool:
    """Whether ``layout`` (``card_run``'s arguments) leaves the tokenizing to the default."""
    return layout.get("threads") is None and layout.get("processes") is None


def card_feeding(card: str, card_cores: int, worker_counts: Sequence[int],
                 thread_counts: Sequence[int | None], records: int, replicates: int,
                 texts: list[str], workunit_size: int, batch_size: int) -> pd.DataFrame:
    """Notebook 01's card section: each (workers on the card, tokenizing threads each; None:
    the default, a real card's worker's, unless it is one of the thread counts named: on a
    share of one core, the worker's own thread)."""
    named = {(n, 0) for n in thread_counts if n is not None}  # (threads, processes) named
    layouts = [{"workers": w, "threads": t, "workunit_size": workunit_size}
               for w in worker_counts for t in thread_counts
               if t is not None or default_tokenizing(w) not in named]
    return card_layouts(texts, layouts, card, card_cores, records, replicates, batch_size)


def default_tokenizing(workers: int) -> tuple[int, int]:
    """The (threads, processes) each of ``workers`` on one simulated card of this node
    tokenizes on by default (``loading.tokenizing_for`` on the share of the cores the engine
    gives each)."""
    from helpers.workloads.embedding.loading import tokenizing_for

    return tokenizing_for(None, None, True, share_of_cores(workers))


def cores_needed(table: pd.DataFrame) -> float:
    """The cores of this machine one real card of the table's profile would need at the
    cheapest layout's CPU per token (its median)."""
    cheapest = table.groupby(list(LAYOUT))["cpu_s_per_m_tokens"].median().min()
    return float(cheapest * table["card_tokens_per_s"].iloc[0] / 1e6)
