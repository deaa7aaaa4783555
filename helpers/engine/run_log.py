"""What each run did, kept in its output: the picture of a finished run (``python -m helpers
report``) is drawn from the output alone.

A finished run (a resumed one too: each adds its own) writes the group ``runs/<n>`` into its
output, while it still holds the output's lock:

- ``stats``: the job's PipelineStats as JSON (``to_dict``: workers, stages, phases, counts,
  recovery, settings), and ``finished``, when;
- ``timeline/``: one row per workunit span (``worker``, ``device`` as an index into the
  attribute ``devices``, ``records``, ``start_s``, ``end_s``, and one column per phase and
  count the workload measured in it, ``phase_<name>``, ``count_<name>``);
- ``telemetry/``: each sample (``seconds``, ``device``, ``worker`` (-1: the whole card),
  ``utilization``, ``memory_mb``, ``source``).

The outputs' readers (``read_output``, export, compaction) read the top-level datasets and
the errors; a ``runs`` group is theirs to ignore. A resumed run takes the finished file over as a
part, and merging parts (at the end, or ``compact``) carries their runs (``carry``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GROUP = "runs"
log = logging.getLogger("gpufeed")


@dataclass(frozen=True)
class RunLog:
    """One run's record, read back: its stats (as ``to_dict`` gave them), its spans and its
    telemetry as columns."""

    number: int
    stats: dict[str, Any]
    timeline: dict[str, np.ndarray]
    telemetry: dict[str, np.ndarray]


def _columns(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {name: np.asarray([row.get(name, np.nan) for row in rows]) for name in names}


def _timeline(stats: Any) -> tuple[dict[str, np.ndarray], list[str]]:
    devices = list(dict.fromkeys(span.device for span in stats.timeline))
    rows = [{"worker": span.worker, "device": devices.index(span.device),
             "records": span.records, "workunits": span.workunits, "start_s": span.start_s,
             "end_s": span.end_s,
             **{f"phase_{k}": float(v) for k, v in (span.phases or {}).items()},
             **{f"count_{k}": float(v) for k, v in (span.counts or {}).items()}}
            for span in stats.timeline]
    return _columns(rows), devices


def record(output: str | Path, stats: Any) -> None:
    """Add ``stats``'s run to ``output`` (an HDF5 output this process holds the lock of); a
    failure to is logged, not raised: the rows are written already."""
    import h5py

    try:
        with h5py.File(output, "a") as f:
            runs = f.require_group(GROUP)
            group = runs.create_group(str(len(runs)))
            group.attrs["stats"] = json.dumps(stats.to_dict(), default=str)
            timeline, devices = _timeline(stats)
            spans = group.create_group("timeline")
            spans.attrs["devices"] = json.dumps(devices)
            for name, values in timeline.items():
                spans.create_dataset(name, data=values)
            samples = group.create_group("telemetry")
            for name, values in _columns([
                    {"seconds": s.seconds, "device": s.device, "worker":
                     -1 if s.worker is None else s.worker, "utilization": s.utilization,
                     "memory_mb": s.memory_mb, "source": s.source}
                    for s in stats.telemetry]).items():
                samples.create_dataset(name, data=values.astype("S") if values.dtype.kind == "U"
                                       else values)
    except (OSError, ValueError, TypeError) as exc:
        log.warning("the run's record could not be added to %s (%s: %s); its rows are written",
                    output, type(exc).__name__, exc)


def read(output: str | Path) -> list[RunLog]:
    """Every run ``output`` records, oldest first (an output from before this record: none)."""
    import h5py

    with h5py.File(output, "r") as f:
        if GROUP not in f:
            return []
        runs = []
        for name in sorted(f[GROUP], key=int):
            group = f[GROUP][name]
            timeline = {k: v[()] for k, v in group["timeline"].items()}
            devices = json.loads(group["timeline"].attrs["devices"])
            if "device" in timeline:
                timeline["device"] = np.asarray(devices, dtype=object)[
                    timeline["device"].astype(int)] if devices else timeline["device"]
            telemetry = {k: (v[()].astype(str) if v.dtype.kind == "S" else v[()])
                         for k, v in group["telemetry"].items()}
            runs.append(RunLog(int(name), json.loads(group.attrs["stats"]), timeline,
                               telemetry))
        return runs


def carry(source: Any, target: Any) -> None:
    """Add the runs ``source`` records (an open HDF5 file: a part a resumed run built on, an
    index being compacted) to ``target``'s (one being written), after those it has."""
    if GROUP not in source:
        return
    runs = target.require_group(GROUP)
    for name in sorted(source[GROUP], key=int):
        source.copy(source[GROUP][name], runs, name=str(len(runs)))
