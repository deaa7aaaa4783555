"""Workloads: what a worker runs. See ``base`` for the protocol every workload follows.

Names are imported on first use, so a worker that runs one workload imports that one only."""
from __future__ import annotations

from helpers import lazy_names

_PUBLIC = {
    "BadRecord": "helpers.workloads.base",
    "BinningWorkload": "helpers.workloads.binning",
    "EmbeddingWorkload": "helpers.workloads.embedding",
    "OutputSpec": "helpers.workloads.base",
    "SyntheticWorkload": "helpers.workloads.synthetic",
    "Workload": "helpers.workloads.base",
}

__all__ = sorted(_PUBLIC)
__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
