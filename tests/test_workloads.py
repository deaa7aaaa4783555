import pickle

import numpy as np
import pytest

from helpers.workloads import EmbeddingWorkload, SyntheticWorkload, Workload
from helpers.workloads.synthetic import InjectedFailure


@pytest.mark.parametrize("workload", [EmbeddingWorkload(), SyntheticWorkload(speed={"a": 2.0})])
def test_workloads_follow_the_protocol_and_pickle(workload):
    assert isinstance(workload, Workload)
    assert pickle.loads(pickle.dumps(workload)) == workload


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"), ({"model": 3}, "model")])
def test_embedding_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EmbeddingWorkload(**kwargs)


def test_embedding_checks_records():
    workload = EmbeddingWorkload()
    workload.check_record("a text")
    for bad in (None, 3, b"bytes"):
        with pytest.raises(TypeError, match="expected a text string"):
            workload.check_record(bad)


def test_embedding_normalize_and_any_model_path(st_model):
    from helpers.workloads.embedding import default_model_path

    workload = EmbeddingWorkload(model=default_model_path(), normalize=True, batch_size=4)
    model = workload.load("cpu", 1)
    assert workload.outputs(model)["embeddings"].shape == (384,)
    out = workload.process(model, ["one text", "another, longer text"])["embeddings"]
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert workload.attrs()["model"] == default_model_path()


def test_synthetic_speed_factor_scales_cost():
    workload = SyntheticWorkload(0.01, speed={"cuda:1": 0.25})
    assert workload.load("cuda:1", 1)["cost"] == pytest.approx(0.04)
    assert workload.load("cuda:0", 1)["cost"] == pytest.approx(0.01)


@pytest.mark.parametrize("kwargs", [{"mode": "nap"}, {"speed": {"x": 0}},
                                    {"seconds_per_record": -1}])
def test_synthetic_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        SyntheticWorkload(**kwargs)


def test_synthetic_failure_injection():
    with pytest.raises(InjectedFailure):
        SyntheticWorkload(fail_on_load=True).load("cpu", 1)
    workload = SyntheticWorkload(0.0, fail_on_records={"bad"})
    model = workload.load("cpu", 1)
    assert workload.process(model, ["ok", "fine"])["values"].shape == (2, 8)
    with pytest.raises(InjectedFailure, match="'bad'"):
        workload.process(model, ["ok", "bad"])
