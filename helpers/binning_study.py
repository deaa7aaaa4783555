"""The binning study's experiments: throughput of the two layouts, and one full pass over the images.

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

from helpers.hdf5_sink import read_output
from helpers.sources import ImageFolderSource
from helpers.paths import DATA
from helpers.pipeline import WorkerPool
from helpers.stats import PipelineStats
from helpers.workloads.binning import TIMINGS, BinningWorkload

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


def _row(stats: PipelineStats, strategy: str) -> dict[str, Any]:
    busy = sum(w.busy_seconds for w in stats.workers)
    return {"strategy": strategy, "records": stats.records + stats.failed_records,
            "wall_s": stats.wall_seconds, "records_per_s": stats.records_per_second,
            "efficiency": busy / (len(stats.workers) * stats.wall_seconds)}


def layouts(workload: BinningWorkload, device: str, worker_counts: Sequence[int],
            pairs: list[tuple[int, str]], replicates: int, workunit_size: int = 4,
            backend: str = "process") -> pd.DataFrame:
    """Queue-fed vs static split on ``pairs``, for each worker count on ``device``."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in worker_counts:
            with WorkerPool(workload, [device] * workers, backend, progress=False) as pool:
                for replicate in range(replicates):
                    queued = pool.run(pairs, Path(tmp) / "queue.h5", workunit_size=workunit_size)
                    static = pool.run_static(pairs, Path(tmp) / "static.h5")
                    rows += [{**_row(s, name), "replicate": replicate, "workers": workers,
                              "spinup_s": pool.spinup_seconds}
                             for s, name in ((queued, "queue"), (static, "static"))]
    return pd.DataFrame(rows).assign(device=device, workunit_size=workunit_size, backend=backend)


def bin_images(workload: BinningWorkload, devices: Sequence[str], pairs: list[tuple[int, str]],
               output: str | Path, workunit_size: int = 4) -> tuple[pd.DataFrame, PipelineStats]:
    """``(id, path)`` pairs through a queue-fed pool into ``output`` (HDF5, plus its CSV beside);
    returns one row per image and the run's stats."""
    from helpers.binning import write_csv

    with WorkerPool(workload, list(devices), "process", progress=False) as pool:
        stats = pool.run(pairs, output, workunit_size=workunit_size)
    write_csv(output, paths=dict(pairs))
    return per_image(output, dict(pairs)), stats


def per_image(output: str | Path, paths: dict[int, str]) -> pd.DataFrame:
    """A binning output file as one row per image; failed images have their ``error``."""
    data = read_output(output)
    columns = [c for c in data if c not in ("ids", "errors", "attrs", "detections")]
    table = pd.DataFrame({c: data[c] for c in columns}).assign(id=data["ids"], error="")
    errors = pd.DataFrame([{"id": e["id"], "path": paths.get(e["id"], ""),
                            "error": f"{e['type']}: {e['message']}"} for e in data["errors"]])
    table = pd.concat([table, errors], ignore_index=True) if len(errors) else table
    table["file"] = table["path"].map(lambda p: Path(p).name)
    table["kind"] = table["file"].str.split("_").str[0]
    return table.sort_values("id", ignore_index=True)


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
