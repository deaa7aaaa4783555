"""A binning run's output as one row per image: the study's table and the CSV written for people.

Both start from the output as ``helpers.read_output`` returns it (the workload never opens files
it did not write), so the table and the CSV cannot disagree.
"""
from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

CSV_COLUMNS = ("id", "path", "bin", "text_boxes", "text_area", "objects", "unique_classes",
               "classes", "dispersion", "similarity", "caption", "text", "decode_s", "ocr_s",
               "detector_s", "similarity_s", "error")
NOT_PER_IMAGE = ("ids", "errors", "attrs", "detections")  # read_output's keys that are not columns


def image_rows(data: Mapping[str, Any], paths: Mapping[int, str] | None = None) -> list[dict]:
    """One row per image of a binning output, by id: every feature column, and ``error`` ("" or
    "type: message"). A failed image has only its id, its error and, given ``paths`` (id -> path,
    e.g. ``dict(ImageFolderSource(folder))``), its path."""
    paths = paths or {}
    columns = [c for c in data if c not in NOT_PER_IMAGE]
    rows = [{"id": record_id, **{c: data[c][k] for c in columns}, "error": ""}
            for k, record_id in enumerate(data["ids"].tolist())]
    rows += [{"id": error["id"], "path": paths.get(error["id"], ""),
              "error": f"{error['type']}: {error['message']}"} for error in data["errors"]]
    return sorted(rows, key=lambda row: (row["id"] is None, row["id"] or 0))  # no id: last


def write_csv(data: Mapping[str, Any], path: str | os.PathLike,
              paths: Mapping[int, str] | None = None) -> Path:
    """``image_rows`` as CSV at ``path``: CSV_COLUMNS only, floats to 4 decimals."""
    path = Path(path)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: _plain(v) for k, v in row.items()} for row in image_rows(data, paths))
    return path


def is_table(path: str | os.PathLike) -> bool:
    """True for a regular file whose first line is the header ``write_csv`` writes."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, newline="", errors="replace") as f:
        return f.readline(4096).rstrip("\r\n") == ",".join(CSV_COLUMNS)


def _plain(value: Any) -> Any:
    if isinstance(value, np.floating):
        return round(float(value), 4)
    return int(value) if isinstance(value, np.integer) else value
