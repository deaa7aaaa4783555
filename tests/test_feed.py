"""The feeding side: the Rust tokenizer's ids as sentence-transformers' own, collation, batches
by count or token budget, and a feeder that hands every text to the card once."""
import numpy as np
import pytest

from helpers.workloads.embedding import tokenizer_name
from helpers.workloads.feed import CHUNK_TEXTS, Feeder, RustTokenizer, batches, collate


@pytest.fixture(scope="module", params=["files", "wrapper"])
def rust(request, st_model):
    """The simulated card's tokenizer as its workers read it (the model's files, no
    transformers), and as taken from transformers' tokenizer."""
    from helpers.workloads.embedding import default_model_path
    from helpers.workloads.simulated import read_model

    if request.param == "files":
        return read_model(default_model_path())[1]
    return RustTokenizer.of(st_model[0].tokenizer, st_model.max_seq_length)


@pytest.fixture(scope="module")
def sample():
    from helpers.study.paths import sample_texts

    texts = sample_texts()
    longest = sorted(texts, key=len)[-64:]  # (past max_seq_length: truncated)
    return texts[:448] + longest + ["  spaces around  ", "Ünïcödé — ‘quotes’ 日本語", "a"]


def test_the_rust_tokenizer_gives_the_ids_sentence_transformers_computes(st_model, rust, sample):
    features = getattr(st_model, tokenizer_name(st_model))(sample)
    ids, mask = features["input_ids"].numpy(), features["attention_mask"].numpy()
    got = rust.encode(sample)
    assert max(map(len, got)) == st_model.max_seq_length  # truncation was exercised
    for row, tokens in enumerate(got):
        assert tokens == ids[row, :mask[row].sum()].tolist(), sample[row][:80]
    batch, ours = collate(got, rust.pad_id)
    assert batch.shape == ids.shape and (batch == ids).all() and (ours == mask).all()


def test_collate_pads_to_the_longest_with_a_mask():
    batch, mask = collate([[1, 2, 3], [4]], pad_id=0)
    assert batch.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.dtype == np.int64 and mask.dtype == np.int64


def test_batches_longest_first_by_count_or_by_a_token_budget():
    lengths = [5, 50, 10, 40, 20]
    assert batches(lengths, 2, None) == [[1, 3], [4, 2], [0]]
    assert batches(lengths, 3, 60) == [[1], [3], [4, 2, 0]]  # 50; 40 (+20: 80); 3 x 20 = 60
    assert batches(lengths, 2, 60) == [[1], [3], [4, 2], [0]]  # and at most batch_size texts
    assert batches([500], 2, 60) == [[0]]  # a text longer than the budget is a batch of its own


class FakeCard:
    def __init__(self):
        self.shapes, self.waits = [], []

    def submit(self, texts, tokens):
        self.shapes.append((texts, tokens))
        return 0.001

    def done(self):  # (a real card's is a moment: here, the batches submitted so far)
        return len(self.shapes)

    def wait(self, until=None):
        self.waits.append(until)
        return 0.0


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("batch_tokens", [None, 2048])
def test_the_feeder_hands_every_text_to_the_card_once(rust, sample, threads, batch_tokens):
    texts = sample[:5 * CHUNK_TEXTS + 7]
    card = FakeCard()
    counts, phases = Feeder(rust, card, threads).run(texts, 32, batch_tokens)
    lengths = [len(t) for t in rust.encode(texts)]
    assert sum(n for n, _ in card.shapes) == len(texts)
    assert counts.tokens_needed == sum(lengths)
    assert counts.tokens_computed == sum(n * length for n, length in card.shapes)
    assert counts.tokens_computed < 1.3 * counts.tokens_needed  # sorted by tokens
    if batch_tokens is None:
        assert max(n for n, _ in card.shapes) == 32
    else:
        assert all(n * length <= batch_tokens or n == 1 for n, length in card.shapes)
        assert max(n for n, _ in card.shapes) <= 32
    assert card.waits == [len(card.shapes)]  # once, for every batch it submitted
    assert counts.card_busy_us == 1000 * len(card.shapes)
    assert counts.tokenize_cpu_us > 0 and counts.collate_cpu_us > 0
    assert set(phases) == {"tokenize", "forward", "copy_out"}


def test_a_launched_workunit_waits_for_its_own_batches_not_the_next_one_s(rust, sample):
    """Two workunits launched before the first is finished (a worker overlapping them): the
    first waits only until the card is done with its own batches."""
    card = FakeCard()
    feeder = Feeder(rust, card, 1)
    first = feeder.launch(sample[:100], 32, None)
    own = len(card.shapes)
    second = feeder.launch(sample[100:200], 32, None)
    assert len(card.shapes) > own and card.waits == []  # launching waits for nothing
    feeder.finish(first)
    feeder.finish(second)
    assert card.waits == [own, len(card.shapes)]
    assert first.counts.tokens_needed == sum(map(len, rust.encode(sample[:100])))


def test_a_small_workunit_is_cut_so_that_every_tokenizing_thread_gets_a_chunk(rust, sample):
    """100 texts and 4 threads: chunks of 25, not one chunk of 64 and one of 36 (two threads
    idle while the others tokenize)."""
    import threading

    class Counting:
        def __init__(self):
            self.pad_id, self.calls = rust.pad_id, []

        def encode(self, texts):
            self.calls.append((threading.current_thread().name, len(texts)))
            return rust.encode(texts)

    counting = Counting()
    counts, _ = Feeder(counting, FakeCard(), 4).run(sample[:100], 32, None)
    assert sorted(n for _, n in counting.calls) == [25, 25, 25, 25]
    assert counts.tokens_needed == sum(map(len, rust.encode(sample[:100])))

