"""What a run measured: throughput after spin-up, per-worker load, and time per pipeline stage."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerStats:
    worker: int
    device: str
    pid: int
    load_seconds: float  # model load (and warm-up), part of spin-up
    records: int
    workunits: int
    busy_seconds: float  # inside workload.process (and record checks)
    wait_seconds: float  # blocked on an empty work queue: starved, or waiting for the end


@dataclass(frozen=True)
class PipelineStats:
    """A run's measurements. ``wall_seconds`` runs from the reader's start (every worker ready) to
    the last record written; spin-up (spawning, imports, model loads) is ``spinup_seconds``."""

    records: int  # records written to the output
    failed_records: int  # records in the output's errors table
    wall_seconds: float
    spinup_seconds: float
    workers: tuple[WorkerStats, ...]
    stages: dict[str, float]  # seconds: read, reader_blocked, wait, compute, write
    devices: tuple[str, ...]
    workunit_size: int
    backend: str
    output: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def records_per_second(self) -> float:
        """Records written (failed ones excluded) per wall second after spin-up."""
        return self.records / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def partial(self) -> bool:
        """True when some records failed and are in the errors table instead of the output."""
        return self.failed_records > 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["records_per_second"] = self.records_per_second
        data["partial"] = self.partial
        return data

    def summary(self) -> str:
        """A few human lines: throughput, spin-up, and where each worker spent its time."""
        lines = [f"{self.records} records in {self.wall_seconds:.2f} s = "
                 f"{self.records_per_second:.1f} records/s after {self.spinup_seconds:.2f} s spin-up"
                 f" ({self.backend}, workunit {self.workunit_size}"
                 f"{f', {self.failed_records} failed' if self.failed_records else ''})"]
        for w in self.workers:
            lines.append(f"  worker {w.worker} {w.device:>7}: {w.records:>7} records "
                         f"{w.workunits:>5} units  busy {w.busy_seconds:7.2f} s  "
                         f"waiting {w.wait_seconds:6.2f} s  load {w.load_seconds:5.2f} s")
        lines.append("  stages: " + "  ".join(f"{k} {v:.2f} s" for k, v in self.stages.items()))
        return "\n".join(lines)
