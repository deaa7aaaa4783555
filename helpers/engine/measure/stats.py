"""What a run measured: throughput after spin-up, per-worker load and memory, time per stage, and
a timeline of which worker ran which workunit when.

Nothing here grows with the records of a run: a worker's figures are running totals (``Tally``)
and the timeline keeps at most TIMELINE_SPANS spans, coarser as a run goes on (``Timeline``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from helpers.engine.contract.renamed import older_name

TIMELINE_SPANS = 20_000  # spans kept per job: a figure's worth; past it, neighbours are merged


@dataclass(frozen=True)
class WorkerStats:
    worker: int
    device: str
    pid: int
    load_s: float  # model load (and warm-up), part of spin-up
    records: int
    workunits: int
    busy_s: float  # inside workload.process (and record checks)
    wait_s: float  # the rest of the job's wall time: starved, messaging, or idle at the end
    peak_rss_mib: float = 0.0  # the worker's process (threads share the driver's)
    peak_gpu_mib: float | None = None  # torch's peak allocation on its CUDA device
    restarts: int = 0  # replacements started in this slot since the pool started
    cpu_s: float | None = None  # its process's CPU answering workunits (None: threads)

    def __getattr__(self, name: str) -> Any:
        return older_name(self, name)


@dataclass(frozen=True)
class WorkunitSpan:
    """One workunit on the timeline: seconds from the job's start."""

    worker: int
    device: str
    workunit: int
    records: int
    start_s: float
    end_s: float
    workunits: int = 1  # >1: consecutive workunits of this worker merged (a long run's timeline)
    node: str = ""  # the Ray node the worker ran on ("" off Ray)
    phases: dict[str, float] | None = None  # seconds per phase inside it (workload.phases)
    counts: dict[str, int] | None = None  # what the workload counted in it (workload.counts)

    @property
    def padding(self) -> float | None:
        """Tokens computed ÷ tokens needed (padding's cost; None where nothing was counted)."""
        return padding(self.counts)


def padding(counts: dict[str, int] | None) -> float | None:
    """``tokens_computed`` ÷ ``tokens_needed`` of a workload's counts, if it counts them."""
    if not counts or not counts.get("tokens_needed"):
        return None
    return counts["tokens_computed"] / counts["tokens_needed"]


def add_phases(total: dict[str, float], phases: dict[str, float] | None) -> dict[str, float]:
    """``total`` with ``phases`` added to it, phase by phase."""
    for phase, seconds in (phases or {}).items():
        total[phase] = total.get(phase, 0.0) + seconds
    return total


@dataclass
class Tally:
    """One worker's running totals over a job."""

    records: int = 0
    workunits: int = 0
    busy_s: float = 0.0
    peak_rss_mib: float = 0.0
    peak_gpu_mib: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    cpu_s: float | None = None

    def add(self, records: int, busy_s: float, rss_mib: float, gpu_mib: float | None,
            phases: dict[str, float] | None = None,
            counts: dict[str, int] | None = None, cpu_s: float | None = None) -> None:
        add_phases(self.phases, phases)
        if cpu_s is not None:
            self.cpu_s = (self.cpu_s or 0.0) + cpu_s
        add_phases(self.counts, counts)
        self.records += records
        self.workunits += 1
        self.busy_s += busy_s
        self.peak_rss_mib = max(self.peak_rss_mib, rss_mib)
        if gpu_mib is not None:
            self.peak_gpu_mib = max(self.peak_gpu_mib or 0.0, gpu_mib)


class Timeline:
    """Workunit spans in bounded memory: one span per workunit until ``limit`` are kept; then
    every two consecutive spans of a worker become one (first start to second end, records
    summed), and from then on each new span stands for 2, 4, 8 ... workunits. A day-long run keeps
    its whole shape, at a coarser grain; the idle gaps inside a merged span are lost."""

    def __init__(self, limit: int = TIMELINE_SPANS) -> None:
        self.limit, self.grain = limit, 1
        self._spans: list[WorkunitSpan] = []
        self._open: dict[int, WorkunitSpan] = {}  # per worker: a span still gathering workunits

    def add(self, span: WorkunitSpan) -> None:
        held = self._open.pop(span.worker, None)
        if held is not None:
            span = _joined(held, span)
        if span.workunits < self.grain:
            self._open[span.worker] = span
            return
        self._spans.append(span)
        if len(self._spans) >= self.limit:
            self._coarsen()

    def _coarsen(self) -> None:
        self.grain *= 2
        merged: list[WorkunitSpan] = []
        pending: dict[int, WorkunitSpan] = {}
        for span in self._spans:
            held = pending.pop(span.worker, None)
            if held is None:
                pending[span.worker] = span
            else:
                merged.append(_joined(held, span))
        self._spans = merged
        for worker, span in pending.items():  # an odd one out joins the worker's open span
            held = self._open.pop(worker, None)
            span = span if held is None else _joined(span, held)
            if span.workunits >= self.grain:
                self._spans.append(span)
            else:
                self._open[worker] = span

    @property
    def spans(self) -> tuple[WorkunitSpan, ...]:
        return tuple(self._spans) + tuple(self._open.values())


def _joined(first: WorkunitSpan, second: WorkunitSpan) -> WorkunitSpan:
    phases = None if first.phases is None and second.phases is None else \
        add_phases(add_phases({}, first.phases), second.phases)
    counts = None if first.counts is None and second.counts is None else \
        add_phases(add_phases({}, first.counts), second.counts)
    return replace(first, records=first.records + second.records, end_s=second.end_s,
                   workunits=first.workunits + second.workunits, phases=phases, counts=counts)


@dataclass(frozen=True, kw_only=True)  # (23 fields: built by name)
class PipelineStats:
    """A job's measurements. ``wall_s`` runs from the job's first read (every worker ready)
    to its output closed, every record written; spin-up (starting workers, imports, model loads) is
    ``spinup_s``, the same for every job of a pool."""

    records: int  # records written to the output
    failed_records: int  # records in the output's errors table
    wall_s: float
    spinup_s: float
    workers: tuple[WorkerStats, ...]
    stages: dict[str, float]  # seconds: read, reader_blocked, wait, compute, write, write_blocked
    devices: tuple[str, ...]
    workunit_size: int | str  # "auto": sized per worker (the timeline has each workunit's size)
    backend: str
    output: str
    config: dict[str, Any] = field(default_factory=dict)
    timeline: tuple[WorkunitSpan, ...] = ()  # per workunit (merged past TIMELINE_SPANS)
    peak_rss_mib: float = 0.0  # the driver's high-water mark plus each worker process's
    recovery: dict[str, Any] = field(default_factory=dict)  # deaths, timeouts, retries, splits...
    resumed_after: int = 0  # records an earlier run handled (written, failed, rejected): skipped
    failed_before: int = 0  # of those, the records an earlier run filed in the errors table
    parent_rss_mib: float = 0.0  # the parent process's own high-water mark
    first_dispatch_s: float = 0.0  # from the job's start (output opened, resume scanned)
    longest_dispatch_gap_s: float = 0.0  # no workunit sent for this long (messages of
    # several workunits go out further apart, their workers busy meanwhile)
    longest_idle_s: float = 0.0  # the worst stall: the longest a worker waited between two
    # of its workunits (from the end of one to the start of the next, on its own clock)
    bytes_written: int = 0  # every byte the writer wrote: parts, merges, indexes, the final file
    output_bytes: int = 0  # the finished output's size (its parts too, if it is an index)
    decisions: tuple[dict[str, Any], ...] = ()  # workers_per_device="auto": growth's decisions
    # helpers.engine.measure.telemetry.Sample: each device's use, twice a second
    telemetry: tuple = ()
    phases: dict[str, float] = field(default_factory=dict)  # compute's seconds by the workload's
    # phases, every worker's summed (the embedding workload: tokenize, forward, copy_out)
    counts: dict[str, int] = field(default_factory=dict)  # what the workload counted, summed
    # (the embedding workload: tokens_computed, tokens_needed: ``padding``)
    loaded: dict[str, dict] = field(default_factory=dict)  # what each device's workers said of
    # the model they loaded (``workload.report``: the embedding workload's path, its tokenizing)

    def __getattr__(self, name: str) -> Any:
        return older_name(self, name)

    @property
    def padding(self) -> float | None:
        """Tokens computed ÷ tokens needed over the job: 1.0 when no batch padded a text."""
        return padding(self.counts)

    @property
    def card_busy_share(self) -> float | None:
        """A simulated card's busy seconds ÷ (cards × wall seconds), each device label one
        card; None where no card was simulated."""
        busy = self.counts.get("card_busy_us")
        if not busy or self.wall_s <= 0:
            return None
        return busy / 1e6 / (self.wall_s * (len(set(self.devices)) or 1))

    @property
    def worker_cpu_s(self) -> float | None:
        """CPU seconds every worker process spent answering workunits (None: thread workers,
        whose CPU is their process's, the driver's)."""
        cpu = [w.cpu_s for w in self.workers if w.cpu_s is not None]
        return sum(cpu) if cpu else None

    @property
    def write_amplification(self) -> float:
        """Bytes written ÷ bytes of the finished output (1.0: each byte written once)."""
        return self.bytes_written / self.output_bytes if self.output_bytes else 0.0

    @property
    def records_per_s(self) -> float:
        """Records written (failed ones excluded) per wall second after spin-up."""
        return self.records / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def efficiency(self) -> float:
        """The workers' busy seconds ÷ (workers × wall seconds): 1.0 when no worker ever waits."""
        busy = sum(w.busy_s for w in self.workers)
        return busy / (len(self.workers) * self.wall_s) if self.wall_s > 0 else 0.0

    @property
    def per_device(self) -> dict[str, dict[str, Any]]:
        """Each device's share of the job: its workers, records, records/s, busy share (its
        workers' busy seconds ÷ (workers × wall)), the largest worker process's peak RSS and the
        largest peak of device memory (None where torch measured none)."""
        report: dict[str, dict[str, Any]] = {}
        for device in dict.fromkeys(w.device for w in self.workers):
            mine = [w for w in self.workers if w.device == device]
            records = sum(w.records for w in mine)
            gpu = [w.peak_gpu_mib for w in mine if w.peak_gpu_mib is not None]
            report[device] = {
                "workers": len(mine), "records": records,
                "records_per_s": records / self.wall_s if self.wall_s > 0 else 0.0,
                "busy_share": sum(w.busy_s for w in mine) / (len(mine) * self.wall_s)
                if self.wall_s > 0 else 0.0,
                "peak_rss_mib": max(w.peak_rss_mib for w in mine),
                "peak_gpu_mib": max(gpu) if gpu else None}
        return report

    @property
    def partial(self) -> bool:
        """True when some records failed and are in the errors table instead of the output (this
        run's or, on a resume, an earlier one's: the exit status says what the output holds)."""
        return self.failed_records + self.failed_before > 0

    def to_dict(self) -> dict[str, Any]:
        """Everything but the timeline and the telemetry (too long for a summary line)."""
        data = asdict(self)
        del data["timeline"], data["telemetry"]
        data["records_per_s"] = self.records_per_s
        data["partial"] = self.partial
        data["write_amplification"] = self.write_amplification
        data["efficiency"] = self.efficiency
        data["worker_cpu_s"] = self.worker_cpu_s
        data["card_busy_share"] = self.card_busy_share
        data["padding"] = self.padding
        data["per_device"] = self.per_device
        return data

    def summary(self) -> str:
        """A few human lines: throughput, spin-up, and where each worker spent its time."""
        lines = [f"{self.records} records in {self.wall_s:.2f} s = "
                 f"{self.records_per_s:.1f} records/s after {self.spinup_s:.2f} s spin-up"
                 f" ({self.backend}, workunit {self.workunit_size}"
                 f"{f', {self.failed_records} failed' if self.failed_records else ''}"
                 f"{f', {self.resumed_after} done before' if self.resumed_after else ''}"
                 f"{f' ({self.failed_before} of them failed)' if self.failed_before else ''}; "
                 f"peak RSS {self.peak_rss_mib:.0f} MiB)"]
        for w in self.workers:
            lines.append(f"  worker {w.worker} {w.device:>7}: {w.records:>7} records "
                         f"{w.workunits:>5} units  busy {w.busy_s:7.2f} s  "
                         f"waiting {w.wait_s:6.2f} s  load {w.load_s:5.2f} s")
        for device, d in self.per_device.items():
            gpu = f", device memory {d['peak_gpu_mib']:.0f} MiB" if d["peak_gpu_mib"] else ""
            lines.append(f"  device {device}: {d['workers']} worker{'s' * (d['workers'] > 1)}, "
                         f"{d['records']} records ({d['records_per_s']:.1f}/s), busy "
                         f"{d['busy_share']:.0%}, peak RSS {d['peak_rss_mib']:.0f} MiB{gpu}")
        lines.append("  stages: " + "  ".join(f"{k} {v:.2f} s" for k, v in self.stages.items()))
        if self.phases:
            compute = sum(self.phases.values()) or 1.0
            lines.append("  inside compute: " + "  ".join(
                f"{k} {v:.2f} s ({v / compute:.0%})" for k, v in self.phases.items()))
        if self.padding is not None:
            lines.append(f"  padding: {self.padding:.2f}x (tokens computed / tokens needed, "
                         f"{int(self.counts['tokens_needed']):,} needed)")  # (counts are summed as floats)
        if self.card_busy_share is not None:
            lines.append(f"  simulated card{'s' * (len(set(self.devices)) > 1)}: busy "
                         f"{self.card_busy_share:.0%} of "
                         f"the run (a wait of the card's cost model: no model ran, the rows are "
                         f"zeros)")
        for d in self.decisions:
            lines.append(f"  at {d['seconds']:6.1f} s {d['device']}: {d['action']} -> "
                         f"{d['workers']} workers ({d['reason']})")
        incidents = {k: v for k, v in self.recovery.items() if v and k != "restart_s"}
        if incidents:
            lines.append("  recovered from: " + "  ".join(f"{k} {v}" for k, v in incidents.items()))
        return "\n".join(lines)
