"""The taker alone shapes a workunit: its size (fixed, measured, capped), the take from the feed,
joins and cuts, the one numbering, and the workunits waiting to go again."""
import numpy as np

from helpers.engine.contract.messages import Workunit
from helpers.engine.dispatch.taker import Taker
from helpers.engine.measure.sizing import FIRST_SIZE, Sizing


class Windows:
    """A feed of windows of ``size`` records (a take never crosses one), unnumbered as the
    reader's are."""

    def __init__(self, records, size):
        self.left = [list(range(n, min(n + size, records))) for n in range(0, records, size)]

    records_put = 0

    def expect(self, n):
        self.expected = max(n, getattr(self, "expected", 0))

    def wake_on_more(self, mark):
        pass

    def take(self, n):
        assert n <= self.expected, "a take larger than the taker said it expects"
        if not self.left:
            return None
        window = self.left[0]
        taken, self.left[0] = window[:n], window[n:]
        if not self.left[0]:
            self.left.pop(0)
        return Workunit(0, np.array(taken, np.int64), [f"r{i}" for i in taken])

    def backlog(self, n):
        return sum(-(-len(w) // n) for w in self.left)

    def remaining(self):
        return sum(map(len, self.left))


def test_every_workunit_it_gives_out_has_a_number_of_its_own():
    taker, feed = Taker(), Windows(100, 10)
    taker.new_job(size=4)
    taken = [taker.next_for(0, [0], feed) for _ in range(6)]
    assert [len(u) for u in taken] == [4, 4, 2, 4, 4, 2]  # fixed sizes: a window's end stays short
    assert len({u.index for u in taken}) == 6


def test_a_fixed_size_is_cut_only_by_its_worker_s_cap_and_the_rest_waits_first():
    taker, feed = Taker(), Windows(100, 50)
    taker.new_job(size=20)
    assert taker.cap(1) is None
    taker.cap(1, 8)  # out of memory once: at most 8 records from now on
    assert taker.cap(1) == 8
    assert len(taker.next_for(1, [0, 1], feed)) == 8  # (its size, capped, asked of the feed)
    assert len(taker.next_for(0, [0, 1], feed)) == 20
    taker.requeue([Workunit(0, np.arange(500, 530), ["x"] * 30, attempts=1)])
    first = taker.next_for(1, [0, 1], feed)
    assert (int(first.ids[0]), len(first)) == (500, 8)
    assert [len(u) for u in taker.waiting] == [22]  # the rest of the retried one, first in line


def test_requeued_pieces_go_first_in_their_order_and_renumbered_only_when_new():
    taker = Taker()
    a, b = (taker.number(Workunit(0, np.arange(n, n + 2), ["r"] * 2)) for n in (0, 2))
    taker.requeue([a, b])
    assert [u.index for u in taker.waiting] == [a.index, b.index]
    taker.requeue([a, b], renumber=True)
    fresh = list(taker.waiting)[:2]
    assert [int(u.ids[0]) for u in fresh] == [0, 2]
    assert {u.index for u in fresh}.isdisjoint({a.index, b.index})


def test_with_auto_sizes_a_window_s_short_end_is_joined_up_to_the_worker_s_size():
    sizing = Sizing(1.0)
    sizing.observe(0, 25, 1.0)  # 25 records a second: a target of 25
    taker, feed = Taker(), Windows(100, 10)
    taker.new_job(sizing)
    unit = taker.next_for(0, [0], feed)
    assert len(unit) == 25 and unit.ids.tolist() == list(range(25))  # three windows joined
    assert taker.auto and taker.first_size() == 25


def test_without_joins_each_window_s_end_goes_as_it_is(monkeypatch):
    """The switch the joins bench turns (helpers.bench.joins): off, a window's end is a
    workunit of its own."""
    from helpers.engine.dispatch import taker as module

    monkeypatch.setattr(module, "JOINS", False)
    sizing = Sizing(1.0)
    sizing.observe(0, 25, 1.0)
    taker, feed = Taker(), Windows(100, 10)
    taker.new_job(sizing)
    assert [len(taker.next_for(0, [0], feed)) for _ in range(3)] == [10, 10, 10]


def test_a_static_split_s_slices_wait_pinned_to_their_workers_and_go_whole():
    taker = Taker()
    taker.new_job()
    assert taker.first_size() == FIRST_SIZE and not taker.auto
    taker.deal(Workunit(0, np.arange(n, n + 50), ["r"] * 50, pinned=w)
               for w, n in enumerate((0, 50)))
    assert taker.next_for(1, [0, 1], Windows(0, 1)).ids[0] == 50  # its own slice, not the first
    assert len(taker.next_for(0, [0, 1], Windows(0, 1))) == 50
    assert taker.next_for(0, [0, 1], Windows(0, 1)) is None and not taker.waiting


def test_at_the_end_a_second_workunit_waits_only_while_each_ready_worker_has_one():
    taker, feed = Taker(), Windows(6, 3)
    taker.new_job(size=3)
    assert taker.enough_left(feed, [0, 1])  # two workunits of 3 for two workers
    assert not taker.enough_left(feed, [0, 1, 2])
    assert not taker.enough_left(feed, [0, 1], each=2)
