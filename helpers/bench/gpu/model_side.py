"""The GPU check's model side: the model on the card, alone and as a worker runs it.

Each precision (fp32, fp16, bf16), eager, eager with CUDA graphs and compiled, and the feed
precision unpadded (the transformer on the real tokens alone: cards/unpadded.py), is loaded as a
worker loads it (``EmbeddingWorkload.load``: the cast, ``torch.compile``, the torch card's graphs,
the quality guard against float32 on the guard's texts, pinned memory; the feeder and the torch
card, or, with tokenize-ahead, ``encode``'s path: each row's ``path`` says which), then timed two
ways on the same texts:

- ``forward``: the forward passes alone. The texts are tokenized first (once for every variant),
  in batches of each size sorted by token count as ``encode`` sorts them, and put on the card;
  then REPEATS passes over all batches are timed with CUDA events after a warm-up, launched from
  one Python thread (the card waits for the host's launches where they are slower than its
  kernels: eager PyTorch as it runs; with CUDA graphs, each batch is the card's: copied into
  its bucket's graph and replayed); ``cpu_s``: that thread's CPU for one pass (the launches:
  what the simulated card's launch model stands for; a graphed row's tokens and FLOPs are its
  batches' own, not its buckets' padding). Their FLOPs over the card's measured bf16 matrix rate are
  ``card_share``, the share of the card's limit the model reaches; over the ceiling of its own
  precision (fp32's without TF32), ``own_share``.
- ``encode``: what a worker does per workunit (``workload.process``: on the feeder's path,
  tokenize, sort, collate into pinned staging, copy, forward, back to the host; on ``encode``'s,
  its own loop) on one thread, with its process CPU seconds and its phases; for every variant at
  ENCODE_BATCH on the feeder's path with pinned memory, for the feed variant at every batch size,
  on ``encode``'s path and without pinned memory. ROUNDS rounds, each in another order.

The gap between the two modes is what the CPU side costs a card: the question of the feed issue.
The feed variant is compiled right after the eager loads; the other compiled variants come last
(the feed variant with graphs first), each only while the section's time allows another compile
(the last one's cost, COMPILE_GUESS before one is measured): a row says what was skipped and why.
On a CPU (the dry run) the graphed variants are rows that say why not.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from helpers.bench.gpu.card import timed

PRECISIONS = ("fp32", "fp16", "bf16")
COMPILED_ORDER = (("fp16", False), ("fp16", True), ("bf16", False), ("fp32", False))  # (a
# precision, CUDA graphs): the likeliest to be used first
ENCODE_BATCH = 256  # the batch size each variant is compared at (gpu.yaml's)
FEEDS = ((False, True), (True, True), (False, False), (True, False))  # (tokenize_ahead,
# pin_memory): the first is every variant's and the study's (the feeder's path; tokenize_ahead
# puts a model on encode's, the reference, as the first card measured it)
COMPILE_GUESS = 60.0  # seconds a first torch.compile may take, before one is measured
TIMING_RESERVE = 15.0  # seconds a compiled variant's timing needs once compiled


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
    graphs: bool = False
    unpadded: bool = False

    def key(self) -> dict[str, Any]:
        return {"precision": self.precision, "compile": self.compile, "cuda_graphs": self.graphs,
                "unpadded": self.unpadded,
                "tokenize_ahead": self.tokenize_ahead, "pin_memory": self.pin_memory,
                "path": str(self.report.get("path", "")).split(" (")[0]}

    @property
    def modules(self) -> Any:
        """The SentenceTransformer itself (a fed model holds it beside its feeder)."""
        return getattr(self.model, "model", None) or self.model


def feed_precision(device: str) -> str:
    """The variant the feed grid, the batch sizes and the study use: fp16 on a card (what users
    run there), fp32 on a CPU (no fp16 kernels)."""
    return "fp16" if device.startswith("cuda") else "fp32"


def measure(model_dir: str, device: str, texts: list[str], batch_sizes: tuple[int, ...],
            repeats: int, rounds: int, deadline: float, ceilings: dict[str, float],
            precisions: tuple[str, ...] = PRECISIONS, compiled: bool = True,
            rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Tidy rows, one per (mode, variant, batch size, repeat), plus one per variant skipped
    (``precisions``, ``compiled``: fewer, for a dry run). ``ceilings``: TFLOP/s of the card's
    matrix products by precision (card.ceilings). ``rows``: the list they go into as they are
    measured (the caller keeps them where a later step raises)."""
    feed = feed_precision(device)
    rows = [] if rows is None else rows
    wanted = [(p, *FEEDS[0], graphs, False) for graphs in (False, True) for p in PRECISIONS
              if p in precisions] + [(feed, *FEEDS[0], False, True)] \
        + [(feed, *options, False, False) for options in FEEDS[1:]]
    loaded = [item for item in (_load_row(model_dir, device, p, False, *options, rows=rows)
                                for p, *options in wanted) if item is not None]
    if not loaded:
        return rows
    shapes = _Shapes(model_dir, loaded[0].modules, texts)
    compiling = _Compiles(model_dir, device, rows, deadline, compiled)
    order = [(p, graphs) for p, graphs in COMPILED_ORDER if p in precisions]
    loaded += compiling.load(order[:1])  # (the likeliest to be used, while time is plenty)
    rows += _timed(loaded, device, texts, batch_sizes, shapes, repeats, rounds, deadline,
                   ceilings)
    for variant in order[1:]:
        rows += _timed(compiling.load([variant]), device, texts, batch_sizes, shapes, repeats,
                       rounds, deadline, ceilings)
    return rows


class _Compiles:
    """Loads compiled variants while the time left allows another compile."""

    def __init__(self, model_dir: str, device: str, rows: list[dict[str, Any]],
                 deadline: float, wanted: bool) -> None:
        self.model_dir, self.device, self.rows = model_dir, device, rows
        self.deadline, self.wanted, self.cost = deadline, wanted, COMPILE_GUESS

    def load(self, variants: list[tuple[str, bool]]) -> list[Loaded]:
        loaded = []
        for precision, graphs in variants:
            key = {"mode": "load", "precision": precision, "compile": True, "cuda_graphs": graphs,
                   "unpadded": False}
            if not self.wanted:
                self.rows.append({**key, "skipped": "compile not asked for (a dry run: minutes "
                                                    "on a CPU)"})
            elif time.monotonic() + self.cost + TIMING_RESERVE > self.deadline:
                self.rows.append({**key, "skipped": f"budget (a compile takes ~{self.cost:.0f} "
                                                    f"s)"})
            else:
                item = _load_row(self.model_dir, self.device, precision, True, *FEEDS[0],
                                 graphs, rows=self.rows)
                if item is not None:
                    self.cost = item.load_s
                    loaded.append(item)
        return loaded


def _timed(items: list[Loaded], device: str, texts: list[str], batch_sizes: tuple[int, ...],
           shapes: _Shapes, repeats: int, rounds: int, deadline: float,
           ceilings: dict[str, float]) -> list[dict[str, Any]]:
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
            rows += _forward(item, device, texts, size, shapes, repeats, ceilings)
    return rows + _encode_rounds(_encode_plan(items, batch_sizes, device), texts, shapes,
                                 rounds, deadline, ceilings)


def _base(mode: str, item: Loaded, batch_size: int) -> dict[str, Any]:
    graphs = getattr(getattr(item.model, "card", None), "graphs", None)  # (a FedModel's
    # card's: the buckets captured before this row)
    return {"mode": mode, **item.key(), "batch_size": batch_size, "load_s": item.load_s,
            "guard_mean_cosine": item.report.get("guard_mean_cosine", 1.0),
            "guard_min_cosine": item.report.get("guard_min_cosine", 1.0), "skipped": "",
            **({"graphs_captured": graphs.counts.captured,
                "graph_capture_s": graphs.counts.capture_s} if graphs is not None else {})}


def _load_row(model_dir: str, device: str, precision: str, compile: bool, ahead: bool,
              pin: bool, graphs: bool, unpadded: bool = False, *,
              rows: list[dict[str, Any]]) -> Loaded | None:
    """The variant loaded as a worker loads it, or None and a row (into ``rows``) saying why
    not (it cannot run on ``device``, or its load failed: a variant's failure never ends the
    check)."""
    from helpers.workloads.embedding.runtimes import check_variant

    key = {"mode": "load", "precision": precision, "compile": compile, "cuda_graphs": graphs,
           "unpadded": unpadded, "tokenize_ahead": ahead, "pin_memory": pin}
    if graphs and not device.startswith("cuda"):
        rows.append({**key, "skipped": f"CUDA graphs replay CUDA kernels; this device is "
                                       f"{device}"})
        return None
    try:
        check_variant(precision, "torch", device)
        return _load(model_dir, device, precision, compile, ahead, pin, graphs, unpadded)
    except Exception as exc:
        rows.append({**key, "skipped": f"{type(exc).__name__}: {exc}"[:300]})
        return None


def _load(model_dir: str, device: str, precision: str, compile: bool, ahead: bool,
          pin: bool, graphs: bool, unpadded: bool = False) -> Loaded:
    from helpers.workloads.embedding import EmbeddingWorkload

    workload = EmbeddingWorkload(model=model_dir, batch_size=ENCODE_BATCH, precision=precision,
                                 compile=compile, tokenize_ahead=ahead, pin_memory=pin,
                                 cuda_graphs=graphs, unpadded=unpadded)
    from helpers.engine.contract.devices import available_cores

    started = time.perf_counter()
    model = workload.load(device, available_cores())  # (one worker's share: every core; on
    # a card, what its tokenizing defaults take)
    return Loaded(precision, compile, ahead, pin, workload, model,
                  time.perf_counter() - started, workload.report(model), graphs, unpadded)


class _Shapes:
    """The texts in ``encode``'s batches: sorted by token count, longest first, cut at each
    batch size; each batch's tokens (needed, and computed: padded to its longest) and FLOPs."""

    def __init__(self, model_dir: str, model: Any, texts: list[str]) -> None:
        from transformers import AutoConfig

        from helpers.workloads.embedding.runtimes import token_lengths

        self.config = AutoConfig.from_pretrained(model_dir)
        self.lengths = np.asarray(token_lengths(model, texts))
        self.order = np.argsort(-self.lengths, kind="stable")
        self.model, self.texts = model, texts
        self._features: dict[int, list[dict[str, Any]]] = {}

    def batches(self, size: int) -> list[np.ndarray]:
        return [self.order[k:k + size] for k in range(0, len(self.order), size)]

    def features(self, size: int) -> list[dict[str, Any]]:
        """The batches of ``size`` tokenized (on the host; every variant shares its tokenizer),
        by the class's own method: not the worker's wrappers on the instance (pinned memory,
        tokenize-ahead, the phase clock)."""
        if size not in self._features:
            kind = type(self.model)
            preprocess = getattr(kind, "preprocess", None) or kind.tokenize
            self._features[size] = [
                {k: v for k, v in preprocess(self.model, [self.texts[i] for i in batch]).items()
                 if hasattr(v, "to")} for batch in self.batches(size)]
        return self._features[size]

    def figures(self, size: int, unpadded: bool = False) -> dict[str, float]:
        """The batches' tokens and FLOPs (``unpadded``: each text's own, no padding)."""
        from helpers.bench.gpu.card import flops

        needed = computed = flop = 0.0
        for batch in self.batches(size):
            longest = int(self.lengths[batch].max())
            needed += float(self.lengths[batch].sum())
            computed += float(self.lengths[batch].sum() if unpadded else len(batch) * longest)
            flop += sum(flops(self.config, 1, int(n)) for n in self.lengths[batch]) \
                if unpadded else flops(self.config, len(batch), longest)
        return {"tokens_needed": needed, "tokens_computed": computed, "flop": flop}


def _rates(row: dict[str, Any], texts: int, seconds: float, figures: dict[str, float],
           ceilings: dict[str, float]) -> dict[str, Any]:
    tflops = figures["flop"] / seconds / 1e12
    own = ceilings.get("fp32" if row["precision"] == "fp32" else "bf16", float("nan"))
    return {**row, "texts": texts, "seconds": seconds, "texts_per_s": texts / seconds,
            "tokens_needed": figures["tokens_needed"],
            "tokens_computed": figures["tokens_computed"],
            "tokens_per_s": figures["tokens_needed"] / seconds, "tflop_per_s": tflops,
            "card_share": tflops / ceilings.get("bf16", float("nan")),
            "own_share": tflops / own}


def _forward(item: Loaded, device: str, texts: list[str], size: int, shapes: _Shapes,
             repeats: int, ceilings: dict[str, float]) -> list[dict[str, Any]]:
    """REPEATS timed passes of the forward alone over every batch of ``size``, on the card."""
    import torch

    model = item.modules
    features = [{k: v.to(device) for k, v in one.items()} for one in shapes.features(size)]
    masks = [one["attention_mask"].numpy() for one in shapes.features(size)]  # (on the host:
    # the unpadded pass reads its spans there, as the card's submit gives them)
    card = item.model.card if item.graphs or item.unpadded else None

    def work() -> None:
        for one, mask in zip(features, masks):
            if card is not None:  # (copied into its bucket's graph and replayed, or unpadded)
                card.compute(one["input_ids"], one["attention_mask"], mask)
            else:
                model(dict(one))  # (the modules add their outputs to the dict they get)

    base = _base("forward", item, size)
    clock = getattr(model, "gpufeed_phases", None)  # encode's path: its hook waits for the card
    waits = getattr(clock, "cuda", False)  # after each forward pass: here they must queue up
    if clock is not None:
        clock.cuda = False
    try:
        with torch.inference_mode():
            work()  # (a warm-up: a graphed variant captures its buckets here, not in cpu_s)
            cpu = time.thread_time()
            seconds = timed(device, work, warmups=0, repeats=repeats)
            per_pass = (time.thread_time() - cpu) / repeats  # (the launching thread's)
    except Exception as exc:  # (out of memory at a large batch, say)
        return [{**base, "skipped": f"{type(exc).__name__}: {exc}"[:300]}]
    finally:
        if clock is not None:
            clock.cuda = waits
    figures = shapes.figures(size, item.unpadded)
    return [{**_rates(base, len(texts), s, figures, ceilings), "repeat": r, "cpu_s": per_pass}
            for r, s in enumerate(seconds)]


def _encode_plan(loaded: list[Loaded], batch_sizes: tuple[int, ...],
                 device: str) -> list[tuple[Loaded, int]]:
    """(variant, batch size) pairs to time in ``encode``: each variant at ENCODE_BATCH with the
    study's feed; the feed variant at every other batch size, and with each option off."""
    feed = feed_precision(device)
    plan = [(item, ENCODE_BATCH) for item in loaded]
    plan += [(item, size) for item in loaded
             if (item.precision, item.compile, item.graphs, item.unpadded, item.tokenize_ahead,
                 item.pin_memory) == (feed, False, False, False, *FEEDS[0])
             for size in batch_sizes if size != ENCODE_BATCH]
    return plan


def _encode_rounds(plan: list[tuple[Loaded, int]], texts: list[str], shapes: _Shapes,
                   rounds: int, deadline: float, ceilings: dict[str, float]
                   ) -> list[dict[str, Any]]:
    """``rounds`` rounds of every (variant, batch size) of ``plan``, each round starting one
    further along (the machine's drift falls on all alike)."""
    from helpers.study.autotune import interleaved

    rows: list[dict[str, Any]] = []
    for repeat in range(rounds if plan else 0):
        for item, size in interleaved(plan, repeat):
            base = {**_base("encode", item, size), "repeat": repeat}
            if time.monotonic() > deadline:
                rows.append({**base, "skipped": "budget"})
                continue
            try:
                rows.append(_encode_once(item, size, texts, shapes, base, ceilings))
            except Exception as exc:
                rows.append({**base, "skipped": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def _encode_once(item: Loaded, size: int, texts: list[str], shapes: _Shapes,
                 base: dict[str, Any], ceilings: dict[str, float]) -> dict[str, Any]:
    workload = replace(item.workload, batch_size=size)
    cpu, wall = time.process_time(), time.perf_counter()
    workload.process(item.model, texts)  # (its vectors come back to the host: the card is done)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    phases = workload.phases(item.model) or {}
    return {**_rates(base, len(texts), wall, shapes.figures(size, item.unpadded), ceilings),
            "cpu_s": cpu, **{f"{phase}_s": s for phase, s in phases.items()}}
