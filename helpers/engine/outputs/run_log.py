"""What each run did, kept in its output: the picture of a finished run (``python -m helpers
report``) is drawn from the output alone.

A finished run (a resumed one too: each adds its own) writes the group ``runs/<n>`` into its
output as the writer finishes it (the last file, or the index over big parts, before it is
renamed into place):

- ``stats``: the job's PipelineStats as JSON (``to_dict``: workers, stages, phases, counts,
  recovery, settings), and ``finished``, when;
- ``timeline/``: one row per workunit span (``worker``, ``device`` as an index into the
  attribute ``devices``, ``records``, ``start_s``, ``end_s``, and one column per phase and
  count the workload measured in it, ``phase_<name>``, ``count_<name>``);
- ``telemetry/``: each sample (``seconds``, ``device``, ``worker`` (-1: the whole card),
  ``utilization``, ``memory_mib``, ``source``).

The outputs' readers (``read_output``, export, compaction) read the top-level datasets and
the errors; a ``runs`` group is theirs to ignore. Where runs are kept until the output is one
file: a finished file a resumed run takes over as a part keeps its runs (the part is marked,
``Part.runs``); a resumed index's runs are held in memory by its ``Parts``; merging parts, every
index rewrite and ``compact`` carry them (``carry``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.renamed import current_names

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


def write(target: Any, stats: Any) -> None:
    """Add ``stats``'s run to ``target`` (an open HDF5 file: the output as its writer finishes
    it, before it is renamed into place, so that a crash leaves the old file or the new one,
    whole). Everything is built before the group is made; a failure leaves no group behind and
    is logged, not raised: the rows matter more than their record."""
    name = None
    try:
        summary = json.dumps(stats.to_dict(), default=str)
        timeline, devices = _timeline(stats)
        samples = _columns([{"seconds": s.seconds, "device": s.device,
                             "worker": -1 if s.worker is None else s.worker,
                             "utilization": s.utilization, "memory_mib": s.memory_mib,
                             "source": s.source} for s in stats.telemetry])
        runs = target.require_group(GROUP)
        name = str(len(runs))
        group = runs.create_group(name)
        spans = group.create_group("timeline")
        spans.attrs["devices"] = json.dumps(devices)
        for column, values in timeline.items():
            spans.create_dataset(column, data=values)
        telemetry = group.create_group("telemetry")
        for column, values in samples.items():
            telemetry.create_dataset(column, data=values.astype("S") if values.dtype.kind == "U"
                                     else values)
        group.attrs["stats"] = summary  # (last: a group with its stats is whole)
    except Exception as exc:  # noqa: BLE001 (a record is never worth a finished run)
        if name is not None and GROUP in target and name in target[GROUP]:
            del target[GROUP][name]
        log.warning("the run's record could not be added to %s (%s: %s); its rows are written",
                    target.filename, type(exc).__name__, exc)


def read(output: str | Path) -> list[RunLog]:
    """Every run ``output`` records, oldest first (an output from before this record: none);
    what an older gpufeed recorded reads under today's names (stats, telemetry columns)."""
    import h5py

    with h5py.File(output, "r") as f:
        if GROUP not in f:
            return []
        runs = []
        for name in sorted(f[GROUP], key=int):
            group = f[GROUP][name]
            if "stats" not in group.attrs:  # (a record cut short)
                continue
            timeline = {k: v[()] for k, v in group["timeline"].items()}
            devices = json.loads(group["timeline"].attrs["devices"])
            if "device" in timeline:
                timeline["device"] = np.asarray(devices, dtype=object)[
                    timeline["device"].astype(int)] if devices else timeline["device"]
            telemetry = current_names({k: (v[()].astype(str) if v.dtype.kind == "S" else v[()])
                                       for k, v in group["telemetry"].items()})
            runs.append(RunLog(int(name), current_names(json.loads(group.attrs["stats"])),
                               timeline, telemetry))
        return runs


def held(path: str | Path) -> Any:
    """The runs the file at ``path`` records, copied into an HDF5 file in memory (None if it
    records none): what a resumed index carries into the index or file that replaces it."""
    import io

    import h5py

    with h5py.File(path, "r") as f:
        if GROUP not in f:
            return None
        memory = h5py.File(io.BytesIO(), "w")
        carry(f, memory)
        return memory


def carry(source: Any, target: Any) -> None:
    """Add the runs ``source`` records (an open HDF5 file: a part a resumed run built on, an
    index being compacted) to ``target``'s (one being written), after those it has."""
    if GROUP not in source:
        return
    runs = target.require_group(GROUP)
    for name in sorted(source[GROUP], key=int):
        source.copy(source[GROUP][name], runs, name=str(len(runs)))
