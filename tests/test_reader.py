"""The reader on its own: workunits of the sizes asked for, taken across slices or from
cost-sorted windows, a queue bounded in records that follows what is taken, its error raised in
the scheduler's thread, and a prompt stop."""
import threading
import time

import numpy as np
import pytest

from helpers.engine.dispatch.reader import Reader

pytestmark = pytest.mark.timeout(60)  # reached only on deadlock


def slices(sizes, start=0):
    """(ids, records) slices of the given sizes; record i is the text 'r<i>'."""
    for size in sizes:
        ids = np.arange(start, start + size, dtype=np.int64)
        yield ids, [f"r{i}" for i in ids.tolist()]
        start += size


def gated(gate, slices, size):
    """``slices`` slices of ``size`` records, each once ``gate`` is released, and the end once
    it is released again."""
    for start in range(0, slices * size, size):
        gate.acquire()
        yield np.arange(start, start + size, dtype=np.int64), ["r"] * size
    gate.acquire()


def queued(reader, records):
    """Wait until the reader has queued ``records`` in all."""
    deadline = time.monotonic() + 5
    while reader.records_put < records and time.monotonic() < deadline:
        time.sleep(0.001)
    assert reader.records_put == records


def waited(reader, n):
    """A workunit of ``n`` records, once the reader has queued them."""
    deadline = time.monotonic() + 5
    while (unit := reader.take(n)) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    return unit


def drain(reader, n=4):
    units = []
    while not reader.exhausted():
        unit = reader.take(n)
        if unit is None:
            time.sleep(0.001)
        else:
            units.append(unit)
    return units


def test_workunits_are_taken_across_slices_in_order_and_only_the_last_is_short():
    woken = []
    reader = Reader(slices([5, 1, 7, 4]), depth=2, size=4, wake=lambda: woken.append(1))
    reader.start()
    units = drain(reader)
    reader.stop()
    assert [len(u) for u in units] == [4, 4, 4, 4, 1]
    assert np.concatenate([u.ids for u in units]).tolist() == list(range(17))
    assert all(u.records == [f"r{i}" for i in u.ids.tolist()] for u in units)
    assert {u.index for u in units} == {0}  # (numbered by the taker, once: not here)
    assert woken  # (when: the next test)


def test_each_workunit_holds_as_many_records_as_the_scheduler_asks():
    """The size is the taker's alone: each take says it, and a workunit is cut short only at
    the source's end (not while the next slice is still being read)."""
    reader = Reader(slices([5, 1, 7, 3]), depth=4, size=4)
    reader.start()
    reader.join(5)  # (all queued: 16 records, four workunits of four)
    assert reader.done
    assert [len(reader.take(n)) for n in (3, 1, 9)] == [3, 1, 9]
    assert len(reader.take(9)) == 3 and reader.take(1) is None and reader.exhausted()
    gate = threading.Event()

    def held():
        yield np.arange(3, dtype=np.int64), ["a", "b", "c"]
        gate.wait(5)
        yield np.arange(3, 6, dtype=np.int64), ["d", "e", "f"]

    reader = Reader(held(), depth=2, size=2)  # (windows of two)
    reader.start()
    deadline = time.monotonic() + 5
    while reader.backlog(2) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert reader.take(4) is None  # two queued, more to come: not cut short
    assert reader.take(2).records == ["a", "b"]
    gate.set()
    reader.join(5)
    assert reader.take(4).records == ["c", "d", "e", "f"]  # across windows


def test_the_scheduler_is_woken_at_records_only_once_it_asked_and_a_look_changes_nothing():
    """A wake-up per workunit turned the scheduler's loop once per workunit for nothing when
    it was busy with results anyway: the reader wakes it at the next records only after it
    asked (``wake_on_more``: its dispatch left a worker short), at once if records came while it
    looked, and always at the end. Taking, or asking what is queued, asks nothing (issue 60:
    the looks used to ask as a side effect)."""
    gate, woken = threading.Semaphore(0), []

    def put(slices):  # one more slice through the gate, and wait until it is queued
        gate.release()
        queued(reader, 4 * slices)

    def woken_now(n):  # (the reader wakes after it queued: a moment later)
        deadline = time.monotonic() + 5
        while len(woken) < n and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # (and a wake-up too many would have come by now)
        return len(woken) == n

    reader = Reader(gated(gate, 4, 4), depth=8, size=4, wake=lambda: woken.append(1))
    reader.start()
    put(1)
    assert woken_now(1)  # nothing taken yet: the scheduler may be waiting for it
    mark = reader.records_put
    assert reader.take(4) is not None and reader.take(4) is None
    assert reader.backlog(4) == 1 and reader.remaining() is None
    put(2)
    assert woken_now(1)  # it looked, found nothing, asked nothing: not woken
    reader.wake_on_more(mark)
    assert woken_now(2)  # asked after records came since its look: woken at once
    mark = reader.records_put
    reader.wake_on_more(mark)
    assert woken_now(2)  # asked, nothing new since: waits for the next records
    put(3)
    assert woken_now(3)
    put(4)
    assert woken_now(3)  # asked once, woken once
    gate.release()
    reader.join(5)
    assert reader.done and len(woken) == 4  # the end


def test_the_queue_s_bound_follows_what_the_taker_expects_and_never_what_it_took():
    """The taker says the largest workunit it will take (``expect``); a take never moves the
    bound, so a take of more than the reader was told of waits (None) rather than growing
    the queue behind the taker's back."""
    reader = Reader(slices([100] * 20), depth=2, size=50)
    assert reader.bound == 100
    assert reader.take(300) is None and reader.bound == 100
    reader.expect(30)
    assert reader.bound == 100  # (smaller than what it holds room for: nothing changes)
    reader.expect(150)
    assert reader.bound == 300
    reader.start()
    assert len(waited(reader, 150)) == 150
    reader.stop()


def test_a_workunit_is_a_view_of_its_slice_not_a_copy_of_the_rest():
    """Cutting one slice of 65,536 ids into workunits of 16 copied the rest of the slice for
    each workunit (the reader's work grew with the slice); every workunit's ids are now a view of
    one array, and so are a sorted window's."""
    ids = np.arange(65536, dtype=np.int64)
    for window, cost in ((0, None), (65536, len)):
        reader = Reader(iter([(ids, ["r"] * len(ids))]), depth=5000, size=16, window=window,
                        cost=cost)
        reader.start()
        reader.join(10)
        units = drain(reader, 16)
        assert len(units) == 4096 and len({id(u.ids.base) for u in units}) == 1
        assert np.concatenate([u.ids for u in units]).tolist() == ids.tolist()


class Opener:
    """What a source gives its workers to read records by id: picklable, equal for one source."""

    def __eq__(self, other):
        return isinstance(other, Opener)

    def read(self, ids):
        return [f"r{i}" for i in ids.tolist()]


def test_rows_a_worker_reads_are_cut_like_records_and_never_weighed():
    """A source's Rows (ids and a way for the worker to open the source) go through the reader
    as records do: joined across slices, cut into workunits, each workunit's Rows its own ids;
    a cost function is not called (the driver has no record to weigh)."""
    import pickle

    from helpers.engine.contract.protocol import Rows

    pieces = [(ids, Rows(Opener(), ids)) for ids, _ in slices([5, 1, 7, 3])]
    reader = Reader(iter(pieces), depth=2, size=4, window=8, cost=lambda record: 1 / 0)
    reader.start()
    units = drain(reader)
    reader.stop()
    assert [len(u) for u in units] == [4, 4, 4, 4] and reader.error is None
    for unit in units:
        rows = pickle.loads(pickle.dumps(unit.records))  # as sent to a worker
        assert rows.ids.tolist() == unit.ids.tolist()
        assert rows.read() == [f"r{i}" for i in unit.ids.tolist()]
    first, rest = units[0].records[:1], units[0].records[1:]
    assert (first + rest).ids.tolist() == units[0].ids.tolist()
    with pytest.raises(TypeError, match="a worker reads the records"):
        units[0].records[0]


def test_with_a_cost_each_window_is_ordered_by_it_before_cutting():
    lengths = [9, 1, 8, 2, 7, 3, 6, 4]  # record i costs lengths[i]
    pairs = (np.arange(8, dtype=np.int64), ["x" * n for n in lengths])
    reader = Reader([pairs], depth=8, size=2, window=4, cost=len)
    reader.start()
    units = drain(reader, 2)
    # windows of 4 records, each sorted by cost: (9 1 8 2) -> 1 2 8 9; (7 3 6 4) -> 3 4 6 7
    assert [[len(r) for r in u.records] for u in units] == [[1, 2], [8, 9], [3, 4], [6, 7]]
    assert [u.ids.tolist() for u in units] == [[1, 3], [2, 0], [5, 7], [6, 4]]


def test_a_record_the_cost_function_fails_on_sorts_first_and_is_still_delivered():
    pairs = (np.arange(3, dtype=np.int64), ["bbb", None, "a"])
    reader = Reader([pairs], depth=1, size=3, window=3, cost=len)
    reader.start()
    [unit] = drain(reader)
    assert unit.records == [None, "a", "bbb"] and unit.ids.tolist() == [1, 2, 0]


def test_the_queue_is_bounded_and_stop_ends_a_blocked_reader():
    reader = Reader(slices([10] * 100), depth=3, size=10)
    reader.start()
    time.sleep(0.3)
    assert reader.records_put == 30 and reader.backlog(10) == 4  # three queued, more to come
    started = time.monotonic()
    reader.stop()
    assert not reader.is_alive() and time.monotonic() - started < 2  # POLL_SECONDS, not forever
    assert reader.blocked_s > 0.2 and not reader.done


def test_the_bound_follows_the_largest_workunit_expected_and_what_was_taken_lately():
    """``depth`` workunits of the largest size the taker expects (auto sizes grow), or the
    records taken in the last ``ahead_s`` if more (grown messages, workers added); a put waiting
    on the full queue goes on at once, not after its poll; with ``ahead_s`` 0 (a queue_depth the
    user set) only the first."""
    reader = Reader(slices([10] * 1000), depth=3, size=10, ahead_s=60)
    reader.start()
    time.sleep(0.2)
    assert reader.records_put == 30 and reader.bound == 30
    assert len(reader.take(5)) == 5
    time.sleep(0.1)
    assert reader.records_put == 40  # (room for a slice again)
    reader.expect(40)
    assert reader.take(40) is None and reader.bound == 120  # three of 40, said once
    time.sleep(0.1)  # (well under the put's poll, POLL_SECONDS)
    assert reader.records_put == 130
    for _ in range(20):
        assert len(waited(reader, 10)) == 10
    assert reader.bound == 205  # taken within a minute: 5 + 200
    time.sleep(0.1)
    assert reader.records_put >= 205 + 205
    reader.stop()
    capped = Reader(slices([10] * 1000), depth=3, size=10, ahead_s=0)
    capped.start()
    time.sleep(0.1)
    for _ in range(20):
        assert len(waited(capped, 10)) == 10
    assert capped.bound == 30
    capped.stop()


def test_an_error_in_the_source_is_raised_by_exhausted_in_the_caller_s_thread():
    def broken():
        yield from slices([4])
        raise OSError("input.h5: truncated batch 1")

    woken = threading.Event()
    reader = Reader(broken(), depth=4, size=4, wake=woken.set)
    reader.start()
    reader.join(5)
    assert woken.is_set()
    assert reader.take(4) is not None  # what was read before the error is still there
    with pytest.raises(OSError, match="truncated batch 1"):
        reader.exhausted()


def test_the_reader_pulls_from_the_source_no_further_than_the_queue_allows():
    from helpers.engine.contract.id_ranges import IdRanges
    from helpers.engine.inputs.sources import READ_SLICE, read_slices

    pulled = 0

    def endless():
        nonlocal pulled
        for i in range(10**9):
            pulled += 1
            yield i, "text"

    reader = Reader(read_slices(endless(), IdRanges()), depth=2, size=10)
    reader.start()
    time.sleep(0.5)
    reader.stop()
    assert not reader.is_alive()
    assert pulled <= 2 * READ_SLICE  # the slice queued, and the one read ahead at most


def test_a_feed_past_its_stop_time_gives_no_more_and_says_it_was_cut():
    """JobSettings.stop_at (the tuner's time-boxed trials): once it has passed, no workunit is
    given out, the feed counts as exhausted (the job ends with what is in flight), and
    ``cut`` says the source was not done."""
    import time

    ids = np.arange(100, dtype=np.int64)
    reader = Reader([(ids, list(range(100)))], depth=2, size=10, stop_at=time.monotonic() + 60)
    reader.start()
    deadline = time.monotonic() + 5
    while (first := reader.take(10)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first is not None and not reader.cut
    reader._stop_at = time.monotonic() - 1  # (its time has come)
    assert reader.take(10) is None and reader.exhausted() and reader.cut
    assert reader.remaining() == 0 and reader.backlog(10) == 0
    reader.stop()
    done = Reader([(ids, list(range(100)))], depth=20, size=10, stop_at=time.monotonic() + 60)
    done.start()
    done.join(5)
    while done.take(10) is not None:
        pass
    done._stop_at = time.monotonic() - 1  # (past, but nothing was left: not cut)
    assert done.exhausted() and not done.cut
    done.stop()
