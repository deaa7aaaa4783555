"""What a worker loads for ``EmbeddingWorkload(card=...)``: the model's tokenizer and
configuration (no weights, no torch), a ``Feeder`` and the shared simulated ``Card``."""
from __future__ import annotations

import json
import os
import threading
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
        counts, phases = self.feeder.run(texts, batch_size, batch_tokens)
        self._local.counts, self._local.phases = counts.as_dict(), phases
        return {"embeddings": np.zeros((len(texts), self.dim), dtype=np.float32)}

    def take(self) -> dict[str, float]:
        return dict(getattr(self._local, "phases", {}))

    def take_counts(self) -> dict[str, int]:
        return dict(getattr(self._local, "counts", {}))


def _config_file(path: str) -> Path | None:
    """The model's sentence_bert_config.json: in its folder, else from the hub (its cache);
    None where it has none."""
    own = Path(path) / "sentence_bert_config.json"
    if own.is_file() or Path(path).is_dir():
        return own if own.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(path, "sentence_bert_config.json"))
    except Exception:  # noqa: BLE001 (no such file, or offline: the tokenizer's length)
        return None


def max_seq_length(path: str, tokenizer: Any, config: Any) -> int:
    """The length sentence-transformers truncates to: the model's sentence_bert_config.json
    (its folder's, or the hub's), else the tokenizer's, capped by the model's positions."""
    own = _config_file(path)
    if own is not None:
        found = json.loads(own.read_text(encoding="utf-8")).get("max_seq_length")
        if found:
            return int(found)
    return int(min(tokenizer.model_max_length,
                   getattr(config, "max_position_embeddings", tokenizer.model_max_length)))


def load_simulated(path: str, card: str, card_cores: int | None, device: str,
                   cards: str, threads: int | None) -> SimulatedModel:
    """The tokenizer and configuration of the model at ``path`` (a folder, or a name on the hub),
    on the simulated ``card`` that every worker labelled ``device`` shares (its queue in
    ``cards``)."""
    from transformers import AutoConfig, AutoTokenizer

    config, tokenizer = AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    here = available_cores()
    cost = CardModel(parse_card(card), config.num_hidden_layers, config.hidden_size,
                     config.intermediate_size, scale_for(card_cores, here))
    shared = Card(cost, os.path.join(cards, device.replace(":", "-").replace("/", "-")))
    feeder = Feeder(RustTokenizer(tokenizer, max_seq_length(path, tokenizer, config)), shared,
                    threads or here)
    scaled = f", scaled to {here} of {card_cores} cores" if card_cores else ""
    return SimulatedModel(feeder, int(config.hidden_size), f"simulated {card}{scaled}")
