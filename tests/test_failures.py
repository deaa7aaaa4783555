"""The failures' side of the scheduler, alone: what a failed workunit, a death or a start that goes
wrong does to the slot, the taker's line and the tally (the whole runs are in test_scheduler.py)."""
import numpy as np
import pytest

from helpers.engine.contract.messages import Died, Failed, WorkerInfo, Workunit
from helpers.engine.contract.settings import PoolSettings
from helpers.engine.dispatch.failures import Failures, PipelineError
from helpers.engine.dispatch.slots import Kill, Slot, State
from helpers.engine.dispatch.taker import Taker
from helpers.engine.workers.backends import IMPORTED_MAIN_EXIT


class Backend:
    recyclable, answers_together = True, False

    def __init__(self):
        self.killed = []

    def kill(self, index):
        self.killed.append(index)


def failures(slots, **settings):
    spawned = []
    taker = Taker()
    done = Failures(Backend(), PoolSettings(**settings), taker, spawned.append,
                    lambda: [s for s in slots if s.state is not State.RETIRED])
    return done, taker, spawned


def ready(index=0):
    slot = Slot(WorkerInfo(index, "cpu", 1), state=State.READY)
    return slot


def holding(slot, taker, records):
    unit = taker.number(Workunit(0, np.arange(records), [f"r{i}" for i in range(records)]))
    slot.in_flight.append(unit)
    slot.messages.append({unit.index})
    return unit


def failed(slot, unit, error_type="ValueError"):
    return Failed(slot.info.index, "cpu", unit.index, unit.describe(), error_type, "bad", "tb")


def test_out_of_memory_halves_the_workunit_and_caps_its_worker_at_the_half():
    slot = ready()
    done, taker, _ = failures([slot])
    unit = holding(slot, taker, 10)
    assert done.failed(slot, failed(slot, unit, "OutOfMemoryError")) == []
    assert [len(u) for u in taker.waiting] == [5, 5] and taker.cap(0) == 5
    assert done.recovery.oom_backoffs == 1 and slot.failures_in_a_row == 0  # (not the worker's)


def test_a_second_failure_in_a_row_replaces_the_worker_and_charges_its_workunit_nothing():
    slot = ready()
    done, taker, _ = failures([slot], retries=2)
    first = holding(slot, taker, 4)
    done.failed(slot, failed(slot, first))
    assert [u.attempts for u in taker.waiting] == [1] and done.recovery.retries == 1
    taker.waiting.clear()
    second = holding(slot, taker, 4)
    assert done.failed(slot, failed(slot, second)) == []
    assert [u.attempts for u in taker.waiting] == [0]  # requeued as it was
    assert slot.killed is Kill.RECYCLE and done.backend.killed == [0]
    assert done.recovery.recycles == 1


def test_a_death_charges_the_running_workunit_requeues_the_rest_and_replaces_the_worker():
    slot = ready()
    done, taker, spawned = failures([slot], retries=1)
    running, behind = holding(slot, taker, 3), holding(slot, taker, 3)
    assert done.died(slot, Died(0, -9)) == []
    assert [(u.index, u.attempts) for u in taker.waiting] == [(running.index, 1),
                                                              (behind.index, 0)]
    assert not slot.in_flight and spawned == [slot.info] and slot.restarts == 1
    assert (done.recovery.deaths, done.recovery.restarts) == (1, 1)


def test_with_no_restart_left_a_dead_slot_is_retired_and_the_last_ends_the_run():
    one, two = ready(0), ready(1)
    done, _, spawned = failures([one, two], max_restarts=0)
    done.died(one, Died(0, 1))
    assert one.state is State.RETIRED and spawned == []
    with pytest.raises(PipelineError, match="every worker is gone: the last, worker 1 on cpu"):
        done.died(two, Died(1, 1))


def test_what_ends_a_start_is_named():
    slot = Slot(WorkerInfo(0, "cpu", 1))  # loading
    done, _, _ = failures([slot], max_restarts=0)
    with pytest.raises(PipelineError, match="worker 7 on cpu failed in loading the model: "
                                            "OSError: gone"):
        done.while_starting(slot, Failed(7, "cpu", None, "loading the model", "OSError", "gone",
                                         "tb"))
    with pytest.raises(PipelineError, match="worker 0 on cpu could not start"):
        done.while_starting(slot, Died(0, IMPORTED_MAIN_EXIT))
    with pytest.raises(PipelineError, match="died unexpectedly .* while starting or loading"):
        done.while_starting(slot, Died(0, -9))
    slot.restarts = -1  # (a restart left: a replacement starts instead)
    done.while_starting(slot, Died(0, -9))
