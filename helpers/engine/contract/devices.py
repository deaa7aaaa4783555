"""Device strings: parsing, availability, and each worker's share of the cores.

A run's ``devices`` lists one entry per worker: ``["cuda:0", "cuda:0", "cuda:1"]`` is two workers on
GPU 0 and one on GPU 1; ``"cpu"`` entries likewise. ``"cuda:0*2"`` is short for two entries, and
``"auto"`` stands for every device this machine has (``visible_devices``): ``"auto*2"`` puts two
workers on each. torch is imported only to check a CUDA or MPS entry, or to resolve ``"auto"``, so
CPU-only runs (and the synthetic workload) never pay for it here.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

_DEVICE = re.compile(r"^(cpu|cuda(?::\d+)?|mps|auto)(?:\*(\d+))?$")
ACCEPTED = "'cpu', 'cuda', 'cuda:N', 'mps' or 'auto', each optionally '*k' for k workers"


def parse_devices(devices: str | Iterable[str],
                  visible: Callable[[], tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """Normalise a device list (or a comma-separated string) to a tuple, one entry per worker.

    ``"cuda"`` becomes ``"cuda:0"``, ``"cuda:1*2"`` two entries, ``"auto"`` what ``visible``
    returns (default ``visible_devices``: this machine's; a Ray cluster's devices on Ray).
    Raises ValueError naming the first entry that is not a device.
    """
    entries = devices.split(",") if isinstance(devices, str) else list(devices)
    parsed: list[str] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise ValueError(f"devices: entry {entry!r} is not a string; expected {ACCEPTED}")
        match = _DEVICE.match(entry.strip().lower())
        times = int(match.group(2) or 1) if match else 0
        if not times:
            raise ValueError(f"devices: unknown device {entry!r}; expected {ACCEPTED}")
        name = match.group(1)
        names = (visible or visible_devices)() if name == "auto" else ("cuda:0" if name == "cuda" else name,)
        parsed.extend(device for device in names for _ in range(times))
    if not parsed:
        raise ValueError("devices is empty; name at least one worker's device, e.g. ['cpu']")
    return tuple(parsed)


def visible_devices() -> tuple[str, ...]:
    """Every CUDA GPU this process may use (CUDA_VISIBLE_DEVICES applies), else Apple's MPS,
    else the CPU."""
    try:
        import torch
    except ImportError:
        return ("cpu",)
    if torch.cuda.is_available() and torch.cuda.device_count():
        return tuple(f"cuda:{i}" for i in range(torch.cuda.device_count()))
    if torch.backends.mps.is_available():
        return ("mps",)
    return ("cpu",)


def check_available(devices: Sequence[str]) -> None:
    """ValueError (a bad argument: the CLI's exit status 2) if a listed accelerator is not
    present on this machine."""
    cuda = sorted({int(d.split(":")[1]) for d in devices if d.startswith("cuda:")})
    if cuda:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        missing = [f"cuda:{i}" for i in cuda if i >= count]
        if missing:
            have = f"cuda:0..cuda:{count - 1}" if count else "none"
            raise ValueError(f"devices: {', '.join(missing)} not available on this machine "
                             f"(CUDA devices present: {have}): name one of those, 'cpu', or "
                             f"'auto' for every device here")
    if "mps" in devices:
        import torch

        if not torch.backends.mps.is_available():
            raise ValueError("devices: 'mps' is not available on this machine")


def available_cores() -> int:
    """Cores this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def share_of_cores(models: int, cores: int | None = None) -> int:
    """An even share of this machine's cores (``cores``, None: those this process may run on)
    for each of ``models`` models at work at once, at least one: a CPU model's threads, and
    beside a card's model (whose compute is the card's) the cores its worker tokenizes and
    collates on. Four workers on a 16-core node's cards have four each, not sixteen: each
    starts three tokenizing processes, not eight (workloads.embedding.loading)."""
    return max(1, (cores or available_cores()) // max(1, models))


def workers_in_words(devices: Sequence[str]) -> str:
    """'2 workers on cpu, 1 worker on cuda:0': one entry of ``devices`` per worker."""
    return ", ".join(f"{n} worker{'s' * (n > 1)} on {device}"
                     for device, n in Counter(devices).items())


def threads_in_words(threads: int) -> str:
    """'2 threads each': a worker's CPU threads, as the tuner's trials say them."""
    return f"{threads} thread{'s' * (threads > 1)} each"
