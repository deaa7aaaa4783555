"""Each finished run keeps its record in its output: stats, timeline, telemetry; a resumed run
adds its own, merges, index rewrites and compaction carry them once each, and the output's
readers ignore them."""

import h5py
import numpy as np

import helpers.engine.outputs.checkpoint
from helpers.engine.outputs import run_log
from helpers.engine.outputs.checkpoint import compact
from helpers.engine.outputs.hdf5_sink import read_output
from helpers.engine.pipeline import run_pipeline
from helpers.workloads.synthetic import SyntheticWorkload

RECORDS = [(i, f"r{i}") for i in range(300)]


def test_a_run_records_its_stats_and_timeline_and_a_resume_adds_its_own(tmp_path):
    out = tmp_path / "out.h5"
    first = run_pipeline(RECORDS, SyntheticWorkload(0.0005), devices="cpu*2", workunit_size=25,
                         output=out, limit=100, progress=False)
    second = run_pipeline(RECORDS, SyntheticWorkload(0.0005), devices="cpu*2", workunit_size=25,
                          output=out, resume=True, progress=False)
    runs = run_log.read(out)
    assert [r.number for r in runs] == [0, 1]
    assert runs[0].stats["records"] == first.records == 100
    assert runs[1].stats["records"] == second.records == 200
    spans = runs[1].timeline
    assert spans["records"].sum() == 200 and (spans["end_s"] >= spans["start_s"]).all()
    assert set(spans["device"]) == {"cpu"} and set(spans["worker"]) <= {0, 1}
    assert len(runs[1].stats["workers"]) == 2
    data = read_output(out)  # the rows alone: the runs are not an output
    assert data["ids"].tolist() == list(range(300)) and "runs" not in data


def test_an_embedding_run_records_each_span_s_phases_and_counts(tmp_path):
    from helpers.workloads.embedding import EmbeddingWorkload

    out = tmp_path / "out.h5"
    run_pipeline([(i, f"text number {i} " * (1 + i % 7)) for i in range(200)],
                 EmbeddingWorkload(card="h100", card_cores=16), devices="cuda:0",
                 workunit_size=50, output=out, progress=False)
    (run,) = run_log.read(out)
    spans = run.timeline
    assert spans["count_tokens_needed"].sum() == run.stats["counts"]["tokens_needed"]
    assert (spans["count_card_busy_us"] > 0).all() and (spans["phase_tokenize"] > 0).all()


def test_compaction_carries_the_runs_and_an_output_without_them_reads_as_none(
        tmp_path, monkeypatch):
    # stays an index
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "MERGE_AT_END_BYTES", 0)
    out = tmp_path / "out.h5"
    run_pipeline(RECORDS, SyntheticWorkload(0.0), devices="cpu", workunit_size=50, output=out,
                 progress=False)
    with h5py.File(out) as f:
        assert f["ids"].is_virtual  # (an index of parts)
    compact(out)
    with h5py.File(out) as f:
        assert not f["ids"].is_virtual
    (run,) = run_log.read(out)
    assert run.stats["records"] == 300
    np.testing.assert_array_equal(read_output(out)["ids"], np.arange(300))
    with h5py.File(tmp_path / "old.h5", "w") as f:
        f["ids"] = np.arange(3)
    assert run_log.read(tmp_path / "old.h5") == []


def test_a_big_output_resumed_keeps_every_run_and_compaction_carries_them(tmp_path,
                                                                         monkeypatch):
    # stays an index
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "MERGE_AT_END_BYTES", 0)
    out = tmp_path / "out.h5"
    for options in ({"limit": 100}, {"resume": True, "limit": 200}, {"resume": True}):
        run_pipeline(RECORDS, SyntheticWorkload(0.0), devices="cpu", workunit_size=50,
                     output=out, progress=False, **options)
        with h5py.File(out) as f:
            assert f["ids"].is_virtual
    assert [r.stats["records"] for r in run_log.read(out)] == [100, 100, 100]
    compact(out)
    assert [r.stats["records"] for r in run_log.read(out)] == [100, 100, 100]
    np.testing.assert_array_equal(read_output(out)["ids"], np.arange(300))


def test_a_small_output_taken_over_by_a_resume_that_grows_it_big_keeps_its_first_run(
        tmp_path, monkeypatch):
    out = tmp_path / "out.h5"
    run_pipeline(RECORDS, SyntheticWorkload(0.0), devices="cpu", workunit_size=50, output=out,
                 limit=100, progress=False)  # one file
    monkeypatch.setattr(helpers.engine.outputs.checkpoint, "MERGE_AT_END_BYTES", 0)
    run_pipeline(RECORDS, SyntheticWorkload(0.0), devices="cpu", workunit_size=50, output=out,
                 limit=200, resume=True, progress=False)  # the file a part, the output an index
    run_pipeline(RECORDS, SyntheticWorkload(0.0), devices="cpu", workunit_size=50, output=out,
                 resume=True, progress=False)  # that index resumed: its runs, once each
    assert [r.stats["records"] for r in run_log.read(out)] == [100, 100, 100]


class Span:
    def __init__(self, records):
        self.worker, self.device, self.records, self.workunits = 0, "cpu", records, 1
        self.start_s, self.end_s, self.phases, self.counts = 0.0, 1.0, None, None


class Stats:
    def __init__(self, records, fail=False):
        self.timeline, self.telemetry, self.fail = [Span(records)], [], fail

    def to_dict(self):
        if self.fail:
            raise TypeError("not serialisable")
        return {"records": 1}


def test_a_record_that_cannot_be_written_leaves_no_group_and_no_failed_run(tmp_path, caplog):
    with h5py.File(tmp_path / "out.h5", "w") as f:
        run_log.write(f, Stats(1))
        run_log.write(f, Stats(1, fail=True))  # fails before the group is made
        run_log.write(f, Stats({"a": "dict"}))  # fails half-way: its group goes again
        run_log.write(f, Stats(2))
        assert sorted(f["runs"]) == ["0", "1"]
    assert caplog.text.count("could not be added") == 2
    assert len(run_log.read(tmp_path / "out.h5")) == 2


def test_a_run_an_older_gpufeed_recorded_reads_under_today_s_names(tmp_path):
    """Its stats said wall_seconds, busy_seconds, peak_rss_mb; its telemetry memory_mb: read
    back, and drawn, under today's names (helpers.engine.contract.renamed)."""
    import json

    from helpers.engine.contract.renamed import OLDER_NAMES
    from helpers.study.run_report import draw

    out = tmp_path / "out.h5"
    run_pipeline(RECORDS, SyntheticWorkload(0.0005), devices="cpu*2", workunit_size=25,
                 output=out, progress=False)
    older = {now: before for before, now in OLDER_NAMES.items()}
    with h5py.File(out, "r+") as f:  # written as an older gpufeed wrote it
        group = f[run_log.GROUP]["0"]
        text = group.attrs["stats"]
        for now, before in older.items():
            text = text.replace(f'"{now}"', f'"{before}"')
        group.attrs["stats"] = text
        assert "wall_seconds" in json.loads(text) and "wall_s" not in json.loads(text)
        telemetry = group["telemetry"]
        if "memory_mib" in telemetry:
            telemetry.move("memory_mib", "memory_mb")
    (run,) = run_log.read(out)
    assert run.stats["wall_s"] > 0 and run.stats["records_per_s"] > 0
    assert {"busy_s", "wait_s", "peak_rss_mib"} <= set(run.stats["workers"][0])
    assert "memory_mb" not in run.telemetry
    assert draw(out, tmp_path / "run.png").is_file()
