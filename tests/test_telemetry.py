"""Telemetry: samples for every device of a run (psutil where NVML has no such card), bounded
in number, and a sampler that stops with its job."""
import os
import threading

import pytest

from helpers import SyntheticWorkload, run_pipeline
from helpers.engine.measure.telemetry import Sample, Telemetry

pytestmark = pytest.mark.timeout(120)  # reached only on deadlock


def test_every_device_of_a_run_has_samples(tmp_path):
    workload = SyntheticWorkload(0.002, speed={"cuda:1": 0.5}, mode="busy")
    stats = run_pipeline([(i, f"r{i}") for i in range(1200)], workload, ["cuda:0", "cuda:1"],
                         workunit_size=20, output=tmp_path / "out.h5", progress=False)
    assert {s.device for s in stats.telemetry} == {"cuda:0", "cuda:1"}
    assert all(isinstance(s, Sample) and 0 <= s.seconds <= stats.wall_s + 0.5
               for s in stats.telemetry)
    busy = [s for s in stats.telemetry if s.source == "psutil"]  # no such cards here: processes
    assert {s.worker for s in busy} == {0, 1} and max(s.utilization for s in busy) > 10  # (busy:
    # an idle worker reads ~0; a loaded machine shares its cores with other tests)
    assert all(s.memory_mib > 0 for s in busy)
    assert not [t for t in threading.enumerate() if t.name == "gpufeed-telemetry"]


def test_samples_stay_bounded_and_the_period_grows():
    telemetry = Telemetry(lambda: {0: ("cpu", os.getpid())}, 0.0, interval=0.01, limit=8)
    for _ in range(40):
        telemetry.sample()
    assert len(telemetry.samples) < 8 and telemetry.interval > 0.01
    assert [s.worker for s in telemetry.samples] == [None] * len(telemetry.samples)  # the parent


def test_a_cards_memory_in_use_is_nvmls_reading(monkeypatch):
    """The few NVML calls a card's telemetry makes, faked: a reading in MiB of the card the
    device names, none for a CPU or where NVML fails."""
    import sys
    import types

    from helpers.engine.measure.telemetry import compute_mode, memory_in_use

    calls = []
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda index: f"card {index}",
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(
            used=3 * 2 ** 30 if handle == "card 1" else 0),
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=40),
        nvmlDeviceGetComputeMode=lambda handle: 3)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert memory_in_use("cuda:1") == 3 * 1024 and calls == ["init", "shutdown"]
    assert memory_in_use("cpu") is None
    assert compute_mode("cuda:0") == "exclusive_process" and compute_mode("cpu") is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # cuda:0 is the physical card 1
    assert memory_in_use("cuda:0") == 3 * 1024
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: 1 / 0
    assert memory_in_use("cuda:0") is None
