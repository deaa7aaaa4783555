"""The simulated card: its cost model, its profiles, and one queue shared by threads and
processes."""
import multiprocessing
import threading
import time

import pytest

from helpers.workloads.embedding.cards.simulated import (CARDS, KERNEL_FLOOR_US, REFERENCE,
                                                         CardModel, CardQueue, flops_per_token,
                                                         parse_card, scale_for)


def minilm(card="h100", scale=1.0):
    return CardModel(CARDS[card], REFERENCE["layers"], REFERENCE["hidden"],
                     REFERENCE["intermediate"], scale)


def test_the_reference_model_runs_at_its_profile_s_rate_and_minilm_costs_what_anchors_say():
    assert flops_per_token(6, 384, 1536, 128) == pytest.approx(22.4e6, rel=0.02)  # ANCHORS.md
    for name, profile in CARDS.items():
        seconds = minilm(name).seconds(1024, 128)
        assert 1024 * 128 / seconds == pytest.approx(profile.tokens_per_second)
        assert profile.source  # every figure says where it comes from
    assert CARDS["h100"].tokens_per_second > CARDS["a100"].tokens_per_second \
        > CARDS["l4"].tokens_per_second


def test_a_batch_costs_its_padded_tokens_with_attention_s_quadratic_term():
    card = minilm()
    assert card.seconds(64, 128) == pytest.approx(2 * card.seconds(32, 128))  # linear in texts
    ratio = card.seconds(32, 256) / card.seconds(32, 128)
    assert 2.0 < ratio < 2.2  # twice the tokens, each a little dearer (attention's L²)
    assert card.seconds(1, 1) == pytest.approx(card.kernels * KERNEL_FLOOR_US / 1e6)  # the floor
    assert card.launch_s() > 0 and card.kernels == 6 * 16 + 8


def test_with_graphs_a_batch_costs_its_bucket_and_launches_in_a_few_calls():
    """A graphed card computes each batch as its bucket (cards.graphs.bucket) at the same rate
    and floor, and its launch is GRAPH_OPS calls, not one a kernel: the simulated H200's 104
    kernels at its measured 31.3 µs each against 5 calls of as much."""
    import dataclasses

    from helpers.workloads.embedding.cards.simulated import GRAPH_OPS

    eager = minilm("h200")
    graphed = dataclasses.replace(eager, graphs=(256, 256))
    assert graphed.shape(3, 17) == (8, 24) and eager.shape(3, 17) == (3, 17)
    assert graphed.seconds(3, 17) == eager.seconds(8, 24)
    assert graphed.seconds(256, 256) == eager.seconds(256, 256)
    assert graphed.launch_s() == pytest.approx(GRAPH_OPS * 31.3e-6)
    assert eager.launch_s() == pytest.approx(104 * 31.3e-6) and \
        eager.launch_s() / graphed.launch_s() == pytest.approx(104 / 5)


def test_a_scaled_card_is_the_cores_here_over_the_cores_a_real_gpu_gets():
    assert scale_for(None, 2) == 1.0
    assert scale_for(16, 2) == pytest.approx(1 / 8)
    assert minilm(scale=1 / 8).seconds(32, 128) == pytest.approx(8 * minilm().seconds(32, 128))


def test_an_unknown_card_names_the_choices():
    assert parse_card("H100").name == "h100"
    with pytest.raises(ValueError, match="h100, a100, l4"):
        parse_card("v100")


def slow_card(tmp_path, seconds=0.05):
    model = minilm()
    per_batch = model.seconds(1024, 128)
    return CardQueue(CardModel(model.profile, 6, 384, 1536, per_batch / seconds),
                     str(tmp_path / "q"))


def test_batches_queue_on_the_card_and_a_wait_holds_no_cpu(tmp_path):
    card = slow_card(tmp_path)
    started, cpu = time.monotonic(), time.process_time()
    for _ in range(4):
        assert card.submit(1024, 128) == pytest.approx(0.05)
    launched = time.monotonic() - started
    card.wait()
    assert time.monotonic() - started == pytest.approx(0.2, abs=0.05)  # one after another
    assert launched < 0.05  # launching does not wait for the card
    assert time.process_time() - cpu < 0.05  # the wait sleeps
    assert card.busy_s() == pytest.approx(0.2)


def test_a_wait_until_what_done_said_leaves_the_later_batches_running(tmp_path):
    """A worker that launched its next workunit waits only for the last one's batches."""
    card = slow_card(tmp_path)
    card.submit(1024, 128)
    first = card.done()
    card.submit(1024, 128)
    card.wait(first)
    assert card.done() - time.monotonic() == pytest.approx(0.05, abs=0.02)  # the second's left
    assert card.done() > first


def test_threads_and_processes_share_one_card(tmp_path):
    card = slow_card(tmp_path)
    started = time.monotonic()
    waited = []
    threads = [threading.Thread(target=lambda: (card.submit(1024, 128),
                                                waited.append(card.wait())))
               for _ in range(2)]
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_submit_twice, args=(str(tmp_path / "q"),))
    process.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    process.join()
    card.wait()
    assert process.exitcode == 0
    assert card.busy_s() == pytest.approx(0.2)  # 2 + 2 batches, one queue
    assert card.queue_end() >= started + 0.2 - 1e-6  # one after another, never side by side
    assert max(waited) >= 0.05 - 1e-3  # the second thread waited for the first's batch too


def _submit_twice(path):
    model = minilm()
    card = CardQueue(CardModel(model.profile, 6, 384, 1536, model.seconds(1024, 128) / 0.05), path)
    card.submit(1024, 128)
    card.submit(1024, 128)
    card.wait()


def test_a_card_travels_as_its_path_not_as_an_open_card(tmp_path):
    import pickle

    with pytest.raises(TypeError, match="path travels"):
        pickle.dumps(slow_card(tmp_path))


def test_the_simulated_h200_is_the_measured_card_s_own_figures():
    """Both figures of each H200 profile recomputed from the committed GPU check's table: the
    rate from the forward's best FLOP rate (the largest batches), the launch CPU from the
    smallest batches' time a batch, where the launches bound the card."""
    import math

    import pandas as pd

    from helpers.study.paths import ROOT
    from helpers.workloads.embedding.cards.simulated import KERNELS_OUTSIDE, KERNELS_PER_LAYER

    from helpers.bench.gpu.tables import measured

    table = measured(pd.read_csv(ROOT / "data" / "results" / "gpu" / "gpu_model.csv"))
    forward = table[(table["mode"] == "forward") & ~table["cuda_graphs"].astype(bool)]  # (eager:
    # what the profiles are; a later card's table also times the graphs)
    for name, compiled in (("h200", False), ("h200-compiled", True)):
        runs = forward[(forward["precision"] == "fp16") & (forward["compile"] == compiled)]
        medians = runs.groupby("batch_size")[["tflop_per_s", "seconds", "texts"]].median()
        rate = medians["tflop_per_s"].max() * 1e12 / flops_per_token(6, 384, 1536, 128)
        smallest = medians.index.min()
        per_batch = medians.loc[smallest, "seconds"] / math.ceil(
            medians.loc[smallest, "texts"] / smallest)
        kernels = 6 * KERNELS_PER_LAYER + KERNELS_OUTSIDE
        assert CARDS[name].tokens_per_second == pytest.approx(rate, rel=0.01)
        assert CARDS[name].launch_us == pytest.approx(per_batch / kernels * 1e6, rel=0.01)
        assert "gpu_model.csv" in CARDS[name].source
    model = minilm("h200")
    assert model.launch_s() == pytest.approx(3.25e-3, rel=0.01)  # a batch's launches
    assert CARDS["h200"].tokens_per_second < CARDS["h100"].tokens_per_second  # (eager PyTorch
    # measured against fused kernels estimated: the gap graphs and compile are meant to close)
