"""Device strings: parsing, availability, and each CPU worker's share of the cores.

A run's ``devices`` lists one entry per worker: ``["cuda:0", "cuda:0", "cuda:1"]`` is two workers on
GPU 0 and one on GPU 1; ``"cpu"`` entries likewise. torch is imported only to check a CUDA or MPS
entry, so CPU-only runs (and the synthetic workload) never pay for it here.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")
ACCEPTED = "'cpu', 'cuda', 'cuda:N' or 'mps'"


def parse_devices(devices: str | Iterable[str]) -> tuple[str, ...]:
    """Normalise a device list (or a comma-separated string) to a tuple, one entry per worker.

    ``"cuda"`` becomes ``"cuda:0"``. Raises ValueError naming the first entry that is not a device.
    """
    entries = devices.split(",") if isinstance(devices, str) else list(devices)
    parsed = []
    for entry in entries:
        if not isinstance(entry, str):
            raise ValueError(f"devices: entry {entry!r} is not a string; expected {ACCEPTED}")
        device = entry.strip().lower()
        if not _DEVICE.match(device):
            raise ValueError(f"devices: unknown device {entry!r}; expected {ACCEPTED}")
        parsed.append("cuda:0" if device == "cuda" else device)
    if not parsed:
        raise ValueError("devices is empty; name at least one worker's device, e.g. ['cpu']")
    return tuple(parsed)


def check_available(devices: Sequence[str]) -> None:
    """Raise RuntimeError if a listed accelerator is not present on this machine."""
    cuda = sorted({int(d.split(":")[1]) for d in devices if d.startswith("cuda:")})
    if cuda:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        missing = [f"cuda:{i}" for i in cuda if i >= count]
        if missing:
            have = f"cuda:0..cuda:{count - 1}" if count else "none"
            raise RuntimeError(f"devices: {', '.join(missing)} not available on this machine "
                               f"(CUDA devices present: {have})")
    if "mps" in devices:
        import torch

        if not torch.backends.mps.is_available():
            raise RuntimeError("devices: 'mps' is not available on this machine")


def available_cores() -> int:
    """Cores this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_threads_per_worker(devices: Sequence[str], cores: int | None = None) -> int:
    """An even share of the cores for each ``cpu`` worker, at least one thread."""
    n_cpu = Counter(devices)["cpu"]
    return max(1, (cores or available_cores()) // max(1, n_cpu))
