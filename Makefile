# Two commands do all the set-up: `make run` (the main job: the notebook suite) and `make test`.
# Each creates .venv if missing and installs the project with its test and ray extras (so that CI
# tests the ray backend); torch is pinned to 2.13.0 (pyproject.toml) and installed first, so a
# CPU-only machine never pulls a CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpufeed-installed
TORCH := torch==2.13.0
PARAMS ?= cpu
export HF_HUB_OFFLINE ?= 1

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet "$(TORCH)" -e ".[test,ray,peers]"
	touch $@

# The notebook suite, headless (papermill), with the parameter set notebooks/params/$(PARAMS).yaml:
# `make run` (cpu), `PARAMS=gpu make run`, `PARAMS=smoke make run` (seconds).
run: $(STAMP)
	$(PY) -m helpers notebooks --params $(PARAMS)

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) -m helpers.bench overhead

clean:
	rm -rf build
