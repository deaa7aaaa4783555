"""What feeding a real model costs on the CPU, against the bare tokenizer's limit.

A real model's path, with a model whose forward pass costs next to nothing (a random BERT of
one layer and hidden size 8, ``weights.TINY``, behind MiniLM's own tokenizer), so that what is
measured is everything around the forward pass: what a worker would spend feeding a card.
Two corpora: the sample's paragraphs (``paragraphs``, cycled to ``records``) and texts of 128
tokens cut from them (``tokens128``). For each, in interleaved rounds (the machine's drift falls
on every method alike), CPU seconds per 1,000 texts:

- ``bare`` (this process, one thread): the Rust tokenizer alone (``encode_batch``: the CPU
  side's physical limit here); the call sentence-transformers makes (``tokenizer(texts,
  padding=True, truncation=True, return_tensors="pt")``, a batch at a time); the word cache
  (``word_cache.WordCache``: the tokenizer's ids, below the tokenizer);
- ``in_process`` (this process, one thread, no pipeline): ``model.encode`` (``feeder=False``),
  and the feeder feeding the torch card, with the Rust tokenizer and with the word cache; the
  forward's CPU (on a CPU card: the submit; on encode's path: its forward's time) taken off;
- ``pipeline``: whole runs (reading, dispatch, the worker, writing, the driver) on the process
  backend, one CPU thread a worker, for each of LAYOUTS (workers × tokenizer): the workers'
  CPU by stage, the driver's, and the rate;
- ``card`` (paragraphs): whole runs feeding the simulated H200 (calibrated from the measured
  card, scaled to CARD_CORES cores a GPU) for each of CARD_LAYOUTS (workers × tokenizing threads
  or processes × tokenizer, and one with CUDA graphs: the card's launches a few calls a batch
  instead of one a kernel): the card's busy share, and its busy seconds per CPU-second spent
  (every process's: the workers', their tokenizing children's, the driver's), which says
  which way of tokenizing keeps a card busiest for the CPU it takes.

From the medians, against the goals of issue 58: a worker's CPU around its forward pass against
the bare tokenizer's (``worker_over_bare``: <= 1.3 through the tokenizer, <= 0.5 with the word
cache), the word cache's own CPU against it (<= 0.3), and the fastest whole run's rate against
what every core of this machine tokenizing with the bare tokenizer would give (``rate_over_bare``:
>= 0.7). Everything here runs on this machine's cores; no card (the table says so).
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers.study.autotune import interleaved
from helpers.study.feeding import STAGES, feed_run

CORPORA = ("paragraphs", "tokens128")
LAYOUTS = ((1, False), (1, True), (2, False), (2, True))  # (workers, word cache)
CARD, CARD_CORES = "h200", 16
CARD_LAYOUTS = ((1, 1, 0, True, False), (1, 2, 0, True, False), (1, 0, 2, True, False),
                (2, 1, 0, True, False), (2, 0, 1, True, False), (1, 2, 0, False, False),
                (1, 1, 0, True, True))
# (workers, tokenizing threads, processes, word cache, CUDA graphs: the card's launches); two
# workers on two cores: one thread each is a card worker's default (its share, one core), one
# process each the default before it (the node's cores less one)
GOALS = {"worker_over_bare": 1.3, "worker_over_bare_cached": 0.5, "cache_over_bare": 0.3,
         "rate_over_bare": 0.7}


def corpora(texts: list[str], rust: Any, records: int) -> dict[str, list[str]]:
    """The paragraphs (cycled to ``records``), and ``records`` texts of 128 tokens (126 and
    the two special ones) cut from the paragraphs joined end to end."""
    from tokenizers import Tokenizer

    whole = Tokenizer.from_str(rust.rust.to_str())
    whole.no_truncation()
    whole.no_padding()
    cut: list[str] = []
    for start in range(0, len(texts), 200):
        joined = " ".join(texts[start:start + 200])
        offsets = whole.encode(joined, add_special_tokens=False).offsets
        cut += [joined[offsets[i][0]:offsets[i + 125][1]]
                for i in range(0, len(offsets) - 126, 126)]
        if len(cut) >= records:
            break
    cycled = (texts * (records // len(texts) + 1))[:records]
    return {"paragraphs": cycled, "tokens128": cut[:records]}


def tiny_model(folder: Path) -> str:
    """The embedded model's configuration and tokenizer with a tiny random forward
    (``weights.TINY``), built in ``folder``."""
    from helpers.bench.gpu.weights import TINY, build, prepare

    return str(build(prepare(folder / "prepared"), folder / "tiny", shape=TINY))


def bare(texts: list[str], tokenizer: Any, rust: Any, batch_size: int) -> dict[str, float]:
    """CPU seconds of each bare method over ``texts`` (this process, one thread each)."""
    from helpers.workloads.embedding.word_cache import WordCache

    cache = WordCache(rust)
    cache.encode(texts[:2000])  # (its words met once: a long run's state)

    def wrapper() -> None:
        for i in range(0, len(texts), batch_size):
            tokenizer(texts[i:i + batch_size], padding=True, truncation=True,
                      max_length=rust.max_length, return_tensors="pt")

    seconds = {}
    for method, work in (("rust", lambda: rust.encode(texts)), ("wrapper", wrapper),
                         ("word_cache", lambda: cache.encode(texts))):
        started = time.process_time()
        work()
        seconds[method] = time.process_time() - started
    return seconds


def in_process(texts: list[str], models: dict[str, Any], workload: Any) -> dict[str, dict]:
    """Each path's CPU over ``texts`` in this process (one thread), and its forward's."""
    found = {}
    for method, (loaded, clock) in models.items():
        started = time.process_time()
        workload[method].process(loaded, texts)
        cpu = time.process_time() - started
        if clock == "encode":
            forward = workload[method].phases(loaded)["forward"]  # (one thread: its CPU)
        else:
            forward = workload[method].counts(loaded)["launch_cpu_us"] / 1e6
        found[method] = {"cpu_s": cpu, "forward_cpu_s": forward}
    return found


def measure(records: int = 20_000, repeats: int = 3, batch_size: int = 128,
            workunit_size: int = 1024) -> pd.DataFrame:
    """One tidy row per (corpus, method or layout, round)."""
    import torch
    from transformers import AutoTokenizer

    from helpers.study.paths import sample_texts
    from helpers.workloads.embedding import EmbeddingWorkload
    from helpers.workloads.embedding.model import read_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: the CPU per text
    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpufeed-feed-") as folder:
        path = tiny_model(Path(folder))
        tokenizer = AutoTokenizer.from_pretrained(path)
        rust = read_model(path)[1]
        texts = corpora(sample_texts(), rust, records)
        workloads = {"encode": EmbeddingWorkload(model=path, batch_size=batch_size,
                                                 feeder=False),
                     "feeder": EmbeddingWorkload(model=path, batch_size=batch_size,
                                                 word_cache=False),
                     "feeder_cached": EmbeddingWorkload(model=path, batch_size=batch_size)}
        models = {name: (w.load("cpu", 1), "encode" if name == "encode" else "feeder")
                  for name, w in workloads.items()}
        for replicate in range(repeats):
            for corpus in interleaved(CORPORA, replicate):
                chosen = texts[corpus]
                base = {"replicate": replicate, "corpus": corpus, "texts": len(chosen),
                        "tokens": sum(map(len, rust.encode(chosen)))}
                for method, seconds in bare(chosen, tokenizer, rust, batch_size).items():
                    rows.append({**base, "kind": "bare", "method": method, "cpu_s": seconds,
                                 "forward_cpu_s": 0.0})
                for method, found in in_process(chosen, models, workloads).items():
                    rows.append({**base, "kind": "in_process", "method": method, **found})
                if corpus == "paragraphs":
                    rows += card_rows(chosen, base, replicate, batch_size, workunit_size, folder)
                for workers, cached in interleaved(LAYOUTS, replicate):
                    workload = workloads["feeder_cached" if cached else "feeder"]
                    run = feed_run(chosen, workload, f"cpu*{workers}", workunit_size, folder,
                                   threads_per_worker=1)
                    worker = run["cpu_s"] - run["driver_cpu_s"]
                    rows.append({**base, "kind": "pipeline",
                                 "method": f"{workers} worker{'s' * (workers > 1)}, "
                                           f"{'word cache' if cached else 'Rust tokenizer'}",
                                 **{k: run[k] for k in ("workers", "records_per_s", "seconds",
                                                        "spinup_s", "texts_fast", "padding")},
                                 **{f"{s}_cpu_s": run[f"{s}_cpu_s"] for s in STAGES},
                                 "cpu_s": worker, "forward_cpu_s": run["launch_cpu_s"]})
    table = pd.DataFrame(rows).assign(cores=cores, batch_size=batch_size,
                                      workunit_size=workunit_size,
                                      model="tiny random BERT (1 layer, hidden 8) behind "
                                            "all-MiniLM-L6-v2's tokenizer", card="none (CPU)")
    table["around_forward_cpu_s"] = table["cpu_s"] - table["forward_cpu_s"]
    table["cpu_ms_per_1k_texts"] = table["around_forward_cpu_s"] / table["texts"] * 1e6
    rust_cost = table[table.method.eq("rust")].set_index(["replicate", "corpus"])["cpu_s"]
    keys = pd.Series(list(zip(table.replicate, table.corpus)))
    table["over_bare"] = table["around_forward_cpu_s"] / keys.map(rust_cost).to_numpy()
    bare_rate = cores * table["texts"] / keys.map(rust_cost).to_numpy()  # every core, bare
    table["rate_over_bare"] = table.get("records_per_s", np.nan) / bare_rate
    return table


def card_layout(workers: int, threads: int, processes: int, cached: bool,
                graphs: bool = False) -> str:
    way = (f"{processes} process{'es' * (processes > 1)}" if processes
           else f"{threads} thread{'s' * (threads > 1)}")
    return f"{workers} worker{'s' * (workers > 1)} x {way}, " \
           f"{'word cache' if cached else 'Rust tokenizer'}{', CUDA graphs' if graphs else ''}"


def card_rows(texts: list[str], base: dict[str, Any], replicate: int, batch_size: int,
              workunit_size: int, folder: str) -> list[dict[str, Any]]:
    """Each of CARD_LAYOUTS feeding the simulated card (a round each in another order)."""
    from helpers.workloads.embedding import EmbeddingWorkload

    rows = []
    for workers, threads, processes, cached, graphs in interleaved(CARD_LAYOUTS, replicate):
        workload = EmbeddingWorkload(card=CARD, card_cores=CARD_CORES, batch_size=batch_size,
                                     word_cache=cached, tokenize_threads=threads or None,
                                     tokenize_processes=processes or None, cuda_graphs=graphs)
        run = feed_run(texts, workload, f"cuda:0*{workers}", workunit_size, folder)
        busy_s = run["card_busy_share"] * run["seconds"]
        rows.append({**base, "kind": "card",
                     "method": card_layout(workers, threads, processes, cached, graphs),
                     **{k: run[k] for k in ("workers", "records_per_s", "seconds", "spinup_s",
                                            "texts_fast", "padding", "card_busy_share")},
                     **{f"{s}_cpu_s": run[f"{s}_cpu_s"] for s in STAGES},
                     "cpu_s": run["cpu_s"], "forward_cpu_s": run["launch_cpu_s"],
                     "card_busy_per_cpu_s": busy_s / run["cpu_s"] if run["cpu_s"] else np.nan})
    return rows


def report(table: pd.DataFrame) -> dict[str, float]:
    """Print the medians per corpus and method; return the figures against the goals."""
    summary = table.groupby(["corpus", "kind", "method"], sort=False).agg(
        cpu_ms_per_1k_texts=("cpu_ms_per_1k_texts", "median"),
        over_bare=("over_bare", "median"), over_bare_low=("over_bare", "min"),
        over_bare_high=("over_bare", "max"), records_per_s=("records_per_s", "median"),
        rate_over_bare=("rate_over_bare", "median"), rounds=("cpu_s", "size"))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.to_string(float_format=lambda v: f"{v:.3f}"))
    runs = table[table.kind.eq("pipeline")]
    by_stage = runs.groupby(["corpus", "method"], sort=False)[
        [f"{s}_cpu_s" for s in STAGES] + ["texts"]].median()
    per_1k = by_stage[[f"{s}_cpu_s" for s in STAGES]].div(by_stage["texts"], axis=0) * 1e6
    print("CPU ms per 1,000 texts by stage (launch: the forward pass, on a CPU):")
    print(per_1k.rename(columns=lambda c: c.removesuffix("_cpu_s")).to_string(
        float_format=lambda v: f"{v:.1f}"))
    paragraphs = summary.xs("paragraphs", level="corpus")
    one = {cached: paragraphs.loc[("pipeline", f"1 worker, {name}"), "over_bare"]
           for cached, name in ((False, "Rust tokenizer"), (True, "word cache"))}
    figures = {"worker_over_bare": float(one[False]), "worker_over_bare_cached": float(one[True]),
               "cache_over_bare": float(paragraphs.loc[("bare", "word_cache"), "over_bare"]),
               "rate_over_bare": float(paragraphs.xs("pipeline")["rate_over_bare"].max()),
               "encode_over_bare": float(paragraphs.loc[("in_process", "encode"),
                                                        "over_bare"])}
    words = {"worker_over_bare": "a worker around its forward, Rust tokenizer, x bare",
             "worker_over_bare_cached": "a worker around its forward, word cache, x bare",
             "cache_over_bare": "the word cache alone, x bare",
             "rate_over_bare": "the fastest whole run's rate, x every core tokenizing bare"}
    for name, said in words.items():
        goal, value = GOALS[name], figures[name]
        met = value >= goal if name == "rate_over_bare" else value <= goal
        print(f"paragraphs: {said}: {value:.2f} ({'>=' if name == 'rate_over_bare' else '<='} "
              f"{goal}: {'met' if met else 'NOT met'})")
    print(f"paragraphs: model.encode in process around its forward: "
          f"{figures['encode_over_bare']:.2f}x bare")
    cards = table[table.kind.eq("card")]
    if len(cards):
        fed = cards.groupby("method", sort=False).agg(
            card_busy_share=("card_busy_share", "median"),
            card_busy_per_cpu_s=("card_busy_per_cpu_s", "median"),
            records_per_s=("records_per_s", "median"), rounds=("cpu_s", "size"))
        print(f"the simulated {CARD} (scaled to {CARD_CORES} cores a GPU), paragraphs:")
        print(fed.to_string(float_format=lambda v: f"{v:.3f}"))
        figures["card_busiest"] = float(fed["card_busy_share"].max())
        figures["card_busiest_layout"] = str(fed["card_busy_share"].idxmax())
        figures["card_thriftiest_layout"] = str(fed["card_busy_per_cpu_s"].idxmax())
        print(f"busiest: {figures['card_busiest_layout']}; most card per CPU-second: "
              f"{figures['card_thriftiest_layout']}")
    return figures


def main(records: int, repeats: int, batch_size: int, workunit_size: int,
         results_dir: str | None) -> None:
    from helpers.study.results import save_table

    table = measure(records, repeats, batch_size, workunit_size)
    report(table)
    if results_dir:
        path = save_table(table, "feed_bench", results_dir, "helpers.bench.feed",
                          {"records": records, "repeats": repeats, "batch_size": batch_size,
                           "workunit_size": workunit_size})
        print(f"table: {path}")
