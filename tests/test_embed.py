"""The one-liner (helpers.embed): an array in input order, equal to sentence-transformers' encode."""
import numpy as np
import pytest

from helpers import embed

pytestmark = pytest.mark.timeout(300)  # reached only on deadlock


def test_embed_equals_encode_in_input_order(texts, reference_embeddings):
    shuffled = np.random.default_rng(0).permutation(len(texts))
    got = embed([texts[i] for i in shuffled], devices="cpu,cpu", backend="thread",
                workunit_size=5)
    assert got.shape == reference_embeddings.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, reference_embeddings[shuffled], atol=1e-5, rtol=0)
    one = embed(texts[3], backend="thread")
    np.testing.assert_allclose(one, reference_embeddings[3], atol=1e-5, rtol=0)


def test_embed_names_the_texts_it_could_not_embed(texts):
    with pytest.raises(ValueError, match=r"2 of 4 texts could not be embedded: texts\[1\]: "
                                         r"ValueError: empty text.*texts\[3\]: TypeError"):
        embed([texts[0], "", texts[1], None], backend="thread")
    with pytest.raises(ValueError, match="nothing to embed"):
        embed([])
