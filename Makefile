# Two commands do all the set-up: `make run` (the main job) and `make test` (the test suite).
# Each creates .venv if missing and installs the project; torch is pinned to 2.13.0 (pyproject.toml)
# and installed first, so a CPU-only machine never pulls a CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpufeed-installed
TORCH := torch==2.13.0
export HF_HUB_OFFLINE ?= 1

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet "$(TORCH)" -e ".[test]"
	touch $@

run: $(STAMP)
	$(PY) -m helpers run --input data/python_docs_paragraphs.h5 --output build/embeddings.h5 \
		--workload embedding --devices cpu --workunit-size 100 --limit 2000

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) -m helpers.bench overhead

clean:
	rm -rf build
