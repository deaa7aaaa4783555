"""The image-binning workload: OCR, an object detector and a similarity model per image, then a
bin A, B or C.

- ``workload``: BinningWorkload, what a worker runs;
- ``rule``: the A/B/C rule and the features it reads (Thresholds, assign_bin, dispersion, ...);
- ``detector``: NanoDet-m on onnxruntime; ``images``: decoding (and refusing) image files;
- ``table``: a run's output as one row per image, and the CSV written beside it.
"""
from helpers.workloads.binning.rule import BINS, Thresholds, assign_bin
from helpers.workloads.binning.workload import DEFAULT_PROMPTS, TIMINGS, BinningWorkload

__all__ = ["BINS", "DEFAULT_PROMPTS", "TIMINGS", "BinningWorkload", "Thresholds", "assign_bin"]
