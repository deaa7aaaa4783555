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

from helpers.workloads.cards import CARDS

STAGES = ("tokenize", "collate", "launch", "worker_other", "driver")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def card_run(texts: list[str], workers: int, threads: int, card: str, card_cores: int | None,
             batch_size: int, workunit_size: int, folder: str) -> dict[str, Any]:
    """One run of ``texts`` on the simulated ``card`` (``workers`` on it, ``threads``
    tokenizing in each, process backend): its rate, the card's busy share, and the CPU seconds
    of each stage (tokenize, collate and launch counted on the workers' threads; the rest of
    the workers' CPU, from their Results; the driver's whole process)."""
    from helpers.engine.pipeline import run_pipeline
    from helpers.workloads.embedding import EmbeddingWorkload

    workload = EmbeddingWorkload(card=card, card_cores=card_cores, batch_size=batch_size,
                                 tokenize_threads=threads)
    before = _cpu()
    stats = run_pipeline(list(enumerate(texts)), workload, devices=f"cuda:0*{workers}",
                         workunit_size=workunit_size, output=os.path.join(folder, "out.h5"),
                         overwrite=True, progress=False)
    driver = _cpu() - before
    counts = stats.counts
    stage = {name: counts.get(f"{name}_cpu_us", 0) / 1e6
             for name in ("tokenize", "collate", "launch")}
    stage["worker_other"] = max(0.0, (stats.worker_cpu_seconds or 0.0) - sum(stage.values()))
    stage["driver"] = driver
    tokens = int(counts.get("tokens_needed", 0))
    cpu = sum(stage.values())
    return {"workers": workers, "tokenize_threads": threads, "seconds": stats.wall_seconds,
            "spinup_s": stats.spinup_seconds, "records": stats.records, "tokens": tokens,
            "records_per_s": stats.records_per_second,
            "tokens_per_s": tokens / stats.wall_seconds if stats.wall_seconds > 0 else 0.0,
            "padding": stats.padding,
            "card_busy_share": stats.card_busy_share or 0.0,
            **{f"{name}_cpu_s": value for name, value in stage.items()},
            "cpu_s": cpu, "cpu_s_per_m_tokens": cpu / tokens * 1e6 if tokens else float("nan")}


def card_feeding(card: str, card_cores: int, worker_counts: Sequence[int],
                 thread_counts: Sequence[int], records: int, replicates: int, texts: list[str],
                 workunit_size: int, batch_size: int) -> pd.DataFrame:
    """Notebook 01's card section: each (workers on the card, tokenizing threads each) on the
    first ``records`` texts, ``replicates`` interleaved rounds (each in another order)."""
    layouts = [(w, t) for w in worker_counts for t in thread_counts]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpufeed-card-") as folder:
        for replicate in range(replicates):
            turn = replicate % len(layouts)
            for workers, threads in layouts[turn:] + layouts[:turn]:
                rows.append({"replicate": replicate, **card_run(
                    texts[:records], workers, threads, card, card_cores, batch_size,
                    workunit_size, folder)})
    return pd.DataFrame(rows).assign(
        card=f"simulated {card}", card_cores=card_cores, cores=os.cpu_count(),
        card_tokens_per_s=CARDS[card].tokens_per_second, batch_size=batch_size,
        workunit_size=workunit_size)


def cores_needed(table: pd.DataFrame) -> float:
    """The cores of this machine one real card of the table's profile would need at the
    cheapest layout's CPU per token (its median)."""
    cheapest = table.groupby(["workers", "tokenize_threads"])["cpu_s_per_m_tokens"].median().min()
    return float(cheapest * table["card_tokens_per_s"].iloc[0] / 1e6)
