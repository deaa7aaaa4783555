"""One job: its timeline and worst stall as the workers saw them, and a job whose output does
not hold every row of its input is a failed one, its output left unfinished."""
import time

import pytest

from helpers import PipelineError, SyntheticWorkload, read_output, run_pipeline

pytestmark = pytest.mark.timeout(180)  # reached only on deadlock: every run here ends in seconds

BACKENDS = ["process", "thread"]


def run(source, workload, tmp_path, **kwargs):
    kwargs.setdefault("progress", False)
    return run_pipeline(source, workload, output=tmp_path / "out.h5", **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_timeline_has_one_span_per_workunit_inside_the_run(tmp_path, backend):
    stats = run([(i, i) for i in range(40)], SyntheticWorkload(0.002), tmp_path,
                devices=["cpu", "cpu"], workunit_size=4, backend=backend)
    assert len(stats.timeline) == 10 and sum(s.records for s in stats.timeline) == 40
    assert sorted(s.workunit for s in stats.timeline) == list(range(10))
    for span in stats.timeline:
        assert 0 <= span.start_s <= span.end_s <= stats.wall_s
        assert span.end_s - span.start_s >= span.records * 0.002 * 0.9  # the sleep happened inside
    busy = {w.worker: w.busy_s for w in stats.workers}
    for worker, seconds in busy.items():
        spans = [s.end_s - s.start_s for s in stats.timeline if s.worker == worker]
        assert sum(spans) == pytest.approx(seconds)
    assert stats.peak_rss_mib > 0 and all(w.peak_rss_mib > 0 for w in stats.workers)


def test_the_worst_stall_is_the_longest_a_worker_waited_for_its_next_workunit(tmp_path):
    """A source that stalls for a second halfway: each worker waits about that long between two
    of its workunits (longest_idle_s), and no workunit goes out meanwhile."""
    from helpers.engine.inputs.sources import READ_SLICE

    def stalling():  # (read a slice at a time: the stall comes after the first slice's workunits)
        for i in range(2 * READ_SLICE):
            if i == READ_SLICE + 1:
                time.sleep(1.0)
            yield i, f"r{i}"

    stats = run(stalling(), SyntheticWorkload(0.0), tmp_path, devices=["cpu", "cpu"],
                workunit_size=64, backend="thread", sort_window=0)  # (no window read ahead)
    assert stats.records == 2 * READ_SLICE
    assert 0.8 < stats.longest_idle_s < 3, stats.longest_idle_s
    assert stats.longest_dispatch_gap_s > 0.8


@pytest.mark.parametrize("strategy", ["queue", "static"])
def test_a_run_that_loses_rows_fails_naming_the_count_and_is_not_finished(tmp_path, strategy):
    """Issue 44: rows lost (a CSV quote that swallowed rows, a JSONL cut short) ended in exit 0
    or 3 with the rows in neither the output nor errors/. Whatever loses them, a run whose
    output holds fewer rows (written or failed) than the input is a failed run, and its output
    is left unfinished."""
    import h5py
    import pyarrow as pa
    import pyarrow.parquet as pq

    from helpers.engine.inputs.sources import open_source

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"r{i}" for i in range(5000)]}), path, row_group_size=1000)
    source = open_source(path)
    real = source.slices
    source.slices = lambda skip, limit: (s for n, s in enumerate(real(skip, limit)) if n != 2)
    with pytest.raises(PipelineError, match=r"the input holds 5,000 rows and the output 4,000 "
                                            r"\(written or in errors/\): 1,000 rows unaccounted"):
        run_pipeline(source, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 256,
                     tmp_path / "out.h5", "thread", strategy=strategy, progress=False,
                     writes="driver")
    with h5py.File(tmp_path / "out.h5") as f:
        assert not f.attrs["complete"]
    source.slices = real
    stats = run_pipeline(source, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 256,
                         tmp_path / "out.h5", "thread", strategy=strategy, progress=False,
                         writes="driver", resume=True)
    assert stats.records == 1000 and len(read_output(tmp_path / "out.h5")["ids"]) == 5000
