"""The embedding workload: text records in, one vector each out, through a sentence-transformers
model (the embedded default: all-MiniLM-L6-v2, no network). Its rooms::

    workload.py      EmbeddingWorkload: the options, checked where given; the ways the tuner
                     tries; what the output holds and records
    model.py         the model: where it is, how it loads, what its files say, encode's options
    feeder.py        the feeding path: tokenize -> sort -> batch -> collate -> a card
    rust_tokenizer.py  the model's tokenizer as sentence-transformers calls it, without Python
    word_cache.py    below the bare tokenizer: words to ids for BERT's WordPiece
    tokenizing.py    tokenizing processes of a worker's own
    loading.py       what a worker loads: the model on its path (the feeder and its card,
                     a FedModel, or encode, and why), its variant guarded; a simulated card
    cards/           the last stage, behind one protocol: torch, onnx, simulated
    encode_path.py   sentence-transformers' own encode: the reference, and the path of a
                     model the feeder cannot run
    runtimes.py      precisions and runtimes, the ONNX export, the quality guard
    stored.py        the forms embeddings are stored in (float16, int8, binary, ...)

A worker's model takes one of two paths::

    records ─> prompt ─> Feeder ──────────────────────────────> card.submit ─> rows
                         (word cache or Rust tokenizer,          (torch on its device,
                          a pool of threads, batches by           onnx, or simulated)
                          tokens, collated into staging)
    records ─> model.encode (its own tokenizer and loop) ─────────────────────> rows

The first for every model whose modules the cards know (a Transformer, Pooling, Dense,
Normalize); the second for the others (a Router, an image or multimodal model), with
``feeder=False``, or ``tokenize_ahead``; the worker's report says which, and why.
"""
from __future__ import annotations

from helpers.workloads.embedding.encode_path import (PHASES, TokenizeAhead, encode_order,
                                                     tokenizer_name)
from helpers.workloads.embedding.model import (DEFAULT_MODEL, TASKS, WARMUP_TEXT,
                                               default_model_path, load_sentence_transformer,
                                               longest_input, resolve_prompt)
from helpers.workloads.embedding.workload import EmbeddingWorkload

__all__ = ["DEFAULT_MODEL", "PHASES", "TASKS", "WARMUP_TEXT", "EmbeddingWorkload",
           "TokenizeAhead", "default_model_path", "encode_order", "load_sentence_transformer",
           "longest_input", "resolve_prompt", "tokenizer_name"]
