"""A run's settings: two frozen dataclasses, validated on construction, each default written once.

- ``PoolSettings``: what a pool of workers is started with and keeps until it closes (where the
  workers run, how many, how failures are handled, how deep the work queue is);
- ``JobSettings``: what may change from one job to the next on the same pool (workunit size,
  limit, sort window, progress bar, resume, overwrite).

Two settings may be ``"auto"``: ``workers_per_device`` (start one worker per device and add more
while the device's measured rate rises: helpers.engine.dispatch.growth) and ``workunit_size`` (each
worker's workunits sized from its measured rate to take about ``workunit_seconds``:
helpers.engine.measure.sizing).

``split_options`` sorts a flat ``**options`` (the way ``run_pipeline`` and ``WorkerPool`` take them)
into the two. A bad value raises ValueError naming the setting and what it expected.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import InitVar, dataclass, fields
from typing import Any

import numpy as np

from helpers.engine.contract.devices import parse_devices, share_of_cores
from helpers.engine.contract.messages import WorkerInfo

# helpers.engine.workers.backends and .ray_backend implement them
BACKENDS = ("process", "thread", "ray")
WRITES = ("auto", "driver", "workers")  # who writes the rows (JobSettings.writes)
IN_PLACE_GONE = ("durable=False (--in-place) is deprecated and will be removed: writing the "
                 "output in place measured no faster than crash-safe parts (0.99x: "
                 "failure_costs.csv, docs/benchmarks.md), so the run writes parts as any run "
                 "does; an output over 256 MiB stays an index over them, which `python -m "
                 "helpers compact OUTPUT` makes one file")  # JobSettings.durable
ADAPTIVE_GONE = ("adaptive=True (--adaptive) is deprecated and will be removed: it is the older "
                 "name of workers_per_device='fit' (--workers-per-device fit), which does the "
                 "same")  # PoolSettings.adaptive
QUEUE_DEPTH_PER_WORKER = 2  # workunits waiting per worker: enough to hide the reader's latency
AHEAD_SECONDS = 0.1  # and the reader queues the most records the scheduler took within this
# long, if more: a dispatch's takes (a grown message, or one for every worker added) fall within
# it, and the reader refills between two (helpers.engine.dispatch.reader)
SORT_WORKUNITS = 8  # default sort window, in workunits, and at least SORT_RECORDS records: a
SORT_RECORDS = 16384  # global sort's gain (a 2,400-text job on a loaded pool: 0.95 of bare encode
# at 8 workunits of 64, 0.98-1.02 with the whole job in the window) for a few MB of texts
AUTO = "auto"
FIT = "fit"  # workers_per_device: as many as fit in each device's memory, added at spin-up
RAY_UNITS_PER_MESSAGE = 4  # units_per_message="auto" on Ray with fixed workunit sizes, to start
# with: a call on an actor costs the driver ~1 ms of CPU whatever it carries (under Ray's 100 KB
# for inline arguments: ids travel packed, helpers.engine.contract.messages), four workunits a call
# a quarter of that per workunit; elsewhere, and with sizes from the workers' rates (each workunit
# about a second of work), one
MESSAGE_SECONDS = 0.25  # units_per_message="auto", fixed workunit sizes: a worker whose workunits
# are shorter than this gets more of them a message, up to about this much of its work (its
# workunits' measured seconds), twice as many as its last message at most, and
# MAX_UNITS_PER_MESSAGE: short workunits cost the driver a message each otherwise
# (bench dispatch: on Ray 0.92 ms of its CPU per workunit at one a call, 0.32 at four, 0.16 at
# sixteen; on process workers 0.27 at one, 0.15 at four or more), long ones (4,096 texts on a
# GPU, an image batch) keep the start's size, so a call's answers, its timeout and a death's
# redo stay short
MAX_UNITS_PER_MESSAGE = 16  # (32 saved nothing more on either backend)
MESSAGE_RECORDS = 4096  # and no more records a message than this (or than per_message
# workunits) where the driver holds them: texts it read itself, queued and in flight, whose rows
# come back through it anyway (~11 ms of its CPU per 4,096-row workunit, against ~0.1 for a
# message); twelve a message of 4,096 texts kept ~320 MiB more of the driver over 1 M texts, four
# ~70 MiB. Not where each worker reads its own (the positions of a range are all it holds)
WORKUNIT_SECONDS = 1.0  # workunit_size="auto": a workunit takes about this long on its device;
# long enough that a workunit's fixed costs (messages, a kernel launch) are ~1 % of it, short
# enough that the end of a job (cut finer still) and a retried workunit cost little


@dataclass(frozen=True)
class PoolSettings:
    """Fixed when the workers start: to change one, start another pool."""

    devices: tuple[str, ...] = ("auto",)  # one entry per worker, e.g. ("cuda:0", "cuda:0", "cpu");
    # "auto": every GPU here (CUDA_VISIBLE_DEVICES applies), else MPS, else the CPU, as encode
    # picks its device by itself
    backend: str = "process"  # one of BACKENDS
    workers_per_device: int | str = 1  # workers on each entry of devices; "auto": grow while the
    # device's measured rate rises (and its memory allows); "fit": as many as fit in its memory,
    # started one at a time before any work (the one choice of how many workers a device gets)
    threads_per_worker: int | None = None  # CPU threads per cpu worker; None = an even share
    queue_depth: int | None = None  # workunits the reader queues (of the largest size taken),
    # at most; None = 2 per worker, times the workunits a message (units_per_message), or the
    # most taken within AHEAD_SECONDS if more
    adaptive: bool = False  # deprecated: the same as workers_per_device="fit" (its older name)
    max_workers_per_device: int = 8  # "auto", "fit": the most workers tried on one device
    retries: int = 1  # times a failed workunit is retried whole before it is split
    max_restarts: int = 10  # replacements per worker slot after deaths and timeouts
    workunit_timeout: float | None = None  # seconds a workunit may run before its worker is killed
    load_timeout: float = 600.0  # seconds for every worker to load its model
    units_per_message: int | str = AUTO  # workunits sent to a worker in one message (one Ray call);
    # "auto": RAY_UNITS_PER_MESSAGE on Ray with fixed workunit sizes, else 1, to start with; then
    # (fixed sizes) more for a worker whose workunits take under MESSAGE_SECONDS
    ray_address: str | None = None  # backend="ray": the cluster's head ("host:6379", "auto");
    # None: a cluster this process already joined, else a local Ray started for the pool
    visible: InitVar[Callable[[], tuple[str, ...]] | None] = None  # what "auto" devices are where
    # the workers are not this machine's (the backend says:
    # helpers.engine.workers.backends.visible_devices)

    def __post_init__(self, visible: Callable[[], tuple[str, ...]] | None) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {self.backend!r}")
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError(f"ray_address: only for backend='ray' (backend is {self.backend!r})")
        if self.adaptive:
            if self.workers_per_device not in (1, FIT):
                raise ValueError(f"adaptive: the same as workers_per_device='fit'; it cannot go "
                                 f"with workers_per_device={self.workers_per_device!r}")
            warnings.warn(ADAPTIVE_GONE, FutureWarning, stacklevel=3)
            object.__setattr__(self, "workers_per_device", FIT)
            object.__setattr__(self, "adaptive", False)  # said once: a replace() may change it
        if self.workers_per_device not in (AUTO, FIT):
            positive_int("workers_per_device", self.workers_per_device, also=(AUTO, FIT))
        for name in ("threads_per_worker", "queue_depth"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        positive_int("max_workers_per_device", self.max_workers_per_device)
        for name in ("retries", "max_restarts"):
            positive_int(name, getattr(self, name), allow_zero=True)
        if self.workunit_timeout is not None:
            seconds("workunit_timeout", self.workunit_timeout)
        seconds("load_timeout", self.load_timeout)
        if self.units_per_message != AUTO:
            positive_int("units_per_message", self.units_per_message, also=(AUTO,))
        object.__setattr__(self, "devices", parse_devices(self.devices, visible))  # (last:
        # "auto" asks torch or Ray, seconds that a wrong option above need not cost)

    @property
    def growing(self) -> bool:
        """True when workers are added while they raise a device's rate
        (workers_per_device="auto")."""
        return self.workers_per_device == AUTO

    @property
    def filling(self) -> bool:
        """True when each device gets as many workers as fit in its memory (workers_per_device=
        "fit", or adaptive), started one at a time before any work."""
        return self.workers_per_device == FIT

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """One entry per worker the pool starts with: each entry of ``devices`` workers_per_device
        times; one per distinct device when growing."""
        if self.growing or self.filling:  # (one each to start; filling starts its own)
            return tuple(dict.fromkeys(self.devices))
        return tuple(d for d in self.devices for _ in range(self.workers_per_device))

    @property
    def growing_messages(self) -> bool:
        """True when a worker's messages grow while its workunits are short (MESSAGE_SECONDS)."""
        return self.units_per_message == AUTO

    def per_message(self, auto_size: bool) -> int:
        """Workunits in one message to a worker, for a job with ``auto_size`` or fixed sizes (to
        start with, where messages grow)."""
        if self.units_per_message != AUTO:
            return self.units_per_message
        return RAY_UNITS_PER_MESSAGE if self.backend == "ray" and not auto_size else 1

    def depth(self, per_message: int = 1, workers: int | None = None) -> int:
        """Workunits the reader may queue ahead of the scheduler (``per_message`` per message,
        for ``workers`` workers: those the pool starts with, if not said)."""
        workers = len(self.worker_devices) if workers is None else workers
        return self.queue_depth or QUEUE_DEPTH_PER_WORKER * workers * per_message

    @property
    def ahead_s(self) -> float:
        """Seconds of what the scheduler took that the reader queues, if more than ``depth``
        workunits: AHEAD_SECONDS, or 0 where the user set ``queue_depth`` (a bound)."""
        return 0.0 if self.queue_depth else AHEAD_SECONDS

    def workers(self) -> list[WorkerInfo]:
        """One WorkerInfo per worker to start; ``copy`` counts the earlier ones on its device."""
        devices = self.worker_devices
        return [self.worker(i, device, devices[:i].count(device))
                for i, device in enumerate(devices)]

    def worker(self, index: int, device: str, copy: int = 0) -> WorkerInfo:
        """Worker ``index``, the ``copy``-th on ``device`` (the only place a WorkerInfo is made:
        the pool's first workers, "fit"'s and growth's added ones), with its share of this
        machine's cores (``models``). A CPU worker's threads: ``threads_per_worker``, else one
        where workers are added one at a time (they scale by their number), else the share.
        A card worker's: the share, which its workload tokenizes on (on Ray, each actor takes
        its node's: ray_backend.on_its_node)."""
        threads = self.threads_per_worker or (1 if self.growing or self.filling else None)
        share = share_of_cores(self.models)
        return WorkerInfo.on(index, device, threads or share, copy, share)

    @property
    def models(self) -> int:
        """Models at work at once on this machine's cores, among which they are shared: each
        worker's (a CPU worker's threads each run their forward pass), but one per card on the
        thread backend (its threads share their device's model and its tokenizing) and where
        workers are added one at a time (their count unknown: each gets its device's share)."""
        devices = self.worker_devices
        cards = [d for d in devices if d != "cpu"]
        per_device = self.backend == "thread" or self.growing or self.filling
        return len(devices) - len(cards) + (len(set(cards)) if per_device else len(cards))


@dataclass(frozen=True)
class JobSettings:
    """May change from one job to the next on the same pool."""

    workunit_size: int | str = AUTO  # records per workunit, or "auto" (the default): sized per
    # worker from its rate, about a second of work each: within a few % of the best fixed size
    # on long jobs (autotune_bench.csv 15.2-16.0 k vs 16.1 k at 4,000 and 11.9 k at 250); on the
    # tuner's trials of a second or two, level with it to ~10 % behind (at 6a80879:
    # tune_trials.csv 78 vs 78-81 records/s on the CPU, card_tune_trials.csv 6,923 vs
    # 7,521-7,832 on a simulated H200); small fixed ones starve a card (card_workunit_sizes.csv:
    # 64 records fed a simulated H200 51 % at 6a80879, 80 % at 1a4f267; 1,024 82 %, 91 %); the
    # older default was 100
    workunit_seconds: float = WORKUNIT_SECONDS  # workunit_size="auto": seconds a workunit should take
    limit: int | None = None  # stop after this many records
    sort_window: int | None = None  # records ordered by cost before cutting; None = 8 workunits
    # (at least SORT_RECORDS), 0 = off
    progress: bool = True  # a progress bar on stderr
    durable: bool = True  # deprecated: False (--in-place) wrote the output in place, no faster
    # than parts (failure_costs.csv); it now warns, and the run writes parts as any run does
    resume: bool = False  # skip the ids the output already holds (or gave up on)
    overwrite: bool = False  # replace an existing output (without it, an existing one is refused)
    stop_at: float | None = None  # a time.monotonic() after which no workunit is dispatched:
    # the job ends with those in flight, its output holding fewer rows (a time-boxed trial: the
    # tuner's; no output of it is ever resumed)
    writes: str = AUTO  # who writes the rows: the driver's writer thread ("driver"), or each
    # worker its workunits' own part files, the driver only committing them ("workers");
    # "auto": workers on Ray when they can read the source too (``rows``), else the driver

    def __post_init__(self) -> None:
        if self.workunit_size != AUTO:
            positive_int("workunit_size", self.workunit_size, also=(AUTO,))
        seconds("workunit_seconds", self.workunit_seconds)
        for name in ("limit", "sort_window"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), allow_zero=True)
        if not self.durable:
            warnings.warn(IN_PLACE_GONE, FutureWarning, stacklevel=3)
        if self.writes not in WRITES:
            raise ValueError(f"writes: expected one of {WRITES}, got {self.writes!r}")
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite: choose one (resume keeps what the output "
                             "holds, overwrite replaces it)")

    @property
    def auto_size(self) -> bool:
        return self.workunit_size == AUTO

    @property
    def samples_only(self) -> bool:
        """Whether the input's identity is taken from its samples alone: a new run with a limit
        (a try reads no more; a resume checks every byte: helpers.engine.contract.fingerprint)."""
        return self.limit is not None and not self.resume

    @property
    def window(self) -> int:
        """Records the reader orders by cost at a time (0: none)."""
        if self.sort_window is not None:
            return self.sort_window
        return SORT_RECORDS if self.auto_size else \
            max(SORT_RECORDS, SORT_WORKUNITS * self.workunit_size)


POOL_SETTINGS = tuple(f.name for f in fields(PoolSettings))
JOB_SETTINGS = tuple(f.name for f in fields(JobSettings))


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``options`` as (PoolSettings fields, JobSettings fields); TypeError naming any that is
    neither."""
    unknown = sorted(set(options) - set(POOL_SETTINGS) - set(JOB_SETTINGS))
    if unknown:
        raise TypeError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                        f"a pool takes {', '.join(POOL_SETTINGS)}; a job takes "
                        f"{', '.join(JOB_SETTINGS)}")
    return ({k: v for k, v in options.items() if k in POOL_SETTINGS},
            {k: v for k, v in options.items() if k in JOB_SETTINGS})


def positive_int(name: str, value: Any, allow_zero: bool = False,
                 also: tuple[str, ...] = ()) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an integer >= 1 (>= 0 if allowed);
    ``also`` names the words the setting takes too, for the message."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < (0 if allow_zero else 1):
        expected = or_words([f"an integer >= {int(not allow_zero)}", *map(repr, also)])
        raise ValueError(f"{name}: expected {expected}, got {value!r}")


def or_words(words: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def seconds(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a number of seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: expected seconds > 0, got {value!r}")
