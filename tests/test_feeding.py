"""The study's card runs (helpers.study.feeding): which layouts notebook 01's card section runs."""
from helpers.study import feeding


def layouts_run(monkeypatch, cores, workers, threads):
    ran = []
    monkeypatch.setattr(feeding, "share_of_cores", lambda models: max(1, cores // models))
    monkeypatch.setattr(feeding, "card_layouts", lambda texts, layouts, *rest: ran.extend(
        (layout["workers"], layout["threads"]) for layout in layouts))
    feeding.card_feeding("h200", 16, workers, threads, 64, 1, ["a text"], 32, 16)
    return ran


def test_the_default_runs_beside_thread_counts_unless_it_is_one_of_them(monkeypatch):
    """None: a real card's worker's default, processes on its share of the cores; on a share of
    one core it is the worker's own thread, a run "1" already makes."""
    assert layouts_run(monkeypatch, 2, [1, 2, 3], [None, 1, 2]) == [
        (1, None), (1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]
    assert layouts_run(monkeypatch, 16, [1, 2], [None, 2]) == [
        (1, None), (1, 2), (2, None), (2, 2)]
    assert layouts_run(monkeypatch, 2, [2], [None, 2]) == [(2, None), (2, 2)]  # (no "1" run)


def test_the_default_tokenizing_is_a_real_card_s(monkeypatch):
    from helpers.workloads.embedding.loading import tokenizing_for

    monkeypatch.setattr(feeding, "share_of_cores", lambda models: max(1, 16 // models))
    assert feeding.default_tokenizing(2) == tokenizing_for(None, None, True, 8) == (1, 7)
    assert feeding.default_tokenizing(16) == (1, 0)


def test_a_run_that_named_no_tokenizing_is_the_default_s_line(monkeypatch):
    """card_layouts words each run's tokenizing as its workers loaded it, and a run that named
    none as "default" too: one line of the figure, whatever its count of processes."""
    said = iter([{"tokenize_threads": 1, "tokenize_processes": 7},
                 {"tokenize_threads": 2, "tokenize_processes": 0}])
    monkeypatch.setattr(feeding, "card_run", lambda texts, **layout: {
        "workers": layout["workers"], **next(said)})
    table = feeding.card_layouts(["a text"], [{"workers": 2, "threads": None},
                                              {"workers": 2, "threads": 2}],
                                 "h200", 16, 1, 1, 16)
    assert list(table["tokenizing"]) == ["7 processes", "2 threads"]
    assert list(table["tokenizing_asked"]) == ["default", "2 threads"]
    assert "default" not in table
    assert feeding.layout_name(table.iloc[0], ["tokenizing_asked"]) == "default tokenizing"
