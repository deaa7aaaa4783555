"""gpufeed: keep GPUs fed when running a model over a big dataset.

Three floors, each importing only the floors below it:

- ``helpers.engine``: the queue-fed pipeline (``run_pipeline``, ``WorkerPool``) and everything it
  runs on: the workload protocol, settings, sources, reader, workers, backends, scheduler, writer;
- ``helpers.workloads``: what workers run (embedding, synthetic, binning); a workload imports the
  engine's protocol and nothing else of it;
- ``helpers.study``: what the notebooks use: experiments, findings, plots, result tables.

``helpers.cli``, ``helpers.bench`` and ``helpers.embed`` (the one-liner) stand on all three. The
public names below are imported on first use (PEP 562), so that a worker process, which imports this
package on its way to ``helpers.engine.workers.worker``, loads the worker loop and its workload
only: not h5py, the scheduler or the writer it never runs.
"""
from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "BinningWorkload": "helpers.workloads.binning",
    "EmbeddingWorkload": "helpers.workloads.embedding",
    "ImageFolderSource": "helpers.engine.inputs.sources",
    "JobSettings": "helpers.engine.contract.settings",
    "OutputError": "helpers.engine.outputs.ownership",
    "PipelineError": "helpers.engine.dispatch.failures",
    "calibration_ranges": "helpers.embed",
    "embed": "helpers.embed",
    "export": "helpers.engine.outputs.export",
    "PipelineStats": "helpers.engine.measure.stats",
    "PoolSettings": "helpers.engine.contract.settings",
    "SyntheticWorkload": "helpers.workloads.synthetic",
    "WorkerPool": "helpers.engine.pool",
    "Source": "helpers.engine.contract.protocol",
    "TableSource": "helpers.engine.inputs.tables",
    "WorkerStats": "helpers.engine.measure.stats",
    "Workload": "helpers.engine.contract.protocol",
    "read_output": "helpers.engine.outputs.hdf5_sink",
    "run_pipeline": "helpers.engine.pipeline",
}

def lazy_names(package: str, names: dict[str, str]) -> tuple[Any, Any]:
    """A package's ``__getattr__`` and ``__dir__`` that import ``names`` (name -> module) on first
    use."""
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
