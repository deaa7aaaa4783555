"""Tokenizing processes (helpers.workloads.embedding.tokenizing): the tokenizer's ids from
children of the worker's own, which end with it; a child that dies fails its chunks, naming how."""
import os
import signal
import time

import pytest

from helpers.workloads.embedding.feeder import Feeder
from helpers.workloads.embedding.tokenizing import TokenizerProcesses, TokenizingError, spec_of
from helpers.workloads.embedding.word_cache import WordCache


@pytest.fixture(scope="module")
def rust():
    from helpers.workloads.embedding import default_model_path
    from helpers.workloads.embedding.model import read_model

    return read_model(default_model_path(), 64)[1]


@pytest.fixture(scope="module")
def texts():
    from helpers.study.paths import sample_texts

    return sample_texts(600) + ["Ünïcödé — 日本語", "a [MASK] b"]


@pytest.mark.parametrize("cached", [False, True])
def test_the_children_give_the_tokenizer_s_ids_with_its_truncation(rust, texts, cached):
    tokenizer = WordCache(rust) if cached else rust
    assert spec_of(tokenizer)["word_cache"] is cached and spec_of(tokenizer)["max_length"] == 64
    pool = TokenizerProcesses(tokenizer, 2)
    try:
        futures = [pool.submit(texts[i:i + 50]) for i in range(0, len(texts), 50)]
        got = [ids for future in futures for ids in future.result(timeout=60)[0]]
        assert got == rust.encode(texts)
        _, cpu, fast = futures[0].result()
        assert cpu > 0 and (fast > 40) is cached
    finally:
        pool.close()
    assert all(_gone(pid) for pid in pool.pids())


def test_the_feeder_on_processes_feeds_the_card_as_on_threads(rust, texts):
    from tests.test_feeder import FakeCard

    on_threads, _ = Feeder(rust, FakeCard(), 1).run(texts, 32, None)
    feeder = Feeder(WordCache(rust), FakeCard(), 4, processes=2)
    try:
        assert feeder.threads == 1 and feeder.processes == 2
        rows, launched = feeder.run(texts, 32, None)
        assert (rows == on_threads).all()  # each row its text's first id and token count
        assert launched.counts.tokenize_cpu_us > 0
        assert launched.counts.texts_fast > 0.9 * len(texts)
    finally:
        feeder.close()


def test_a_child_that_dies_fails_its_chunks_naming_how(rust, texts):
    pool = TokenizerProcesses(rust, 1)
    try:
        victim = pool.pids()[0]
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(TokenizingError, match=f"pid {victim}.*SIGKILL"):
            pool.submit(texts[:10]).result(timeout=30)
    finally:
        pool.close()


def test_a_pool_no_one_holds_ends_its_children(rust):
    import gc

    pool = TokenizerProcesses(rust, 2)
    pids = pool.pids()
    del pool
    gc.collect()
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in pids)


def test_a_run_on_tokenizing_processes_writes_every_row_and_leaves_no_process(tmp_path, texts):
    """Whole runs, process and thread backends: the workers' children end with the pool (the
    conftest's check finds none left)."""
    from helpers.engine.outputs.hdf5_sink import read_output
    from helpers.engine.pipeline import run_pipeline
    from helpers.workloads.embedding import EmbeddingWorkload

    workload = EmbeddingWorkload(card="h200", card_cores=16, tokenize_processes=2)
    for backend in ("process", "thread"):
        stats = run_pipeline(list(enumerate(texts)), workload, devices="cuda:0",
                             workunit_size=128, output=tmp_path / f"{backend}.h5",
                             backend=backend, progress=False)
        assert read_output(tmp_path / f"{backend}.h5")["ids"].tolist() == list(range(len(texts)))
        assert stats.counts["texts_fast"] > 0.9 * len(texts)


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # (a zombie not yet reaped by its parent counts as gone)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_a_dead_child_s_siblings_take_the_rest_and_none_left_is_said(rust, texts):
    """One child killed: the chunks it held fail, the next go to the living one; both killed:
    a submit says every child's end."""
    pool = TokenizerProcesses(rust, 2)
    try:
        first, second = pool.pids()
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not pool._children[0].dead and time.monotonic() < deadline:
            time.sleep(0.02)
        for _ in range(4):
            assert pool.submit(texts[:20]).result(timeout=30)[0] == rust.encode(texts[:20])
        os.kill(second, signal.SIGKILL)
        with pytest.raises(TokenizingError):
            for _ in range(50):  # (the second's end is seen by its reader, then by submit)
                pool.submit(texts[:5]).result(timeout=30)
                time.sleep(0.05)
        with pytest.raises(TokenizingError, match=f"every tokenizing process has ended: pid "
                                                  f"{first} \\(killed by SIGKILL\\)"):
            pool.submit(texts[:5])
    finally:
        pool.close()


def test_a_child_that_cannot_start_says_why(rust, monkeypatch):
    """A child whose imports fail (no helpers on its path, say) is named with how it ended,
    not a bare EOFError."""
    monkeypatch.setattr("sys.executable", "/bin/false")
    with pytest.raises(TokenizingError, match="could not start: exit code 1"):
        TokenizerProcesses(rust, 1)


@pytest.mark.parametrize("card, cores, expected", [
    (True, 16, 8), (True, 6, 5), (True, 2, 1), (True, 1, 0), (False, 16, 0)])
def test_a_worker_on_a_card_tokenizes_in_processes_on_the_node_s_cores_by_default(card, cores,
                                                                                   expected):
    from helpers.workloads.embedding.loading import default_processes

    assert default_processes(card, cores) == expected


def test_fed_takes_the_default_processes_only_where_no_layout_is_given(monkeypatch):
    """A worker on an accelerator with no tokenizing option gets the node's cores less one as
    tokenizing processes (8 at most); tokenize_threads or tokenize_processes given: those."""
    import helpers.workloads.embedding.loading as loading

    monkeypatch.setattr(loading, "available_cores", lambda: 8)
    made = []

    class Recorded:
        def __init__(self, tokenizer, card, threads, processes):
            made.append((threads, processes))

    monkeypatch.setattr(loading, "Feeder", Recorded)
    monkeypatch.setattr(loading, "FedModel", lambda feeder, model: type("M", (), {})())
    monkeypatch.setattr(loading.RustTokenizer, "of", classmethod(lambda cls, t, n: object()))
    monkeypatch.setattr(loading, "tokenizer_for", lambda rust, cache: (rust, ""))
    model = type("Model", (), {"tokenizer": None, "max_seq_length": 256})()
    loading.fed(model, None, None, "cuda:0", True, None)
    loading.fed(model, None, None, "cpu", True, None)
    loading.fed(model, None, 4, "cuda:0", True, None)
    loading.fed(model, None, None, "cuda:0", True, 2)
    loading.fed(model, None, None, "cuda:0", True, None, cores=4)  # (its share of the node's)
    loading.fed(model, None, None, "cuda:0", False, None, cores=1)  # (threads: the Rust one's)
    loading.fed(model, None, None, "mps", True, None)  # (any accelerator is a card)
    assert made == [(1, 7), (1, 0), (4, 0), (1, 2), (1, 3), (1, 0), (1, 7)]


@pytest.mark.parametrize("share, given, expected", [
    (4, {}, (1, 3)), (2, {}, (1, 1)), (1, {}, (1, 0)), (16, {}, (1, 8)),
    (4, {"threads": 2}, (2, 0)), (4, {"processes": 2}, (1, 2))])
def test_a_simulated_card_s_worker_tokenizes_as_a_real_card_s_does(monkeypatch, tmp_path, share,
                                                                   given, expected):
    """One decision for every card (loading.tokenizing_for): a worker on a simulated card
    with no tokenizing option takes the layout a worker on a GPU takes on the same share of
    the node's cores (processes on it, less its own thread), not a thread per core of the
    machine, as it did; the options given win on both."""
    import helpers.workloads.embedding.loading as loading
    from helpers.workloads.embedding.model import default_model_path

    made = []

    class Recorded:
        def __init__(self, tokenizer, card, threads, processes):
            made.append((type(card).__name__, threads, processes))

    monkeypatch.setattr(loading, "Feeder", Recorded)
    monkeypatch.setattr(loading, "FedModel", lambda feeder, model=None: type("M", (), {})())
    monkeypatch.setattr(loading.RustTokenizer, "of", classmethod(lambda cls, t, n: object()))
    monkeypatch.setattr(loading, "tokenizer_for", lambda rust, cache: (rust, ""))
    loading.load_simulated(default_model_path(), "h200", 16, "cuda:0", str(tmp_path),
                           given.get("threads"), processes=given.get("processes"), cores=share)
    model = type("Model", (), {"tokenizer": None, "max_seq_length": 256})()
    loading.fed(model, None, given.get("threads"), "cuda:0", True, given.get("processes"),
                cores=share)
    assert made == [("SimulatedCard", *expected), ("NoneType", *expected)]


def test_the_simulated_card_s_load_hands_the_worker_s_share_to_its_tokenizing(monkeypatch):
    """EmbeddingWorkload.load(device, threads) on a simulated card: ``threads`` (the worker's
    share of the node's cores, from the engine) is what its default tokenizing runs on."""
    import helpers.workloads.embedding.loading as loading
    from helpers.workloads.embedding import EmbeddingWorkload

    made = []
    monkeypatch.setattr(loading, "Feeder", lambda tokenizer, card, threads, processes:
                        made.append((threads, processes)))
    monkeypatch.setattr(loading, "FedModel", lambda feeder, model=None: type("M", (), {})())
    for share in (4, 1):
        EmbeddingWorkload(card="h200", card_cores=16).load("cuda:0", share)
    assert made == [(1, 3), (1, 0)]
