"""Stats hold nothing per record: running totals and a bounded timeline."""
import pytest

from helpers.engine.measure.stats import Tally, Timeline, WorkunitSpan


def test_a_timeline_keeps_every_workunit_until_its_limit():
    timeline = Timeline(limit=100)
    for n in range(50):
        timeline.add(WorkunitSpan(n % 2, "cpu", n, 10, n * 1.0, n + 0.5))
    assert len(timeline.spans) == 50 and {s.workunits for s in timeline.spans} == {1}


def test_a_long_timeline_stays_bounded_and_keeps_its_shape():
    timeline = Timeline(limit=100)
    workers = 3
    for n in range(200_000):
        timeline.add(WorkunitSpan(n % workers, "cpu", n, 10, n * 1.0, n + 0.5,
                                  phases={"forward": 0.25, "tokenize": 0.125},
                                  counts={"tokens_computed": 30, "tokens_needed": 20}))
    spans = timeline.spans
    assert len(spans) <= 100 + workers
    assert sum(s.records for s in spans) == 2_000_000  # nothing dropped, only merged
    assert sum(s.phases["forward"] for s in spans) == 50_000  # the phases summed as they merge
    assert sum(s.phases["tokenize"] for s in spans) == 25_000
    assert sum(s.counts["tokens_needed"] for s in spans) == 4_000_000  # counts too
    assert {s.padding for s in spans} == {1.5}
    assert sum(s.workunits for s in spans) == 200_000
    for worker in range(workers):
        mine = sorted((s for s in spans if s.worker == worker), key=lambda s: s.start_s)
        assert mine[0].start_s == worker and mine[-1].end_s >= 199_990  # first to last
        assert all(a.end_s <= b.start_s for a, b in zip(mine, mine[1:]))  # in order, no overlap


def test_a_tally_keeps_totals_and_peaks():
    tally = Tally()
    tally.add(10, 0.5, 100.0, None, {"forward": 0.25})
    tally.add(5, 0.25, 80.0, 300.0, {"forward": 0.125, "tokenize": 0.0625})
    tally.add(5, 0.25, 80.0, 300.0)  # a workload that reports no phases
    tally.add(1, 0.0, 80.0, None, None, {"tokens_computed": 12, "tokens_needed": 9})
    assert (tally.records, tally.workunits, tally.busy_s) == (21, 4, 1.0)
    assert tally.phases == {"forward": 0.375, "tokenize": 0.0625}
    assert tally.counts == {"tokens_computed": 12, "tokens_needed": 9}
    assert tally.peak_rss_mib == 100.0 and tally.peak_gpu_mib == 300.0


def test_each_device_has_its_share_of_the_job_in_the_stats():
    """Records, rate, busy share and peak memory per device, in the summary and in to_dict."""
    from helpers.engine.measure.stats import PipelineStats, WorkerStats

    workers = (WorkerStats(0, "cuda:0", 10, 1.0, 300, 3, 9.0, 1.0, 500.0, 2048.0),
               WorkerStats(1, "cuda:0", 11, 1.0, 100, 1, 3.0, 7.0, 700.0, 1024.0),
               WorkerStats(2, "cpu", 12, 1.0, 50, 1, 5.0, 5.0, 300.0, None))
    stats = PipelineStats(records=450, failed_records=0, wall_s=10.0, spinup_s=2.0,
                          workers=workers, stages={}, devices=("cuda:0", "cuda:0", "cpu"),
                          workunit_size=100, backend="process", output="o.h5")
    assert stats.per_device == {
        "cuda:0": {"workers": 2, "records": 400, "records_per_s": 40.0, "busy_share": 0.6,
                   "peak_rss_mib": 700.0, "peak_gpu_mib": 2048.0},
        "cpu": {"workers": 1, "records": 50, "records_per_s": 5.0, "busy_share": 0.5,
                "peak_rss_mib": 300.0, "peak_gpu_mib": None}}
    assert stats.to_dict()["per_device"] == stats.per_device
    assert "device cuda:0: 2 workers, 400 records (40.0/s), busy 60%, peak RSS 700 MiB, " \
           "device memory 2048 MiB" in stats.summary()
    with pytest.raises(TypeError):
        PipelineStats(450, 0, 10.0, 2.0, workers, {}, (), 100, "process", "o.h5")  # by name only


def test_measurements_answer_to_their_older_names_read_only():
    """Until 2026-11-28 times ended _seconds and MiB _mb: code that reads those names as
    attributes still works, read-only; the dict (the CLI's JSON, a run's record) has today's
    names only."""
    from helpers.engine.measure.stats import PipelineStats, WorkerStats

    worker = WorkerStats(0, "cpu", 10, 1.5, 3, 1, 1.0, 0.25, 512.0, 64.0, cpu_s=0.75)
    stats = PipelineStats(records=3, failed_records=0, wall_s=2.0, spinup_s=4.0,
                          workers=(worker,), stages={}, devices=("cpu",), workunit_size=3,
                          backend="process", output="o.h5", peak_rss_mib=900.0,
                          parent_rss_mib=300.0)
    assert (worker.peak_rss_mb, worker.peak_gpu_mb, worker.load_seconds, worker.busy_seconds,
            worker.wait_seconds, worker.cpu_seconds) == (512.0, 64.0, 1.5, 1.0, 0.25, 0.75)
    assert (stats.peak_rss_mb, stats.parent_rss_mb, stats.wall_seconds, stats.spinup_seconds,
            stats.records_per_second, stats.worker_cpu_seconds) == (900.0, 300.0, 2.0, 4.0,
                                                                   1.5, 0.75)
    with pytest.raises(AttributeError, match="'WorkerStats' object has no attribute 'rss'"):
        worker.rss
    with pytest.raises(AttributeError, match="'PipelineStats' object has no attribute "
                                             "'load_seconds'"):  # (a worker's, not the job's)
        stats.load_seconds
    with pytest.raises(AttributeError):
        worker.peak_rss_mb = 1.0
    data = stats.to_dict()
    assert data["parent_rss_mib"] == 300.0 and data["wall_s"] == 2.0 and \
        data["records_per_s"] == 1.5
    assert not {"parent_rss_mb", "wall_seconds", "records_per_second"} & set(data)
    assert not {"peak_rss_mb", "busy_seconds"} & set(data["workers"][0])


def test_the_summary_counts_tokens_as_whole_numbers():
    """Issue 44: the summary said ``389,794.0 needed`` (counts are summed as floats)."""
    from helpers.engine.measure.stats import PipelineStats

    stats = PipelineStats(records=10, failed_records=0, wall_s=1.0, spinup_s=0.0,
                          workers=(), stages={}, devices=("cpu",), workunit_size=10,
                          backend="process", output="o.h5",
                          counts={"tokens_computed": 400000.0, "tokens_needed": 389794.0})
    assert "389,794 needed" in stats.summary() and "389,794.0" not in stats.summary()
