"""The notebook suite: committed clean, defaults equal cpu.yaml, runs headless, rejects bad input."""
import ast
import json
import re
import shutil
import subprocess

import nbformat
import papermill
import pytest
from papermill.exceptions import PapermillExecutionError

from helpers.study.notebooks import declared, run_notebooks, suite
from helpers.study.parameters import load_parameters, parameter_sets
from helpers.study.paths import ROOT
from helpers.study.results import read_table

pytestmark = pytest.mark.timeout(600)  # reached only on deadlock: the smoke suite takes ~1.5 min

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLES = {  # table -> columns it must have
    "workers_per_device": {"strategy", "workers", "replicate", "records", "wall_s",
                           "records_per_s", "efficiency", "spinup_s", "devices"},
    "card_feeding": {"workers", "tokenize_threads", "tokenize_processes", "tokenizing",
                     "replicate", "records_per_s", "tokens_per_s",
                     "card_busy_share", "cpu_s_per_m_tokens", "tokenize_cpu_s", "driver_cpu_s",
                     "card", "card_cores", "cores"},
    "one_worker_per_device": {"round", "workload", "records_per_s", "efficiency", "wall_s"},
    "one_worker_per_device_timeline": {"round", "worker", "device", "start_s", "end_s"},
    "workunit_sizes": {"workunit_size", "replicate", "records_per_s", "wall_s", "devices"},
    "layouts_heterogeneous": {"strategy", "replicate", "records_per_s", "efficiency"},
    "layouts_heterogeneous_timeline": {"strategy", "worker", "start_s", "end_s"},
    "threads_vs_processes": {"backend", "workers", "replicate", "records_per_s", "peak_rss_mib",
                             "peak_gpu_mib", "wall_s"},
    "best_configurations": {"experiment", "devices", "configuration", "records_per_s",
                            "estimated_days"},
    "binning_layouts": {"strategy", "workers", "replicate", "records_per_s", "wall_s", "device",
                        "speedup"},
    "tune_trials": {"trial", "phase", "batch_size", "workers_per_device", "workunit_size",
                    "records_per_s", "configuration"},
    "self_tuning": {"job", "layout", "configuration", "replicate", "records_per_s", "wall_s",
                    "ideal_s", "makespan_vs_ideal", "finish_spread_s", "final_workers"},
    "self_tuning_timeline": {"worker", "device", "records", "start_s", "end_s"},
    "self_tuning_decisions": {"seconds", "device", "action", "workers", "rate_before",
                              "rate_after", "reason"},
    "tuned_vs_notebook3": {"configuration", "replicate", "records_per_s", "devices",
                           "workunit_size", "batch_size"},
    "scale_out_backends": {"backend", "replicate", "records_per_s", "spinup_s", "cluster_start_s",
                           "wall_s", "workers"},
    "driver_limit": {"backend", "replicate", "rows", "dim", "rows_per_s", "mb_per_s"},
    "scale_out_cluster": {"job", "nodes", "records_per_s", "deaths", "exactly_once"},
    "scale_out_cluster_timeline": {"job", "worker", "node", "start_s", "end_s"},
    "peers": {"system", "label", "family", "replicate", "records", "records_per_s", "spinup_s",
              "steady_s", "end_to_end_s", "peak_pss_mib", "rows_unique", "outcome"},
    "peers_faults": {"system", "label", "fault", "outcome", "killed_pid", "rows_written",
                     "rows_unique", "rows_lost", "rows_duplicated", "error", "end_to_end_s"},
    "binning_images": {"id", "path", "bin", "text_boxes", "text_area", "objects", "unique_classes",
                       "classes", "dispersion", "similarity", "caption", "ocr_s", "detector_s",
                       "error"},
}
FIGURES = ["01_workers_per_device/records_per_s-vs-workers", "01_workers_per_device/card_busy-vs-workers",
           "02_one_worker_per_device/timeline-real", "02_one_worker_per_device/timeline-synthetic",
           "03_queue_and_workunit_size/records_per_s-vs-workunit_size",
           "03_queue_and_workunit_size/timeline-static-vs-queue",
           "03_queue_and_workunit_size/records_per_s-vs-layout",
           "04_threads_vs_processes/throughput_and_memory-vs-workers",
           "05_summary/best-records_per_s-by-experiment",
           "06_binning/images_per_s-vs-workers", "06_binning/images-per-bin",
           "06_binning/seconds_per_image-by-model", "06_binning/gallery-by-bin",
           "07_autotune/tuner-trials", "07_autotune/records_per_s-sweep-vs-self-tuning",
           "07_autotune/timeline-self-tuning", "07_autotune/records_per_s-tuned-vs-notebook3",
           "07_autotune/timeline-tuned", "08_scale_out/records_per_s-by-backend",
           "08_scale_out/rows_per_s-driver-limit", "08_scale_out/timeline-by-node",
           "09_peers/peers-rate-time-memory", "09_peers/faults-rows"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The whole suite run once with smoke.yaml, writing into a temporary folder."""
    out = tmp_path_factory.mktemp("smoke")
    overrides = {"results_dir": str(out / "results"), "figures_dir": str(out / "figures")}
    executed = run_notebooks("smoke", executed_dir=out / "executed", overrides=overrides,
                             log=lambda *_: None)
    return out, executed


def test_there_are_nine_notebooks_in_order():
    assert [nb.stem[:2] for nb in suite()] == ["01", "02", "03", "04", "05", "06", "07", "08",
                                               "09"]


@pytest.mark.parametrize("notebook", suite(), ids=lambda p: p.stem)
def test_committed_without_outputs_and_parameters_cell_first(notebook):
    book = nbformat.read(notebook, as_version=4)
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    assert code[0].metadata.get("tags") == ["parameters"]
    assert sum("parameters" in cell.metadata.get("tags", []) for cell in code) == 1
    assert not any(line.lstrip().startswith(("def ", "class ")) for cell in code
                   for line in cell.source.splitlines()), "thin notebooks: no def or class"


@pytest.mark.parametrize("notebook", suite(), ids=lambda p: p.stem)
def test_parameters_are_typed_commented_literals_equal_to_cpu_yaml(notebook):
    found = papermill.inspect_notebook(str(notebook))
    source = nbformat.read(notebook, as_version=4).cells[1].source
    assert len(found) == len([line for line in source.splitlines() if line.strip()])
    defaults = {}
    for name, info in found.items():
        assert info["inferred_type_name"] != "None", f"{name}: no type annotation"
        assert info["help"], f"{name}: no comment"
        defaults[name] = ast.literal_eval(info["default"])  # a literal, nothing derived
    common = set(load_parameters("cpu", "common"))
    assert declared(notebook, load_parameters("cpu", notebook.stem), common) == defaults


@pytest.mark.parametrize("params", parameter_sets())
def test_every_set_names_only_declared_parameters(params):
    assert set(parameter_sets()) >= {"smoke", "cpu", "gpu"}
    common = set(load_parameters(params, "common"))
    for notebook in suite():
        declared(notebook, load_parameters(params, notebook.stem), common)


@pytest.mark.slow
def test_smoke_run_saves_every_table_with_its_columns_and_sidecar(smoke):
    out, _ = smoke
    for table, columns in TABLES.items():
        header = (out / "results" / f"{table}.csv").read_text().splitlines()[0].split(",")
        assert columns <= set(header), f"{table}: missing {columns - set(header)}"
        sidecar = json.loads((out / "results" / f"{table}.json").read_text())
        assert {"commit", "machine", "packages", "parameters", "notebook"} <= set(sidecar)
        assert sidecar["machine"]["cores"] >= 1 and sidecar["packages"]["torch"] != "missing"
        if sidecar["notebook"] not in ("05_summary", "06_binning", "09_peers"):  # no workload
            assert sidecar["parameters"]["workload"] == "synthetic"  # the smoke set was injected


@pytest.mark.slow
def test_smoke_run_saves_every_figure_and_lists_it_with_a_finding(smoke):
    out, _ = smoke
    readme = (out / "figures" / "README.md").read_text()
    for name in FIGURES:
        png = (out / "figures" / name).with_suffix(".png")
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, f"{png}: not a real PNG"
        assert png.with_suffix(".svg").stat().st_size > 1000
        meta = json.loads(png.with_suffix(".json").read_text())
        assert meta["finding"] and meta["finding"] in readme and meta["machine"] in readme
        assert meta["note"] == "smoke run (synthetic workload, tiny samples): not a measurement"
        assert f"({name}.png)" in readme


@pytest.mark.slow
def test_smoke_peers_fault_table_has_a_row_per_system_and_gpufeed_keeps_every_row(smoke):
    import pandas as pd

    out, _ = smoke
    faults = pd.read_csv(out / "results" / "peers_faults.csv").set_index("system")
    assert list(faults.index) == load_parameters("smoke", "09_peers")["systems"]
    assert faults["killed_pid"].notna().all()  # each was killed in its steady state
    assert faults.loc["gpufeed_process", "outcome"] == "finished"
    assert faults.loc["gpufeed_process", ["rows_lost", "rows_duplicated"]].tolist() == [0, 0]
    assert faults.loc["bare", "outcome"] == "failed" and faults.loc["bare", "rows_lost"] == 64


@pytest.mark.slow
def test_smoke_run_keeps_executed_copies_apart(smoke):
    out, executed = smoke
    assert [p.parent for p in executed] == [out / "executed"] * len(suite())
    book = nbformat.read(executed[0], as_version=4)
    assert any(cell.get("outputs") for cell in book.cells if cell.cell_type == "code")


@pytest.mark.parametrize("notebook, bad, message", [
    ("03", {"devices": ["cpu", "gpu0"]}, "devices: unknown device 'gpu0'"),
    ("03", {"workunit_sizes": [10, 0]}, "workunit_sizes: expected an integer >= 1, got 0"),
    ("01", {"device": "tpu"}, "device: unknown device 'tpu'"),
    ("06", {"text_area_threshold": 1.5}, "text_area_threshold: expected a fraction in [0, 1]"),
    ("07", {"parallelism": 0}, "parallelism: expected an integer >= 1, got 0"),
    ("09", {"systems": ["bare", "dask"]}, "systems: expected a non-empty list drawn from"),
])
def test_a_bad_parameter_stops_the_notebook_with_a_message_naming_it(tmp_path, notebook, bad,
                                                                     message):
    overrides = {"results_dir": str(tmp_path / "r"), "figures_dir": str(tmp_path / "f"), **bad}
    with pytest.raises(PapermillExecutionError) as failure:
        run_notebooks("smoke", only=[notebook], executed_dir=tmp_path, overrides=overrides,
                      log=lambda *_: None)
    assert failure.value.ename == "ValueError" and message in failure.value.evalue
    assert "check_parameters(" in failure.value.source  # the first cell after the parameters
    assert failure.value.exec_count == 3  # parameters, injected parameters, then the check
    assert not (tmp_path / "r").exists()  # no worker ran, no table was written


def test_an_unknown_parameter_set_or_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no parameter set 'nosuch'"):
        run_notebooks("nosuch", executed_dir=tmp_path)
    with pytest.raises(ValueError, match="no parameter named replicate"):
        run_notebooks("smoke", only=["01"], executed_dir=tmp_path, overrides={"replicate": 3})


def committed_tables():
    return sorted((ROOT / "data" / "results").glob("*/*.csv"))


def made_at_a_clean_commit(table):
    """Whether ``table``'s sidecar names a commit of this history, not dirty, and the CSV's
    columns as they were written."""
    sidecar = json.loads(table.with_suffix(".json").read_text())
    commit = sidecar.get("commit", "")
    known = re.fullmatch(r"[0-9a-f]{40}", commit) is not None and subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", commit + "^{commit}"],
        capture_output=True).returncode == 0
    return known and sidecar["columns"] == table.read_text().splitlines()[0].split(",")


@pytest.mark.parametrize("table", committed_tables(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_committed_table_names_the_clean_commit_that_made_it(table):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert made_at_a_clean_commit(table), f"{table.stem}: its sidecar names no clean commit"


@pytest.mark.slow
def test_a_committed_table_has_every_column_its_code_writes_now(smoke):
    """The smoke run writes each notebook's tables with today's code: a committed table of the
    same name lacking one of its columns was made by older code."""
    out, _ = smoke
    compared = 0
    for made in sorted((out / "results").glob("*.csv")):
        committed = ROOT / "data" / "results" / "cpu" / made.name
        if not committed.is_file():
            continue
        now = set(made.read_text().splitlines()[0].split(","))
        then = set(read_table(committed).columns)  # (an older *_mb column read as *_mib)
        assert now <= then, f"{made.stem}: committed without {sorted(now - then)}"
        compared += 1
    assert compared >= 5, f"only {compared} of the smoke run's tables have a committed twin"


def test_make_results_regenerates_every_committed_benchmark_table():
    """Each committed table a benchmark wrote has a line in the Makefile's ``results`` target
    that runs that benchmark with the options its sidecar records."""
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\nresults:", 1)[1].split("\n\n", 1)[0]
    lines = [line.split("helpers.bench", 1)[1].split() for line in target.splitlines()
             if "helpers.bench" in line]
    benches = 0
    for sidecar in sorted((ROOT / "data" / "results" / "cpu").glob("*.json")):
        made = json.loads(sidecar.read_text())
        bench = made["notebook"].replace("python -m helpers.bench ", "helpers.bench.")
        if not bench.startswith("helpers.bench."):
            continue  # a notebook's table: `make run`
        benches += 1
        wanted = [bench.removeprefix("helpers.bench.")] + [
            f"--{key}={made['parameters'][key]}" for key in ("backend", "writes", "source")
            if key in made["parameters"] and made["parameters"][key] not in ("process", "driver",
                                                                               "cycled")]
        said = [[words[0]] + [f"{a}={b}" for a, b in zip(words[1::2], words[2::2])]
                for words in lines]
        assert any(set(wanted) <= set(line) and not {w for w in line if w.split("=")[0] in (
            "--backend", "--writes", "--source")} - set(wanted) for line in said), \
            f"{sidecar.stem}: no `make results` line runs {' '.join(wanted)}"
    assert benches >= 10, f"only {benches} benchmark tables found in data/results/cpu/"
