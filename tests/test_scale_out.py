"""Notebook 08's experiments on backends that need no Ray (Ray's own runs: test_ray_backend.py and
the notebook's smoke run): interleaved tables, the writer alone, bad input named."""
import pytest

from helpers.study import scale_out
from helpers.workloads.synthetic import SyntheticWorkload

pytestmark = pytest.mark.timeout(120)  # reached only on deadlock


def test_backends_side_by_side_interleaves_the_same_records_on_loaded_pools():
    texts = [f"text {i}" for i in range(50)]
    table, first = scale_out.backends_side_by_side(SyntheticWorkload(0.0005), ["cpu"] * 2, 30, 2,
                                                  texts, 5, backends=("process", "thread"))
    assert table["backend"].tolist() == ["process", "thread", "thread", "process"]  # turns
    assert (table["records"] == 30).all() and (table["records_per_s"] > 0).all()
    assert (table["cluster_start_s"] == 0).all() and set(first) == {"process", "thread"}
    assert table.groupby("backend")["spinup_s"].nunique().eq(1).all()  # one pool per backend


def test_the_driver_limit_has_a_row_per_backend_and_the_writer_alone(tmp_path):
    table = scale_out.driver_limit(4096, 16, 2, 512, 2, backends=("process",))
    assert sorted(table["backend"]) == ["process", "process", "writer alone", "writer alone"]
    assert (table["rows_per_s"] > 0).all()
    assert table["mb_per_s"].tolist() == pytest.approx(
        (table["rows_per_s"] * 16 * 4 / 2**20).tolist())
    assert scale_out.writer_alone(tmp_path / "w.h5", 1000, 8, 300) > 0


def test_a_cluster_of_one_node_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="nodes: expected at least 2"):
        scale_out.simulated_cluster(SyntheticWorkload(0.0), 1, 1, 1, 10, ["a"], 5, 1.0)


def test_the_simulated_cluster_s_workers_run_at_the_driver_s_niceness(monkeypatch):
    """Its head's system config is a local Ray's (worker_niceness 0; Ray's default, 15, loses
    the cores to the driver); the cluster itself runs in the notebooks' smoke run."""
    import ray.cluster_utils

    from helpers.engine.workers.ray_backend import NICENESS_ENV

    monkeypatch.delenv(NICENESS_ENV, raising=False)

    class Asked(Exception):
        pass

    def cluster(**arguments):
        raise Asked(arguments)

    monkeypatch.setattr(ray.cluster_utils, "Cluster", cluster)
    with pytest.raises(Asked) as asked:
        scale_out.simulated_cluster(SyntheticWorkload(0.0), 2, 1, 1, 10, ["a"], 5, 1.0)
    head = asked.value.args[0]["head_node_args"]
    assert head["_system_config"] == {"worker_niceness": 0}
