"""The two settings classes: each field in one of them, bad values named, defaults written once."""
import dataclasses
import warnings

import pytest

from helpers.cli import build_parser
from helpers.engine.contract.settings import (JOB_SETTINGS, POOL_SETTINGS, JobSettings,
                                              PoolSettings, split_options)


def test_every_setting_belongs_to_the_pool_or_to_the_job_never_both():
    assert not set(POOL_SETTINGS) & set(JOB_SETTINGS)
    pool, job = split_options({"retries": 3, "limit": 5, "adaptive": True, "resume": True})
    assert pool == {"retries": 3, "adaptive": True} and job == {"limit": 5, "resume": True}
    with pytest.raises(TypeError, match="unknown option workers_per_gpu; a pool takes devices"):
        split_options({"workers_per_gpu": 2, "limit": 5})


def test_devices_are_parsed_once_into_a_tuple_and_the_settings_are_frozen():
    settings = PoolSettings("cuda, cpu,CUDA:1")
    assert settings.devices == ("cuda:0", "cpu", "cuda:1")
    assert dataclasses.replace(settings, retries=2).devices == settings.devices
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.retries = 5


@pytest.mark.parametrize("cls, bad, message", [
    (PoolSettings, {"devices": ["gpu0"]}, "devices: unknown device 'gpu0'"),
    (PoolSettings, {"devices": []}, "devices is empty"),
    (PoolSettings, {"backend": "dask"},
     "backend: expected one of ('process', 'thread', 'ray'), got 'dask'"),
    (PoolSettings, {"queue_depth": 0}, "queue_depth: expected an integer >= 1, got 0"),
    (PoolSettings, {"threads_per_worker": 1.5}, "threads_per_worker: expected an integer"),
    (PoolSettings, {"max_workers_per_device": None}, "max_workers_per_device: expected an integer"),
    (PoolSettings, {"retries": -1}, "retries: expected an integer >= 0, got -1"),
    (PoolSettings, {"max_restarts": True}, "max_restarts: expected an integer"),
    (PoolSettings, {"workunit_timeout": 0}, "workunit_timeout: expected seconds > 0, got 0"),
    (PoolSettings, {"load_timeout": None}, "load_timeout: expected seconds > 0, got None"),
    (PoolSettings, {"units_per_message": 0}, "units_per_message: expected an integer >= 1 or "
                                             "'auto', got 0"),
    (PoolSettings, {"workers_per_device": 0}, "workers_per_device: expected an integer >= 1, "
                                              "'auto' or 'fit', got 0"),
    (PoolSettings, {"workers_per_device": "auto", "adaptive": True},
     "adaptive: the same as workers_per_device='fit'; it cannot go with workers_per_device='auto'"),
    (JobSettings, {"workunit_size": 0}, "workunit_size: expected an integer >= 1 or 'auto', got 0"),
    (JobSettings, {"workunit_size": "big"}, "workunit_size: expected an integer >= 1 or 'auto'"),
    (JobSettings, {"workunit_seconds": 0}, "workunit_seconds: expected seconds > 0, got 0"),
    (JobSettings, {"limit": -5}, "limit: expected an integer >= 0, got -5"),
    (JobSettings, {"sort_window": "big"}, "sort_window: expected an integer"),
    (JobSettings, {"writes": "nodes"}, "writes: expected one of ('auto', 'driver', 'workers')"),
])
def test_a_bad_value_raises_naming_the_setting_and_what_it_expected(cls, bad, message):
    with pytest.raises(ValueError) as caught:
        cls(**bad)
    assert message in str(caught.value)


def test_derived_settings_follow_their_rule(monkeypatch):
    monkeypatch.setattr("helpers.engine.contract.devices.available_cores", lambda: 2)
    assert PoolSettings(("cpu",) * 3).depth() == 6 and PoolSettings(queue_depth=1).depth(4) == 1
    assert PoolSettings(("cpu",) * 3).depth(4) == 24  # two messages of four a worker
    assert PoolSettings().per_message(False) == PoolSettings().per_message(True) == 1
    ray = PoolSettings(backend="ray")
    assert (ray.per_message(False), ray.per_message(True)) == (4, 1)  # sized per worker: 1
    assert PoolSettings(units_per_message=8).per_message(True) == 8
    assert PoolSettings().growing_messages  # units_per_message="auto"
    assert not PoolSettings(units_per_message=8).growing_messages
    assert JobSettings(workunit_size=10).window == 16384  # at least SORT_RECORDS
    assert JobSettings(workunit_size=4096).window == 8 * 4096  # 8 workunits
    assert JobSettings(workunit_size=10, sort_window=0).window == 0
    workers = PoolSettings(("cuda:0", "cpu", "cuda:0", "cpu"), threads_per_worker=3).workers()
    assert [(w.index, w.device, w.threads, w.copy) for w in workers] == [
        (0, "cuda:0", 1, 0), (1, "cpu", 3, 0), (2, "cuda:0", 1, 1), (3, "cpu", 3, 1)]


@pytest.mark.parametrize("backend, options, expected", [
    ("process", {}, [4, 4, 4, 4]), ("ray", {}, [4, 4, 4, 4]),  # (Ray's: its node's, on_its_node)
    ("thread", {}, [8, 8, 8, 8]),  # (a model per device, shared by its threads)
    ("process", {"workers_per_device": 2}, [4] * 4),
    ("process", {"workers_per_device": "auto"}, [8, 8]),  # (added one at a time: their
    ("process", {"workers_per_device": "fit"}, [8, 8]),  # device's share each)
    ("thread", {"workers_per_device": "fit"}, [8, 8]),
    ("process", {"threads_per_worker": 3}, [4, 4, 4, 4])])  # (a cpu worker's option)
def test_a_card_worker_gets_its_share_of_the_node_s_cores(monkeypatch, backend, options,
                                                          expected):
    """Four workers on a 16-core node's cards: four cores each (the tokenizing processes its
    workload starts by default: loading.default_processes), not sixteen each; beside CPU
    workers, the cores shared among them all (three models on 16 cores: 5 each)."""
    monkeypatch.setattr("helpers.engine.contract.devices.available_cores", lambda: 16)
    settings = PoolSettings(("cuda:0", "cuda:0", "cuda:1", "cuda:1") if "workers_per_device"
                            not in options else ("cuda:0", "cuda:1"), backend, **options)
    assert [w.threads for w in settings.workers()] == expected
    assert [w.threads for w in PoolSettings(("cpu", "cpu", "cuda:0"), backend).workers()] == \
        [5, 5, 5]
    assert [w.threads for w in PoolSettings(("cpu",) * 4, backend).workers()] == [4] * 4
    grown = PoolSettings(("cpu", "cuda:0"), backend, workers_per_device="auto").workers()
    assert [w.threads for w in grown] == [1, 8]  # (a CPU worker grows a thread each)


def test_workers_per_device_multiplies_the_entries_or_starts_one_per_device_to_grow():
    settings = PoolSettings(("cuda:0", "cuda:1", "cuda:0"), workers_per_device=2)
    assert settings.worker_devices == ("cuda:0",) * 2 + ("cuda:1",) * 2 + ("cuda:0",) * 2
    assert [w.copy for w in settings.workers()] == [0, 1, 0, 1, 2, 3] and settings.depth() == 12
    assert dataclasses.replace(settings, retries=0).worker_devices == settings.worker_devices
    growing = PoolSettings(("cuda:0", "cuda:1", "cuda:0", "cpu"), workers_per_device="auto")
    assert growing.growing and growing.worker_devices == ("cuda:0", "cuda:1", "cpu")
    assert [w.threads for w in growing.workers()] == [1, 1, 1]  # a cpu worker grows one thread
    for filling in (PoolSettings(("cuda:0", "cuda:1", "cuda:0"), workers_per_device="fit"),
                    PoolSettings(("cuda:0", "cuda:1", "cuda:0"), adaptive=True)):  # (its old name)
        assert filling.filling and not filling.growing and filling.workers_per_device == "fit"
        assert filling.worker_devices == ("cuda:0", "cuda:1")
        one = dataclasses.replace(filling, workers_per_device=1)  # (the static fallback's)
        assert not one.filling and one.worker_devices == ("cuda:0", "cuda:1", "cuda:0")
    assert JobSettings(workunit_size="auto").auto_size and JobSettings().window == 16384
    assert JobSettings(workunit_size="auto").window > 0


def test_auto_and_counts_on_the_command_line():
    args = build_parser().parse_args(["run", "--input", "in.h5", "--output", "out.h5",
                                      "--workunit-size", "AUTO", "--workers-per-device", "auto",
                                      "--devices", "auto*2"])
    assert (args.workunit_size, args.workers_per_device, args.devices) == \
        ("auto", "auto", "auto*2")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--input", "a", "--output", "b", "--workunit-size", "x"])
    assert build_parser().parse_args(["run", "--input", "a", "--output", "b",
                                      "--workers-per-device", "Fit"]).workers_per_device == "fit"


def test_writing_in_place_is_deprecated_saying_why_and_still_runs_with_resume_or_workers():
    with pytest.warns(FutureWarning, match=r"deprecated and will be removed: .* no faster .* "
                                           r"writes parts as any run does; .* compact"):
        job = JobSettings(durable=False, resume=True, writes="workers")
    assert (job.durable, job.resume, job.writes) == (False, True, "workers")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        JobSettings()  # the default says nothing


def test_the_command_line_takes_its_defaults_from_the_settings():
    args = build_parser().parse_args(["run", "--input", "in.h5", "--output", "out.h5"])
    pool, job = PoolSettings(), JobSettings()
    assert args.devices == ",".join(PoolSettings.devices) == "auto"  # (as given, not resolved)
    assert args.backend == pool.backend
    assert (args.retries, args.max_restarts, args.max_workers_per_device) == \
        (pool.retries, pool.max_restarts, pool.max_workers_per_device)
    assert (args.workunit_timeout, args.queue_depth, args.threads_per_worker) == \
        (pool.workunit_timeout, pool.queue_depth, pool.threads_per_worker)
    assert (args.workunit_size, args.limit, args.workunit_seconds) == \
        (job.workunit_size, job.limit, job.workunit_seconds)
    assert args.workers_per_device == pool.workers_per_device
    assert (not args.no_progress, not args.in_place, args.resume, args.adaptive) == \
        (job.progress, job.durable, job.resume, pool.adaptive)


def test_auto_writes_are_the_workers_only_on_ray_with_a_source_they_can_read():
    from helpers.engine.pool import who_writes

    class Openable:
        def rows(self, skip, limit):
            return iter(())

    auto = JobSettings()
    assert auto.writes == "auto"
    assert who_writes(auto, "ray", Openable()) == "workers"
    assert who_writes(auto, "ray", [(0, "x")]) == "driver"  # records only the driver holds
    assert who_writes(auto, "process", Openable()) == "driver"  # one machine: measured faster
    assert who_writes(JobSettings(writes="driver"), "ray", Openable()) == "driver"
    assert who_writes(JobSettings(writes="workers"), "process", [(0, "x")]) == "workers"


def test_adaptive_is_folded_into_fit_with_a_warning_naming_it():
    """Issue 60: worker counts came in three modes and an alias; the alias says what it is."""
    with pytest.warns(FutureWarning, match="older name of workers_per_device='fit'"):
        settings = PoolSettings(("cpu",), adaptive=True)
    assert settings.workers_per_device == "fit" and not settings.adaptive
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PoolSettings(("cpu",), workers_per_device="fit")  # (the mode itself: no warning)


@pytest.mark.parametrize("bad, message", [
    ({"workunit_size": 0}, "workunit_size: expected an integer >= 1 or 'auto', got 0"),
    ({"retries": -1}, "retries: expected an integer >= 0, got -1"),
])
def test_a_wrong_option_is_refused_before_auto_devices_ask_torch(bad, message):
    """"auto" devices import torch to find GPUs (1.7 CPU s here): a wrong option of the pool or
    the job is refused first (a run so refused took 2.2 s, now 0.5)."""
    import json
    import subprocess
    import sys

    script = (f"import sys; from helpers.engine.pipeline import run_pipeline\n"
              f"try:\n    run_pipeline([(0, 'a')], None, 'auto', output='/nonexistent/o.h5', "
              f"**{json.dumps(bad)})\nexcept ValueError as exc:\n    print(exc)\n"
              f"print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.splitlines() == [message, "False"], done.stderr
