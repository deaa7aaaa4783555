"""A run's settings: one frozen dataclass, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from helpers.backends import BACKENDS
from helpers.devices import cpu_threads_per_worker, parse_devices
from helpers.worker import WorkerInfo

QUEUE_DEPTH_PER_WORKER = 2  # workunits waiting per worker: enough to hide the reader's latency
SORT_WORKUNITS = 8  # default sort window, in workunits: most of a global sort's gain, bounded memory
POOL_FIELDS = ("devices", "backend", "queue_depth", "threads_per_worker", "load_timeout")


@dataclass(frozen=True)
class PipelineConfig:
    """A run's settings, validated on construction: a bad value raises ValueError naming it.

    The fields in POOL_FIELDS belong to the workers and are fixed when they start; the others
    (workunit_size, limit, sort_window, progress) may change from one job to the next.
    """

    devices: tuple[str, ...] = ("cpu",)
    workunit_size: int = 100
    backend: str = "process"
    queue_depth: int | None = None  # workunits on the work queue; None = 2 per worker
    threads_per_worker: int | None = None  # CPU threads per cpu worker; None = an even share
    limit: int | None = None  # stop after this many records
    sort_window: int | None = None  # records ordered by cost before cutting; None = 8 workunits, 0 = off
    load_timeout: float = 600.0  # seconds for every worker to load its model
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", parse_devices(self.devices))
        positive_int("workunit_size", self.workunit_size)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {self.backend!r}")
        for name in ("queue_depth", "threads_per_worker", "limit", "sort_window"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), allow_zero=name in ("limit", "sort_window"))
        if not self.load_timeout > 0:
            raise ValueError(f"load_timeout: expected seconds > 0, got {self.load_timeout!r}")

    @property
    def window(self) -> int:
        return SORT_WORKUNITS * self.workunit_size if self.sort_window is None else self.sort_window

    @property
    def depth(self) -> int:
        return self.queue_depth or QUEUE_DEPTH_PER_WORKER * len(self.devices)

    def workers(self) -> list[WorkerInfo]:
        cpu_threads = self.threads_per_worker or cpu_threads_per_worker(self.devices)
        return [WorkerInfo(i, device, cpu_threads if device == "cpu" else 1)
                for i, device in enumerate(self.devices)]


def positive_int(name: str, value: Any, allow_zero: bool = False) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an integer >= 1 (>= 0 if allowed)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < (0 if allow_zero else 1):
        raise ValueError(f"{name}: expected an integer >= {0 if allow_zero else 1}, got {value!r}")
