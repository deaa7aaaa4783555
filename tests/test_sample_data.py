import h5py

from helpers.engine.inputs.sources import open_source
from helpers.study.paths import DATA, SAMPLE_TEXT


def test_sample_corpus_has_5000_real_paragraphs_in_the_users_layout():
    records = list(open_source(SAMPLE_TEXT))
    assert len(records) >= 5000
    assert [i for i, _ in records] == list(range(len(records)))
    assert all(isinstance(t, str) and len(t) >= 200 for _, t in records)
    assert len({t for _, t in records}) == len(records)  # no duplicates
    words = sum(len(t.split()) for _, t in records[:100])
    assert words > 100 * 30  # prose, not code
    with h5py.File(SAMPLE_TEXT) as f:
        assert sorted(f["batches"], key=int) == [str(n) for n in range(len(f["batches"]))]
        assert "PSF" in f.attrs["licence"]


def test_sample_corpus_licence_and_script_are_shipped():
    assert "PSF License Agreement" in (DATA / "README.md").read_text()
    assert (DATA / "make_text_sample.py").exists()


def test_markup_is_stripped():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_text_sample", DATA / "make_text_sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.clean_inline("Use :func:`len` and ``x`` per :pep:`8`, see `docs <http://x>`_::") \
        == "Use len and x per PEP 8, see docs:"
    text = "A paragraph of prose::\n\n    code = 1\n\nAfter the code.\n"
    assert module.paragraphs(text) == ["A paragraph of prose:", "After the code."]


def test_image_sample_has_200_images_each_with_source_and_licence():
    import csv

    from helpers.engine.inputs.sources import ImageFolderSource

    rows = list(csv.DictReader(open(DATA / "images" / "manifest.csv")))
    files = {path.split("/")[-1] for _, path in ImageFolderSource(DATA / "images")}
    assert len(files) >= 200 and {r["file"] for r in rows} == files
    assert all(r["source"] and r["licence"] for r in rows)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"photo", "collage", "chart", "page"}
    assert sum(r["kind"] == "photo" for r in rows) >= 20


def test_detector_weights_are_the_documented_file():
    import hashlib

    from helpers.workloads.binning.detector import DEFAULT_WEIGHTS

    digest = hashlib.sha256(DEFAULT_WEIGHTS.read_bytes()).hexdigest()
    assert digest == "5c0cef08cd9f3dcf83b2d54fb4a59935207ca5af594cd56ec36f61e6716a1b26"
    assert digest in (DEFAULT_WEIGHTS.parent / "README.md").read_text()
