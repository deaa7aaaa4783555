"""The embedding workload: what a user asks for (the model, its options, how it runs), checked
where it is given; the ways the tuner may try; what a worker's model does with its records, and
what the output holds and records.

A worker's model is loaded by ``loading`` on one of two paths (the package's docstring draws
them): the feeder feeding a card (the torch card, the onnx card, a simulated card), for every
model whose modules the card knows; and sentence-transformers' own ``encode`` (``encode_path``)
for the others, the run saying why.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.protocol import UNRECORDED, OptionRefused, OutputSpec
from helpers.workloads.embedding.encode_path import encode_order
from helpers.workloads.embedding.feeder import FedModel
from helpers.workloads.embedding.model import (DEFAULT_MODEL, TASKS, default_model_path,
                                               model_identity)
from helpers.workloads.embedding.runtimes import (GUARD_MEAN, GUARD_MIN, PRECISIONS, RUNTIMES,
                                                  OnnxEncoder, check_variant)
from helpers.workloads.embedding.stored import check_stored, stored_form, stored_spec


def _runs(precision: str, runtime: str, device: str) -> bool:
    try:
        check_variant(precision, runtime, device)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class EmbeddingWorkload:
    """Embed text records with a sentence-transformers model.

    ``model``: a model name on the hub or a local path; None is the embedded all-MiniLM-L6-v2.
    ``batch_size``: texts per forward pass. ``normalize``: unit-length embeddings.
    ``max_chars``: longer texts are rejected (the model reads only its first few hundred tokens,
    so a megabyte of text costs tokenizing time for nothing: chunk documents before embedding
    them). Empty or blank texts are rejected too.

    How it runs. ``precision`` (fp32, bf16, fp16: CUDA only; the weights cast) and ``runtime``
    (torch, onnx, onnx-int8: CPU only): helpers.workloads.embedding.runtimes; any variant but
    fp32 torch is first checked against fp32 torch on a fixed sample in the worker that loads
    it, and refused (QualityRefused, with the numbers) if its mean or least cosine is below
    ``guard``. ``compile``: ``torch.compile`` the transformer (runtime torch; compiled and
    guarded in the worker's load, so its cost is spin-up). ``pin_memory``: on CUDA devices,
    batches go through pinned host memory without blocking (ignored on a CPU).
    ``cuda_graphs``: on CUDA devices, the torch card replays each batch's pass from a CUDA
    graph of its padded shape, one launch for the pass (helpers.workloads.embedding.cards.graphs;
    guarded like a variant; on a CPU, or for a model that runs through ``encode``, skipped, and
    the worker's report says why). ``unpadded``: the torch card runs the transformer on each
    batch's real tokens alone, attention over each text's span (flash ``varlen_attn`` on CUDA
    in fp16/bf16; helpers.workloads.embedding.cards.unpadded): transformers' BertModel only,
    else refused with the reason; guarded like a variant.

    The feeder (helpers.workloads.embedding.feeder; the package's docstring draws both paths):
    ``feeder`` (default True) feeds the model's modules with batches the feeder tokenizes once,
    on ``tokenize_threads`` threads per worker, or in ``tokenize_processes`` processes of the
    worker's own (helpers.workloads.embedding.tokenizing: what scales the word cache, which runs
    in Python); neither given: one thread on a CPU, beside a GPU or a simulated card processes
    on the worker's share of the node's cores (``loading.default_processes``: one decision for
    every card, ``loading.tokenizing_for``);
    False runs every model through ``encode``, the reference path, as a model the feeder cannot
    run does. ``batch_tokens``: batches hold as many texts as fit that
    many padded tokens, at most ``batch_size`` (None: ``batch_size`` texts). ``word_cache``:
    texts the rules of a BERT WordPiece tokenizer vouch for are tokenized from a cache of words
    (helpers.workloads.embedding.word_cache: the tokenizer's own ids, about a fifth of its CPU);
    False: the Rust tokenizer for all. ``tokenize_ahead``: on ``encode``'s path, tokenize the
    next batch in a helper thread while the current one runs (TokenizeAhead; it puts the model
    on that path).

    ``card``: run on a simulated card (helpers.workloads.embedding.cards.simulated: "h100",
    "a100", "l4") instead of the model's forward pass: the model's own tokenizer and the same
    feeder, the forward pass a wait of the card's cost model, the embeddings zeros of the
    model's width (the output says it is simulated); device strings are then labels, several
    entries of one label sharing that card. ``card_cores``: scale the card to the cores a real
    machine gives each GPU (this machine's cores ÷ ``card_cores`` of its speed; None: full).
    With ``cuda_graphs``, the simulated card computes each batch as its graph's bucket and its
    launch costs a few calls instead of one a kernel (an estimate: cards.simulated).

    What ``encode`` takes, named as it names them (``helpers.embed`` checks that the vectors
    are ``encode``'s): ``prompt``: a text put before every record ("query: "); ``prompt_name``:
    one of the model's own prompts (its config's ``prompts``); ``task``: "query" or "document",
    as ``encode_query`` / ``encode_document`` (the model's prompt of that name, where it has
    one, and the task routed to a model that routes by it); none of these: the model's default
    prompt, if any. ``max_seq_length``: tokens read of each text (the model's own if None;
    fewer is faster, and changes the vectors of longer texts). ``truncate_dim``: the first that
    many dimensions (Matryoshka models), normalized after the cut with ``normalize``.
    ``stored``: the precision the embeddings are stored in (helpers.workloads.embedding.stored:
    float32, float16, int8, uint8, binary, ubinary; ``precision`` is the one the model computes
    in); int8 and uint8 are cut with ``ranges``, ``(2, dim)`` calibration ranges
    (``helpers.calibration_ranges``).
    Output: ``embeddings`` ``[n, dim]`` of ``stored`` (binary forms: ``[n, dim / 8]``).
    """

    model: str | None = None
    batch_size: int = 32
    normalize: bool = False
    max_chars: int = 100_000
    tokenize_ahead: bool = False
    precision: str = "fp32"
    runtime: str = "torch"
    guard: tuple[float, float] = (GUARD_MEAN, GUARD_MIN)
    compile: bool = False
    cuda_graphs: bool = False
    unpadded: bool = False
    pin_memory: bool = True
    word_cache: bool = True
    feeder: bool = True
    card: str | None = None
    card_cores: int | None = None
    tokenize_threads: int | None = None
    tokenize_processes: int | None = None
    batch_tokens: int | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    task: str | None = None
    max_seq_length: int | None = None
    truncate_dim: int | None = None
    stored: str = "float32"
    ranges: Any = field(default=None, repr=False)  # (2, dim) for stored int8 / uint8
    name: str = "embedding"
    requires_hardware: bool = field(default=True, init=False)  # False on a simulated card
    cards: str | None = field(default=None, init=False, repr=False, compare=False)  # the
    # simulated cards' queues (a folder every worker copy shares)

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, (str, Path)):
            raise ValueError(f"model: expected a model name or path (or None for the embedded "
                             f"default), got {self.model!r}")
        if self.model is not None:
            object.__setattr__(self, "model", str(self.model))
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or self.batch_size < 1:
            raise ValueError(f"batch_size: expected a positive integer, got {self.batch_size!r}")
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int) \
                or self.max_chars < 1:
            raise ValueError(f"max_chars: expected a positive integer, got {self.max_chars!r}")
        for option in ("tokenize_ahead", "compile", "cuda_graphs", "pin_memory", "word_cache",
                       "feeder", "unpadded"):
            if not isinstance(getattr(self, option), bool):
                raise ValueError(f"{option}: expected True or False, got "
                                 f"{getattr(self, option)!r}")
        check_variant(self.precision, self.runtime, "cpu" if self.precision != "fp16" else "cuda")
        if self.tokenize_ahead and self.runtime != "torch":
            raise ValueError(f"tokenize_ahead: for runtime='torch' (runtime={self.runtime!r} "
                             f"tokenizes in its own loop)")
        if self.compile and self.runtime != "torch":
            raise ValueError(f"compile: torch.compile is for runtime='torch' (runtime="
                             f"{self.runtime!r} is compiled by onnxruntime already)")
        if self.cuda_graphs and self.runtime != "torch":
            raise ValueError(f"cuda_graphs: the torch card's (runtime={self.runtime!r} runs "
                             f"the model in onnxruntime)")
        off = self._off_feeder()
        if self.cuda_graphs and off:
            raise ValueError(f"cuda_graphs: the torch card's, on the feeder's path ({off} "
                             f"runs the model through its own encode)")
        if self.unpadded:
            self._check_unpadded()
        guard = tuple(self.guard) if isinstance(self.guard, (tuple, list)) else ()
        if len(guard) != 2 or not all(isinstance(g, (int, float)) and 0 < g <= 1 for g in guard):
            raise ValueError(f"guard: expected (mean, min) cosines in (0, 1], got {self.guard!r}")
        object.__setattr__(self, "guard", (float(guard[0]), float(guard[1])))
        self._check_encode_options()
        for option in ("card_cores", "tokenize_threads", "tokenize_processes", "batch_tokens"):
            value = getattr(self, option)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{option}: expected a positive integer or None, got {value!r}")
        if self.tokenize_processes is not None and (self.tokenize_threads or 1) > 1:
            raise ValueError(f"tokenize_threads={self.tokenize_threads} and tokenize_processes="
                             f"{self.tokenize_processes}: tokenize in threads or in processes, "
                             f"not both")
        object.__setattr__(self, "requires_hardware", self.card is None)  # (a card: labels)
        if self.card is None:
            if self.card_cores is not None:
                raise ValueError("card_cores: an option of a simulated card (card=h100, say)")
            if off:
                for option in ("tokenize_threads", "tokenize_processes", "batch_tokens"):
                    if getattr(self, option) is not None:
                        raise ValueError(f"{option}: an option of the feeder; with {off} the "
                                         f"model runs through its own encode")
            return
        from helpers.workloads.embedding.cards.simulated import parse_card

        object.__setattr__(self, "card", parse_card(self.card).name)
        if self.runtime != "torch" or self.precision != "fp32" or self.compile \
                or self.tokenize_ahead or not self.feeder or self.unpadded:
            raise ValueError(f"card={self.card!r}: a simulated card's speed is its profile's; "
                             f"precision, runtime, compile, tokenize_ahead, feeder=False and "
                             f"unpadded are a real model's options (cuda_graphs: its "
                             f"launches)")
        if self.prompt_name is not None or self.task is not None \
                or self.truncate_dim is not None or self.stored != "float32":
            raise ValueError(f"card={self.card!r}: a simulated card tokenizes what a model "
                             f"would (prompt= and max_seq_length= apply) but computes no "
                             f"vectors: prompt_name, task, truncate_dim and stored are the "
                             f"model's options (give the prompt's text with prompt=)")
        cards = tempfile.mkdtemp(prefix="gpufeed-cards-")  # shared by every worker copy
        object.__setattr__(self, "cards", cards)
        weakref.finalize(self, shutil.rmtree, cards, True)

    def _check_unpadded(self) -> None:
        """ValueError where ``unpadded`` cannot go with the other options."""
        said = f"runtime={self.runtime!r}" if self.runtime != "torch" else self._off_feeder()
        if said:
            raise ValueError(f"unpadded: the torch card's, on the feeder's path ({said} runs "
                             f"the model another way)")
        if self.cuda_graphs or self.compile:
            said = "cuda_graphs" if self.cuda_graphs else "compile"
            raise ValueError(f"unpadded: {said} runs the padded pass (its shapes are the "
                             f"padded batch's); choose one")

    def _off_feeder(self) -> str | None:
        """The option that puts the model on ``encode``'s path, in words (None: the feeder's)."""
        return "feeder=False" if not self.feeder else \
            "tokenize_ahead=True" if self.tokenize_ahead else None

    def _check_encode_options(self) -> None:
        """What ``encode`` is given, checked before any worker starts."""
        for option in ("prompt", "prompt_name"):
            value = getattr(self, option)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{option}: expected a string or None, got {value!r}")
        if self.prompt is not None and self.prompt_name is not None:
            raise ValueError(f"prompt={self.prompt!r} and prompt_name={self.prompt_name!r}: "
                             f"give one (sentence-transformers would use prompt and ignore "
                             f"prompt_name)")
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"task: expected one of {', '.join(TASKS)} or None, got "
                             f"{self.task!r}")
        for option in ("max_seq_length", "truncate_dim"):
            value = getattr(self, option)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{option}: expected a positive integer or None, got "
                                 f"{value!r}")
        object.__setattr__(self, "ranges", check_stored(self.stored, self.ranges))
        if self.ranges is not None and self.truncate_dim is not None \
                and len(self.ranges[0]) != self.truncate_dim:
            raise ValueError(f"ranges: {len(self.ranges[0])} dimensions, but truncate_dim="
                             f"{self.truncate_dim}: calibrate on the embeddings as stored")

    @property
    def imports(self) -> tuple[str, ...]:
        """What ``load`` imports (the fork server's preload): a simulated card's worker reads
        the tokenizer alone."""
        return ("tokenizers",) if self.card is not None else ("torch", "sentence_transformers")

    def check_devices(self, devices: tuple[str, ...]) -> None:
        """In the driver, before any worker starts: a device this variant cannot run on (fp16 on
        a CPU, onnx on a GPU) is a bad argument, not a worker's crash."""
        for device in devices:
            check_variant(self.precision, self.runtime, device, hardware=False)

    def load(self, device: str, threads: int) -> Any:
        """The model as ``device``'s worker runs it (helpers.workloads.embedding.loading: a
        simulated card fed, or the model on its path, its variant guarded)."""
        from helpers.workloads.embedding.loading import load_model, load_simulated

        if self.card is not None:
            if self.model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the default never needs the hub
            return load_simulated(self.model or default_model_path(), self.card,
                                  self.card_cores, device, self.cards, self.tokenize_threads,
                                  self.max_seq_length, self.word_cache, self.tokenize_processes,
                                  self.batch_size if self.cuda_graphs else None, threads)
        return load_model(self, device, threads)

    @staticmethod
    def _graphs_now(model: Any) -> str:
        """What the report says of the graphs: the load's word, and what they did so far (the
        guard's buckets, when the worker reports its load)."""
        graphs = getattr(getattr(model, "card", None), "graphs", None)  # (a FedModel's card)
        if graphs is None:
            return model.gpufeed_graphs
        counts = graphs.counts
        return f"{model.gpufeed_graphs}: {counts.captured} captured so far in " \
               f"{counts.capture_s:.2f} s, {counts.replayed} batches replayed"

    def variants(self, devices: list[str]) -> list[dict[str, Any]]:
        """The ways every one of ``devices`` can run the model, for the tuner's phase 0: each
        precision and runtime, the torch ones also compiled (only those when this workload
        compiles; only torch ones when it tokenizes ahead), and on CUDA devices each torch one
        also with CUDA graphs (only those when it asks for them); whether the guard passes each is
        found when its workers load it. None on a simulated card, whose speed is its profile's:
        what varies there is the CPU side feeding it (``tokenizing_variants``). Asked for
        ``unpadded``: the torch ones it goes with, eager, flash's precisions on CUDA."""
        if self.card is not None:
            return []
        if self.unpadded:
            cuda = any(device.startswith("cuda") for device in devices)
            return [{"precision": precision, "runtime": "torch", "compile": False}
                    for precision in PRECISIONS if not (cuda and precision == "fp32")
                    and all(_runs(precision, "torch", device) for device in devices)]
        graphs = (True,) if self.cuda_graphs else \
            (False, True) if self._feeds_cuda(devices) else (False,)
        ways = [(compiled, graphed) for compiled in ((True,) if self.compile else (False, True))
                for graphed in graphs]  # (graphs before a compile: seconds, not a minute)
        return [{"precision": precision, "runtime": runtime, "compile": compiled,
                 **({"cuda_graphs": True} if graphed else {})}
                for (compiled, graphed), precision, runtime in product(ways, PRECISIONS, RUNTIMES)
                if (runtime == "torch" or not (compiled or graphed or self.tokenize_ahead))
                and all(_runs(precision, runtime, device) for device in devices)]

    def tokenizing_variants(self, devices: list[str]) -> list[dict[str, Any]]:
        """The tokenizing layouts the tuner tries on the way its phase 0 picked, where the
        feeder feeds a card (a simulated one, or CUDA devices) and the workload names no layout
        of its own: the workload as given (a card's default: processes on each worker's share of
        the cores, ``loading.default_processes``, whatever the count of workers the later phases
        find), then tokenizing threads, one, half the cores and every core. None on a CPU,
        where the forward pass has the cores, or on ``encode``'s path (``feeder`` off,
        ``tokenize_ahead``)."""
        cards = self.card is not None or self._feeds_cuda(devices)
        if not cards or self.tokenize_threads is not None or self.tokenize_processes is not None:
            return []
        from helpers.workloads.embedding.feeder import available_cores
        from helpers.workloads.embedding.loading import default_processes

        cores = available_cores()
        return ([{}] if default_processes(True, cores) else []) + \
            [{"tokenize_threads": n} for n in sorted({1, max(1, cores // 2), cores})]

    def _feeds_cuda(self, devices: list[str]) -> bool:
        """Whether the feeder feeds the torch card on every one of ``devices``, CUDA devices
        (``feeder`` on, not ``tokenize_ahead``: the model's own path there)."""
        return bool(devices) and all(device.startswith("cuda") for device in devices) \
            and self._off_feeder() is None

    def report(self, model: Any) -> dict[str, Any]:
        """What a worker says of the model it loaded: its variant, and the guard's figures."""
        fed = isinstance(model, FedModel)
        path = {"path": f"feeder -> {model.label}", "tokenize_threads": model.feeder.threads,
                **({"tokenize_processes": model.feeder.processes}
                   if model.feeder.processes else {}),
                "tokenizer": model.tokenizer_said} if fed else \
            {"path": f"encode ({getattr(model, 'gpufeed_encode', None) or 'loaded elsewhere'})"}
        if self.card is not None:
            return {"card": model.label, **path}
        quality = getattr(model, "gpufeed_quality", None)
        guard_s = getattr(model, "gpufeed_guard_s", None)
        prompt = getattr(model, "gpufeed_prompt", None)
        length = getattr(model.model if fed else model, "max_seq_length", None)
        return {**path, "precision": self.precision, "runtime": self.runtime,
                **({"compile": True} if self.compile else {}),
                **({"cuda_graphs": self._graphs_now(model)}
                   if getattr(model, "gpufeed_graphs", None) else {}),
                **({"prompt": prompt} if prompt else {}),
                **({"max_seq_length": int(length)} if length else {}),
                **({"guard_mean_cosine": round(quality.mean, 6),
                    "guard_min_cosine": round(quality.min, 6)} if quality else {}),
                **({"guard_s": round(guard_s, 2)} if guard_s is not None else {})}

    def outputs(self, model: Any) -> dict[str, OutputSpec]:
        get_dim = getattr(model, "get_embedding_dimension", None) \
            or model.get_sentence_embedding_dimension  # renamed in sentence-transformers 6
        dim = int(get_dim())
        if self.truncate_dim is not None:
            if self.truncate_dim > dim:
                raise OptionRefused(f"truncate_dim={self.truncate_dim}: the model's embeddings "
                                    f"have {dim} dimensions")
            dim = self.truncate_dim
        if self.ranges is not None and len(self.ranges[0]) != dim:
            raise OptionRefused(f"ranges: {len(self.ranges[0])} dimensions, the embeddings "
                                f"stored {dim}: calibrate with this model (and truncate_dim)")
        return {"embeddings": stored_spec(self.stored, dim)}

    def check_record(self, record: Any) -> None:
        if not isinstance(record, str):
            raise TypeError(f"expected a text string, got {type(record).__name__}")
        if not record.strip():
            raise ValueError("empty text: nothing to embed")
        if not record.isascii():  # (O(1) for a str: only the others are walked)
            try:
                record.encode("utf-8")
            except UnicodeEncodeError as exc:  # a lone surrogate, as "\ud800" or a JSON
                # "\\ud800" escape reads: no tokenizer takes it, and retrying cannot help
                raise ValueError(f"the text is not valid UTF-8: {exc.reason} "
                                 f"{record[exc.start]!r} at character {exc.start:,}") from None
        if len(record) > self.max_chars:
            raise ValueError(f"text of {len(record):,} characters is longer than max_chars="
                             f"{self.max_chars:,}: split it into chunks first")

    def record_cost(self, record: str) -> float:
        """Characters: a proxy for tokens, so the reader can put texts of similar length
        together."""
        return float(len(record))

    def launches(self, model: Any) -> bool:
        """Whether ``launch`` hands records to a card without waiting (the feeder's model on a
        card that computes asynchronously, a GPU or a simulated card: yes; a CPU computes as it
        is fed, and sentence-transformers' ``encode`` waits for its results)."""
        return isinstance(model, FedModel) and model.asynchronous

    def launch(self, model: Any, records: list[Any]) -> Callable[[], dict[str, np.ndarray]]:
        """``process``, in two steps: the records handed to the card, then (the function this
        returns) the wait for it and the arrays."""
        finish = model.launch(self._prompted(model, records), self.batch_size, self.batch_tokens)
        return lambda: {"embeddings": stored_form(finish(), self.stored, self.ranges)}

    def _prompted(self, model: Any, records: list[str]) -> list[str]:
        """The texts as the model tokenizes them: its prompt first (``resolve_prompt``'s; a
        simulated card's: ``prompt``); stripped, and lower-cased where the transformer says so,
        for sentence-transformers before 6, which did that in Python before tokenizing."""
        prompt = getattr(model, "gpufeed_prompt", None) if self.card is None else self.prompt
        texts = records if not prompt else [prompt + record for record in records]
        if getattr(model, "strip_texts", False):
            texts = [text.strip() for text in texts]
            if getattr(model, "lower_texts", False):
                texts = [text.lower() for text in texts]
        return texts

    def process(self, model: Any, records: list[Any]) -> dict[str, np.ndarray]:
        if isinstance(model, FedModel):
            return self.launch(model, records)()
        clock = getattr(model, "gpufeed_phases", None)
        if clock is not None:
            clock.start()
        order = getattr(model, "gpufeed_order", None)
        if order is not None:  # batches by token count (TokenOrder)
            started = time.perf_counter()
            order.measure(records)
            if clock is not None:
                clock.add("tokenize", time.perf_counter() - started)
        ahead = getattr(model, "gpufeed_ahead", None)
        if ahead is not None:
            ordered = [records[i] for i in encode_order(model, records)]
            ahead.expect([ordered[i:i + self.batch_size]
                          for i in range(0, len(ordered), self.batch_size)])
        embeddings = self._encode(model, records)
        if clock is not None:
            clock.stop()
        return {"embeddings": stored_form(embeddings, self.stored, self.ranges)}

    def _encode(self, model: Any, records: list[str]) -> np.ndarray:
        """float32 embeddings of ``records``: ``encode`` with this workload's options (an
        OnnxEncoder runs the model's modules only: the prompt is put before each text here)."""
        prompt = getattr(model, "gpufeed_prompt", None)
        if isinstance(model, OnnxEncoder):
            texts = records if not prompt else [prompt + record for record in records]
            return model.encode(texts, batch_size=self.batch_size,
                                normalize_embeddings=self.normalize,
                                truncate_dim=self.truncate_dim)
        embeddings = model.encode(records, batch_size=self.batch_size, show_progress_bar=False,
                                  normalize_embeddings=self.normalize, convert_to_numpy=True,
                                  prompt=prompt, truncate_dim=self.truncate_dim,
                                  **({"task": self.task} if self.task is not None else {}))
        return np.asarray(embeddings, dtype=np.float32)

    def close(self, model: Any) -> None:
        """End what the model's load started beside it (the feeder's tokenizing threads or
        processes): the thread backend's call when its pool shuts down."""
        if isinstance(model, FedModel):
            model.close()

    def phases(self, model: Any) -> dict[str, float] | None:
        """The seconds this thread's last ``process`` spent tokenizing, in the forward pass and
        copying out (see PhaseClock); None for a model loaded elsewhere."""
        clock = model if isinstance(model, FedModel) else getattr(model, "gpufeed_phases", None)
        return None if clock is None else clock.take()

    def counts(self, model: Any) -> dict[str, int] | None:
        """The tokens this thread's last ``process`` computed and needed (padding: their
        ratio); None for a model loaded elsewhere."""
        clock = model if isinstance(model, FedModel) else getattr(model, "gpufeed_phases", None)
        clock = clock if clock is not None or not hasattr(model, "take_counts") else model  # (an
        # OnnxEncoder counts itself)
        return None if clock is None else clock.take_counts()

    def fingerprint(self) -> dict[str, Any]:
        """What decides the embeddings (and which texts are rejected): a resumed run must keep
        these, the model's files included (model_identity); batch size, tokenize_ahead and the
        guard may change."""
        workload = self.name if self.card is None else f"{self.name} on a simulated {self.card}"
        return {"workload": workload, "model": self.model or DEFAULT_MODEL,
                **model_identity(self.model),  # (two folders of one name, a moved revision)
                "normalize": self.normalize, "max_chars": self.max_chars,
                "precision": self.precision, "runtime": self.runtime,  # (variants never mix)
                "card": f"simulated {self.card}" if self.card else "none",  # (a simulated
                # card's zeros are never mixed with a model's rows; "none": an older output,
                # which did not record it, still resumes)
                **self._encode_options(fingerprint=True)}

    def identity(self, model: Any) -> dict[str, Any]:
        """The model's files as this worker found them (model_identity: a hub model it fetched
        itself, which the driver may never have, or another revision of it); none for a
        simulated card (its weights are seeded)."""
        return {} if self.card is not None else model_identity(self.model)

    def _encode_options(self, fingerprint: bool = False) -> dict[str, Any]:
        """The options of ``encode`` that change the vectors: those set, the calibration ranges
        as a float32 ``(2, dim)`` array. For the ``fingerprint``, every one (an unset one as a
        word in brackets, the ranges as their SHA-256) and, as UNRECORDED, each one unset: what
        an output written before these options existed was made with."""
        ranges = None if self.ranges is None else np.asarray(self.ranges, dtype=np.float32)
        options = {"prompt": self.prompt, "prompt_name": self.prompt_name, "task": self.task,
                   "max_seq_length": self.max_seq_length, "truncate_dim": self.truncate_dim,
                   "stored": self.stored, "ranges": ranges}
        if fingerprint:
            unset = {k: {"prompt": "(the model's default)", "max_seq_length": "(the model's own)",
                         "truncate_dim": "(every dimension)"}.get(k, "(none)")
                     for k in options}
            unset["stored"] = "float32"
            return {**{k: ("sha256:" + hashlib.sha256(v.tobytes()).hexdigest()[:16]
                           if isinstance(v, np.ndarray) else v if v is not None else unset[k])
                       for k, v in options.items()},
                    UNRECORDED: unset}  # (an output from before these options: all unset)
        options["stored"] = None if self.stored == "float32" else self.stored
        return {k: v for k, v in options.items() if v is not None}

    def attrs(self) -> dict[str, Any]:
        return {"workload": self.name, "model": self.model or DEFAULT_MODEL,
                "batch_size": self.batch_size, "normalize": self.normalize,
                "tokenize_ahead": self.tokenize_ahead,
                "max_chars": self.max_chars, "precision": self.precision,
                "runtime": self.runtime, "guard": list(self.guard), "compile": self.compile,
                "cuda_graphs": self.cuda_graphs,
                **({"unpadded": True} if self.unpadded else {}),
                "pin_memory": self.pin_memory, "feeder": self.feeder,
                "word_cache": self.word_cache, **self._encode_options(),
                **{k: v for k, v in (("card", f"simulated {self.card}" if self.card else None),
                                     ("card_cores", self.card_cores),
                                     ("tokenize_threads", self.tokenize_threads),
                                     ("tokenize_processes", self.tokenize_processes),
                                     ("batch_tokens", self.batch_tokens)) if v is not None}}
