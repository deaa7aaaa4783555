"""The check's first section: the model's side on the card, alone and as a worker runs it.

Each precision (fp32, fp16, bf16), eager and compiled, is loaded as a worker loads it
(``EmbeddingWorkload.load``: the cast, ``torch.compile``, the quality guard against float32 on the
guard's texts, pinned memory, tokenize-ahead), then timed two ways on the same texts:

- ``forward``: the card alone. The texts are tokenized first, in batches of each size sorted by
  token count as ``encode`` sorts them, and put on the card; then only the forward passes are
  timed (CUDA events, REPEATS passes over all batches after a warm-up). Its FLOPs over the
  card's measured bf16 rate are the share of the card's limit the model reaches.
- ``encode``: what a worker does per workunit (``workload.process``: sort by tokens, tokenize,
  copy, forward, back to the host) on one thread, with its process CPU seconds and its phases;
  for every variant at ENCODE_BATCH with tokenize-ahead and pinned memory on, for the FEED
  variant at every batch size and with each of those two options off. Rounds are interleaved,
  each in another order.

The gap between the two modes is what the CPU side costs a card: the question of the feed issue.
Compiled variants come last and only while the section's time allows one more compile (the first
one's cost, measured; COMPILE_GUESS before it): a row says what was skipped and why.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from helpers.bench.gpu.card import timed

PRECISIONS = ("fp32", "fp16", "bf16")
COMPILED_ORDER = ("fp16", "bf16", "fp32")  # the likeliest to be used first
ENCODE_BATCH = 256  # the batch size each variant is compared at (gpu.yaml's)
FEEDS = ((True, True), (False, True), (True, False), (False, False))  # (tokenize_ahead,
# pin_memory): the first is every variant's and the study's
COMPILE_GUESS = 90.0  # seconds a first torch.compile may take, before one is measured
TIMING_RESERVE = 10.0  # seconds a compiled variant's timing needs once compiled


@dataclass
class Loaded:
    """One variant as a worker would run it."""

    precision: str
    compile: bool
    tokenize_ahead: bool
    pin_memory: bool
    workload: Any
    model: Any
    load_s: float
    report: dict[str, Any]

    def key(self) -> dict[str, Any]:
        return {"precision": self.precision, "compile": self.compile,
                "tokenize_ahead": self.tokenize_ahead, "pin_memory": self.pin_memory}


def feed_precision(device: str) -> str:
    """The variant the feed grid, the batch sizes and the study use: fp16 on a card (what users
    run there), fp32 on a CPU (no fp16 kernels)."""
    return "fp16" if device.startswith("cuda") else "fp32"


def measure(model_dir: str, device: str, texts: list[str], batch_sizes: tuple[int, ...],
            repeats: int, deadline: float, ceiling_tflops: float,
            precisions: tuple[str, ...] = PRECISIONS, compiled: bool = True
            ) -> list[dict[str, Any]]:
    """Tidy rows, one per (mode, variant, batch size, repeat), plus one per variant skipped
    (``precisions``, ``compiled``: fewer, for a dry run). The eager variants are loaded and
    timed first; then each compiled one, while the time left allows its compile."""
    feed = feed_precision(device)
    rows: list[dict[str, Any]] = []
    wanted = [(p, *FEEDS[0]) for p in PRECISIONS if p in precisions] + \
        [(feed, *options) for options in FEEDS[1:]]
    eager = [item for item in (_load_row(model_dir, device, p, False, ahead, pin, rows)
                               for p, ahead, pin in wanted) if item is not None]
    if not eager:
        return rows
    shapes = _Shapes(model_dir, eager[0].model, texts)
    rows += _timed(eager, device, texts, batch_sizes, shapes, repeats, deadline, ceiling_tflops)
    compile_cost = COMPILE_GUESS
    for precision in (p for p in COMPILED_ORDER if p in precisions):
        key = {"mode": "load", "precision": precision, "compile": True}
        if not compiled:
            rows.append({**key, "skipped": "compile not asked for (a dry run: minutes on a CPU)"})
        elif time.monotonic() + compile_cost + TIMING_RESERVE > deadline:
            rows.append({**key, "skipped": f"budget (a compile takes ~{compile_cost:.0f} s)"})
        elif (item := _load_row(model_dir, device, precision, True, *FEEDS[0], rows)) is not None:
            compile_cost = item.load_s
            rows += _timed([item], device, texts, batch_sizes, shapes, repeats, deadline,
                           ceiling_tflops)
    return rows


def _timed(items: list[Loaded], device: str, texts: list[str], batch_sizes: tuple[int, ...],
           shapes: _Shapes, repeats: int, deadline: float,
           ceiling_tflops: float) -> list[dict[str, Any]]:
    """The forward pass of each variant (loaded with the study's feed) at every batch size,
    then the encode rounds of ``_encode_plan``."""
    rows: list[dict[str, Any]] = []
    for item in items:
        if (item.tokenize_ahead, item.pin_memory) != FEEDS[0]:
            continue  # (the same weights and kernels as the variant's own load)
        for size in batch_sizes:
            if time.monotonic() > deadline:
                rows.append({**_base("forward", item, size), "skipped": "budget"})
                continue
            rows += _forward(item, device, texts, size, shapes, repeats, ceiling_tflops)
    return rows + _encode_rounds(_encode_plan(items, batch_sizes, device), texts, shapes,
                                 repeats, deadline, ceiling_tflops)


def _base(mode: str, item: Loaded, batch_size: int) -> dict[str, Any]:
    return {"mode": mode, **item.key(), "batch_size": batch_size, "load_s": item.load_s,
            "guard_mean_cosine": item.report.get("guard_mean_cosine", 1.0),
            "guard_min_cosine": item.report.get("guard_min_cosine", 1.0), "skipped": ""}


def _load_row(model_dir: str, device: str, precision: str, compile: bool, ahead: bool,
              pin: bool, rows: list[dict[str, Any]]) -> Loaded | None:
    """The variant loaded as a worker loads it, or None and a row saying why not (it cannot
    run on ``device``, or its load failed: a variant's failure never ends the check)."""
    from helpers.workloads.runtimes import check_variant

    key = {"mode": "load", "precision": precision, "compile": compile, "tokenize_ahead": ahead,
           "pin_memory": pin}
    try:
        check_variant(precision, "torch", device)
        return _load(model_dir, device, precision, compile, ahead, pin)
    except Exception as exc:
        rows.append({**key, "skipped": f"{type(exc).__name__}: {exc}"[:300]})
        return None


def _load(model_dir: str, device: str, precision: str, compile: bool, ahead: bool,
          pin: bool) -> Loaded:
    from helpers.workloads.embedding import EmbeddingWorkload

    workload = EmbeddingWorkload(model=model_dir, batch_size=ENCODE_BATCH, precision=precision,
                                 compile=compile, tokenize_ahead=ahead, pin_memory=pin)
    from helpers.engine.devices import available_cores

    started = time.perf_counter()
    model = workload.load(device, available_cores())  # (threads: for a CPU's dry run alone)
    return Loaded(precision, compile, ahead, pin, workload, model,
                  time.perf_counter() - started, workload.report(model))


class _Shapes:
    """The texts in ``encode``'s batches: sorted by token count, longest first, cut at each
    batch size; each batch's tokens (needed, and computed: padded to its longest) and FLOPs."""

    def __init__(self, model_dir: str, model: Any, texts: list[str]) -> None:
        from transformers import AutoConfig

        from helpers.workloads.runtimes import token_lengths

        self.config = AutoConfig.from_pretrained(model_dir)
        self.lengths = np.asarray(token_lengths(model, texts))
        self.order = np.argsort(-self.lengths, kind="stable")

    def batches(self, size: int) -> list[np.ndarray]:
        return [self.order[k:k + size] for k in range(0, len(self.order), size)]

    def figures(self, size: int) -> dict[str, float]:
        from helpers.bench.gpu.card import flops

        needed = computed = flop = 0.0
        for batch in self.batches(size):
            longest = int(self.lengths[batch].max())
            needed += float(self.lengths[batch].sum())
            computed += float(len(batch) * longest)
            flop += flops(self.config, len(batch), longest)
        return {"tokens_needed": needed, "tokens_computed": computed, "flop": flop}


def _rates(row: dict[str, Any], texts: int, seconds: float, figures: dict[str, float],
           ceiling_tflops: float) -> dict[str, Any]:
    tflops = figures["flop"] / seconds / 1e12
    return {**row, "texts": texts, "seconds": seconds, "texts_per_s": texts / seconds,
            "tokens_needed": figures["tokens_needed"],
            "tokens_computed": figures["tokens_computed"],
            "tokens_per_s": figures["tokens_needed"] / seconds, "tflop_per_s": tflops,
            "card_share": tflops / ceiling_tflops if ceiling_tflops else float("nan")}


def _forward(item: Loaded, device: str, texts: list[str], size: int, shapes: _Shapes,
             repeats: int, ceiling_tflops: float) -> list[dict[str, Any]]:
    """REPEATS timed passes of the forward alone over every batch of ``size``, on the card."""
    import torch

    model = item.model
    preprocess = getattr(type(model), "preprocess", None) or type(model).tokenize  # the
    # class's: not the worker's wrappers (pinned, ahead, the phase clock) on the instance
    features = []
    for batch in shapes.batches(size):
        tensors = preprocess(model, [texts[k] for k in batch])
        features.append({k: v.to(device) for k, v in tensors.items() if hasattr(v, "to")})

    def work() -> None:
        for one in features:
            model(dict(one))  # (the modules add their outputs to the dict they get)

    base = _base("forward", item, size)
    try:
        with torch.inference_mode():
            seconds = timed(device, work, warmups=1, repeats=repeats)
    except Exception as exc:  # (out of memory at a large batch, say)
        return [{**base, "skipped": f"{type(exc).__name__}: {exc}"[:300]}]
    figures = shapes.figures(size)
    return [{**_rates(base, len(texts), s, figures, ceiling_tflops), "repeat": r}
            for r, s in enumerate(seconds)]


def _encode_plan(loaded: list[Loaded], batch_sizes: tuple[int, ...],
                 device: str) -> list[tuple[Loaded, int]]:
    """(variant, batch size) pairs to time in ``encode``: each variant at ENCODE_BATCH with the
    study's feed; the feed variant at every other batch size, and with each option off."""
    feed = feed_precision(device)
    plan = [(item, ENCODE_BATCH) for item in loaded]
    plan += [(item, size) for item in loaded
             if (item.precision, item.compile, item.tokenize_ahead, item.pin_memory) ==
             (feed, False, *FEEDS[0]) for size in batch_sizes if size != ENCODE_BATCH]
    return plan


def _encode_rounds(plan: list[tuple[Loaded, int]], texts: list[str], shapes: _Shapes,
                   repeats: int, deadline: float, ceiling_tflops: float) -> list[dict[str, Any]]:
    """``repeats`` rounds of every (variant, batch size) of ``plan``, each round starting one
    further along (the machine's drift falls on all alike)."""
    rows = []
    for repeat in range(repeats):
        for item, size in plan[repeat % len(plan):] + plan[:repeat % len(plan)]:
            base = {**_base("encode", item, size), "repeat": repeat}
            if time.monotonic() > deadline:
                rows.append({**base, "skipped": "budget"})
                continue
            try:
                rows.append(_encode_once(item, size, texts, shapes, base, ceiling_tflops))
            except Exception as exc:
                rows.append({**base, "skipped": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def _encode_once(item: Loaded, size: int, texts: list[str], shapes: _Shapes,
                 base: dict[str, Any], ceiling_tflops: float) -> dict[str, Any]:
    workload = replace(item.workload, batch_size=size)
    cpu, wall = time.process_time(), time.perf_counter()
    workload.process(item.model, texts)  # (its vectors come back to the host: the card is done)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    phases = workload.phases(item.model) or {}
    return {**_rates(base, len(texts), wall, shapes.figures(size), ceiling_tflops),
            "cpu_s": cpu, **{f"{phase}_s": s for phase, s in phases.items()}}
