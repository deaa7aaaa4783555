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
