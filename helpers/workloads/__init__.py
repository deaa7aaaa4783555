"""Workloads: what a worker runs. See ``base`` for the protocol every workload follows."""
from helpers.workloads.base import BadRecord, OutputSpec, Workload
from helpers.workloads.binning import BinningWorkload
from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.synthetic import SyntheticWorkload

__all__ = ["BadRecord", "BinningWorkload", "EmbeddingWorkload", "OutputSpec", "SyntheticWorkload", "Workload"]
