"""One job on a pool's workers (helpers.engine.pool): the main loop that drives the scheduler
and hands what comes back to the writer, the job's clock, and what its workers did (running
totals per worker and a bounded timeline: nothing per record), as PipelineStats.

The loop, each turn (all of it in the driver's main thread)::

    scheduler.dispatch(feed) ──► next_messages ──► handle ──► results to the writer (sink),
         ▲                                                    given-up records to errors/
         └── check_timeouts, growth's step (its workers, shorter workunits while it decides)

until the feed is exhausted and the scheduler idle. A job that ends checks that every row the
input holds is in the output, written or in ``errors/`` (``check_accounted``), before the output
is marked complete.
"""
from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import Any

from helpers.engine.contract.fingerprint import same_everywhere
from helpers.engine.contract.messages import POLL_SECONDS, Died, Failed, Ready, Result, Workunit
from helpers.engine.contract.settings import JobSettings, PoolSettings
from helpers.engine.dispatch.growth import EXPLORE_SECONDS, Growth
from helpers.engine.dispatch.scheduler import PipelineError, Scheduler
from helpers.engine.dispatch.slots import Slot, State, loaded_reports
from helpers.engine.dispatch.taker import Feed, Taker
from helpers.engine.inputs.carried import Carried
from helpers.engine.measure.stats import (PipelineStats, Tally, Timeline, WorkerStats, WorkunitSpan,
                                          add_phases)
from helpers.engine.measure.telemetry import Telemetry
from helpers.engine.outputs.checkpoint import PartTarget
from helpers.engine.outputs.hdf5_sink import HDF5Sink
from helpers.engine.workers.worker import peak_memory

log = logging.getLogger("gpufeed")

SETTLED = 0.5  # growth measures a worker on workunits of at least this share of its target size
HOST = socket.gethostname()  # telemetry samples the workers on this machine


def _loader(info: Any, ready: Ready) -> str:
    """A worker's load, by name: its slot and process (a replacement in the same slot is
    another load)."""
    return f"{info} (pid {ready.pid})"


class Job:
    """One job on a pool's workers: its settings, its output, its clock, and what the workers did
    (running totals per worker and a bounded timeline: nothing per record)."""

    def __init__(self, scheduler: Scheduler, taker: Taker, settings: JobSettings, sink: HDF5Sink,
                 started: float, growth: Growth | None = None,
                 carried: dict[str, Any] | None = None, key: str | None = None) -> None:
        self.scheduler, self.taker = scheduler, taker
        self.settings, self.sink, self.started = settings, sink, started
        self.growth = growth
        self._taken: PipelineStats | None = None
        self._decided = len(growth.decisions) if growth is not None else 0
        if growth is not None:
            growth.new_job()
        self.tallies = {index: Tally() for index in scheduler.slots
                        if scheduler.slots[index].state is not State.RETIRED}
        self.timeline = Timeline()
        self.longest_idle = 0.0  # the longest a worker waited between two of its workunits
        self._ended: dict[int, tuple[Any, float]] = {}  # per slot: its worker, its last one's end
        self.rejected: deque[tuple] = deque()  # the reader's rejects, for errors/ (thread-safe)
        self.carried = Carried(carried or {}, key)  # the source's columns of the records in
        # flight, ``key`` the one of its keys (errors/key)
        self.clock = self.wall = self.read_s = self.reader_blocked_s = 0.0
        self._token, self._sends = secrets.token_hex(4), itertools.count()
        self._loaded = {_loader(s.info, s.ready): s.ready.identity
                        for s in scheduler.slots.values()
                        if s.ready is not None and s.ready.identity}  # (the start's, checked)

    def stamp(self, unit: Workunit) -> Workunit:
        """``unit`` as sent when workers write: where its worker writes its part (a name of its
        own each time it is sent: a retry never takes a late first attempt's file), and the
        source's columns for its records."""
        return replace(unit, target=self.target(),
                       carried=self.carried.peek(unit.ids) if self.carried else None)

    def target(self) -> PartTarget:
        """Where a worker writes its next part: a name no other part of any run has."""
        return self.sink.target(f"{self._token}-{next(self._sends)}")

    def once(self, take: Callable[[], PipelineStats]) -> Callable[[], PipelineStats]:
        """``take`` called once however often asked: the output's record of the job and the
        stats the job returns are one set (taking them reads the recovery since the last)."""
        def taken() -> PipelineStats:
            if self._taken is None:
                self._taken = take()
            return self._taken
        return taken

    def start_clock(self) -> None:
        self.clock = time.monotonic()
        self.telemetry = Telemetry(self._at_work, self.clock)
        self.telemetry.start()

    def stop_clock(self, read_s: float, reader_blocked_s: float) -> None:
        self.wall = time.monotonic() - self.clock
        self.read_s, self.reader_blocked_s = read_s, reader_blocked_s
        self.telemetry.stop()

    def _at_work(self) -> dict[int, tuple[str, int]]:
        """``{slot: (device, pid)}`` of the workers taking workunits on this machine (the
        telemetry thread's: a Ray actor on another node has a pid only there)."""
        return {s.info.index: (s.info.device, s.ready.pid)
                for s in list(self.scheduler.slots.values())
                if s.ready is not None and s.state in (State.READY, State.DRAINING)
                and s.ready.host in ("", HOST)}

    def drive(self, feed: Feed, total: int | None = None) -> None:
        """The main loop: feed the workers, hand what comes back to the writer, until ``feed``
        is exhausted and no workunit is left anywhere."""
        from tqdm.auto import tqdm

        scheduler, sink = self.scheduler, self.sink
        with tqdm(total=total, unit="rec", desc="records written",
                  disable=not self.settings.progress, dynamic_ncols=True) as bar, \
                _stopping(self.telemetry):
            while True:
                scheduler.dispatch(feed)
                bar.update(self._file_rejects())
                if feed.exhausted() and scheduler.idle:
                    bar.update(self._file_rejects())
                    return
                for slot, message in scheduler.next_messages(POLL_SECONDS):
                    if isinstance(message, Ready):
                        self.admit(slot, message)
                    written, given_up = scheduler.handle(slot, message)
                    if isinstance(message, (Failed, Died)):
                        self._ended.pop(slot, None)  # (the time to its next result was not idle)
                    for result in written:
                        bar.update(self._write(result))
                    sink.append_errors(self.carried.drop(given_up))
                    bar.update(len(given_up))
                sink.poll()
                scheduler.check_timeouts()
                if self.growth is not None and not self.growth.settled:
                    self.growth.step(scheduler, time.monotonic(), self.clock)
                    self.taker.explore(self.growth.deciding(), EXPLORE_SECONDS)  # short
                    # workunits while a count is decided

    def admit(self, slot: int, ready: Ready) -> None:
        """A worker ready mid-job (a replacement, one growth added) loaded what the job's
        workers did, or the job stops before it is given anything (PipelineError naming it: a
        hub revision that moved since the job's workers fetched theirs). Each load is compared
        with every one before it, a dead worker's too (a one-worker pool's replacement with the
        worker it replaces); where no worker had loaded when the job began, the first to load
        is what the others are compared with."""
        if not ready.identity or slot not in self.scheduler.slots:  # (discarded: "fit")
            return
        info = self.scheduler.slots[slot].info
        loaded = {**self._loaded, _loader(info, ready): ready.identity}
        try:
            same_everywhere({}, loaded)
        except ValueError as exc:
            raise PipelineError(f"{exc}; {info} started mid-job and was given nothing") from None
        self._loaded = loaded

    def _file_rejects(self) -> int:
        """Hand the records the reader rejected so far to the writer's errors/; how many."""
        rows = []
        while self.rejected:
            rows.append(self.rejected.popleft())
        for record_id, error_type, message, _, position, *_ in rows:
            log.warning("record %s failed: %s: %s", f"at position {position}" if position >= 0
                        else record_id, error_type, message)
        self.sink.append_errors(rows)
        return len(rows)

    def _write(self, result: Result) -> int:
        """Hand a result to the writer and add it to the totals; returns its records."""
        if result.part is not None:  # written by its worker: committed by the writer thread
            if self.carried:
                self.carried.take(result.ids)
            self.sink.commit(result.part)
        elif len(result.ids):
            arrays = {**result.arrays, **self.carried.take(result.ids)} if self.carried \
                else result.arrays
            self.sink.append(result.ids, arrays)
        rejected = self.carried.drop(result.rejected)
        for record_id, error_type, message, *_ in rejected:
            log.warning("record %d failed: %s: %s", record_id, error_type, message)
        self.sink.append_errors(rejected)
        slot = self.scheduler.slots[result.worker]
        device = slot.info.device
        span = WorkunitSpan(result.worker, device, result.workunit,
                            len(result.ids) + len(result.rejected), result.started - self.clock,
                            result.ended - self.clock, node=slot.ready.node if slot.ready else "",
                            phases=result.phases, counts=result.counts)
        self.tallies.setdefault(result.worker, Tally()).add(
            span.records, result.compute_s, result.peak_rss_mib, result.peak_gpu_mib,
            result.phases, result.counts, result.cpu_s)
        self.timeline.add(span)
        self._idle(slot, result)
        if self.growth is not None and self.taker.settled(result.worker, span.records, SETTLED):
            self.growth.observe(result.worker, device, span.records, result.started,
                                result.ended)
        return span.records

    def _idle(self, slot: Slot, result: Result) -> None:
        """The time ``result``'s worker waited since its previous workunit ended: nothing to run
        (both times from its own clock; not across a replacement, which may be on another
        machine)."""
        worker, ended = self._ended.get(result.worker, (None, 0.0))
        if worker is not None and worker is slot.ready:
            self.longest_idle = max(self.longest_idle, result.started - ended)
        self._ended[result.worker] = (slot.ready, result.ended)

    def decisions(self) -> tuple[dict[str, Any], ...]:
        """The growth decisions made during this job."""
        if self.growth is None:
            return ()
        return tuple(d.as_dict() for d in self.growth.decisions[self._decided:])

    def phases(self) -> dict[str, float]:
        """Compute's seconds by the workload's phases, summed over the workers."""
        total: dict[str, float] = {}
        for tally in self.tallies.values():
            add_phases(total, tally.phases)
        return total

    def counts(self) -> dict[str, int]:
        """What the workload counted (tokens, say), summed over the workers."""
        total: dict[str, int] = {}
        for tally in self.tallies.values():
            add_phases(total, tally.counts)
        return total

    def stats(self, pool: PoolSettings, spinup_s: float, recovery: dict[str, Any],
              output: Any) -> PipelineStats:
        """What this job did, as PipelineStats: its workers' totals, its stages, its timeline and
        decisions; the pool gives its settings, its spin-up and what it recovered from since the
        last job."""
        slots = self.scheduler.slots.values()
        workers = [self.worker_stats(slot) for slot in slots
                   if slot.state is not State.RETIRED or slot.info.index in self.tallies]
        stages = {"read": self.read_s, "reader_blocked": self.reader_blocked_s,
                  "wait": sum(w.wait_s for w in workers),
                  "compute": sum(w.busy_s for w in workers),
                  "write": self.sink.write_s, "write_blocked": self.sink.blocked_s}
        config = {k: v for k, v in (asdict(pool) | asdict(self.settings)).items()
                  if k not in ("devices", "workunit_size", "backend")}
        dispatches, sink = self.scheduler.dispatches, self.sink
        return PipelineStats(
            records=sink.records_written, failed_records=sink.errors_written,
            wall_s=self.wall, spinup_s=spinup_s, workers=tuple(workers),
            stages=stages, devices=tuple(w.device for w in workers),
            workunit_size=self.settings.workunit_size, backend=pool.backend,
            output=str(output), config=config, timeline=self.timeline.spans,
            peak_rss_mib=peak_rss(workers), recovery=recovery,
            resumed_after=sink.resumed_after, failed_before=sink.failed_before,
            parent_rss_mib=peak_memory("cpu")[0],
            first_dispatch_s=(dispatches.first - self.started)
            if dispatches.first is not None else 0.0,
            longest_dispatch_gap_s=dispatches.longest_gap,
            longest_idle_s=self.longest_idle,
            bytes_written=sink.bytes_written, output_bytes=sink.output_bytes,
            decisions=self.decisions(), telemetry=self.telemetry.samples, phases=self.phases(),
            counts=self.counts(), loaded=loaded_reports(slots))

    def worker_stats(self, slot: Slot) -> WorkerStats:
        tally, ready = self.tallies.get(slot.info.index, Tally()), slot.ready
        return WorkerStats(slot.info.index, slot.info.device, ready.pid if ready else 0,
                           ready.load_s if ready else 0.0, tally.records, tally.workunits,
                           tally.busy_s, max(0.0, self.wall - tally.busy_s),
                           tally.peak_rss_mib, tally.peak_gpu_mib, slot.restarts,
                           tally.cpu_s)


@contextmanager
def _stopping(telemetry: Telemetry) -> Iterator[None]:
    """Stop the telemetry thread however the job ends."""
    try:
        yield
    finally:
        telemetry.stop()


class _Dealt:
    """A static split's feed: every workunit was dealt to its worker before the job started."""

    records_put = 0  # (nothing is ever put: no wake-up is owed)

    def expect(self, n: int) -> None:
        pass

    def take(self, n: int) -> None:
        return None

    def backlog(self, n: int) -> int:
        return 0

    def remaining(self) -> int:
        return 0

    def exhausted(self) -> bool:
        return True

    def wake_on_more(self, mark: int) -> None:
        pass


DEALT = _Dealt()


def check_accounted(source: Any, expected: int | None, sink: HDF5Sink,
                    limit: int | None) -> None:
    """PipelineError, before the output is marked complete, unless every row the input holds
    (``expected``: sources.accounted; None, not known) is in the output, written or in
    ``errors/``: a row lost or read twice is never a finished run. With ``limit``, an output
    holding more (an earlier run's larger limit) is not one."""
    if expected is None:
        return
    sink.flush()
    held = sink.rows_held
    if held == expected or (limit is not None and held > expected):
        return
    raise PipelineError(f"{source.describe()}: the input holds {expected:,} rows and the output "
                        f"{held:,} (written or in errors/): {abs(expected - held):,} rows "
                        f"{'unaccounted for' if held < expected else 'too many'}; the output "
                        f"is left unfinished (a bug: please report it with the input's shape)")


def finished(job: Job, sink: HDF5Sink) -> PipelineStats:
    """The job's stats (taken as the output was finished, once every row was written, and
    recorded in it) with what finishing the output added: the wall time to the output whole,
    the writer's time and bytes."""
    stats = job.take_stats()
    wall = time.monotonic() - job.clock
    workers = tuple(replace(w, wait_s=max(0.0, wall - w.busy_s))
                    for w in stats.workers)
    return replace(stats, wall_s=wall, workers=workers,
                   stages={**stats.stages, "write": sink.write_s,
                           "write_blocked": sink.blocked_s,
                           "wait": sum(w.wait_s for w in workers)},
                   bytes_written=sink.bytes_written, output_bytes=sink.output_bytes,
                   parent_rss_mib=peak_memory("cpu")[0], peak_rss_mib=peak_rss(list(workers)))


def peak_rss(workers: list[WorkerStats]) -> float:
    """The driver's peak plus each worker process's (threads live in the driver)."""
    driver = os.getpid()
    by_pid = {w.pid: w.peak_rss_mib for w in workers if w.pid != driver}
    return peak_memory("cpu")[0] + sum(by_pid.values())
