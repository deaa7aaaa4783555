"""What the CPU side of feeding a card costs, against the tokenizer's own limit, and whether it keeps a simulated card busy.

Two corpora: the sample's paragraphs (``paragraphs``) and texts of 128 tokens cut from them
(``tokens128``). For each, in interleaved rounds (the machine's drift falls on every method alike):

- ``bare``: the CPU seconds per million tokens of the Rust tokenizer alone
  (``encode_batch``, one thread: the CPU side's physical limit here); of the call
  sentence-transformers makes (``tokenizer(texts, padding=True, truncation=True,
  return_tensors="pt")``, a batch at a time); of gpufeed's feeder without a pipeline (Rust ids
  collated into padded arrays);
- ``pipeline``: a whole run (reading, dispatch, tokenizing, collating, launching, writing, the
  driver) on a simulated card (``EmbeddingWorkload(card=...)``, scaled to ``--card-cores`` cores
  a GPU), for each layout in LAYOUTS (workers on the card × tokenizing threads each): its CPU
  seconds per million tokens by stage (the workers' tokenize, collate and launch counted on
  their threads; the rest of the workers' CPU: reading, checks, writing their parts; the
  driver's whole process), the card's busy share, its rate.

From the medians: the feeding side's CPU against the bare tokenizer's (goal: <= 1.3x), and the
cores one real H100 would need at 17.5 M tokens/s (the card profile's rate for MiniLM-L6) at
each of those costs (goal: <= 16). Everything here is measured on this machine's cores; the card
is simulated (the table says so).
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import pandas as pd

from helpers.study.feeding import STAGES, card_run
from helpers.workloads.cards import CARDS

CORPORA = ("paragraphs", "tokens128")
LAYOUTS = ((1, 1), (1, 2), (2, 1))  # (workers on the card, tokenizing threads each)
GOALS = {"feeding_over_bare": 1.3, "h100_cores": 16.0}


def corpora(texts: list[str], tokenizer: Any, records: int) -> dict[str, list[str]]:
    """The paragraphs (the first ``records``), and ``records`` texts of 128 tokens (126 and the
    two special ones) cut from the paragraphs joined end to end."""
    from tokenizers import Tokenizer

    rust = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    rust.no_truncation()
    rust.no_padding()
    cut: list[str] = []
    for start in range(0, len(texts), 200):
        joined = " ".join(texts[start:start + 200])
        offsets = rust.encode(joined, add_special_tokens=False).offsets
        cut += [joined[offsets[i][0]:offsets[i + 125][1]]
                for i in range(0, len(offsets) - 126, 126)]
        if len(cut) >= records:
            break
    return {"paragraphs": texts[:records], "tokens128": cut[:records]}


def bare(texts: list[str], tokenizer: Any, rust: Any, batch_size: int) -> dict[str, float]:
    """CPU seconds of each bare method over ``texts`` (this process, one thread each)."""
    from helpers.workloads.feed import collate

    def wrapper() -> None:
        for i in range(0, len(texts), batch_size):
            tokenizer(texts[i:i + batch_size], padding=True, truncation=True,
                      max_length=rust.max_length, return_tensors="pt")

    def feeder() -> None:
        for i in range(0, len(texts), batch_size):
            collate(rust.encode(texts[i:i + batch_size]), rust.pad_id)

    seconds = {}
    for method, work in (("rust", lambda: rust.encode(texts)), ("wrapper", wrapper),
                         ("feeder", feeder)):
        started = time.process_time()
        work()
        seconds[method] = time.process_time() - started
    return seconds


def measure(records: int = 4096, repeats: int = 3, card: str = "h100", card_cores: int = 16,
            batch_size: int = 128, workunit_size: int = 512) -> pd.DataFrame:
    """One tidy row per (corpus, method or layout, round)."""
    from transformers import AutoTokenizer

    from helpers.study.paths import sample_texts
    from helpers.workloads.embedding import default_model_path
    from helpers.workloads.simulated import read_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: the CPU per token
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rust = read_model(path)[1]
    texts = corpora(sample_texts(), tokenizer, records)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpufeed-feed-") as folder:
        for replicate in range(repeats):
            for corpus in (CORPORA if replicate % 2 == 0 else CORPORA[::-1]):
                chosen = texts[corpus]
                tokens = sum(map(len, rust.encode(chosen)))
                for method, seconds in bare(chosen, tokenizer, rust, batch_size).items():
                    rows.append({"replicate": replicate, "corpus": corpus, "kind": "bare",
                                 "method": method, "tokens": tokens, "cpu_s": seconds})
                layouts = LAYOUTS[replicate % len(LAYOUTS):] + LAYOUTS[:replicate % len(LAYOUTS)]
                for workers, threads in layouts:
                    found = card_run(chosen, workers, threads, card, card_cores, batch_size,
                                     workunit_size, folder)
                    rows.append({"replicate": replicate, "corpus": corpus, "kind": "pipeline",
                                 "method": f"{workers} worker{'s' * (workers > 1)} x "
                                           f"{threads} thread{'s' * (threads > 1)}", **found})
    table = pd.DataFrame(rows).assign(
        card=f"simulated {card}", card_cores=card_cores, cores=os.cpu_count(),
        batch_size=batch_size, workunit_size=workunit_size)
    table["cpu_s_per_m_tokens"] = table["cpu_s"] / table["tokens"] * 1e6  # (bare rows' too)
    rust_cost = table[table.method.eq("rust")].set_index(["replicate", "corpus"])[
        "cpu_s_per_m_tokens"]
    table["over_bare"] = table["cpu_s_per_m_tokens"] / pd.Series(
        list(zip(table.replicate, table.corpus))).map(rust_cost).to_numpy()
    rate = CARDS["h100"].tokens_per_second  # (MiniLM-L6, 128 tokens)
    table["h100_cores"] = table["cpu_s_per_m_tokens"] * rate / 1e6
    return table


def report(table: pd.DataFrame) -> dict[str, float]:
    """Print the medians per corpus and method; return the best layout's figures against the
    goals."""
    summary = table.groupby(["corpus", "kind", "method"], sort=False).agg(
        cpu_s_per_m_tokens=("cpu_s_per_m_tokens", "median"),
        over_bare=("over_bare", "median"), over_bare_low=("over_bare", "min"),
        over_bare_high=("over_bare", "max"), h100_cores=("h100_cores", "median"),
        card_busy_share=("card_busy_share", "median"), rounds=("cpu_s", "size"))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.to_string(float_format=lambda v: f"{v:.3f}"))
    runs = table[table.kind.eq("pipeline")]
    by_stage = runs.groupby(["corpus", "method"], sort=False)[
        [f"{s}_cpu_s" for s in STAGES] + ["tokens"]].median()
    shares = by_stage[[f"{s}_cpu_s" for s in STAGES]].div(
        by_stage[[f"{s}_cpu_s" for s in STAGES]].sum(axis=1), axis=0)
    print("CPU by stage (share of the feeding side's):")
    print(shares.to_string(float_format=lambda v: f"{v:.0%}"))
    pipelines = summary.xs("pipeline", level="kind")
    best = pipelines["over_bare"].idxmin()
    figures = {"feeding_over_bare": float(pipelines.loc[best, "over_bare"]),
               "h100_cores": float(pipelines.loc[best, "h100_cores"]),
               "bare_h100_cores": float(summary.loc[(best[0], "bare", "rust"), "h100_cores"]),
               "card_busy_share": float(pipelines["card_busy_share"].max())}
    print(f"cheapest feeding side: {best[1]} on {best[0]}: "
          f"{figures['feeding_over_bare']:.2f}x the bare Rust tokenizer's CPU per token "
          f"(<= {GOALS['feeding_over_bare']}: "
          f"{'met' if figures['feeding_over_bare'] <= GOALS['feeding_over_bare'] else 'NOT met'})")
    print(f"one real H100 at 17.5 M tokens/s would need {figures['h100_cores']:.1f} of these "
          f"cores ({figures['bare_h100_cores']:.1f} at the bare tokenizer's rate; <= "
          f"{GOALS['h100_cores']:.0f}: "
          f"{'met' if figures['h100_cores'] <= GOALS['h100_cores'] else 'NOT met'})")
    print(f"the simulated card's busiest share: {figures['card_busy_share']:.0%}")
    return figures


def main(records: int, repeats: int, card: str, card_cores: int, batch_size: int,
         workunit_size: int, results_dir: str | None) -> None:
    from helpers.study.results import save_table

    table = measure(records, repeats, card, card_cores, batch_size, workunit_size)
    report(table)
    if results_dir:
        path = save_table(table, "feed_bench", results_dir, "helpers.bench.feed",
                          {"records": records, "repeats": repeats, "card": card,
                           "card_cores": card_cores, "batch_size": batch_size,
                           "workunit_size": workunit_size})
        print(f"table: {path}")
