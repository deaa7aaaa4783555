import h5py

from helpers.paths import DATA, SAMPLE_TEXT
from helpers.sources import open_source


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
