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
POOL_FIELDS = ("devices", "backend", "queue_depth", "threads_per_worker", "load_timeout", "retries",
               "max_restarts", "workunit_timeout", "adaptive", "max_workers_per_device")


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
    retries: int = 1  # times a failed workunit is retried whole before it is split
    max_restarts: int = 10  # replacements per worker slot after deaths and timeouts
    workunit_timeout: float | None = None  # seconds a workunit may run before its worker is killed
    durable: bool = True  # write part files + an index, so that a killed run leaves a readable file
    resume: bool = False  # skip the ids the output already holds (or gave up on); needs durable
    adaptive: bool = False  # add workers per device one at a time while memory allows
    max_workers_per_device: int = 8  # adaptive: the most workers tried on one device

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", parse_devices(self.devices))
        positive_int("workunit_size", self.workunit_size)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {self.backend!r}")
        for name in ("queue_depth", "threads_per_worker", "limit", "sort_window", "retries",
                     "max_restarts", "max_workers_per_device"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name),
                             allow_zero=name in ("limit", "sort_window", "retries", "max_restarts"))
        for name in ("load_timeout", "workunit_timeout"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                raise ValueError(f"{name}: expected seconds > 0, got {value!r}")
        if self.resume and not self.durable:
            raise ValueError("resume: needs durable=True (an in-place file may not survive a crash)")

    @property
    def window(self) -> int:
        return SORT_WORKUNITS * self.workunit_size if self.sort_window is None else self.sort_window

    @property
    def depth(self) -> int:
        return self.queue_depth or QUEUE_DEPTH_PER_WORKER * len(self.devices)

    def workers(self) -> list[WorkerInfo]:
        """One WorkerInfo per entry of ``devices``; ``copy`` counts the earlier ones on its device."""
        cpu_threads = self.threads_per_worker or cpu_threads_per_worker(self.devices)
        return [WorkerInfo(i, device, cpu_threads if device == "cpu" else 1,
                           self.devices[:i].count(device))
                for i, device in enumerate(self.devices)]


def positive_int(name: str, value: Any, allow_zero: bool = False) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an integer >= 1 (>= 0 if allowed)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < (0 if allow_zero else 1):
        raise ValueError(f"{name}: expected an integer >= {0 if allow_zero else 1}, got {value!r}")
