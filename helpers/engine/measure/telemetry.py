"""Were the devices fed? Their use, sampled about twice a second while a job runs.

On an NVIDIA GPU the sample is the card's own: NVML's utilisation (the share of the last sample
period in which a kernel ran) and the memory in use, through ``nvidia-ml-py``; a device NVML does
not know (a CPU, a simulated card, a machine without the driver) is sampled per worker process
through psutil: its CPU use (100 % = one core busy) and resident memory. Threads share their
driver's process, so a thread backend's samples are the driver's, once per device.

Memory stays flat over a day-long job: at most MAX_SAMPLES are kept; past that every second one
is dropped and the period doubles, so the whole job stays in view at a coarser grain.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

log = logging.getLogger("gpufeed")

SAMPLE_SECONDS = 0.5
MAX_SAMPLES = 20_000


@dataclass(frozen=True)
class Sample:
    seconds: float  # since the job's start
    device: str
    worker: int | None  # the worker's slot (psutil), or None: the whole card (NVML)
    utilization: float  # percent: the GPU's busy share (NVML), or the process's CPU use (psutil)
    memory_mib: float  # the card's memory in use (NVML), or the process's resident memory (psutil)
    source: str  # "nvml" or "psutil"


class Telemetry(threading.Thread):
    """Samples ``workers()`` — ``{slot: (device, pid)}`` of the workers at work — every
    ``interval`` seconds from ``start()`` until ``stop()``; ``samples`` holds what it saw,
    seconds counted from ``clock`` (time.monotonic())."""

    def __init__(self, workers: Callable[[], dict[int, tuple[str, int]]], clock: float,
                 interval: float = SAMPLE_SECONDS, limit: int = MAX_SAMPLES) -> None:
        super().__init__(name="gpufeed-telemetry", daemon=True)
        self._workers, self.clock, self.interval, self.limit = workers, clock, interval, limit
        self._halt = threading.Event()
        self._samples: list[Sample] = []
        self._processes: dict[int, psutil.Process] = {}
        self._nvml = _Nvml()

    def run(self) -> None:
        try:
            self.sample()  # NVML's first sample; psutil's first reading only starts its count
            while not self._halt.wait(self.interval):
                self.sample()
        except Exception as exc:  # telemetry must never stop a run
            log.warning("telemetry stopped: %s: %s", type(exc).__name__, exc)
        finally:
            self._nvml.close()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()

    @property
    def samples(self) -> tuple[Sample, ...]:
        return tuple(self._samples)

    def sample(self) -> None:
        """One round: every NVML card in use once, every other worker's process once."""
        now = time.monotonic() - self.clock
        seen_cards, seen_pids = set(), set()
        for slot, (device, pid) in sorted(self._workers().items()):
            card = self._nvml.read(device) if device not in seen_cards else None
            if card is not None:
                seen_cards.add(device)
                self._keep(Sample(now, device, None, *card, "nvml"))
            elif device not in seen_cards and pid not in seen_pids:
                seen_pids.add(pid)
                process = self._process(pid)
                if process is not None:
                    self._keep(Sample(now, device, None if pid == os.getpid() else slot,
                                      *process, "psutil"))

    def _process(self, pid: int) -> tuple[float, float] | None:
        try:
            process = self._processes.get(pid)
            if process is None:
                process = self._processes[pid] = psutil.Process(pid)
                process.cpu_percent(None)  # the first reading has nothing to compare with
                return None
            return process.cpu_percent(None), process.memory_info().rss / 2 ** 20
        except psutil.Error:  # the worker is gone (replaced, retired)
            self._processes.pop(pid, None)
            return None

    def _keep(self, sample: Sample) -> None:
        self._samples.append(sample)
        if len(self._samples) >= self.limit:
            self._samples = self._samples[::2]
            self.interval *= 2


def memory_in_use(device: str) -> float | None:
    """MiB in use on a CUDA device by NVML's count (every process's, the driver's too), or None
    where NVML cannot tell (a CPU, no driver)."""
    nvml = _Nvml()
    try:
        card = nvml.read(device)
        return None if card is None else card[1]
    finally:
        nvml.close()


COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def compute_mode(device: str) -> str | None:
    """A CUDA device's compute mode by NVML ("default": any number of processes may use it;
    "exclusive_process": one, so a pool's workers cannot share it with their driver), or None
    where NVML cannot tell."""
    nvml = _Nvml()
    try:
        return nvml.compute_mode(device)
    finally:
        nvml.close()


class _Nvml:
    """NVML's view of the CUDA devices, or nothing where there is no NVIDIA driver."""

    def __init__(self) -> None:
        self._handles: dict[str, Any] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self._pynvml = pynvml
        except Exception:  # no package, no driver, no GPU: every device goes to psutil
            self._pynvml = None

    def read(self, device: str) -> tuple[float, float] | None:
        """(utilisation %, memory used MiB) of a CUDA device, or None if NVML cannot tell."""
        if self._pynvml is None or not device.startswith("cuda:"):
            return None
        try:
            handle = self._handles.get(device) or self._handle(int(device.split(":")[1]))
            self._handles[device] = handle
            used = self._pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2 ** 20
            return float(self._pynvml.nvmlDeviceGetUtilizationRates(handle).gpu), used
        except Exception:  # a simulated card beyond the real ones, or one NVML cannot read
            return None

    def compute_mode(self, device: str) -> str | None:
        if self._pynvml is None or not device.startswith("cuda:"):
            return None
        try:
            mode = self._pynvml.nvmlDeviceGetComputeMode(self._handle(int(device.split(":")[1])))
        except Exception:
            return None
        return COMPUTE_MODES.get(int(mode), str(mode))

    def _handle(self, index: int) -> Any:
        """NVML numbers cards physically; ``cuda:i`` is the i-th of CUDA_VISIBLE_DEVICES."""
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                   if v.strip()]
        if index < len(visible):
            name = visible[index]
            if not name.isdigit():
                return self._pynvml.nvmlDeviceGetHandleByUUID(name)
            index = int(name)
        return self._pynvml.nvmlDeviceGetHandleByIndex(index)

    def close(self) -> None:
        if self._pynvml is not None:
            try:
                self._pynvml.nvmlShutdown()
            except Exception:
                pass
