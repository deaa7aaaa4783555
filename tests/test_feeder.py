"""The feeding side: the Rust tokenizer's ids as sentence-transformers' own, collation, batches
by count or token budget, and a feeder that hands every text to the card once."""
import numpy as np
import pytest

from helpers.workloads.embedding import tokenizer_name
from helpers.workloads.embedding.feeder import CHUNK_TEXTS, Feeder, batches, collate
from helpers.workloads.embedding.rust_tokenizer import RustTokenizer


@pytest.fixture(scope="module", params=["files", "wrapper"])
def rust(request, st_model):
    """The simulated card's tokenizer as its workers read it (the model's files, no
    transformers), and as taken from transformers' tokenizer."""
    from helpers.workloads.embedding import default_model_path
    from helpers.workloads.embedding.model import read_model

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
    """A card of the protocol (helpers.workloads.embedding.cards) that records what it is fed:
    each row it gives back is the text's first id and its token count, so that a test can
    tell which text each row came from."""

    dim, label = 2, "fake"

    def __init__(self, asynchronous=True):
        self.asynchronous = asynchronous
        self.shapes, self.collected, self.staged = [], [], []

    def staging(self, texts, tokens):
        arrays = (np.empty((texts, tokens), np.int64), np.empty((texts, tokens), np.int64))
        self.staged.append(arrays)
        return arrays

    def submit(self, ids, mask):
        assert ids is self.staged[-1][0] and mask is self.staged[-1][1]  # collated in place
        self.shapes.append(ids.shape)
        rows = np.stack([ids[:, 1], mask.sum(axis=1)], axis=1).astype(np.float32)
        return type("Ticket", (), {"rows": rows, "busy_s": 0.001, "number": len(self.shapes)})

    def collect(self, tickets):
        self.collected.append([t.number for t in tickets])
        return [t.rows for t in tickets]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("batch_tokens", [None, 2048])
def test_the_feeder_hands_every_text_to_the_card_once(rust, sample, threads, batch_tokens):
    texts = sample[:5 * CHUNK_TEXTS + 7]
    card = FakeCard()
    rows, launched = Feeder(rust, card, threads).run(texts, 32, batch_tokens)
    counts, phases = launched.counts, launched.phases
    ids = rust.encode(texts)
    lengths = [len(t) for t in ids]
    assert sum(n for n, _ in card.shapes) == len(texts)
    assert rows[:, 0].tolist() == [t[1] for t in ids]  # every row where its text was
    assert rows[:, 1].tolist() == lengths
    assert counts.tokens_needed == sum(lengths)
    assert counts.tokens_computed == sum(n * length for n, length in card.shapes)
    assert counts.tokens_computed < 1.3 * counts.tokens_needed  # sorted by tokens
    if batch_tokens is None:
        assert max(n for n, _ in card.shapes) == 32
    else:
        assert all(n * length <= batch_tokens or n == 1 for n, length in card.shapes)
        assert max(n for n, _ in card.shapes) <= 32
    assert card.collected == [list(range(1, len(card.shapes) + 1))]  # once, every batch
    assert counts.card_busy_us == 1000 * len(card.shapes)
    assert counts.tokenize_cpu_us > 0 and counts.collate_cpu_us > 0
    assert set(phases) == {"tokenize", "forward", "copy_out"}


def test_a_card_that_computes_as_it_is_fed_gets_the_workunit_sorted_whole(rust, sample):
    """A CPU computes each batch as it is submitted: nothing is gained by starting before the
    workunit is tokenized, so its batches pad as little as a sort of the whole workunit by
    tokens (encode's order); an asynchronous card starts after the first chunk."""
    from helpers.workloads.embedding import feeder

    texts = sample[:6 * CHUNK_TEXTS]
    lengths = [len(t) for t in rust.encode(texts)]
    whole = sum(len(g) * lengths[g[0]] for g in batches(lengths, 32, None))
    computed, cut = {}, []
    real = feeder.batches
    feeder.batches = lambda lengths, *args: cut.append(len(lengths)) or real(lengths, *args)
    try:
        for asynchronous in (False, True):
            card = FakeCard(asynchronous)
            cut.clear()
            _, launched = Feeder(rust, card, 1).run(texts, 32, None)
            computed[asynchronous] = launched.counts.tokens_computed
            if not asynchronous:  # the workunit batched once, not again at every chunk (a
                assert cut == [len(texts)]  # workunit of 20,000 texts cost 2x the tokenizer)
            else:
                assert len(cut) == 6 and max(cut) <= CHUNK_TEXTS + 32 * 3  # (a window)
    finally:
        feeder.batches = real
    assert computed[False] == whole <= computed[True]


def test_a_card_s_unknown_seconds_are_not_counted_as_zero(rust, sample):
    """A card that does not know its own time (a real GPU's, here) leaves card_busy_us out of
    the counts: the run then says nothing of a busy share, not 0 %."""
    card = FakeCard()
    card.submit = lambda ids, mask, submit=card.submit: type(
        "Ticket", (), {"rows": submit(ids, mask).rows, "busy_s": None, "number": 0})
    _, launched = Feeder(rust, card, 1).run(sample[:40], 16, None)
    assert "card_busy_us" not in launched.counts.as_dict()
    assert launched.counts.as_dict()["tokens_needed"] > 40


def test_a_launched_workunit_waits_for_its_own_batches_not_the_next_one_s(rust, sample):
    """Two workunits launched before the first is finished (a worker overlapping them): the
    first collects only its own batches."""
    card = FakeCard()
    feeder = Feeder(rust, card, 1)
    first = feeder.launch(sample[:100], 32, None)
    own = len(card.shapes)
    second = feeder.launch(sample[100:200], 32, None)
    assert len(card.shapes) > own and card.collected == []  # launching waits for nothing
    rows = feeder.finish(first)
    feeder.finish(second)
    assert card.collected == [list(range(1, own + 1)), list(range(own + 1, len(card.shapes) + 1))]
    assert rows.shape == (100, 2)
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
    _, launched = Feeder(counting, FakeCard(), 4).run(sample[:100], 32, None)
    assert sorted(n for _, n in counting.calls) == [25, 25, 25, 25]
    assert launched.counts.tokens_needed == sum(map(len, rust.encode(sample[:100])))


def test_the_simulated_card_and_the_torch_card_are_fed_by_the_same_code(monkeypatch):
    """One feeder for every card: a simulated card's worker and a real model's hold the same
    FedModel over the same Feeder, and a workunit goes through the same Feeder.launch and
    finish to either card, which then only computes."""
    from helpers.study.paths import sample_texts
    from helpers.workloads.embedding import EmbeddingWorkload
    from helpers.workloads.embedding.cards.simulated import SimulatedCard
    from helpers.workloads.embedding.cards.torch_card import TorchCard
    from helpers.workloads.embedding.feeder import FedModel

    fed = []
    launch, finish = Feeder.launch, Feeder.finish
    monkeypatch.setattr(Feeder, "launch", lambda self, *args: fed.append(
        ("launch", type(self.card).__name__)) or launch(self, *args))
    monkeypatch.setattr(Feeder, "finish", lambda self, *args: fed.append(
        ("finish", type(self.card).__name__)) or finish(self, *args))
    texts = sample_texts(40)
    for workload, card in ((EmbeddingWorkload(card="h100", tokenize_threads=1), SimulatedCard),
                           (EmbeddingWorkload(), TorchCard)):
        model = workload.load("cuda:0" if workload.card else "cpu", 1)
        assert type(model) is FedModel and type(model.feeder) is Feeder
        assert type(model.card) is card and model.feeder.card is model.card
        fed.clear()
        rows = workload.process(model, texts)["embeddings"]
        assert rows.shape == (40, 384)
        assert fed == [("launch", card.__name__), ("finish", card.__name__)]
        assert workload.counts(model)["tokens_needed"] > 40
