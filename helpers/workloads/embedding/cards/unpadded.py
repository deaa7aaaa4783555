"""Unpadded attention: a BERT encoder's pass over a batch's real tokens only.

A batch padded to its longest text computes every padding token through every layer (in real
runs 1.2-1.45x the tokens the texts need, even sorted within a window: data/results/cpu/
card_feeding.csv, feed_bench.csv). As text-embeddings-inference does (its flash BERT,
``flash_attn_varlen`` over ``cu_seqlens``), the pass here packs the batch's real tokens into one
sequence: the embeddings, the linear layers, the layer norms and the feed-forward run on those
tokens alone, and attention runs on each text's own span. Then the rows go back to their padded
places (zeros at the padding), so that sentence-transformers' own pooling, dense and normalize
modules read them as they read the transformer's output.

Attention over the spans: on CUDA in float16 or bfloat16, torch's flash ``varlen_attn``
(``torch.nn.attention.varlen``, one kernel for the batch); elsewhere each text's span through
``scaled_dot_product_attention`` (a CPU's kernels take one text as well as a batch; on a CUDA
device in float32, no flash kernel runs, and a launch per text would cost more than the padding:
refused there). The pass is transformers' BertModel's (absolute positions, one text a row:
token type 0), which all-MiniLM-L6-v2, bge, e5 and gte-small use; any other model is refused,
with the reason (``unsupported``). The vectors are the padded pass's (tests/test_unpadded.py).
"""
from __future__ import annotations

import importlib.util
from typing import Any, Callable

import numpy as np

FLASH_DTYPES = ("float16", "bfloat16")  # what varlen_attn's flash kernel computes in


def unsupported(model: Any, device: str) -> str | None:
    """Why the unpadded pass cannot run ``model``'s transformer (a SentenceTransformer) on
    ``device`` (None: it can)."""
    bert = getattr(model[0], "auto_model", None)
    config = getattr(bert, "config", None)
    name = type(bert).__name__
    if name != "BertModel" or config is None:
        return f"its transformer is {name}, not transformers' BertModel"
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        return f"its positions are {config.position_embedding_type!r}, not absolute"
    if getattr(config, "is_decoder", False):
        return "its BERT is a decoder"
    layer = bert.encoder.layer[0]
    needed = ("attention.self.query", "attention.self.key", "attention.self.value",
              "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
              "intermediate.intermediate_act_fn", "output.dense", "output.LayerNorm")
    missing = [path for path in needed if _get(layer, path) is None] + [
        f"embeddings.{name}" for name in ("word_embeddings", "position_embeddings",
                                          "token_type_embeddings", "LayerNorm")
        if _get(bert.embeddings, name) is None]
    if missing:
        return (f"its BERT lacks {missing} (not laid out as transformers' BertModel and "
                f"BertLayer)")
    if device.startswith("cuda"):
        dtype = str(bert.embeddings.word_embeddings.weight.dtype).removeprefix("torch.")
        if dtype not in FLASH_DTYPES:
            return (f"on {device} its spans run through flash attention, which computes in "
                    f"float16 or bfloat16, not {dtype} (precision='fp16' or 'bf16')")
        if importlib.util.find_spec("torch.nn.attention.varlen") is None:
            return ("this torch has no torch.nn.attention.varlen (flash attention over packed "
                    "spans)")
    return None


def _get(module: Any, path: str) -> Any:
    for name in path.split("."):
        module = getattr(module, name, None)
    return module


def spans_attention(query: Any, key: Any, value: Any, starts: np.ndarray) -> Any:
    """Attention within each text's span of the packed tokens (``[tokens, heads, head_dim]``;
    ``starts``: the spans' bounds, one more than the texts), a text at a time."""
    import torch

    out = torch.empty_like(query)
    for start, end in zip(starts[:-1].tolist(), starts[1:].tolist()):
        span = slice(start, end)
        out[span] = torch.nn.functional.scaled_dot_product_attention(
            query[span].transpose(0, 1), key[span].transpose(0, 1),
            value[span].transpose(0, 1)).transpose(0, 1)
    return out


def flash_attention(query: Any, key: Any, value: Any, starts: np.ndarray) -> Any:
    """The same, in one flash kernel over the batch (CUDA, float16 or bfloat16)."""
    import torch
    from torch.nn.attention.varlen import varlen_attn

    bounds = torch.from_numpy(starts.astype(np.int32)).to(query.device, non_blocking=True)
    longest = int(np.diff(starts).max())
    return varlen_attn(query, key, value, bounds, bounds, longest, longest)


class UnpaddedBert:
    """A BertModel's pass over a batch's real tokens (the module docstring): ``bert``,
    transformers' model (its own weights and dtype); ``attention``: over the packed spans
    (``flash_attention`` on CUDA, ``spans_attention`` elsewhere: None chooses by ``device``)."""

    def __init__(self, bert: Any, device: str,
                 attention: Callable[[Any, Any, Any, np.ndarray], Any] | None = None) -> None:
        self.bert = bert
        self.heads = int(bert.config.num_attention_heads)
        self.attention = attention or (flash_attention if device.startswith("cuda")
                                       else spans_attention)

    def __call__(self, ids: Any, mask: Any, host_mask: np.ndarray) -> Any:
        """The transformer's token embeddings ``[texts, tokens, hidden]`` of a padded batch
        (``ids``, ``mask`` on the device; ``host_mask``: the mask on the host, where the spans
        are read without waiting for the device), zeros at the padding."""
        import torch

        lengths = host_mask.sum(axis=1)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        where = torch.from_numpy(np.flatnonzero(host_mask.reshape(-1))).to(ids.device,
                                                                            non_blocking=True)
        positions = torch.from_numpy(np.concatenate([np.arange(n) for n in lengths])).to(
            ids.device, non_blocking=True)
        embeddings = self.bert.embeddings
        tokens = ids.reshape(-1).index_select(0, where)
        x = embeddings.word_embeddings(tokens) + embeddings.position_embeddings(positions) \
            + embeddings.token_type_embeddings(torch.zeros_like(tokens))
        x = embeddings.LayerNorm(x)
        for layer in self.bert.encoder.layer:
            x = self._layer(layer, x, starts)
        out = x.new_zeros((ids.numel(), x.shape[1]))
        out.index_copy_(0, where, x)
        return out.view(*ids.shape, x.shape[1])

    def _layer(self, layer: Any, x: Any, starts: np.ndarray) -> Any:
        """One BertLayer over the packed tokens ``x`` (dropout off: inference)."""
        own = layer.attention.self
        shape = (x.shape[0], self.heads, x.shape[1] // self.heads)
        attended = self.attention(own.query(x).view(shape), own.key(x).view(shape),
                                  own.value(x).view(shape), starts).reshape(x.shape)
        out = layer.attention.output
        x = out.LayerNorm(out.dense(attended) + x)
        inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(x))
        return layer.output.LayerNorm(layer.output.dense(inner) + x)
