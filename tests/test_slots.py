"""helpers.engine.dispatch.slots: a worker slot's state as the scheduler keeps it."""
from helpers.engine.contract.messages import WorkerInfo
from helpers.engine.dispatch.slots import Kill, Slot, State


def test_a_new_slot_is_loading_holds_nothing_and_shares_no_queue_with_another():
    one, two = Slot(WorkerInfo(0, "cpu", 1)), Slot(WorkerInfo(1, "cpu", 1))
    assert one.state is State.LOADING and not one.in_flight and not one.messages
    assert (one.restarts, one.killed, one.held, one.optional) == (0, None, 0, False)
    one.in_flight.append("workunit")
    one.messages.append([0])
    assert not two.in_flight and not two.messages  # each slot its own queues


def test_a_kill_s_value_is_the_error_type_its_workunit_is_charged():
    assert {kill.value for kill in Kill} == {"WorkunitTimeout", "LoadTimeout", "Recycled"}
    assert [state.value for state in State] == ["loading", "ready", "draining", "retired"]
