import pytest

from helpers.engine.contract.devices import (check_available, parse_devices, share_of_cores,
                                             visible_devices)


def test_parse_normalises_and_keeps_one_entry_per_worker():
    assert parse_devices("cpu, CUDA,cuda:1,cuda:1") == ("cpu", "cuda:0", "cuda:1", "cuda:1")
    assert parse_devices(["cpu", "cpu"]) == ("cpu", "cpu")


def test_a_count_repeats_an_entry_and_auto_is_every_visible_device(monkeypatch):
    assert parse_devices("cuda:1*2,cpu") == ("cuda:1", "cuda:1", "cpu")
    import helpers.engine.contract.devices

    monkeypatch.setattr(helpers.engine.contract.devices, "visible_devices",
                        lambda: ("cuda:0", "cuda:1"))
    assert parse_devices("auto") == ("cuda:0", "cuda:1")
    assert parse_devices(["auto*2", "cpu"]) == ("cuda:0", "cuda:0", "cuda:1", "cuda:1", "cpu")


def test_visible_devices_here_match_what_torch_sees():
    torch = pytest.importorskip("torch")
    expected = tuple(f"cuda:{i}" for i in range(torch.cuda.device_count())) \
        if torch.cuda.is_available() else ("mps",) if torch.backends.mps.is_available() else ("cpu",)
    assert visible_devices() == expected


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "cpu:0", "", "cpu*0", "auto*", "gpu*2"])
def test_unknown_device_names_the_entry(bad):
    with pytest.raises(ValueError, match="devices"):
        parse_devices([bad])


def test_empty_device_list_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        parse_devices([])


def test_missing_cuda_device_is_reported():
    pytest.importorskip("torch")
    import torch

    beyond = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"cuda:{beyond} not available"):
        check_available(["cpu", f"cuda:{beyond}"])
    check_available(["cpu"])  # never raises


@pytest.mark.parametrize("models, cores, expected", [
    (1, 2, 2), (2, 2, 1), (4, 2, 1), (2, 16, 8), (4, 16, 4), (3, 16, 5), (0, 8, 8)])
def test_models_share_the_cores(models, cores, expected):
    assert share_of_cores(models, cores) == expected


def test_devices_default_to_every_gpu_here(monkeypatch):
    """Issue 59: run's --devices and embed() defaulted to the CPU on a machine with GPUs,
    where encode picks CUDA by itself: the default is 'auto' everywhere."""
    import inspect

    import helpers.engine.contract.devices as devices
    from helpers import embed, run_pipeline
    from helpers.cli import build_parser
    from helpers.engine.contract.settings import PoolSettings

    monkeypatch.setattr(devices, "visible_devices", lambda: ("cuda:0", "cuda:1"))
    assert PoolSettings().devices == ("cuda:0", "cuda:1")
    for function in (embed, run_pipeline):
        assert inspect.signature(function).parameters["devices"].default == ("auto",)
    args = build_parser().parse_args(["run", "--input", "a.jsonl", "--output", "b.h5"])
    assert args.devices == "auto"
