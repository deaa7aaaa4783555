"""Result tables and their provenance sidecars."""
import json
import subprocess

import pandas as pd
import pytest

from helpers.study.paths import ROOT
from helpers.study.results import load_sidecar, load_table, read_table, resolve, save_table


def test_a_table_round_trips_with_its_sidecar(tmp_path):
    frame = pd.DataFrame({"workers": [1, 2], "replicate": [0, 0], "records_per_s": [10.5, 19.25]})
    path = save_table(frame, "demo", tmp_path / "r", "01_demo", {"records": 300})
    assert path == tmp_path / "r" / "demo.csv"
    pd.testing.assert_frame_equal(load_table("demo", tmp_path / "r"), frame)
    sidecar = load_sidecar("demo", tmp_path / "r")
    assert sidecar["parameters"] == {"records": 300} and sidecar["notebook"] == "01_demo"
    assert sidecar["columns"] == ["workers", "replicate", "records_per_s"] and sidecar["rows"] == 2
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode == 0:  # a checkout (as CI's clone is): the commit itself, maybe dirty
        assert sidecar["commit"].removesuffix("-dirty") == head.stdout.strip()
    else:
        assert sidecar["commit"] == "unknown"
    assert {"cpu", "cores", "memory_gib", "gpus"} <= set(sidecar["machine"])
    assert sidecar["packages"]["python"] and "torch" in sidecar["packages"]
    json.dumps(sidecar)


def test_a_table_written_before_mib_reads_with_mib_columns(tmp_path):
    """Tables written before 2026-11-28 name their MiB columns ``*_mb``: read back, they are
    ``*_mib`` like today's, other columns as they were."""
    (tmp_path / "old.csv").write_text("run,parent_rss_mb,tree_rss_mb,wall_s\nfull,512,900,3\n")
    frame = load_table("old", tmp_path)
    assert list(frame.columns) == ["run", "parent_rss_mib", "tree_rss_mib", "wall_s"]
    assert frame.parent_rss_mib.tolist() == [512]
    assert list(read_table(tmp_path / "old.csv").columns) == list(frame.columns)


def test_an_empty_table_is_refused(tmp_path):
    with pytest.raises(ValueError, match="table 'none' is empty"):
        save_table(pd.DataFrame(), "none", tmp_path, "nb", {})


def test_a_missing_table_says_which_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the notebook that writes 'absent'"):
        load_table("absent", tmp_path)


def test_relative_folders_are_relative_to_the_checkout(tmp_path):
    from helpers.study.paths import ROOT

    assert resolve("data/results/cpu") == ROOT / "data" / "results" / "cpu"
    assert resolve(tmp_path) == tmp_path
