"""What a worker loads for ``EmbeddingWorkload(card=...)``: the model's tokenizer and
configuration (no weights, no torch, no transformers), a ``Feeder`` and the shared simulated
``Card``."""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from helpers.workloads.cards import Card, CardModel, parse_card, scale_for
from helpers.workloads.feed import Feeder, RustTokenizer, available_cores


class SimulatedModel:
    """A model whose forward pass is a simulated card's (helpers.workloads.cards)."""

    def __init__(self, feeder: Feeder, dim: int, label: str) -> None:
        self.feeder, self.dim, self.label = feeder, dim, label
        self._local = threading.local()
        self.gpufeed_phases = self  # what EmbeddingWorkload.phases and counts read

    def get_embedding_dimension(self) -> int:
        return self.dim

    def process(self, texts: list[str], batch_size: int,
                batch_tokens: int | None) -> dict[str, np.ndarray]:
        return self.launch(texts, batch_size, batch_tokens)()

    def launch(self, texts: list[str], batch_size: int,
               batch_tokens: int | None) -> Callable[[], dict[str, np.ndarray]]:
        """Hand ``texts`` to the card; what waits for it and gives their rows (zeros)."""
        launched = self.feeder.launch(texts, batch_size, batch_tokens)

        def finish() -> dict[str, np.ndarray]:
            self.feeder.finish(launched)
            self._local.counts, self._local.phases = launched.counts.as_dict(), launched.phases
            return {"embeddings": np.zeros((len(texts), self.dim), dtype=np.float32)}
        return finish

    def take(self) -> dict[str, float]:
        return dict(getattr(self._local, "phases", {}))

    def take_counts(self) -> dict[str, int]:
        return dict(getattr(self._local, "counts", {}))


UNBOUNDED = 2**31 - 1  # the length of a model that says none (transformers': "very large")
ARCHITECTURE = ("num_hidden_layers", "hidden_size", "intermediate_size")  # what the cost
# model reads of config.json (a model that names them otherwise is read through transformers)


def _model_file(path: str, name: str) -> Path | None:
    """The model's file ``name``: in its folder, else from the hub (its cache); None where it
    has none."""
    own = Path(path) / name
    if own.is_file() or Path(path).is_dir():
        return own if own.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(path, name))
    except Exception:  # noqa: BLE001 (no such file, or offline)
        return None


def _json(path: str, name: str) -> dict[str, Any]:
    found = _model_file(path, name)
    return json.loads(found.read_text(encoding="utf-8")) if found is not None else {}


def max_seq_length(path: str, model_max_length: float, positions: int | None) -> int:
    """The length sentence-transformers truncates to: the model's sentence_bert_config.json
    (its folder's, or the hub's), else the tokenizer's, capped by the model's positions."""
    found = _json(path, "sentence_bert_config.json").get("max_seq_length")
    if found:
        return int(found)
    return int(min(model_max_length, positions or model_max_length, UNBOUNDED))


def read_model(path: str, max_length: int | None = None
               ) -> tuple[dict[str, Any], RustTokenizer]:
    """The model's architecture (ARCHITECTURE) and its tokenizer, truncating as
    sentence-transformers does, read from its files (config.json, tokenizer.json,
    tokenizer_config.json, special_tokens_map.json) without transformers, whose import (and
    torch's, which it brings) costs each worker 4 s here; a model without a tokenizer.json, or
    whose config.json names its sizes otherwise, through transformers. The ids are
    sentence-transformers' where tokenizer.json is the whole tokenizer (tests/test_feed.py:
    the embedded MiniLM); transformers may still change a normalizer from tokenizer_config.json
    (``do_lower_case``, ``add_prefix_space``), which a simulated card only sees in its token
    counts. ``max_length``: tokens read of each text instead of the model's own
    (``EmbeddingWorkload(max_seq_length=...)``)."""
    config, settings = _json(path, "config.json"), _json(path, "tokenizer_config.json")
    tokenizer_file = _model_file(path, "tokenizer.json")
    if tokenizer_file is None or not all(name in config for name in ARCHITECTURE):
        from transformers import AutoConfig, AutoTokenizer

        auto, tokenizer = AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        length = max_length or max_seq_length(path, tokenizer.model_max_length,
                                              getattr(auto, "max_position_embeddings", None))
        return ({name: getattr(auto, name) for name in ARCHITECTURE},
                RustTokenizer.of(tokenizer, length))
    from tokenizers import Tokenizer

    rust = Tokenizer.from_file(str(tokenizer_file))
    pad = settings.get("pad_token") or _json(path, "special_tokens_map.json").get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
    pad_id = rust.token_to_id(pad) if pad else None
    length = max_length or max_seq_length(
        path, float(settings.get("model_max_length", float("inf"))),
        config.get("max_position_embeddings"))
    return config, RustTokenizer(rust, int(pad_id or 0), length)


def load_simulated(path: str, card: str, card_cores: int | None, device: str,
                   cards: str, threads: int | None,
                   max_length: int | None = None) -> SimulatedModel:
    """The tokenizer and architecture of the model at ``path`` (a folder, or a name on the
    hub), on the simulated ``card`` that every worker labelled ``device`` shares (its queue in
    ``cards``); ``max_length``: tokens read of each text (None: the model's own)."""
    config, tokenizer = read_model(path, max_length)
    here = available_cores()
    cost = CardModel(parse_card(card), *(int(config[name]) for name in ARCHITECTURE),
                     scale_for(card_cores, here))
    shared = Card(cost, os.path.join(cards, device.replace(":", "-").replace("/", "-")))
    feeder = Feeder(tokenizer, shared, threads or here)
    scaled = f", scaled to {here} of {card_cores} cores" if card_cores else ""
    return SimulatedModel(feeder, int(config["hidden_size"]), f"simulated {card}{scaled}")
