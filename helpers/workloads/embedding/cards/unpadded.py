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
device in float32, or a card older than FLASH_CAPABILITY, no flash kernel runs, and a launch per
text would cost more than the padding: refused there). The spans' bounds, the tokens' places and
positions are made on the host once a batch and copied from pinned memory without blocking.
The pass is transformers' BertModel's (absolute positions, one text a row: token type 0), which
all-MiniLM-L6-v2, bge, English e5 and gte-small use (multilingual e5 is XLM-RoBERTa); any other
model is refused, with the reason (``unsupported``). The vectors are the padded pass's
(tests/test_unpadded.py).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

FLASH_DTYPES = ("float16", "bfloat16")  # what varlen_attn's flash kernel computes in
FLASH_CAPABILITY = (8, 0)  # and the cards it runs on (A100, H100, H200, L4: 8.0 and newer)


def unsupported(model: Any, device: str) -> str | None:
    """Why the unpadded pass cannot run ``model``'s transformer (a SentenceTransformer) on
    ``device`` (None: it can)."""
    from transformers import BertModel

    bert = getattr(model[0], "auto_model", None)
    if type(bert) is not BertModel:  # (not a subclass, nor remote code's)
        return f"its transformer is {type(bert).__name__}, not transformers' BertModel"
    config = bert.config
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
        import torch

        capability = torch.cuda.get_device_capability(device)
        if tuple(capability) < FLASH_CAPABILITY:
            return (f"on {device} its spans run through flash attention, which needs a card of "
                    f"compute capability {FLASH_CAPABILITY[0]}.{FLASH_CAPABILITY[1]} or newer "
                    f"(Ampere, Hopper); this one is {capability[0]}.{capability[1]}")
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


@dataclass(frozen=True)
class Spans:
    """The texts' spans in a packed batch: ``starts`` (on the host: one more than the texts),
    the same as int32 ``bounds`` on the device, and the ``longest`` span (made once a batch,
    read by every layer)."""

    starts: np.ndarray
    bounds: Any
    longest: int


def spans_attention(query: Any, key: Any, value: Any, spans: Spans) -> Any:
    """Attention within each text's span of the packed tokens (``[tokens, heads, head_dim]``),
    a text at a time."""
    import torch

    out = torch.empty_like(query)
    starts = spans.starts
    for start, end in zip(starts[:-1].tolist(), starts[1:].tolist()):
        span = slice(start, end)
        out[span] = torch.nn.functional.scaled_dot_product_attention(
            query[span].transpose(0, 1), key[span].transpose(0, 1),
            value[span].transpose(0, 1)).transpose(0, 1)
    return out


def flash_attention(query: Any, key: Any, value: Any, spans: Spans) -> Any:
    """The same, in one flash kernel over the batch (CUDA, float16 or bfloat16)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(query, key, value, spans.bounds, spans.bounds, spans.longest,
                       spans.longest)


def _to(array: np.ndarray, device: Any) -> Any:
    """``array`` on ``device``: from pinned memory without blocking on CUDA (a copy from
    pageable memory may wait for the device's stream), as it is on a CPU."""
    import torch

    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


class UnpaddedBert:
    """A BertModel's pass over a batch's real tokens (the module docstring): ``bert``,
    transformers' model (its own weights and dtype); ``attention``: over the packed spans
    (``flash_attention`` on CUDA, ``spans_attention`` elsewhere: None chooses by ``device``)."""

    def __init__(self, bert: Any, device: str,
                 attention: Callable[[Any, Any, Any, Spans], Any] | None = None) -> None:
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
        spans = Spans(starts, _to(starts.astype(np.int32), ids.device), int(lengths.max()))
        where = _to(np.flatnonzero(host_mask.reshape(-1)), ids.device)
        positions = _to(np.concatenate([np.arange(n) for n in lengths]), ids.device)
        embeddings = self.bert.embeddings
        tokens = ids.reshape(-1).index_select(0, where)
        x = embeddings.word_embeddings(tokens) \
            + embeddings.token_type_embeddings(torch.zeros_like(tokens))  # (BERT's order)
        x = embeddings.LayerNorm(x + embeddings.position_embeddings(positions))
        for layer in self.bert.encoder.layer:
            x = self._layer(layer, x, spans)
        out = x.new_zeros((ids.numel(), x.shape[1]))
        out.index_copy_(0, where, x)
        return out.view(*ids.shape, x.shape[1])

    def _layer(self, layer: Any, x: Any, spans: Spans) -> Any:
        """One BertLayer over the packed tokens ``x`` (dropout off: inference)."""
        own = layer.attention.self
        shape = (x.shape[0], self.heads, x.shape[1] // self.heads)
        attended = self.attention(own.query(x).view(shape), own.key(x).view(shape),
                                  own.value(x).view(shape), spans).reshape(x.shape)
        out = layer.attention.output
        x = out.LayerNorm(out.dense(attended) + x)
        inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(x))
        return layer.output.LayerNorm(layer.output.dense(inner) + x)
