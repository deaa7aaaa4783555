"""Stats hold nothing per record: running totals and a bounded timeline."""
from helpers.engine.stats import Tally, Timeline, WorkunitSpan


def test_a_timeline_keeps_every_workunit_until_its_limit():
    timeline = Timeline(limit=100)
    for n in range(50):
        timeline.add(WorkunitSpan(n % 2, "cpu", n, 10, n * 1.0, n + 0.5))
    assert len(timeline.spans) == 50 and {s.workunits for s in timeline.spans} == {1}


def test_a_long_timeline_stays_bounded_and_keeps_its_shape():
    timeline = Timeline(limit=100)
    workers = 3
    for n in range(200_000):
        timeline.add(WorkunitSpan(n % workers, "cpu", n, 10, n * 1.0, n + 0.5,
                                  phases={"forward": 0.25, "tokenize": 0.125},
                                  counts={"tokens_computed": 30, "tokens_needed": 20}))
    spans = timeline.spans
    assert len(spans) <= 100 + workers
    assert sum(s.records for s in spans) == 2_000_000  # nothing dropped, only merged
    assert sum(s.phases["forward"] for s in spans) == 50_000  # the phases summed as they merge
    assert sum(s.phases["tokenize"] for s in spans) == 25_000
    assert sum(s.counts["tokens_needed"] for s in spans) == 4_000_000  # counts too
    assert {s.padding for s in spans} == {1.5}
    assert sum(s.workunits for s in spans) == 200_000
    for worker in range(workers):
        mine = sorted((s for s in spans if s.worker == worker), key=lambda s: s.start_s)
        assert mine[0].start_s == worker and mine[-1].end_s >= 199_990  # first to last
        assert all(a.end_s <= b.start_s for a, b in zip(mine, mine[1:]))  # in order, no overlap


def test_a_tally_keeps_totals_and_peaks():
    tally = Tally()
    tally.add(10, 0.5, 100.0, None, {"forward": 0.25})
    tally.add(5, 0.25, 80.0, 300.0, {"forward": 0.125, "tokenize": 0.0625})
    tally.add(5, 0.25, 80.0, 300.0)  # a workload that reports no phases
    tally.add(1, 0.0, 80.0, None, None, {"tokens_computed": 12, "tokens_needed": 9})
    assert (tally.records, tally.workunits, tally.busy_seconds) == (21, 4, 1.0)
    assert tally.phases == {"forward": 0.375, "tokenize": 0.0625}
    assert tally.counts == {"tokens_computed": 12, "tokens_needed": 9}
    assert tally.peak_rss_mb == 100.0 and tally.peak_gpu_mb == 300.0
