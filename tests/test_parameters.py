"""Notebook parameter sets and the check every notebook runs first."""
import pytest

from helpers.study.parameters import check_parameters, load_parameters, parameter_sets


@pytest.mark.parametrize("name, value", [
    ("devices", ["cpu", "cuda:1", "cuda"]), ("device", "cuda:0"), ("worker_counts", [1, 2, 8]),
    ("workunit_sizes", [1, 1000]), ("speed_factors", [1.0, 0.35, 2]), ("replicates", 1),
    ("seed", 0), ("seconds_per_record", 0), ("workload", "synthetic"), ("model", ""),
    ("backends", ["thread"]), ("results_dir", "data/results/x"),
    ("tokenize_threads", [None, 1, 4]),
])
def test_good_values_pass(name, value):
    check_parameters(**{name: value})


@pytest.mark.parametrize("name, value, message", [
    ("devices", ["cpu", "gpu0"], "devices: unknown device 'gpu0'"),
    ("devices", "cpu", "devices: expected a list of devices"),
    ("synthetic_devices", [], "synthetic_devices is empty"),
    ("device", "tpu", "device: unknown device 'tpu'"),
    ("workunit_sizes", [10, 0], "workunit_sizes: expected an integer >= 1, got 0"),
    ("workunit_sizes", [], "workunit_sizes: expected a non-empty list"),
    ("worker_counts", [1, 2.5], "worker_counts: expected an integer >= 1, got 2.5"),
    ("replicates", 0, "replicates: expected an integer >= 1, got 0"),
    ("records", True, "records: expected an integer"),
    ("speed_factors", [1.0, 0], "speed_factors: expected a non-empty list of numbers > 0"),
    ("seconds_per_record", -1, "seconds_per_record: expected seconds >= 0"),
    ("workload", "llm", "workload: expected one of"),
    ("backends", ["thread", "dask"], "backends: expected a non-empty list drawn from"),
    ("model", None, "model: expected a model name or path"),
    ("figures_dir", "", "figures_dir: expected a non-empty string"),
    ("replicate", 3, "replicate: not a known parameter"),
    ("tokenize_threads", [None, 0], "tokenize_threads: expected an integer >= 1, got 0"),
    ("tokenize_threads", [], "tokenize_threads: expected a non-empty list of integers >= 1 or "
                             "None"),
])
def test_bad_values_are_named(name, value, message):
    with pytest.raises(ValueError) as error:
        check_parameters(**{name: value})
    assert message in str(error.value)


def test_a_set_merges_common_then_the_notebook_section(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("common:\n  records: 5\n  seed: 1\nnb:\n  records: 7\n")
    assert load_parameters(path, "nb") == {"records": 7, "seed": 1}
    assert load_parameters(path, "other") == {"records": 5, "seed": 1}


def test_auto_devices_are_spelled_out_when_a_set_is_loaded(tmp_path, monkeypatch):
    import helpers.engine.contract.devices

    monkeypatch.setattr(helpers.engine.contract.devices, "visible_devices",
                        lambda: ("cuda:0", "cuda:1"))
    path = tmp_path / "gpus.yaml"
    path.write_text("common:\n  devices: auto\nnb:\n  device: auto\n"
                    "other:\n  devices: [auto*2]\n  synthetic_devices: cuda:0*2\n")
    assert load_parameters(path, "nb") == {"devices": ["cuda:0", "cuda:1"], "device": "cuda:0"}
    assert load_parameters(path, "other") == {
        "devices": ["cuda:0", "cuda:0", "cuda:1", "cuda:1"], "synthetic_devices": ["cuda:0"] * 2}
    gpu = load_parameters("gpu", "02_one_worker_per_device")  # 1 to N GPUs: whatever is here
    assert gpu["devices"] == ["cuda:0", "cuda:1"]


def test_an_unknown_set_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"no parameter set 'huge'; expected one of \['cpu'"):
        load_parameters("huge", "01_workers_per_device")
    assert {"smoke", "cpu", "gpu"} <= set(parameter_sets())


@pytest.mark.parametrize("bad, message", [
    ({"prompts": []}, "prompts: expected a non-empty list"),
    ({"prompts": ["a page", ""]}, "prompts: expected a non-empty list"),
    ({"spatial_dispersion_threshold": 2}, "spatial_dispersion_threshold: expected a fraction"),
    ({"object_count_threshold": -1}, "object_count_threshold: expected a number >= 0"),
    ({"pass_images": 0}, "pass_images"),
])
def test_binning_parameters_are_checked(bad, message):
    with pytest.raises(ValueError, match=message):
        check_parameters(**bad)
    check_parameters(prompts=["a page of text"], spatial_dispersion_threshold=0.3, pass_images=5)
