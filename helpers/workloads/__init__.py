"""Workloads: what a worker runs. Each follows the protocol of ``helpers.engine.contract.protocol``
and imports nothing else of the engine: a workload is a small frozen description, the engine runs
it.

- ``embedding``: sentence-transformers over text (default: the embedded all-MiniLM-L6-v2);
- ``synthetic``: a stand-in with a set cost per record, simulated devices and injected faults;
- ``binning``: OCR, a detector and a similarity model per image, then a bin A/B/C.

Names are imported on first use, so a worker that runs one workload imports that one only.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from helpers import lazy_names

WORKLOADS = ("embedding", "synthetic", "binning")
_PUBLIC = {
    "BadRecord": "helpers.engine.contract.protocol",
    "BinningWorkload": "helpers.workloads.binning",
    "EmbeddingWorkload": "helpers.workloads.embedding",
    "OutputSpec": "helpers.engine.contract.protocol",
    "SyntheticWorkload": "helpers.workloads.synthetic",
    "Workload": "helpers.engine.contract.protocol",
}


def make_workload(name: str, model: str | None = None, batch_size: int | None = None,
                  seconds_per_record: float | None = None,
                  speed: Mapping[str, float] | None = None, **options: Any) -> Any:
    """The workload called ``name`` (one of WORKLOADS), from the knobs a notebook or the command
    line sets for every workload; each takes those that apply to it, and None keeps its default.

    - embedding: ``model`` (None: the embedded MiniLM), ``batch_size``; options: ``normalize``,
      ``tokenize_ahead``, ``precision``, ``runtime``, ``guard``;
    - synthetic: ``seconds_per_record``, ``speed`` (device -> factor); options: ``mode``;
    - binning: ``model`` (its similarity model); options: BinningWorkload's other fields.
    """
    def given(**knobs: Any) -> dict[str, Any]:
        return {k: v for k, v in knobs.items() if v is not None} | options

    if name == "embedding":
        from helpers.workloads.embedding import EmbeddingWorkload

        return EmbeddingWorkload(**given(model=model, batch_size=batch_size))
    if name == "synthetic":
        from helpers.workloads.synthetic import SyntheticWorkload

        return SyntheticWorkload(**given(seconds_per_record=seconds_per_record, speed=speed))
    if name == "binning":
        from helpers.workloads.binning import BinningWorkload

        return BinningWorkload(**given(similarity_model=model))
    raise ValueError(f"workload: expected one of {WORKLOADS}, got {name!r}")


__all__ = sorted([*_PUBLIC, "WORKLOADS", "make_workload"])
__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
