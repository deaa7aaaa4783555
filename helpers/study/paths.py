"""Where the project's files live, resolved from the checkout (data is not part of the wheel)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # this file is <checkout>/helpers/study/paths.py
DATA = ROOT / "data"
SAMPLE_TEXT = DATA / "python_docs_paragraphs.h5"  # 10,674 paragraphs; see data/README.md
FIGURES = ROOT / "figures"
NOTEBOOKS = ROOT / "notebooks"


def sample_texts(n: int | None = None) -> list[str]:
    """The first ``n`` paragraphs of the shipped sample corpus (all of them if None)."""
    from itertools import islice

    from helpers.engine.inputs.sources import HDF5BatchesSource

    return [text for _, text in islice(HDF5BatchesSource(SAMPLE_TEXT), n)]
