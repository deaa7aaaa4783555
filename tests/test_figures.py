"""The one figure helper: PNG and SVG, a caption, a finding, and the README it regenerates."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers.study.figures import save_figure, write_readme  # noqa: E402


def figure():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 4], [3, 5, 6])
    return fig


def test_save_writes_png_svg_meta_and_lists_it(tmp_path):
    png = save_figure(figure(), "01_nb", "rate-vs-workers", tmp_path, finding="2 workers win",
                      machine="CPU only: 2 cores", replicates=3, tables=["workers_per_device"])
    assert png == tmp_path / "01_nb" / "rate-vs-workers.png"
    assert png.read_bytes().startswith(b"\x89PNG") and png.with_suffix(".svg").is_file()
    meta = json.loads(png.with_suffix(".json").read_text())
    assert meta["finding"] == "2 workers win" and meta["replicates"] == 3
    readme = (tmp_path / "README.md").read_text()
    assert "![rate-vs-workers](01_nb/rate-vs-workers.png)" in readme
    assert "2 workers win" in readme and "CPU only: 2 cores" in readme


def test_the_readme_lists_exactly_the_figures_there_are(tmp_path):
    for name in ("a", "b"):
        save_figure(figure(), "nb", name, tmp_path, finding=f"finding {name}", machine="m",
                    replicates=1, tables=[])
    (tmp_path / "nb" / "a.png").unlink()
    readme = write_readme(tmp_path).read_text()
    assert "finding b" in readme and "finding a" not in readme


def test_ranked_bars_wrap_a_long_title_and_draw_no_spread_for_single_runs():
    import pandas as pd
    from matplotlib.container import ErrorbarContainer

    from helpers.study import plots

    one_run = pd.DataFrame({"configuration": ["a", "b"], "rate": [2.0, 1.0],
                            "layout": ["fixed", "self-tuning"]})
    fig = plots.ranked_bars(one_run, "configuration", "rate", "layout",
                            title="a title long enough to run past the axes " * 3, xlabel="x")
    ax = fig.axes[0]
    spread = lambda ax: [c for c in ax.containers if isinstance(c, ErrorbarContainer)]  # noqa: E731
    assert "\n" in ax.get_title() and not spread(ax)  # one run each: no spread to draw
    twice = pd.concat([one_run, one_run.assign(rate=[3.0, 1.5])])
    ax = plots.ranked_bars(twice, "configuration", "rate", "layout", title="t", xlabel="x").axes[0]
    assert spread(ax)
    plt.close("all")


def test_a_card_busy_figure_s_long_title_fits_its_figure():
    """Notebook 04's card title (88 characters) ran past both edges of its figure: wrapped,
    every line of it lies inside the figure."""
    import pandas as pd

    from helpers.study import plots

    table = pd.DataFrame({"workers": [1, 2, 1, 2], "backend": ["thread"] * 2 + ["process"] * 2,
                          "card_busy_share": [0.6, 0.8, 0.7, 0.8]})
    fig = plots.card_busy(table, "Simulated H200 (2 of 16 cores): busy vs workers, threads or "
                                 "processes (higher is better)", lines="backend")
    fig.canvas.draw()
    title = fig.axes[0].title.get_window_extent()
    assert fig.bbox.x0 <= title.x0 and title.x1 <= fig.bbox.x1
    said = plots.card_busy(table, "one worker:\nbusy", lines="backend").axes[0].get_title()
    assert said == "one worker:\nbusy"  # (a line break the title asks for stays where it is)
    plt.close("all")
