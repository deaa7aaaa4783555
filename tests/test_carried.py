"""A source's own columns on their way to the output (helpers.engine.inputs.carried): held by id
for the records in flight only, given back in the order asked, kept for a workunit sent again,
and an error row names its record's key."""
import threading

import numpy as np

from helpers.engine.contract.protocol import TEXT, OutputSpec
from helpers.engine.inputs.carried import Carried

KEY = "doc_id"  # the input's string id column: its own dataset
COLUMNS = {KEY: OutputSpec((), TEXT), "score": OutputSpec((), "float32")}


def held(n=6, first=0):
    carried = Carried(COLUMNS, KEY)
    ids = np.arange(first, first + n, dtype=np.int64)
    carried.add(ids, {KEY: np.array([f"doc-{i}" for i in ids], dtype=object),
                      "score": np.arange(n, dtype=np.float32) / 2})
    return carried, ids


def test_values_come_back_in_the_order_asked_with_their_column_s_dtype():
    carried, ids = held()
    out = carried.take(np.array([4, 0, 2], dtype=np.int64))
    assert out[KEY].tolist() == ["doc-4", "doc-0", "doc-2"] and out[KEY].dtype == object
    assert out["score"].tolist() == [2.0, 0.0, 1.0] and out["score"].dtype == np.float32
    assert len(carried) == 3  # taken ones are held no more


def test_peek_keeps_what_a_workunit_sent_again_will_need():
    carried, ids = held()
    first = carried.peek(ids[:3])
    again = carried.take(ids[:3])
    assert first[KEY].tolist() == again[KEY].tolist() and len(carried) == 3


def test_only_the_records_in_flight_are_held():
    carried = Carried(COLUMNS, KEY)
    for start in range(0, 100_000, 1000):  # a long input, a workunit at a time
        ids = np.arange(start, start + 1000, dtype=np.int64)
        carried.add(ids, {KEY: np.array(["k"] * 1000, dtype=object),
                          "score": np.zeros(1000, np.float32)})
        carried.take(ids)
        assert len(carried) == 0


def test_an_error_row_names_its_record_s_key_and_forgets_its_values():
    carried, ids = held()
    rows = carried.drop([(1, "ValueError", "empty text", 1.0), (5, "KeyError", "no field", 2.0)])
    assert rows == [(1, "ValueError", "empty text (key 'doc-1')", 1.0, -1, "doc-1"),
                    (5, "KeyError", "no field (key 'doc-5')", 2.0, -1, "doc-5")]  # (errors/key)
    assert len(carried) == 4
    assert carried.drop([(99, "ValueError", "never held", 3.0)]) == \
        [(99, "ValueError", "never held", 3.0)]  # no key known: the message as it was
    assert Carried(COLUMNS).drop([(0, "ValueError", "x", 1.0)]) == [(0, "ValueError", "x", 1.0)]


def test_without_columns_it_holds_nothing_and_is_false():
    carried = Carried()
    assert not carried and len(carried) == 0
    assert carried.take(np.array([1, 2], dtype=np.int64)) == {}
    assert carried.drop([(1, "E", "m", 0.0)]) == [(1, "E", "m", 0.0)]


def test_the_reader_adds_while_the_writer_takes():
    carried = Carried(COLUMNS, KEY)
    batches = [np.arange(s, s + 50, dtype=np.int64) for s in range(0, 5000, 50)]
    added = threading.Semaphore(0)

    def reader():
        for ids in batches:
            carried.add(ids, {KEY: np.array([str(i) for i in ids], dtype=object),
                              "score": ids.astype(np.float32)})
            added.release()

    thread = threading.Thread(target=reader)
    thread.start()
    for ids in batches:
        added.acquire()
        out = carried.take(ids)
        assert out[KEY].tolist() == [str(i) for i in ids.tolist()]
    thread.join()
    assert len(carried) == 0
