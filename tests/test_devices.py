import pytest

from helpers.engine.devices import check_available, cpu_threads_per_worker, parse_devices


def test_parse_normalises_and_keeps_one_entry_per_worker():
    assert parse_devices("cpu, CUDA,cuda:1,cuda:1") == ("cpu", "cuda:0", "cuda:1", "cuda:1")
    assert parse_devices(["cpu", "cpu"]) == ("cpu", "cpu")


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "cpu:0", ""])
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
    with pytest.raises(RuntimeError, match=f"cuda:{beyond} not available"):
        check_available(["cpu", f"cuda:{beyond}"])
    check_available(["cpu"])  # never raises


@pytest.mark.parametrize("devices, cores, expected", [
    (["cpu"], 2, 2), (["cpu", "cpu"], 2, 1), (["cpu"] * 4, 2, 1), (["cpu", "cpu"], 16, 8),
    (["cuda:0", "cpu"], 8, 8)])
def test_cpu_workers_share_the_cores(devices, cores, expected):
    assert cpu_threads_per_worker(devices, cores) == expected
