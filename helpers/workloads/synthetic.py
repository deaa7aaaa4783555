"""A model-free workload with a fixed cost per record and a speed factor per device.

It lets tests and CPU-only machines reproduce a heterogeneous GPU layout deterministically: with
``devices=["cuda:0", "cuda:1", "cuda:2"]`` and ``speed={"cuda:1": 0.35, "cuda:2": 0.35}`` a record
costs ``seconds_per_record / speed`` on each device. Device strings are only labels here
(``requires_hardware`` is False), so the layout runs on any machine. ``mode="sleep"`` costs wall
time but no CPU, like a GPU kernel; ``mode="busy"`` spins a core, like CPU inference.

``values="zeros"`` with ``seconds_per_record=0`` is a model that costs nothing: rows of zeros,
no per-record work, so a benchmark measures the pipeline's machinery alone (helpers.bench.scale).
The default, ``values="record"``, derives each row from its record (``record_vector``), so that a
test can check every row landed under its own id.

What tuning needs, modelled deterministically so that CPU tests reproduce a GPU's behaviour:

- ``seconds_per_workunit``: a fixed cost per workunit (a kernel launch, a transfer, a sync), so
  that small workunits waste time and the workunit size matters;
- ``parallelism``: a device runs at most that many workunits at once (one per lock file, worker
  copy ``c`` taking lock ``c % parallelism``), so that k workers on it reach
  ``min(k, parallelism) × speed`` and no more: the point where a real card saturates;
- ``device_memory_mib`` and ``model_mib``: a copy that does not fit fails to load, and each Ready
  reports the memory left, so that growth stops where a real card would run out.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
import weakref
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from helpers.engine.contract.protocol import MODEL_COPY_ENV, OutputSpec

MODES = ("sleep", "busy")
VALUES = ("record", "zeros")  # a vector per record (tests check the id -> row mapping), or zeros


class InjectedFailure(RuntimeError):
    """Raised on purpose by a SyntheticWorkload told to fail (tests, demonstrations)."""


def record_vector(record: Any, dim: int) -> np.ndarray:
    """A deterministic float32 vector for a record: what the synthetic 'model' outputs."""
    seed = zlib.crc32(repr(record).encode("utf-8"))
    return np.random.default_rng(seed).random(dim, dtype=np.float32)


@dataclass(frozen=True)
class SyntheticWorkload:
    """A fixed cost per record, scaled by a per-device speed factor (default 1.0).

    Faults to inject, for the failure paths' tests and demonstrations: ``fail_on_load`` and
    ``fail_on_records`` raise InjectedFailure at load time or when a workunit holds one of those
    records; ``exit_on_records`` makes the worker exit at once (``os._exit``, as a segfault would);
    ``hang_on_records`` makes it sleep for an hour; ``oom_above`` raises MemoryError for a workunit
    of more records than that; ``break_on_records`` raises and leaves the model broken, so that
    every later workunit of that worker fails too (a CUDA device-side assert does that). With
    ``transient`` (a folder) each record's fault fires only the first time, like a fault that goes
    away on retry. ``device_memory_mib`` simulates devices of that many MiB, each model copy taking
    ``model_mib``: a copy that does not fit fails to load. ``seconds_per_workunit`` and
    ``parallelism`` (an int for every device, or per device): see the module docstring.
    """

    seconds_per_record: float = 0.001
    speed: Mapping[str, float] = field(default_factory=dict)
    seconds_per_workunit: float = 0.0
    parallelism: int | Mapping[str, int] | None = None
    mode: str = "sleep"
    dim: int = 8
    values: str = "record"
    fail_on_load: bool = False
    fail_on_records: frozenset = frozenset()
    exit_on_records: frozenset = frozenset()
    hang_on_records: frozenset = frozenset()
    break_on_records: frozenset = frozenset()
    oom_above: int | None = None
    transient: str | None = None
    device_memory_mib: Mapping[str, float] = field(default_factory=dict)
    model_mib: float = 100.0
    name: str = "synthetic"
    requires_hardware: bool = False
    locks: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("seconds_per_record", "seconds_per_workunit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value < math.inf:
                raise ValueError(f"{name}: expected a finite number of seconds >= 0, got "
                                 f"{value!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        if self.values not in VALUES:
            raise ValueError(f"values: expected one of {VALUES}, got {self.values!r}")
        bad = {d: s for d, s in dict(self.speed).items() if not s > 0}
        if bad:
            raise ValueError(f"speed: factors must be > 0, got {bad}")
        object.__setattr__(self, "speed", dict(self.speed))
        for name in ("fail_on_records", "exit_on_records", "hang_on_records", "break_on_records"):
            object.__setattr__(self, name, frozenset(getattr(self, name)))
        object.__setattr__(self, "device_memory_mib", dict(self.device_memory_mib))
        if self.transient is not None:
            object.__setattr__(self, "transient", str(self.transient))
        if self.parallelism is not None:
            self._check_parallelism()
            locks = tempfile.mkdtemp(prefix="gpufeed-devices-")  # shared by every worker copy
            object.__setattr__(self, "locks", locks)
            weakref.finalize(self, shutil.rmtree, locks, True)

    def _check_parallelism(self) -> None:
        each = self.parallelism if isinstance(self.parallelism, Mapping) else {"*": self.parallelism}
        bad = {d: p for d, p in each.items() if isinstance(p, bool) or not isinstance(p, int)
               or p < 1}
        if bad:
            raise ValueError(f"parallelism: expected an integer >= 1 (or one per device), got "
                             f"{self.parallelism!r}")
        if isinstance(self.parallelism, Mapping):
            object.__setattr__(self, "parallelism", dict(self.parallelism))

    def device_parallelism(self, device: str) -> int | None:
        """Workunits ``device`` runs at once (None: no limit)."""
        if isinstance(self.parallelism, Mapping):
            return self.parallelism.get(device)
        return self.parallelism

    def load(self, device: str, threads: int) -> dict[str, Any]:
        copy = int(os.environ.get(MODEL_COPY_ENV, "0"))
        if self.fail_on_load:
            raise InjectedFailure(f"fail_on_load: refusing to load on {device}")
        capacity = self.device_memory_mib.get(device)
        if capacity is not None and (copy + 1) * self.model_mib > capacity:
            raise MemoryError(f"simulated: copy {copy + 1} of {self.model_mib:g} MiB does not fit "
                              f"in {device}'s {capacity:g} MiB")
        return {"device": device, "cost": self.seconds_per_record / self.speed.get(device, 1.0),
                "fixed": self.seconds_per_workunit / self.speed.get(device, 1.0), "copy": copy}

    def device_memory(self, model: dict[str, Any], device: str) -> tuple[float | None, float | None]:
        """Simulated (free MiB, MiB per copy) when ``device_memory_mib`` names the device."""
        capacity = self.device_memory_mib.get(device)
        if capacity is None:
            return None, None
        return capacity - (model["copy"] + 1) * self.model_mib, self.model_mib

    def outputs(self, model: Any) -> dict[str, OutputSpec]:
        return {"values": OutputSpec((self.dim,), "float32")}

    def check_record(self, record: Any) -> None:
        if record is None:
            raise TypeError("expected a record, got None")

    def process(self, model: dict[str, Any], records: list[Any]) -> dict[str, np.ndarray]:
        if self.exit_on_records or self.hang_on_records or self.break_on_records \
                or self.fail_on_records or model.get("broken"):
            self._inject_faults(model, records)
        if self.oom_above is not None and len(records) > self.oom_above:
            raise MemoryError(f"simulated: {len(records)} records do not fit "
                              f"(oom_above={self.oom_above})")
        seconds = model["cost"] * len(records) + model.get("fixed", 0.0)
        if seconds:
            with self._device_share(model):
                _spend(seconds, self.mode)
        if self.values == "zeros" or not records:
            return {"values": np.zeros((len(records), self.dim), np.float32)}
        return {"values": np.stack([record_vector(r, self.dim) for r in records])}

    @contextmanager
    def _device_share(self, model: dict[str, Any]) -> Iterator[None]:
        """Hold one of the device's ``parallelism`` locks while the work runs (none: no limit)."""
        parallelism = self.device_parallelism(model["device"])
        if parallelism is None or self.locks is None:
            yield
            return
        import fcntl  # POSIX; imported here so that a model without limits runs anywhere

        name = f"{model['device'].replace(':', '-')}-{model['copy'] % parallelism}"
        with open(os.path.join(self.locks, name), "a") as lock:  # a new open file: threads too
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _inject_faults(self, model: dict[str, Any], records: list[Any]) -> None:
        hashable = [r for r in records if _hashable(r)]
        if self._fires(self.exit_on_records, hashable):
            os._exit(70)  # no cleanup, no message: what a crashed worker looks like
        if self._fires(self.hang_on_records, hashable):
            time.sleep(3600)
        if model.get("broken") or self._fires(self.break_on_records, hashable):
            model["broken"] = True
            raise InjectedFailure("simulated: device-side assert triggered; this worker's device "
                                  "context is unusable")
        poisoned = self._fires(self.fail_on_records, hashable)
        if poisoned:
            raise InjectedFailure(f"fail_on_records: workunit holds {sorted(map(repr, poisoned))}")

    def fingerprint(self) -> dict[str, Any]:
        """What decides the values: a resumed run must keep these (timings may change)."""
        return {"workload": self.name, "dim": self.dim, "values": self.values}

    def attrs(self) -> dict[str, Any]:
        return {"workload": self.name, "seconds_per_record": self.seconds_per_record,
                "seconds_per_workunit": self.seconds_per_workunit,
                "parallelism": repr(self.parallelism), "speed": repr(self.speed),
                "mode": self.mode, "values": self.values}

    def _fires(self, faults: frozenset, records: list[Any]) -> list[Any]:
        """The records of ``faults`` present; with ``transient``, only those not yet fired."""
        hit = [r for r in records if r in faults]
        if self.transient is None:
            return hit
        fresh = []
        for record in hit:
            marker = os.path.join(self.transient, f"fired-{zlib.crc32(repr(record).encode())}")
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                fresh.append(record)
            except FileExistsError:
                pass
        return fresh


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
