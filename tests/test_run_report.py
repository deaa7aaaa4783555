"""A finished run's picture, drawn from its output alone."""
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from helpers.engine.pipeline import run_pipeline
from helpers.study import run_report
from helpers.study.paths import ROOT
from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.synthetic import SyntheticWorkload


def test_a_simulated_card_s_run_is_drawn_with_its_error_rows(tmp_path):
    out = tmp_path / "out.h5"
    records = [(i, "" if i == 7 else f"paragraph {i} " * (1 + i % 9)) for i in range(400)]
    run_pipeline(records, EmbeddingWorkload(card="h100", card_cores=16), devices="cuda:0*2",
                 workunit_size=50, output=out, progress=False)
    assert run_report._errors(out).to_dict() == {"ValueError": 1}  # the empty text
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "helpers", "report", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    png = run_report.default_path(out)
    assert done.stdout.strip() == str(png) and png.read_bytes()[:4] == b"\x89PNG"
    assert png.stat().st_size > 30_000  # four panels drawn, not an empty canvas


def test_a_cpu_run_is_drawn_and_an_output_without_runs_is_refused(tmp_path):
    out = tmp_path / "out.h5"
    run_pipeline([(i, i) for i in range(100)], SyntheticWorkload(0.001), devices="cpu*2",
                 workunit_size=10, output=out, progress=False)
    assert run_report.draw(out, tmp_path / "mine.png").is_file()
    run_pipeline([(i, i) for i in range(100)], SyntheticWorkload(0.001), devices="cpu",
                 workunit_size=10, output=out, resume=True, progress=False)  # nothing left
    assert run_report.draw(out, tmp_path / "empty.png").is_file()  # its run: no workunits
    with pytest.raises(ValueError, match="records runs 0 to 1, not 3"):  # (--run counts from 0)
        run_report.draw(out, run=3)
    import h5py

    with h5py.File(tmp_path / "old.h5", "w") as f:
        f["ids"] = np.arange(3)
    with pytest.raises(ValueError, match="records no finished run"):
        run_report.draw(tmp_path / "old.h5")


def test_report_on_what_gpufeed_did_not_write_says_so_in_one_line(tmp_path):
    """Issue 59: report on a file gpufeed did not write, an empty file or a folder gave an
    h5py errno dump: one line names the file and why, exit 2."""
    import h5py

    (tmp_path / "empty.h5").write_bytes(b"")
    (tmp_path / "text.h5").write_text("not hdf5")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.arange(3)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name, why in [("empty.h5", "an empty file, not a gpufeed output"),
                      ("text.h5", "not a gpufeed output (not an HDF5 file)"),
                      ("other.h5", "an HDF5 file gpufeed did not write (no ids)"),
                      (".", "a folder, not an output (name the .h5 file a run wrote)"), ("none.h5", "no such file")]:
        done = subprocess.run([sys.executable, "-m", "helpers", "report", name], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (name, done.stderr)
        assert done.stderr == f"error: {name}: {why}\n", done.stderr


def test_a_wrong_output_is_told_before_the_plotting_libraries_load(tmp_path, monkeypatch):
    """matplotlib and seaborn take a second and a half to import here: a name that is no
    output is refused first."""
    monkeypatch.setattr(run_report, "needs", lambda *args: pytest.fail(f"loaded {args[0]}"))
    with pytest.raises(ValueError, match="no such file"):
        run_report.draw(tmp_path / "none.h5")


def test_a_cpu_run_without_errors_draws_only_what_it_has_and_says_the_rest(tmp_path, monkeypatch):
    """Issue 59: half of a plain CPU run's picture was two empty panels (no card, no errors),
    and its title said "run 0 of 1". It draws two panels, says the rest under the title, and
    names the run as a reader counts it."""
    out = tmp_path / "out.h5"
    run_pipeline([(i, i) for i in range(60)], SyntheticWorkload(0.001), devices="cpu",
                 workunit_size=10, output=out, progress=False, backend="thread")
    drawn = {}
    import matplotlib.figure

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: drawn.setdefault("fig", fig))
    run_report.draw(out, tmp_path / "x.png")
    fig = drawn["fig"]
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 2
    texts = [t.get_text() for t in fig.texts]
    assert any("no card: a CPU run" in t and "no error rows" in t for t in texts)
    assert "its one recorded run: 60 rows" in fig._suptitle.get_text()
    assert "run 0 of 1" not in fig._suptitle.get_text()


def test_a_resumed_output_s_title_counts_every_run_s_rows(tmp_path):
    """Issue 59: report on a resumed output said "180 rows" for an output of 400: the title
    counts what the output holds, and how much of it earlier runs wrote (a run killed before it
    finished is not recorded, yet its rows are there)."""
    out = tmp_path / "out.h5"
    records = [(i, i) for i in range(100)]
    run_pipeline(records, SyntheticWorkload(0.0), devices="cpu", workunit_size=10, output=out,
                 progress=False, backend="thread", limit=40)
    run_pipeline(records, SyntheticWorkload(0.0), devices="cpu", workunit_size=10, output=out,
                 progress=False, backend="thread", resume=True)
    from helpers.engine.outputs import run_log

    runs = run_log.read(out)
    title = run_report._title(out, runs, runs[-1], runs[-1].stats)
    assert "run 2 of 2 recorded (--run 1): 60 rows" in title
    assert "the output holds 100 rows and 0 error rows: 40 of them from earlier runs" in title


def test_the_rate_is_drawn_in_tokens_where_the_workload_counts_them():
    """Issue 59: a CPU run's rows/s fell from 120 to 16 as its texts grew longer, under "a dip
    is a stall": tokens/s is what stays flat, rows/s beside it on an axis of its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = pd.DataFrame({"start_s": [0.0, 1.0, 2.0], "end_s": [1.0, 2.0, 3.0],
                          "records": [120, 40, 16], "device": ["cpu"] * 3, "worker": [0] * 3,
                          run_report.TOKENS: [1200.0, 1200.0, np.nan]})
    fig, ax = plt.subplots()
    run_report._rate(ax, spans, np.linspace(0, 3, 4))
    assert ax.get_ylabel() == "tokens per second" and "tokens/s is flat" in ax.get_title()
    (twin,) = [other for other in fig.axes if other is not ax]
    assert twin.get_ylabel() == "rows per second"
    assert ax.lines[-1].get_ydata().tolist() == [1200.0, 1200.0, 0.0]
    assert twin.lines[0].get_ydata().tolist() == [120.0, 40.0, 16.0]
    plt.close(fig)
    fig, ax = plt.subplots()
    run_report._rate(ax, spans.drop(columns=[run_report.TOKENS]), np.linspace(0, 3, 4))
    assert ax.get_ylabel() == "rows per second" and len(fig.axes) == 1
    plt.close(fig)


def test_a_span_s_rows_are_spread_over_the_bins_it_covers():
    spans = pd.DataFrame({"start_s": [0.0, 1.0], "end_s": [2.0, 1.5], "records": [100, 10]})
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    spread = run_report._spread(spans, "records", edges)
    assert spread.tolist() == pytest.approx([50.0, 60.0, 0.0]) and spread.sum() == 110
