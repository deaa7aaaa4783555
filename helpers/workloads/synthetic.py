"""A model-free workload with a fixed cost per record and a speed factor per device.

It lets tests and CPU-only machines reproduce a heterogeneous GPU layout deterministically: with
``devices=["cuda:0", "cuda:1", "cuda:2"]`` and ``speed={"cuda:1": 0.35, "cuda:2": 0.35}`` a record
costs ``seconds_per_record / speed`` on each device. Device strings are only labels here
(``requires_hardware`` is False), so the layout runs on any machine. ``mode="sleep"`` costs wall time
but no CPU, like a GPU kernel; ``mode="busy"`` spins a core, like CPU inference.
"""
from __future__ import annotations

import os
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from helpers.workloads.base import OutputSpec

MODES = ("sleep", "busy")


class InjectedFailure(RuntimeError):
    """Raised on purpose by a SyntheticWorkload told to fail (tests, demonstrations)."""


def record_vector(record: Any, dim: int) -> np.ndarray:
    """A deterministic float32 vector for a record: what the synthetic 'model' outputs."""
    seed = zlib.crc32(repr(record).encode("utf-8"))
    return np.random.default_rng(seed).random(dim, dtype=np.float32)


@dataclass(frozen=True)
class SyntheticWorkload:
    """A fixed cost per record, scaled by a per-device speed factor (default 1.0).

    ``fail_on_load`` and ``fail_on_records`` make it raise InjectedFailure at load time or when a
    workunit holds one of those records; ``exit_on_records`` makes the worker exit at once
    (``os._exit``, as a segfault would): the failure paths are tested with them.
    """

    seconds_per_record: float = 0.001
    speed: Mapping[str, float] = field(default_factory=dict)
    mode: str = "sleep"
    dim: int = 8
    fail_on_load: bool = False
    fail_on_records: frozenset = frozenset()
    exit_on_records: frozenset = frozenset()
    name: str = "synthetic"
    requires_hardware: bool = False

    def __post_init__(self) -> None:
        if not self.seconds_per_record >= 0:
            raise ValueError(f"seconds_per_record: expected >= 0, got {self.seconds_per_record!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        bad = {d: s for d, s in dict(self.speed).items() if not s > 0}
        if bad:
            raise ValueError(f"speed: factors must be > 0, got {bad}")
        object.__setattr__(self, "speed", dict(self.speed))
        object.__setattr__(self, "fail_on_records", frozenset(self.fail_on_records))
        object.__setattr__(self, "exit_on_records", frozenset(self.exit_on_records))

    def load(self, device: str, threads: int) -> dict[str, Any]:
        if self.fail_on_load:
            raise InjectedFailure(f"fail_on_load: refusing to load on {device}")
        return {"device": device, "cost": self.seconds_per_record / self.speed.get(device, 1.0)}

    def outputs(self, model: Any) -> dict[str, OutputSpec]:
        return {"values": OutputSpec((self.dim,), "float32")}

    def check_record(self, record: Any) -> None:
        if record is None:
            raise TypeError("expected a record, got None")

    def process(self, model: dict[str, Any], records: list[Any]) -> dict[str, np.ndarray]:
        hashable = [r for r in records if _hashable(r)]
        if self.exit_on_records.intersection(hashable):
            os._exit(70)  # no cleanup, no message: what a crashed worker looks like
        poisoned = self.fail_on_records.intersection(hashable)
        if poisoned:
            raise InjectedFailure(f"fail_on_records: workunit holds {sorted(map(repr, poisoned))}")
        _spend(model["cost"] * len(records), self.mode)
        values = np.stack([record_vector(r, self.dim) for r in records]) if records else \
            np.empty((0, self.dim), np.float32)
        return {"values": values}

    def attrs(self) -> dict[str, Any]:
        return {"workload": self.name, "seconds_per_record": self.seconds_per_record,
                "speed": repr(self.speed), "mode": self.mode}


def _hashable(record: Any) -> bool:
    try:
        hash(record)
    except TypeError:
        return False
    return True


def _spend(seconds: float, mode: str) -> None:
    if mode == "sleep":
        time.sleep(seconds)
        return
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass
