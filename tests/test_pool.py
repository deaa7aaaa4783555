"""The pool: workers started once run many jobs, queue-fed or statically split, and a pool whose
job failed refuses more, while one refused before it began stays usable."""
import threading

import numpy as np
import pytest

from helpers import PipelineError, SyntheticWorkload, WorkerPool, read_output

pytestmark = pytest.mark.timeout(180)  # reached only on deadlock: every run here ends in seconds

BACKENDS = ["process", "thread"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pool_runs_many_jobs_on_models_loaded_once(tmp_path, backend):
    records = [(i, f"record {i}") for i in range(60)]
    with WorkerPool(SyntheticWorkload(0.0), ["cpu"] * 3, backend, progress=False) as pool:
        runs = [pool.run(records, tmp_path / f"out-{size}.h5", workunit_size=size)
                for size in (1, 10, 100)]
        for size, stats in zip((1, 10, 100), runs):
            assert read_output(tmp_path / f"out-{size}.h5")["ids"].tolist() == list(range(60))
            assert sum(w.workunits for w in stats.workers) == -(-60 // size)
            assert stats.spinup_s == pool.spinup_s
        assert len({tuple(w.pid for w in stats.workers) for stats in runs}) == 1  # same workers
        with pytest.raises(ValueError, match="devices: fixed when the pool starts"):
            pool.run(records, tmp_path / "x.h5", devices=["cpu"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_static_split_gives_each_worker_exactly_its_slice(tmp_path, backend):
    # one instant worker and two slow ones: unpinned, the instant one would take others' slices
    workload = SyntheticWorkload(0.02, {"cuda:0": 1000.0})
    pairs = [(w * 100 + i, f"r{w}-{i}") for w in range(3) for i in range(3)]
    with WorkerPool(workload, ["cuda:0", "cuda:1", "cuda:1"], backend, progress=False) as pool:
        rounds = [pool.run_static(pairs, tmp_path / f"out-{n}.h5") for n in range(10)]
    for n, stats in enumerate(rounds):
        assert sorted(span.worker for span in stats.timeline) == [0, 1, 2]
        assert [span.records for span in stats.timeline] == [3, 3, 3]
        assert stats.records == 9 and 0 < stats.efficiency < 0.8  # the fast worker idles
        assert max(span.end_s for span in stats.timeline) <= stats.wall_s
        assert read_output(tmp_path / f"out-{n}.h5")["ids"].tolist() == [i for i, _ in pairs]


def test_a_static_split_after_a_self_sizing_job_on_the_same_pool_keeps_its_slices_whole(
        tmp_path):
    """The auto job's per-worker sizes (about 5 records here) must not cut the static slices."""
    pairs = [(i, f"r{i}") for i in range(60)]
    with WorkerPool(SyntheticWorkload(0.01), ["cpu", "cpu"], "thread", progress=False) as pool:
        pool.run(pairs, tmp_path / "auto.h5", workunit_size="auto", workunit_seconds=0.05)
        static = pool.run_static(pairs, tmp_path / "static.h5")
    assert sorted((span.worker, span.records) for span in static.timeline) == [(0, 30), (1, 30)]
    assert read_output(tmp_path / "static.h5")["ids"].tolist() == list(range(60))


def test_static_split_deals_every_record_once_in_even_contiguous_slices():
    from helpers.engine.pool import static_split

    for records, workers in [(9, 3), (10, 3), (2, 3), (0, 2), (1_000_003, 7)]:
        bounds = static_split(records, workers)
        sizes = np.diff(bounds)
        assert bounds[0] == 0 and bounds[-1] == records and len(sizes) == workers
        assert (sizes >= 0).all() and sizes.max() - sizes.min() <= 1


def test_a_pool_refuses_work_after_a_failed_job(tmp_path):
    broken = [(0, "a"), (1, "b"), "not a pair", (3, "d")]
    with WorkerPool(SyntheticWorkload(0.0), ["cpu"], "thread", progress=False) as pool:
        with pytest.raises(ValueError, match="source item 2 is not an"):
            pool.run(broken, tmp_path / "a.h5", workunit_size=2)
        with pytest.raises(PipelineError, match="stopped after a failed job"):
            pool.run([(0, 0)], tmp_path / "b.h5")


def test_a_refused_output_leaves_the_pool_and_its_loaded_workers_usable(tmp_path):
    from helpers.engine.outputs.ownership import OutputError

    pairs = [(i, f"r{i}") for i in range(20)]
    with WorkerPool(SyntheticWorkload(0.0), ["cpu"], "thread", progress=False) as pool:
        pool.run(pairs, tmp_path / "a.h5", workunit_size=5)
        with pytest.raises(OutputError, match="already holds a finished output"):
            pool.run(pairs, tmp_path / "a.h5", workunit_size=5)  # nothing dispatched
        stats = pool.run(pairs, tmp_path / "b.h5", workunit_size=5)
    assert stats.records == 20


class FetchedByWorkers(SyntheticWorkload):
    """A model the driver never has (a hub name only workers fetch): the driver's fingerprint
    cannot tell its files; each worker's load says them (``identity``), the n-th worker to
    load its ``digests[n]``."""

    def __init__(self, digests):
        super().__init__(0.0, dim=4)
        self.digests, self.loads = digests, 0

    def fingerprint(self):
        return {"workload": self.name, "model_path": None, "model_digest": None}

    def load(self, device, threads=None):
        with _LOADS_LOCK:
            n, self.loads = self.loads, self.loads + 1
        return {**super().load(device, threads), "digest": self.digests[n % len(self.digests)],
                "cache": f"/cache/{n}"}

    def identity(self, model):  # (another cache each: the same files elsewhere are fine)
        return {"model_path": model["cache"], "model_digest": model["digest"]}


_LOADS_LOCK = threading.Lock()


class LoadsRecorded(SyntheticWorkload):
    """Each load's (device, threads), in the driver's list (the thread backend's workers)."""

    def __init__(self):
        super().__init__(0.0, dim=4)
        self.loaded = []

    def load(self, device, threads=None):
        with _LOADS_LOCK:
            self.loaded.append((device, threads))
        return super().load(device, threads)


def test_a_worker_loads_with_its_share_of_the_cores(tmp_path, monkeypatch):
    """A card's model gets the cores shared among the models the pool starts: per device on
    the thread backend (its threads share a device's model), which the workload's load takes
    (its tokenizing defaults: workloads.embedding.loading). (No CPU worker here: its thread
    would set torch's threads in this process.)"""
    monkeypatch.setattr("helpers.engine.contract.devices.available_cores", lambda: 12)
    workload = LoadsRecorded()
    with WorkerPool(workload, ["cuda:0", "cuda:0", "cuda:1"], "thread", progress=False) as pool:
        pool.run([(i, f"r{i}") for i in range(8)], tmp_path / "out.h5")
    assert sorted(workload.loaded) == [("cuda:0", 6), ("cuda:1", 6)]


def test_a_model_only_the_workers_fetched_is_recorded_and_one_they_disagree_on_refused(tmp_path):
    """Issue 59: a hub model the driver never cached left the output without its model_digest
    (a resume with another revision went unnoticed). The workers say what they loaded: the
    output records it, a resume whose workers loaded other files is refused naming the digest,
    and workers that loaded different files from each other never start a job."""
    from helpers.engine.outputs.ownership import OutputError, recorded_fingerprints

    records = [(i, f"r{i}") for i in range(20)]
    out = tmp_path / "out.h5"
    with WorkerPool(FetchedByWorkers(["d1"]), ["cpu"] * 2, "thread", progress=False) as pool:
        pool.run(records, out, limit=10)
    assert recorded_fingerprints(out)["workload_fingerprint"]["model_digest"] == "d1"
    with WorkerPool(FetchedByWorkers(["d2"]), ["cpu"] * 2, "thread", progress=False) as pool:
        with pytest.raises(OutputError, match="another workload: model_digest 'd1' -> 'd2'"):
            pool.run(records, out, resume=True)
    assert read_output(out)["ids"].tolist() == list(range(10))
    with WorkerPool(FetchedByWorkers(["d1", "d3"]), ["cuda:0", "cuda:1"], "thread",
                    progress=False) as pool:  # (threads share a device's model: two devices)
        with pytest.raises(PipelineError, match=r"worker \d on cuda:\d and worker \d on cuda:\d "
                                                r"loaded "
                                                r"different models \(model_digest 'd[13]' and "
                                                r"'d[13]'\)"):
            pool.run(records, tmp_path / "other.h5")
    assert not (tmp_path / "other.h5").exists()
    with WorkerPool(FetchedByWorkers(["d1"]), ["cpu"] * 2, "thread", progress=False) as pool:
        pool.run(records, out, resume=True)
    assert read_output(out)["ids"].tolist() == list(range(20))


class RefetchedLater(SyntheticWorkload):
    """Worker processes whose first ``first`` loads fetch ``d1`` and any later one ``d2`` (a hub
    revision that moved while the job ran), counted in ``folder``, each row saying which (1.0,
    2.0); ``r30`` kills its worker, once."""

    def __init__(self, folder, first):
        super().__init__(0.01, dim=4, exit_on_records=frozenset({"r30"}),
                         transient=f"{folder}/fired")
        self.folder, self.first = str(folder), first

    def fingerprint(self):
        return {"workload": self.name, "model_path": None, "model_digest": None}

    def load(self, device, threads=None):
        import os

        n = len([name for name in os.listdir(self.folder) if name.startswith("load")])
        open(os.path.join(self.folder, f"load-{os.getpid()}"), "w").close()
        return {**super().load(device, threads), "digest": "d1" if n < self.first else "d2"}

    def identity(self, model):
        return {"model_digest": model["digest"]}

    def process(self, model, records):
        values = super().process(model, records)["values"]
        return {"values": np.full_like(values, 1.0 if model["digest"] == "d1" else 2.0)}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_that_loads_other_files_mid_job_stops_it_before_it_takes_anything(tmp_path,
                                                                                 workers):
    """A replacement (or a worker growth adds) loads the model again, mid-job: where its files
    are not those the job's workers loaded (with one worker: those of the worker it replaces),
    the job stops naming it, and the output holds the first files' rows alone."""
    (tmp_path / "loads" / "fired").mkdir(parents=True)
    records = [(i, f"r{i}") for i in range(1000)]  # (10 s of work: the replacement loads in it,
    # and the job stops then)
    with WorkerPool(RefetchedLater(tmp_path / "loads", workers), ["cpu"] * workers, "process",
                    progress=False) as pool:
        with pytest.raises(PipelineError, match=r"loaded different models \(model_digest "
                                                r"'d[12]' and 'd[12]'\).*started mid-job and "
                                                r"was given nothing"):
            pool.run(records, tmp_path / "out.h5", workunit_size=10)
    loads = [p for p in (tmp_path / "loads").iterdir() if p.name.startswith("load")]
    assert len(loads) == workers + 1  # the job's, then the replacement
    data = read_output(tmp_path / "out.h5")
    assert len(data["ids"]) < 1000 and (data["values"] == 1.0).all()


def test_what_a_worker_process_loaded_comes_back_to_the_driver_s_record(tmp_path):
    from helpers.engine.outputs.ownership import recorded_fingerprints

    out = tmp_path / "out.h5"
    with WorkerPool(FetchedByWorkers(["d7"]), ["cpu"], "process", progress=False) as pool:
        pool.run([(i, f"r{i}") for i in range(5)], out)
    recorded = recorded_fingerprints(out)["workload_fingerprint"]
    assert (recorded["model_digest"], recorded["model_path"]) == ("d7", "/cache/0")
