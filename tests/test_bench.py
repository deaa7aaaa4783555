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
