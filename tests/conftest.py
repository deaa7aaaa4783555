"""Shared fixtures: a small real corpus, its reference embeddings, and the leftover-process
check."""
from __future__ import annotations

import os
import time

import numpy as np
import psutil
import pytest

from helpers.engine.workers.backends import is_fork_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# OpenMP's threads (torch's, 2 in each worker here) wait by spinning unless told otherwise; the
# suite's 3 test processes share 2 cores, and the spinning of one took the cores the others
# wanted: two MiniLM encodes side by side took 14 CPU s each spinning, 9 waiting passively
# (0.64x, and 0.7x the wall time). Set before any process of the suite loads OpenMP (torch's
# import, here or in the workers, kernels and Ray daemons that inherit it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

LEFTOVER_GRACE_SECONDS = 5.0  # a finished run's children must be gone within this


def live_children(parent: psutil.Process | None = None) -> list[psutil.Process]:
    """``parent``'s live descendants (default: this process's), ignoring multiprocessing's
    resource tracker and fork server (one each per interpreter; the server's forked workers are
    counted) and any that ends or is a zombie while looked at (a short-lived helper such as
    platform's ``uname -p``)."""
    alive = []
    for child in (parent or psutil.Process()).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not multiprocessing_own(child):
                alive.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return alive


def multiprocessing_own(process: psutil.Process) -> bool:
    """Multiprocessing's resource tracker or fork server (whose forked workers share its command
    line, but not its parent's)."""
    command = " ".join(process.cmdline())
    return "resource_tracker" in command or is_fork_server(command,
                                                           " ".join(process.parent().cmdline()))


PRELOADED = ("torch", "sentence_transformers", "tokenizers", "onnxruntime",
             "rapidocr_onnxruntime")  # the embedding and binning workloads' ``imports``


@pytest.fixture(scope="session", autouse=True)
def fork_server_with_the_models_libraries():
    """This test process's fork server (helpers.engine.workers.backends), started before its
    first pool, imports what the embedding and binning workers import, so that each of their
    process workers is forked with them imported. The server keeps the imports of the pool that
    started it: a synthetic pool first (none), and every embedding worker after it imported torch
    and sentence-transformers itself, 4-8 s of CPU each here. A first process forked here waits
    for the imports, so that no test's timed first pool does."""
    from types import SimpleNamespace

    from helpers.engine.workers.backends import process_context

    context = process_context(SimpleNamespace(imports=PRELOADED))
    if context.get_start_method() == "forkserver":
        first = context.Process(target=int)
        first.start()
        first.join()


@pytest.fixture(autouse=True)
def cpu_unless_named(monkeypatch):
    """devices="auto" (the default) is the CPU in the tests, as in CI, even on a machine with a
    GPU: the tests compare with references computed on the CPU. A test that wants "auto" to be
    something else patches visible_devices itself."""
    import helpers.engine.contract.devices as devices

    monkeypatch.setattr(devices, "visible_devices", lambda: ("cpu",))


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every test must leave no worker process behind, and shut down quickly."""
    before = {p.pid for p in live_children()}
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE_SECONDS
    while (left := [p for p in live_children() if p.pid not in before]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in left:
        process.kill()
    assert not left, f"child processes left behind: {[p.pid for p in left]}"


@pytest.fixture(scope="session")
def texts() -> list[str]:
    """24 real paragraphs from the shipped sample, the shortest of its first 400 (cheap to
    embed)."""
    from helpers.study.paths import sample_texts

    return sorted(sample_texts(400), key=len)[:24]


@pytest.fixture(scope="session")
def st_model():
    from helpers.workloads.embedding import load_sentence_transformer

    return load_sentence_transformer(None, "cpu", 2)


@pytest.fixture(scope="session")
def reference_embeddings(st_model, texts) -> np.ndarray:
    """``model.encode`` in this one process: what every pipeline run must reproduce."""
    return st_model.encode(texts, batch_size=32, convert_to_numpy=True)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The embedded model's configuration and tokenizer with a one-layer random forward of hidden
    size 8 (helpers.bench.gpu.weights.TINY): a model's whole path for a test that needs a real
    transformer but not MiniLM's numbers (torch.compile's test: 30 s cold here against 48 s)."""
    from helpers.bench.feed import tiny_model

    return tiny_model(tmp_path_factory.mktemp("tiny"))


def as_driver_reads(source) -> dict:
    """Every record of ``source`` as the driver's slices give them, by id (what a worker reading
    its own rows must give: tests/test_table_rows.py, tests/test_jsonl_rows.py)."""
    from helpers.engine.contract.id_ranges import IdRanges

    return {i: r for ids, records, _ in source.slices(IdRanges(), None)
            for i, r in zip(ids.tolist(), records)}


def same_record(got, expected) -> bool:
    """The same record, or the same error (type, message, position)."""
    from helpers.engine.contract.protocol import BadRecord

    if isinstance(expected, BadRecord):
        return isinstance(got, BadRecord) and (got.error_type, got.message, got.position) == \
            (expected.error_type, expected.message, expected.position)
    return got == expected


def change_at_fourth_read(monkeypatch, opener: type, change) -> None:
    """Call ``change()`` as the fourth read through ``opener`` (a Rows opener class) begins: an
    input rewritten while the workers read it."""
    real, calls = opener.read, []

    def read(self, ids):
        calls.append(len(ids))
        if len(calls) == 4:
            change()
        return real(self, ids)

    monkeypatch.setattr(opener, "read", read)


def run_changed_half_way(monkeypatch, source, output, opener: type, change, name: str) -> dict:
    """Run ``source`` with the workers reading it (two threads, workunits of 64) and
    ``change()`` made at the fourth read through ``opener``: the run must stop naming the file
    ``name`` changed (InputUnreadable); what the output holds then."""
    import re

    from helpers import PipelineError, SyntheticWorkload, read_output, run_pipeline

    change_at_fourth_read(monkeypatch, opener, change)
    with pytest.raises(PipelineError, match=r"InputUnreadable: worker \d on .* cannot read the "
                                            r"input: InputChanged: .*" + re.escape(name) +
                                            r": changed since the run started"):
        run_pipeline(source, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 64, output, "thread",
                     progress=False, writes="workers")
    return read_output(output)


def run_then_resume(source, output, backend: str, limit: int) -> tuple:
    """``source`` run with the workers reading and writing (two, workunits of 64, the synthetic
    8-d model) to ``limit`` records, then resumed: the two runs' stats and what the output
    holds."""
    from helpers import SyntheticWorkload, read_output, run_pipeline

    options = dict(workunit_size=64, output=output, backend=backend, progress=False,
                   writes="workers")
    first = run_pipeline(source, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, limit=limit,
                         **options)
    then = run_pipeline(source, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, resume=True,
                        **options)
    return first, then, read_output(output)


def assert_rows_are(data: dict, ids: list, text_of) -> None:
    """The output ``data`` holds rows ``ids``, in order, each the synthetic model's vector of
    its text (``text_of(id)``; every 97th checked)."""
    from helpers.workloads.synthetic import record_vector

    assert data["ids"].tolist() == ids
    np.testing.assert_array_equal(data["values"][::97],
                                  np.stack([record_vector(text_of(i), 8) for i in ids[::97]]))


def read_by_either_side(source, folder, **options) -> list[tuple[list, list]]:
    """``source`` run twice, read and written by the driver, then by the workers (two threads,
    workunits of 64; ``options``: run_pipeline's): each output's error rows (id, type, message,
    position; sorted) and ids."""
    from helpers import SyntheticWorkload, read_output, run_pipeline

    found = []
    for writes in ["driver", "workers"]:
        run_pipeline(source, SyntheticWorkload(0.0, dim=8), ["cpu"] * 2, 64,
                     folder / f"{writes}.h5", "thread", progress=False, writes=writes,
                     **options)
        data = read_output(folder / f"{writes}.h5")
        found.append((sorted(((e["id"], e["type"], e["message"], e["position"])
                              for e in data["errors"]), key=repr), data["ids"].tolist()))
    return found
