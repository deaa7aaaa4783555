"""Workloads: what a worker runs. See ``base`` for the protocol every workload follows.

Names are imported on first use, so a worker that runs one workload imports that one only."""
from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "BadRecord": "helpers.workloads.base",
    "BinningWorkload": "helpers.workloads.binning",
    "EmbeddingWorkload": "helpers.workloads.embedding",
    "OutputSpec": "helpers.workloads.base",
    "SyntheticWorkload": "helpers.workloads.synthetic",
    "Workload": "helpers.workloads.base",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'helpers.workloads' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
