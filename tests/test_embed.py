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


def test_embed_takes_encode_s_shapes_and_options(st_model, texts):
    """No texts: a (0, dim) array of the form asked for; encode's options give encode's
    vectors through a whole run; int8 without ranges is cut with the texts' own, as
    ``encode(precision="int8")`` cuts them."""
    empty = embed([], backend="thread")
    assert empty.shape == (0, 384) and empty.dtype == np.float32
    assert embed([], backend="thread", truncate_dim=64, stored="ubinary").shape == (0, 8)
    assert embed([], backend="thread", stored="int8").dtype == np.int8
    got = embed(texts, backend="thread", prompt="query: ", truncate_dim=128, normalize=True)
    want = st_model.encode(texts, prompt="query: ", truncate_dim=128, normalize_embeddings=True)
    assert got.shape == (len(texts), 128)
    assert float((got * want).sum(axis=1).min()) >= 0.9999
    binary = embed(texts, backend="thread", stored="binary", workunit_size=5)
    np.testing.assert_array_equal(binary, st_model.encode(texts, precision="binary"))
    int8 = embed(texts, backend="thread", stored="int8")
    want = st_model.encode(texts, precision="int8")
    assert int8.dtype == np.int8 and np.abs(int8.astype(int) - want.astype(int)).max() <= 1
    with pytest.raises(ValueError, match="single embedding|two texts or more"):
        embed(texts[0], backend="thread", stored="uint8")  # (encode refuses it likewise)
