"""gpufeed: keep GPUs fed when running a model over a big dataset.

The queue-fed pipeline (``run_pipeline``), its workloads, and the tools around them. The public
names are imported on first use (PEP 562), so that a worker process, which imports this package
on its way to ``helpers.worker``, loads the worker loop and its workload only: not h5py, the
scheduler or the writer it never runs.
"""
from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "BinningWorkload": "helpers.workloads.binning",
    "EmbeddingWorkload": "helpers.workloads.embedding",
    "ImageFolderSource": "helpers.sources",
    "PipelineConfig": "helpers.config",
    "PipelineError": "helpers.scheduler",
    "PipelineStats": "helpers.stats",
    "SyntheticWorkload": "helpers.workloads.synthetic",
    "WorkerPool": "helpers.pipeline",
    "WorkerStats": "helpers.stats",
    "Workload": "helpers.workloads.base",
    "read_output": "helpers.hdf5_sink",
    "run_pipeline": "helpers.pipeline",
}

def lazy_names(package: str, names: dict[str, str]) -> tuple[Any, Any]:
    """A package's ``__getattr__`` and ``__dir__`` that import ``names`` (name -> module) on first use."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(names[name]), name)
        return value  # looked up once

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__


__all__ = sorted(_PUBLIC)
__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
