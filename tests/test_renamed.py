"""helpers.engine.contract.renamed: what an older gpufeed wrote, read under today's names."""
import numpy as np

from helpers.engine.contract.renamed import OLDER_NAMES, current_names, renamed


def test_an_older_run_s_record_reads_under_today_s_names_at_any_depth():
    older = {"wall_seconds": 2.0, "records": 3, "recovery": {"restart_seconds": [0.5]},
             "workers": [{"busy_seconds": 1.0, "peak_rss_mb": 512.0, "worker": 0}],
             "per_device": {"cpu": {"peak_gpu_mb": None, "records_per_s": 1.5}},
             "config": {"workunit_seconds": 1.0}}  # (a setting keeps its name)
    assert current_names(older) == {
        "wall_s": 2.0, "records": 3, "recovery": {"restart_s": [0.5]},
        "workers": [{"busy_s": 1.0, "peak_rss_mib": 512.0, "worker": 0}],
        "per_device": {"cpu": {"peak_gpu_mib": None, "records_per_s": 1.5}},
        "config": {"workunit_seconds": 1.0}}
    columns = current_names({"memory_mb": np.arange(3), "seconds": np.zeros(3)})
    assert sorted(columns) == ["memory_mib", "seconds"] and columns["memory_mib"].tolist() == \
        [0, 1, 2]


def test_only_the_top_level_is_renamed_for_a_fingerprint_and_today_s_names_are_kept():
    assert renamed({"text_field": "body", "outputs": {"memory_mb": "x"}, "size": 3}) == \
        {"text_column": "body", "outputs": {"memory_mb": "x"}, "size": 3}
    assert not set(OLDER_NAMES) & set(OLDER_NAMES.values())  # (no name means two things)
