"""The GPU check's simulated card: does this machine's CPU feed the card it has?

The card of the check's machine, simulated at full speed (helpers.workloads.embedding.cards.simulated:
the H200 as its first check measured it, 9.07 M tokens/s for MiniLM-L6 and its launches; an
H100's 17.5 M on another card), fed by every core of the machine through the feeder real models
take: the question of issue 45 on the node it is about (16 cores for one GPU), where the
study's own machine has 2. Each of ``layouts`` is one run of the sample's paragraphs, repeated,
on the process backend (the model's configuration and tokenizer are the check's): the card's busy
share, the CPU per token, and the busy share every core would give at that CPU per token
(helpers.study.feeding.card_run). The study beside it runs the real model on the real card, so
the two stand side by side.
"""
from __future__ import annotations

import tempfile
import time
from typing import Any

CARD = "h100"  # the profile simulated (the check's card's own, where it has one)
SPINUP_GUESS = 10.0  # seconds a run's pool may take to start, before one is measured


def layouts(cores: int) -> list[tuple[int, int, int]]:
    """(workers on the card, tokenizing threads each, tokenizing processes each): first one
    worker with a real card's default, tokenizing processes on its share of the cores
    (workloads.embedding.loading.default_processes: what users run, measured first should the
    section's time run short), then one worker on every core (threads: the Rust tokenizer's way
    to use cores), two on half each, one on a single core, and a worker on every core with one
    thread each (worker processes: the word cache's way, which runs in Python)."""
    from helpers.workloads.embedding.loading import default_processes

    default = default_processes(True, cores)
    return list(dict.fromkeys(([(1, 1, default)] if default else []) + [
        (1, cores, 0), (2, max(1, cores // 2), 0), (1, 1, 0), (cores, 1, 0)]))


def card_for(gpu: str) -> str:
    """The simulated profile nearest the check's card (its name: 'NVIDIA H200' ...)."""
    from helpers.workloads.embedding.cards.simulated import CARDS

    name = gpu.lower()
    return next((card for card in CARDS if card in name), CARD)


def measure(model_dir: str, texts: list[str], card: str, batch_size: int, workunit_size: int,
            deadline: float) -> list[dict[str, Any]]:
    """One row per layout: ``card_run``'s figures, or why it was skipped (out of time)."""
    from helpers.engine.contract.devices import available_cores
    from helpers.study.feeding import card_run

    cores, rows, took = available_cores(), [], SPINUP_GUESS
    with tempfile.TemporaryDirectory(prefix="gpufeed-gpu-sim-") as folder:
        for workers, threads, processes in layouts(cores):
            row = {"card": f"simulated {card}", "card_cores": None, "cores": cores,
                   "workers": workers, "tokenize_threads": threads,
                   "tokenize_processes": processes, "batch_size": batch_size,
                   "workunit_size": workunit_size}
            if time.monotonic() + took > deadline:
                rows.append({**row, "skipped": "out of time (the check's budget)"})
                continue
            started = time.monotonic()
            found = card_run(texts, workers, None if processes else threads, card, None,
                             batch_size, workunit_size, folder, model=model_dir,
                             processes=processes or None)
            took = max(took, time.monotonic() - started)
            rows.append({**row, **found, "skipped": ""})
    return rows
