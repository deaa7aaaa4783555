"""Recovery's decisions (helpers.engine.dispatch.recovery): a failed workunit halved on out of
memory, retried, split to its bad record, given up alone; a death charged to the running
workunit only, each suspect sent alone where it cannot be told, all sent back where it was not
theirs. The scheduler applies them (tests/test_scheduler.py runs them end to end)."""
import numpy as np

from helpers.engine.contract.messages import Workunit
from helpers.engine.dispatch.recovery import after_death, cut, halves, retry_or_split


def unit(index, first, count, **fields):
    ids = np.arange(first, first + count, dtype=np.int64)
    return Workunit(index, ids, [f"r{i}" for i in ids.tolist()], **fields)


def test_out_of_memory_halves_the_workunit_and_caps_its_worker():
    decision = retry_or_split("worker 0 on cuda:0", unit(4, 0, 9, pinned=1), "OutOfMemoryError",
                              "CUDA out of memory", out_of_memory=True, retries=2, cap=None)
    first, rest = decision.requeue
    assert (len(first), len(rest)) == (5, 4) and decision.renumber
    assert first.pinned is None and rest.pinned is None
    assert first.ids.tolist() + rest.ids.tolist() == list(range(9))
    assert decision.cap == 5 and decision.count == "oom_backoffs" and not decision.given_up
    assert "out of memory on workunit 4 (9 records" in decision.warning
    assert decision.warning.endswith("at most 5 records per workunit")
    smaller = retry_or_split("w", unit(4, 0, 9), "OOM", "", True, 2, cap=3)
    assert smaller.cap == 3  # a cap only ever comes down


def test_a_failure_is_retried_then_split_then_its_record_given_up_on():
    failing = unit(7, 100, 4, attempts=0)
    retried = retry_or_split("w", failing, "ValueError", "bad", False, retries=1, cap=None)
    (again,) = retried.requeue
    assert again.attempts == 1 and again.index == 7 and not retried.renumber
    assert retried.count == "retries" and "retry 1 of 1" in retried.warning
    split = retry_or_split("w", again, "ValueError", "bad", False, retries=1, cap=None)
    assert [len(u) for u in split.requeue] == [2, 2] and split.renumber
    assert split.count == "splits" and "splitting it into 2 + 2" in split.warning
    alone = replace_attempts(unit(9, 101, 1), 1)
    given = retry_or_split("w", alone, "ValueError", "bad", False, retries=1, cap=None)
    assert not given.requeue and given.count is None
    (record, kind, message, when), = given.given_up
    assert (record, kind, message) == (101, "ValueError", "bad") and when > 0


def replace_attempts(workunit, attempts):
    from dataclasses import replace

    return replace(workunit, attempts=attempts)


def test_a_death_is_charged_to_the_running_workunit_and_the_rest_go_back_uncharged():
    units = [unit(1, 0, 3, pinned=0), unit(2, 3, 3, pinned=0)]
    decision = after_death("worker 0 died (SIGKILL)", units, not_theirs=False, unknown=False,
                           suspects=2)
    assert decision.charge is units[0]
    (waiting,) = decision.requeue
    assert waiting.index == 2 and waiting.pinned is None and waiting.attempts == 0
    assert decision.warning == "worker 0 died (SIGKILL) during workunit 1 (3 records, ids 0..2)"


def test_where_the_death_cannot_be_pinned_each_suspect_goes_alone_charged_nothing():
    units = [unit(1, 0, 3), unit(2, 3, 3), unit(3, 6, 3)]
    decision = after_death("timed out", units, not_theirs=False, unknown=True, suspects=2)
    assert [u.alone for u in decision.requeue] == [True, True, False]
    assert decision.charge is None and "any of 2 of which may have done it" in decision.warning


def test_a_death_that_was_not_theirs_sends_every_workunit_back_as_it_was():
    units = [unit(1, 0, 3, pinned=0, attempts=1), unit(2, 3, 3)]
    decision = after_death("recycled", units, not_theirs=True, unknown=True, suspects=2)
    assert [(u.index, u.attempts, u.pinned, u.alone) for u in decision.requeue] == \
        [(1, 1, None, False), (2, 0, None, False)]
    assert decision.charge is None and not decision.warning
    assert after_death("idle", [], not_theirs=False, unknown=False, suspects=2).requeue == ()


def test_cut_and_halves_keep_every_record_once_in_order():
    whole = unit(5, 10, 7, attempts=2)
    first, rest = cut(whole, 3)
    assert first.ids.tolist() == [10, 11, 12] and rest.records == ["r13", "r14", "r15", "r16"]
    assert first.attempts == rest.attempts == 2
    a, b = halves(whole)
    assert (len(a), len(b)) == (4, 3)
