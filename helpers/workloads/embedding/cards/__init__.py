"""Cards: the last stage of the feeding path, behind one small protocol.

The feeder (``helpers.workloads.embedding.feeder``) tokenizes, sorts, batches and collates; a
card only computes. Every card answers the same four things:

- ``staging(texts, tokens)``: two int64 host arrays ``[texts, tokens]`` the feeder collates a
  batch's ids and mask into (a GPU's: pinned memory, so the copy to the device does not block);
- ``submit(ids, mask)``: launch the batch (from the arrays ``staging`` gave); a ticket, which
  may say the card's own seconds for it (``busy_s``) and the tokens it computed where it padded
  the batch further (``tokens``); an asynchronous card returns at once;
- ``collect(tickets)``: wait for those batches; their rows, one ``[texts, dim]`` array each;
- ``dim``, ``label``, ``asynchronous``: the rows' width, what the run says of the card, and
  whether ``submit`` returns before the batch is computed (the worker then overlaps workunits).

The cards:

- ``torch_card.TorchCard``: the model's own modules (transformer, pooling, normalize) on its
  device, with ``truncate_dim`` and ``normalize`` as ``encode`` applies them; on CUDA, pinned
  staging, copies on a stream of their own, rows copied back without blocking, and with
  ``graphs`` each batch replayed from a CUDA graph of its padded shape (``graphs.CardGraphs``);
- ``onnx_card.OnnxCard``: the exported modules in ONNX Runtime (CPU);
- ``simulated.SimulatedCard``: a card's cost model instead of a forward pass (zeros of the
  model's width), shared by every worker on it.

A model the feeder cannot run (its modules are not these, a prompt its pooling leaves out, a
model that routes by task) runs through ``encode`` (``helpers.workloads.embedding.encode_path``)
and the run says why (``torch_card.unsupported``).
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Card(Protocol):
    """What the feeder hands batches to (the module docstring)."""

    dim: int
    label: str
    asynchronous: bool

    def staging(self, texts: int, tokens: int) -> tuple[np.ndarray, np.ndarray]: ...

    def submit(self, ids: np.ndarray, mask: np.ndarray) -> Any: ...

    def collect(self, tickets: list[Any]) -> list[np.ndarray]: ...


def host_staging(texts: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Plain host arrays for a batch (a card that reads them where they are: a CPU's)."""
    return (np.empty((texts, tokens), dtype=np.int64), np.empty((texts, tokens), dtype=np.int64))
