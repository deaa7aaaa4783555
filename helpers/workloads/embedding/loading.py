"""What a worker loads to feed a card: the tokenizer (the word cache in front of the Rust
tokenizer where it vouches for it), the feeder, and the card, put together as a ``FedModel``;
and which path a model takes (the feeder, or ``encode`` and why)."""
from __future__ import annotations

import os
from typing import Any

from helpers.workloads.embedding.cards.simulated import (CardModel, CardQueue, SimulatedCard,
                                                         parse_card, scale_for)
from helpers.workloads.embedding.feeder import Feeder, FedModel, available_cores
from helpers.workloads.embedding.rust_tokenizer import RustTokenizer
from helpers.workloads.embedding.model import ARCHITECTURE, read_model
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
