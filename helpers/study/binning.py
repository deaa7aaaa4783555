"""The binning study's experiments: throughput of the two layouts, and one full pass over the
images.

- ``layouts``: for each worker count, one pool of that many workers on a device; each replicate runs
  the same sampled images queue-fed (workers pull workunits) and as a static split (one even,
  contiguous slice per worker, as the study did it), on the same loaded models.
- ``bin_images``: one queue-fed pass over every image; one row per image (features, bin, seconds
  per model, or the error that stopped it).

Both return tidy tables (one row per configuration × replicate, or per image; units in names).
"""
from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers.engine.inputs.sources import ImageFolderSource
from helpers.engine.measure.stats import PipelineStats
from helpers.engine.outputs.hdf5_sink import read_output
from helpers.engine.pipeline import WorkerPool
from helpers.study.experiments import fair_workunit_size, layout_row
from helpers.study.paths import DATA
from helpers.workloads.binning import TIMINGS, BinningWorkload
from helpers.workloads.binning.table import image_rows, write_csv

IMAGES = DATA / "images"
MODEL_TIMES = {"decode_s": "decode", "ocr_s": "OCR", "detector_s": "detector",
               "similarity_s": "similarity"}


def images(folder: str | Path = IMAGES) -> ImageFolderSource:
    """The images of ``folder`` (default: the shipped sample, data/images/)."""
    return ImageFolderSource(Path(folder) if Path(folder).is_absolute() else DATA.parent / folder)


def sample(source: ImageFolderSource, n: int, seed: int = 0) -> list[tuple[int, str]]:
    """``n`` images drawn without replacement (all of them if ``n`` is larger), in id order."""
    pairs = list(source)
    picked = np.random.default_rng(seed).choice(len(pairs), size=min(n, len(pairs)), replace=False)
    return [pairs[i] for i in sorted(picked)]


def layouts(workload: BinningWorkload, device: str, worker_counts: Sequence[int],
            pairs: list[tuple[int, str]], replicates: int, workunit_size: int = 4,
            backend: str = "process") -> pd.DataFrame:
    """Queue-fed vs static split on ``pairs``, for each worker count on ``device``; queue-fed
    workunits of ``workunit_size`` images or fewer (``fair_workunit_size``)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in worker_counts:
            size = fair_workunit_size(workunit_size, len(pairs), workers)
            with WorkerPool(workload, [device] * workers, backend, progress=False) as pool:
                for replicate in range(replicates):
                    queued = pool.run(pairs, Path(tmp) / "queue.h5", workunit_size=size,
                                      overwrite=True)  # scratch files, one per layout
                    static = pool.run_static(pairs, Path(tmp) / "static.h5", overwrite=True)
                    rows += [{**layout_row(s, name), "replicate": replicate, "workers": workers,
                              "workunit_size": size, "spinup_s": pool.spinup_s}
                             for s, name in ((queued, "queue"), (static, "static"))]
    table = pd.DataFrame(rows).assign(device=device, backend=backend)
    return table.assign(speedup=speedup(table))


def speedup(table: pd.DataFrame) -> pd.Series:
    """Each row's rate ÷ its strategy's mean rate with the fewest workers (one, usually)."""
    fewest = table[table["workers"] == table["workers"].min()]
    return table["records_per_s"] / table["strategy"].map(
        fewest.groupby("strategy")["records_per_s"].mean())


def bin_images(workload: BinningWorkload, devices: Sequence[str], pairs: list[tuple[int, str]],
               output: str | Path, workunit_size: int = 4) -> tuple[pd.DataFrame, PipelineStats]:
    """``(id, path)`` pairs through a queue-fed pool into ``output`` (HDF5, plus its CSV beside);
    returns one row per image and the run's stats."""
    with WorkerPool(workload, list(devices), "process", progress=False) as pool:
        stats = pool.run(pairs, output, workunit_size=workunit_size, overwrite=True)  # rerunnable
    data, paths = read_output(output), dict(pairs)
    write_csv(data, Path(output).with_suffix(".csv"), paths)
    return per_image(data, paths), stats


def per_image(data: dict[str, Any], paths: dict[int, str]) -> pd.DataFrame:
    """A binning output (as read_output returns it) as one row per image (see
    helpers.workloads.binning.table), with each image's file name and kind (its name's prefix)."""
    table = pd.DataFrame(image_rows(data, paths))
    table["file"] = table["path"].map(lambda p: Path(p).name)
    table["kind"] = table["file"].str.split("_").str[0]
    return table


def model_times(table: pd.DataFrame) -> pd.DataFrame:
    """Long form of the per-model seconds: one row per (image, model)."""
    done = table[table["error"] == ""]
    long = done.melt(id_vars=["id", "kind"], value_vars=list(TIMINGS), var_name="stage",
                     value_name="seconds")
    return long.assign(model=long["stage"].map(MODEL_TIMES))


def detections(output: str | Path) -> dict[int, list]:
    """id -> the detector's boxes ``[x0, y0, x1, y1, class name, score]`` (for the gallery)."""
    import json

    data = read_output(output)
    return {int(i): json.loads(d) for i, d in zip(data["ids"], data["detections"])}
