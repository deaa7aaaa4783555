"""What travels between the driver and its workers (helpers.engine.contract.messages): ids that
run one by one travel as their first id and count and arrive as the same array; any other ids
travel as they are; each message names what went wrong in the words the module defines."""
import pickle

import numpy as np
import pytest

from helpers.engine.contract.id_ranges import IdRun
from helpers.engine.contract.messages import Died, Failed, Result, WorkerInfo, Workunit


def workunit(ids, **fields):
    return Workunit(3, ids, [f"text {i}" for i in range(len(ids))], **fields)


@pytest.mark.parametrize("ids", [
    np.arange(5, 4101, dtype=np.int64),  # a source read by position
    np.array([2**63 - 3, 2**63 - 2, 2**63 - 1], dtype=np.int64),  # up to the last int64
    np.array([-2, -1, 0, 1], dtype=np.int64),
])
def test_ids_that_run_one_by_one_travel_as_first_and_count_and_arrive_whole(ids):
    unit = workunit(ids, attempts=1, pinned=0)
    wire = pickle.dumps(unit, protocol=5)
    assert len(wire) < len(pickle.dumps(unit.records, protocol=5)) + 400  # not 8 bytes an id
    assert isinstance(unit.__getstate__()["ids"], IdRun)
    back = pickle.loads(wire)
    assert back.ids.dtype == np.int64 and np.array_equal(back.ids, ids)
    assert (back.index, back.records, back.attempts, back.pinned) == \
        (3, unit.records, 1, 0)
    assert unit.ids is ids  # the sender's workunit is left as it was


@pytest.mark.parametrize("ids", [
    np.array([7, 9, 10], dtype=np.int64),  # a gap
    np.array([4, 3], dtype=np.int64),  # descending
    np.array([5], dtype=np.int64),  # one id: nothing to gain
    np.array([], dtype=np.int64),
    np.array([1, 2, 3], dtype=np.int32),  # not the engine's id type
])
def test_other_ids_travel_as_they_are(ids):
    unit = workunit(ids)
    assert unit.__getstate__()["ids"] is ids
    back = pickle.loads(pickle.dumps(unit, protocol=5))
    assert back.ids.dtype == ids.dtype and np.array_equal(back.ids, ids)


def test_a_result_s_ids_are_packed_the_same_way_and_its_arrays_travel_whole():
    ids = np.arange(100, 164, dtype=np.int64)
    result = Result(worker=1, workunit=3, ids=ids, arrays={"v": np.ones((64, 4), np.float32)},
                    rejected=[(7, "ValueError", "bad", 1.0)], started=10.0, ended=12.5)
    back = pickle.loads(pickle.dumps(result, protocol=5))
    assert isinstance(result.__getstate__()["ids"], IdRun)
    assert np.array_equal(back.ids, ids) and np.array_equal(back.arrays["v"], result.arrays["v"])
    assert back.rejected == result.rejected and back.compute_s == 2.5


def test_a_workunit_describes_itself_by_its_ids():
    assert workunit(np.arange(10, 14, dtype=np.int64)).describe() == \
        "workunit 3 (4 records, ids 10..13)"
    assert workunit(np.array([], dtype=np.int64)).describe() == "workunit 3 (0 records, no ids)"
    sorted_by_cost = workunit(np.array([3934, 530, 3820, 15710], dtype=np.int64))  # (a GPU log:
    assert sorted_by_cost.describe() == \
        "workunit 3 (4 records, ids between 530 and 15710)"  # "ids 3934..3820")
    assert len(workunit(np.arange(4, dtype=np.int64))) == 4


def test_a_worker_on_a_card_gets_its_cores_and_on_the_cpu_its_threads():
    assert WorkerInfo.on(0, "cpu", 6) == WorkerInfo(0, "cpu", 6, 0)
    assert WorkerInfo.on(0, "cpu", 6, card_cores=3) == WorkerInfo(0, "cpu", 6, 0)
    assert WorkerInfo.on(2, "cuda:1", 6, copy=1) == WorkerInfo(2, "cuda:1", 1, 1)
    assert WorkerInfo.on(2, "cuda:1", 6, copy=1, card_cores=3) == WorkerInfo(2, "cuda:1", 3, 1)
    assert str(WorkerInfo.on(2, "cuda:1", 6)) == "worker 2 on cuda:1"


def test_what_went_wrong_is_said_in_one_word_each():
    def failed(error_type):
        return Failed(0, "cuda:0", 3, "workunit 3", error_type, "m", "tb")

    assert failed("OutOfMemoryError").out_of_memory and failed("MemoryError").out_of_memory
    assert not failed("ValueError").out_of_memory
    assert Died(0, -9).how() == "killed by signal 9"
    assert Died(0, 3).how() == "exit code 3"
    assert Died(0, None).how() == "abandoned"
    assert Died(0, None, cause="node lost", lost=True).how() == "node lost"
