"""gpufeed: keep GPUs fed when running a model over a big dataset.

The queue-fed pipeline (``run_pipeline``), its workloads, and the tools around them.
"""
from helpers.config import PipelineConfig
from helpers.hdf5_sink import read_output
from helpers.pipeline import PipelineError, WorkerPool, run_pipeline
from helpers.stats import PipelineStats, WorkerStats
from helpers.images import ImageFolderSource
from helpers.workloads import BinningWorkload, EmbeddingWorkload, SyntheticWorkload, Workload

__all__ = ["BinningWorkload", "EmbeddingWorkload", "ImageFolderSource", "PipelineConfig", "PipelineError", "PipelineStats",
           "SyntheticWorkload", "WorkerPool", "WorkerStats", "Workload", "read_output",
           "run_pipeline"]
