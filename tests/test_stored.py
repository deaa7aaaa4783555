"""How embeddings are stored (helpers.workloads.embedding.stored): sentence-transformers'
forms, shapes and the calibration ranges int8 and uint8 are cut with."""
import numpy as np
import pytest

from helpers.workloads.embedding.stored import (STORED, calibration_ranges, check_stored,
                                                stored_form, stored_spec)


def test_each_form_s_dataset_is_the_arrays_it_stores():
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(50, 20)).astype(np.float32)
    ranges = calibration_ranges(embeddings)
    for stored in STORED:
        spec = stored_spec(stored, 20)
        got = stored_form(embeddings, stored, ranges if stored.endswith("int8") else None)
        spec.check("embeddings", got, 50)  # (raises where shape or dtype differ)
    assert stored_spec("binary", 20).shape == (3,) and stored_spec("int8", 20).dtype == "int8"


def test_the_forms_are_sentence_transformers_bytes():
    rng = np.random.default_rng(1)
    embeddings = rng.normal(size=(40, 16)).astype(np.float32)
    bits = embeddings > 0
    np.testing.assert_array_equal(stored_form(embeddings, "ubinary"), np.packbits(bits, axis=-1))
    np.testing.assert_array_equal(stored_form(embeddings, "binary"),
                                  (np.packbits(bits, axis=-1).astype(np.int16) - 128)
                                  .astype(np.int8))
    ranges = calibration_ranges(embeddings)
    np.testing.assert_array_equal(ranges, [embeddings.min(0), embeddings.max(0)])
    uint8 = stored_form(embeddings, "uint8", ranges)
    steps = (ranges[1] - ranges[0]) / 255
    np.testing.assert_array_equal(uint8, np.clip(np.floor((embeddings - ranges[0]) / steps),
                                                 0, 255).astype(np.uint8))
    np.testing.assert_array_equal(stored_form(embeddings, "int8", ranges).astype(np.int16),
                                  uint8.astype(np.int16) - 128)
    assert stored_form(embeddings, "float16").dtype == np.float16


@pytest.mark.parametrize("stored, ranges, message", [
    ("float64", None, "stored: expected one of"),
    ("int8", None, "needs the calibration ranges"),
    ("float32", [[0.0], [1.0]], "ranges: calibration ranges are for"),
    ("uint8", [[0.0, 1.0]], r"expected a \(2, dim\) array"),
    ("uint8", [[1.0], [0.0]], "low <= high"),
    ("uint8", [[0.0], [float("nan")]], "finite"),
])
def test_a_bad_form_or_ranges_is_refused_naming_it(stored, ranges, message):
    with pytest.raises(ValueError, match=message):
        check_stored(stored, ranges)


def test_ranges_are_kept_as_floats_that_cut_as_given():
    ranges = np.array([[-0.5, -0.25], [0.5, 0.75]], dtype=np.float32)
    kept = check_stored("int8", ranges)
    assert kept == ((-0.5, -0.25), (0.5, 0.75))
    with pytest.raises(ValueError, match="two texts or more"):
        calibration_ranges(np.zeros((1, 4), np.float32))


def test_the_bytes_are_sentence_transformers_own_even_outside_the_ranges():
    """Rows after the calibration sample may fall outside its ranges: clipped to them, as
    sentence-transformers 6 does (never wrapped around)."""
    from sentence_transformers.util.quantization import quantize_embeddings

    rng = np.random.default_rng(2)
    sample = rng.normal(size=(100, 24)).astype(np.float32)
    ranges = calibration_ranges(sample)
    later = (rng.normal(size=(60, 24)) * 3).astype(np.float32)  # (many outside the ranges)
    for stored in ("int8", "uint8", "binary", "ubinary"):
        given = ranges if stored in ("int8", "uint8") else None
        np.testing.assert_array_equal(stored_form(later, stored, given),
                                      quantize_embeddings(later, stored, ranges=given))
    assert set(np.unique(stored_form(later, "uint8", ranges))) >= {0, 255}
    with pytest.raises(ValueError, match="more than an output's attribute holds"):
        check_stored("int8", np.zeros((2, 8_001)))
