"""Names an older gpufeed wrote, and what they are called now: one table for every rename a user
may meet again (in an output's recorded fingerprints and runs, in code that reads the stats).

- a JSON-lines input's ``text_field`` and ``id_field``: ``text_column`` and ``id_column``, as a
  table's (2026-11-28);
- MiB under names ending ``_mb``: ``_mib``; a measurement's seconds ending ``_seconds``: ``_s``,
  as the result tables name them (2026-11-28).

Settings keep their names (``workunit_seconds``, ``--budget-seconds``): they are what users type.
"""
from __future__ import annotations

from typing import Any

OLDER_NAMES = {  # and every name ending _mb (it held MiB) ends _mib now (``current``)
    "text_field": "text_column", "id_field": "id_column",
    "wall_seconds": "wall_s", "spinup_seconds": "spinup_s", "records_per_second": "records_per_s",
    "worker_cpu_seconds": "worker_cpu_s", "first_dispatch_seconds": "first_dispatch_s",
    "longest_dispatch_gap_seconds": "longest_dispatch_gap_s",
    "longest_idle_seconds": "longest_idle_s", "load_seconds": "load_s", "busy_seconds": "busy_s",
    "wait_seconds": "wait_s", "cpu_seconds": "cpu_s", "restart_seconds": "restart_s",
}


def current(name: str) -> str:
    """What ``name`` is called now (itself, unless an older gpufeed's)."""
    if name in OLDER_NAMES:
        return OLDER_NAMES[name]
    return name[:-3] + "_mib" if name.endswith("_mb") else name


def renamed(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with each older name (its own keys only) as it is called now."""
    return {current(key): value for key, value in fields.items()}


def current_names(recorded: Any) -> Any:
    """What an older gpufeed recorded (a run's stats as JSON: its workers, recovery, devices;
    its telemetry's columns), each key at any depth under today's name."""
    if isinstance(recorded, dict):
        return {current(k): current_names(v) for k, v in recorded.items()}
    if isinstance(recorded, list):
        return [current_names(v) for v in recorded]
    return recorded


def older_name(obj: Any, name: str) -> Any:
    """What ``obj`` reads under an older name of one of its attributes (its ``__getattr__``:
    read-only); AttributeError for any other name."""
    now = current(name)
    if now != name:
        try:
            return object.__getattribute__(obj, now)
        except AttributeError:
            pass
    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")
