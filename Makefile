# Two commands do all the set-up: `make run` (the main job: the notebook suite) and `make test`.
# Each creates .venv if missing and installs the project with every extra (test, ray and peers, so
# that CI tests the ray backend; notebooks, report, onnx, binning), torch first; every install is
# constrained by constraints.txt (torch 2.13.0's CPU build), so a CPU-only machine never pulls a
# CUDA build. pyproject.toml asks only for torch >= 2.11: `pip install -e .` into an environment
# that has a torch keeps it; it installs what running and exporting need, the rest are its extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpufeed-installed
CONSTRAINTS := constraints.txt
PARAMS ?= cpu
export HF_HUB_OFFLINE ?= 1

.PHONY: run test quick bench results clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) torch
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[test,ray,peers,notebooks,report,onnx,binning]"
	touch $@

# The notebook suite, headless (papermill), with the parameter set notebooks/params/$(PARAMS).yaml:
# `make run` (cpu), `PARAMS=gpu make run`, `PARAMS=smoke make run` (seconds).
run: $(STAMP)
	$(PY) -m helpers notebooks --params $(PARAMS)

# Everything committed under data/results/cpu/ and figures/: the notebooks (`make run`), then each
# benchmark that writes a committed table, as its table's sidecar says it was run (hours here:
# each scale run moves the study's 20.6 M rows, about 31 GB written and deleted).
results: run
	$(PY) -m helpers.bench runtimes --repeats 7
	$(PY) -m helpers.bench feed
	$(PY) -m helpers.bench dispatch
	$(PY) -m helpers.bench dispatch --backend ray --units 10000
	$(PY) -m helpers.bench prefetch --rounds 6
	$(PY) -m helpers.bench joins
	$(PY) -m helpers.bench failures
	$(PY) -m helpers.bench ray
	$(PY) -m helpers.bench autotune --records 340000 --repeats 1
	$(PY) -m helpers.bench sources --records 20000000
	$(PY) -m helpers.bench scale
	$(PY) -m helpers.bench scale --backend ray
	$(PY) -m helpers.bench scale --writes workers
	$(PY) -m helpers.bench scale --writes workers --backend ray
	$(PY) -m helpers.bench scale --writes workers --source parquet
	$(PY) -m helpers.bench scale --writes workers --source jsonl
	$(PY) -m helpers.bench scale --writes workers --source csv

# Every test (what CI runs), then how long the tests took: in TEST_WORKERS processes (pytest-xdist),
# a test file to one of them whole (its fixtures, the notebooks' smoke run or a Ray cluster, made
# once); 3 on this 2-core machine, where a test waits on its workers' spawns and Ray's daemons
# (1,122 tests: 586 s at 3, 723 s at 2, 1,119 s in one; 1,150 on a slower day: 955 s at 3, and
# 651 s the same morning with OpenMP's threads waiting passively, which conftest.py sets; 1,154:
# 515 s with jsonschema pinned, every Ray process 1.4 CPU s lighter; 4 processes gain nothing).
# `make quick` leaves out the cases marked slow (end-to-end runs of 6 s or more: the notebooks'
# smoke run, Ray clusters, exports).
TEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile
test: $(STAMP)
	@start=$$(date +%s); $(PYTEST); status=$$?; \
	echo "make test: the tests took $$(( $$(date +%s) - start )) s"; exit $$status

quick: $(STAMP)
	@start=$$(date +%s); $(PYTEST) -m "not slow"; status=$$?; \
	echo "make quick: the tests took $$(( $$(date +%s) - start )) s"; exit $$status

bench: $(STAMP)
	$(PY) -m helpers.bench overhead

clean:
	rm -rf build
