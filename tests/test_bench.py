import pytest

from helpers.bench import overhead

pytestmark = pytest.mark.timeout(240)  # reached only on deadlock


def test_overhead_measures_both_sides_interleaved(capsys):
    rows = overhead.measure(records=16, repeats=2, batch_size=8, workunit_size=8, threads=1)
    assert [r["method"] for r in rows] == ["bare", "pipeline", "pipeline_unsorted",
                                           "pipeline_unsorted", "pipeline", "bare"]
    assert all(r["records_per_s"] > 0 and r["records"] == 16 for r in rows)
    ratio = overhead.report(rows)
    assert ratio > 0
    assert "steady-state throughput ratio pipeline / bare" in capsys.readouterr().out


def test_failure_costs_measure_durable_writes_and_a_crash(capsys):
    from helpers.bench import failures

    frame = failures.pd.DataFrame(failures.durable_rows(3000, 2, "writer")
                                  + failures.crash_rows("synthetic", 200, 1))
    killed = frame[(frame.experiment == "crash") & (frame.killed == True)]  # noqa: E712
    assert len(killed) == 1 and 0 <= killed.detection_s.iloc[0] < 1.0
    assert killed.restart_s.iloc[0] > 0
    assert (frame[frame.experiment == "durable"].records == 3000).all()
    summary = failures.report(frame)
    assert summary["durable/in-place writer"] > 0
    assert "throughput ratio durable / in place, writer" in capsys.readouterr().out
