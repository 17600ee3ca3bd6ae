# Two commands do all set-up on a fresh clone: `make demo` and `make test`.
# The virtualenv is (re)built whenever pyproject.toml or constraints.txt change.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_out

.PHONY: install test test-fast demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,bench,interop,slurm]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -ra --durations=15

test-fast: $(STAMP)
	$(PY) -m pytest -q -ra -m "not slow"

demo: $(STAMP)
	$(VENV)/bin/mriprep demo $(DEMO_DIR) --run --check

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(DEMO_DIR) .pytest_cache
