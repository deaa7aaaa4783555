"""What a worker loads: the model of an EmbeddingWorkload's options on its path (``load_model``:
the feeder feeding the torch or onnx card, or ``encode`` and why: ``why_encode``), its variant
checked by the quality guard (``guarded``), or a simulated card fed (``load_simulated``); the
tokenizer (the word cache in front of the Rust tokenizer where it vouches for it), the feeder and
the card put together as a ``FedModel``; and how a worker tokenizes (``tokenizing_for``)."""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from helpers.engine.contract.protocol import OptionRefused
from helpers.workloads.embedding.cards.simulated import (CardModel, CardQueue, SimulatedCard,
                                                         parse_card, scale_for)
from helpers.workloads.embedding.encode_path import (PhaseClock, TokenizeAhead, TokenOrder,
                                                     tokenizer_name)
from helpers.workloads.embedding.feeder import Feeder, FedModel, available_cores
from helpers.workloads.embedding.model import (ARCHITECTURE, WARMUP_TEXT,
                                               load_sentence_transformer, longest_input,
                                               read_model, resolve_prompt)
from helpers.workloads.embedding.runtimes import (OnnxEncoder, Quality, QualityRefused,
                                                  check_variant, compile_transformer, cosines,
                                                  exported, guard_texts, pinned, torch_dtype)
from helpers.workloads.embedding.rust_tokenizer import RustTokenizer
from helpers.workloads.embedding.word_cache import WordCache, why_not


def tokenizer_for(rust: RustTokenizer, word_cache: bool) -> tuple[Any, str]:
    """What the feeder tokenizes with, and in words: the word cache where it vouches for the
    tokenizer's rules (``word_cache``), else the Rust tokenizer and why."""
    if not word_cache:
        return rust, "the Rust tokenizer (word_cache=False)"
    reason = why_not(rust.rust)
    if reason is None:
        try:
            return WordCache(rust), "the word cache, the Rust tokenizer on a miss"
        except ValueError as exc:
            reason = str(exc)
    return rust, f"the Rust tokenizer (no word cache: {reason})"


PROCESSES_PER_CARD = 8  # tokenizing processes a worker on a card starts at most by default: the
# word cache tokenizes about 35,000 texts/s on a core here, the Rust tokenizer about 9,000; MiniLM
# runs at 78,000 eager on the H200, 99,000 compiled, and with graphs should pass 150,000


def default_processes(card: bool, cores: int) -> int:
    """Tokenizing processes a worker beside a ``card`` (an accelerator, or a simulated card) runs
    where no tokenizing layout is given: its ``cores`` (its share of the node's: the engine's
    WorkerInfo.threads beside a card) less the one its own thread collates and launches on,
    PROCESSES_PER_CARD at most; none on a CPU (the forward pass has the cores) or with one core.
    Processes, not threads: on the H200's 16 cores, threads in one process fed the simulated
    card 16 %, processes 44 % (issue 58); bench feed's card section: the simulated H200 fed 93 %
    busy by any layout tokenizing with the word cache, processes at 1.2 card seconds per CPU
    second against 1.5 for one thread, but only processes scale past the one core a thread of
    Python holds."""
    return min(cores - 1, PROCESSES_PER_CARD) if card and cores > 1 else 0


def tokenizing_for(threads: int | None, processes: int | None, card: bool,
                   cores: int) -> tuple[int, int]:
    """The (threads, processes) a worker tokenizes on, decided once for every card (the
    model's own, or a simulated one: the same feeder, the same defaults): the layout given
    (``threads`` or ``processes``), else beside a ``card`` processes on its ``cores``
    (``default_processes``), where none (a CPU, one core) the worker's own thread: the forward
    pass has a CPU's cores, and the word cache runs in Python, where threads would queue for
    the GIL. Processes tokenize for the worker's one thread."""
    if threads is None and processes is None:
        processes = default_processes(card, cores)
    return (1 if processes else threads or 1, processes or 0)


def fed(model: Any, card: Any, threads: int | None, device: str,
        word_cache: bool, processes: int | None = None, cores: int | None = None) -> FedModel:
    """A SentenceTransformer's tokenizer (as ``encode`` truncates it) feeding ``card``
    (``threads``, ``processes``: tokenizing threads or processes, None: the defaults for
    ``device`` on the worker's ``cores``, None: every core of this node)."""
    rust = RustTokenizer.of(model.tokenizer, int(model.max_seq_length))
    tokenizer, said = tokenizer_for(rust, word_cache)
    feeder = Feeder(tokenizer, card, *tokenizing_for(threads, processes, device != "cpu",
                                                      cores or available_cores()))
    loaded = FedModel(feeder, model)
    loaded.tokenizer_said = said
    return loaded


def load_simulated(path: str, card: str, card_cores: int | None, device: str,
                   cards: str, threads: int | None, max_length: int | None = None,
                   word_cache: bool = True, processes: int | None = None,
                   graphs: int | None = None, cores: int | None = None) -> FedModel:
    """The tokenizer and architecture of the model at ``path`` (a folder, or a name on the
    hub), feeding the simulated ``card`` that every worker labelled ``device`` shares (its
    queue in ``cards``); ``max_length``: tokens read of each text (None: the model's own);
    ``graphs``: the batch size, for a card that replays CUDA graphs (None: eager);
    ``threads``, ``processes``: tokenizing threads or processes, neither: a real card's
    defaults on the worker's ``cores`` (its share of the node's; None: every core here)."""
    config, rust = read_model(path, max_length)
    here = available_cores()
    cost = CardModel(parse_card(card), *(int(config[name]) for name in ARCHITECTURE),
                     scale_for(card_cores, here),
                     (graphs, rust.max_length) if graphs is not None else None)
    queue = CardQueue(cost, os.path.join(cards, device.replace(":", "-").replace("/", "-")))
    scaled = f", scaled to {here} of {card_cores} cores" if card_cores else ""
    simulated = SimulatedCard(queue, int(config["hidden_size"]),
                              f"simulated {card}{scaled}"
                              f"{' (CUDA graphs)' if graphs is not None else ''}")
    tokenizer, said = tokenizer_for(rust, word_cache)
    loaded = FedModel(Feeder(tokenizer, simulated,
                             *tokenizing_for(threads, processes, True, cores or here)))
    loaded.tokenizer_said = said
    return loaded


def load_model(workload: Any, device: str, threads: int) -> Any:
    """The model of ``workload`` (an EmbeddingWorkload: its options) as ``device``'s worker runs
    it, on ``threads`` (a CPU's threads, or beside a card its share of the node's cores): its
    options applied, warmed, on its path (the feeder feeding the torch or onnx card, or
    ``encode``: ``why_encode``), its variant (a precision other than fp32, onnx, compile, CUDA
    graphs) checked by the quality guard against float32 PyTorch (``guarded``)."""
    check_variant(workload.precision, workload.runtime, device)
    model = load_sentence_transformer(workload.model, device, threads)
    if workload.max_seq_length is not None:
        most = longest_input(model)
        if most is not None and workload.max_seq_length > most:
            raise OptionRefused(f"max_seq_length={workload.max_seq_length}: the model reads at "
                                f"most {most} tokens")
        model.max_seq_length = workload.max_seq_length
    model.gpufeed_prompt = resolve_prompt(model, workload.prompt, workload.prompt_name,
                                          workload.task)
    workload.outputs(model)  # (a truncate_dim or ranges wider than the model: said now)
    model.encode([WARMUP_TEXT], batch_size=1, show_progress_bar=False)
    why = why_encode(workload, model)
    if workload.runtime != "torch":
        return _load_onnx(workload, model, device, threads, why)
    graphs = workload.cuda_graphs and why is None and device.startswith("cuda")
    graphs_said = _graphs_said(workload.cuda_graphs, graphs, why, device)
    variant = workload.precision != "fp32" or workload.compile or graphs or workload.unpadded
    reference = _reference(workload, model) if variant else None
    if variant:
        model.to(torch_dtype(workload.precision))
        if workload.compile:
            compile_transformer(model)
    if why is None:
        from helpers.workloads.embedding.cards.torch_card import TorchCard

        try:
            card = TorchCard(model, device, workload.normalize, workload.truncate_dim,
                             pinned=workload.pin_memory, half_rows=workload.stored == "float16",
                             graphs=graphs, batch_size=workload.batch_size,
                             unpadded=workload.unpadded)
        except ValueError as exc:
            raise OptionRefused(str(exc)) from exc  # (unpadded: a model it cannot run)
        card.capture_ahead()  # (with graphs: the full batches' buckets, in the load)
        loaded = _fed(workload, model, card, device, threads)
        loaded.gpufeed_graphs = graphs_said
        return guarded(workload, loaded, reference, device) if variant else loaded
    if workload.unpadded:
        raise OptionRefused(f"unpadded: the torch card's; this model runs through encode "
                            f"({why})")
    model.gpufeed_encode = why
    model.gpufeed_graphs = graphs_said
    if variant:
        guarded(workload, model, reference, device)
    model.gpufeed_order = TokenOrder(model)
    name = tokenizer_name(model)
    if workload.pin_memory and device.startswith("cuda"):
        setattr(model, name, pinned(getattr(model, name), device))
    if workload.tokenize_ahead:
        model.gpufeed_ahead = TokenizeAhead(getattr(model, name))
        setattr(model, name, model.gpufeed_ahead)
    model.gpufeed_phases = PhaseClock(model, device.startswith("cuda"))
    return model


def _load_onnx(workload: Any, model: Any, device: str, threads: int, why: str | None) -> Any:
    """``model`` exported to ONNX (runtime onnx, onnx-int8), fed to the onnx card, or run
    through ``encode`` where ``why`` says so, guarded."""
    check_exportable(workload, model)
    reference = _reference(workload, model)
    path = exported(model, workload.runtime)
    if why is None:
        from helpers.workloads.embedding.cards.onnx_card import OnnxCard

        return guarded(workload, _fed(workload, model, OnnxCard(
            path, threads, int(model.get_embedding_dimension()), workload.normalize,
            workload.truncate_dim, f"onnx ({workload.runtime}) on {device}"),
            "cpu", threads), reference, device)  # (onnxruntime's CPU provider computes: the
        # tokenizing defaults of a CPU, whatever the label, mps say)
    encoder = OnnxEncoder(model, path, threads)
    encoder.gpufeed_prompt, encoder.max_seq_length = \
        model.gpufeed_prompt, model.max_seq_length  # (what process and report read)
    encoder.gpufeed_encode = why
    return guarded(workload, encoder, reference, device)


def _graphs_said(asked: bool, graphs: bool, why: str | None, device: str) -> str | None:
    """What the worker's report says of ``cuda_graphs`` (None: not ``asked`` for)."""
    if not asked:
        return None
    if graphs:
        return "each batch replayed from its bucket's graph"
    if why is not None:
        return "skipped: the model runs through encode, which has no graphs"
    return f"skipped: CUDA graphs replay CUDA kernels; this device is {device}"


def why_encode(workload: Any, model: Any) -> str | None:
    """Why ``model`` runs through ``encode`` and not the feeder (None: the feeder runs it):
    ``feeder=False``, ``tokenize_ahead`` (an option of ``encode``'s path), or what the card
    does not know of the model (``cards.torch_card.unsupported``)."""
    if not workload.feeder:
        return "feeder=False"
    if workload.tokenize_ahead:
        return "tokenize_ahead=True (an option of the encode path)"
    from helpers.workloads.embedding.cards.torch_card import unsupported

    why = unsupported(model, model.gpufeed_prompt, workload.task)
    if why is None:
        try:
            RustTokenizer.of(model.tokenizer, model.max_seq_length)
        except Exception as exc:  # noqa: BLE001 (a custom pre-tokenizer, say: encode's)
            why = f"its tokenizer cannot be copied for the feeder ({type(exc).__name__}: " \
                  f"{exc})"
    return why


def _fed(workload: Any, model: Any, card: Any, device: str, threads: int) -> FedModel:
    """``model``'s tokenizer feeding ``card`` on the worker's ``threads`` (beside a card: its
    share of the node's cores, which its tokenizing defaults take), warmed (its first batch
    pays for allocations, as ``encode``'s did)."""
    loaded = fed(model, card, workload.tokenize_threads, device, workload.word_cache,
                 workload.tokenize_processes, threads)
    loaded.gpufeed_prompt = model.gpufeed_prompt
    loaded.strip_texts = not hasattr(model, "preprocess")  # (sentence-transformers before 6
    # strips each text, and lower-cases it where its transformer says do_lower_case, in
    # Python; 6 does neither, and moves do_lower_case into the Rust tokenizer)
    loaded.lower_texts = loaded.strip_texts and bool(getattr(model[0], "do_lower_case", False))
    loaded.encode([WARMUP_TEXT], batch_size=1)
    return loaded


def check_exportable(workload: Any, model: Any) -> None:
    """OptionRefused where the workload's options need more of the model than its exported
    modules give (runtime onnx puts the prompt before each text and cuts the dimensions
    itself): a pooling that leaves the prompt's tokens out, a model that routes by task."""
    runtime = workload.runtime
    if model.gpufeed_prompt and any(getattr(module, "include_prompt", True) is False
                                    for module in model):
        raise OptionRefused(f"runtime={runtime!r} with a prompt: this model's pooling "
                            f"leaves the prompt's tokens out, which its exported modules "
                            f"cannot; run it with runtime='torch'")
    if workload.task is not None and any(type(module).__name__ == "Router" for module in model):
        raise OptionRefused(f"runtime={runtime!r} with task={workload.task!r}: this model "
                            f"routes each text by its task, which its exported modules "
                            f"cannot; run it with runtime='torch'")


def _reference(workload: Any, model: Any) -> np.ndarray:
    """float32 PyTorch's embeddings of the guard's texts (the model not yet changed; cut to
    ``truncate_dim``, as the fed path's card cuts them)."""
    return model.encode(guard_texts(), batch_size=workload.batch_size, show_progress_bar=False,
                        truncate_dim=workload.truncate_dim)


def guarded(workload: Any, variant: Any, reference: np.ndarray, device: str) -> Any:
    """``variant`` (a model, as it will run) once the quality guard has passed; QualityRefused
    with the numbers if it fails. Its time is the variant's first calls: a compiled model's
    compiling."""
    started = time.perf_counter()
    got = variant.encode(guard_texts(), batch_size=workload.batch_size,
                         show_progress_bar=False, truncate_dim=workload.truncate_dim)
    variant.gpufeed_guard_s = time.perf_counter() - started
    found = cosines(reference, np.asarray(got, dtype=np.float32))
    quality = Quality(float(found.mean()), float(found.min()), len(found))
    variant.gpufeed_quality = quality
    if not quality.passes(*workload.guard):
        raise QualityRefused(
            f"precision={workload.precision!r} runtime={workload.runtime!r}"
            f"{' compile=True' if workload.compile else ''}"
            f"{' cuda_graphs=True' if workload.cuda_graphs else ''}"
            f"{' unpadded=True' if workload.unpadded else ''} on {device}: its "
            f"embeddings of the guard's {quality.texts} texts differ from float32 "
            f"PyTorch's: mean cosine {quality.mean:.4f} (needs >= {workload.guard[0]}), least "
            f"{quality.min:.4f} (needs >= {workload.guard[1]}): refused, not used")
    return variant
