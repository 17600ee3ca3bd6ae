"""Shared fixtures: the demo cohort (synthetic people made from nilearn's MNI152, offline).

``make test`` runs the suite on every core (pytest-xdist); the expensive session
fixtures are built once per run, not once per worker (:mod:`tests.built_once`), and the
demo build starts in the background while the tests that do not need it run
(:mod:`tests.demo_build`).
"""

from __future__ import annotations

import os

import pytest

from mriprep.run.worker_setup import keep_freed_memory
from tests.built_once import shared_folder
from tests.demo_build import (DEMO_FIXTURES, DemoCache, demo_cache_in, demo_cohort_in,
                              start_background_build, stop_background_build)
from tests.shared_people import share_people

# Heavy libraries get one thread each: the CI machine has two cores and the tests must
# stay deterministic whatever the machine.
os.environ.setdefault("ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


# What `make test-fast` leaves out besides `slow` and `demo`: tests that build or register
# whole synthetic or real heads, seconds each (the slowest of `make test`'s durations).
HEAVY = (
    "tests/demo/test_conform_fidelity.py",
    "tests/demo/test_demo.py",
    "tests/demo/test_registration_sets.py",
    "tests/pipelines/test_conform_pipeline.py",
    "tests/pipelines/test_template_swap.py",
    "tests/pipelines/test_pipeline.py::test_a_wheel_in_a_fresh_virtualenv",
    "tests/splits/test_identity.py",
    "tests/stages/mask_slices/test_artifacts.py",
    "tests/stages/mask_slices/test_lattice.py",
    "tests/stages/test_plausibility.py",
    "tests/stages/test_register.py",
    "tests/stages/test_register_ants.py",
    "tests/stages/test_register_heldout.py",
    "tests/stages/test_register_population.py",
    "tests/stages/test_register_pyramid.py",
    "tests/test_real_scans.py",
)


def _demo_need(item) -> int:
    """0: no demo build; 1: the demo cohort only (ready before the cache); 2: its cache."""
    names = set(getattr(item, "fixturenames", ()))
    if names.isdisjoint(DEMO_FIXTURES):
        return 0
    return 2 if "demo_cache" in names else 1


def pytest_collection_modifyitems(config, items):
    """Mark the tests that need the demo build `demo` and the HEAVY ones `heavy`, and
    order them: the tests that need no demo build first, then those that need its
    cohort only (ready before the cache), then those that need its cache, the heavy ones
    first among them. xdist hands out a group of tests before any
    single test, whatever this order, and its worker runs it in this order: a group's
    members run in the same three steps, so that those that wait for nothing are done
    while the build runs (the Slurm group holds one worker for its whole length).

    Every xdist worker sorts the same collection the same way, as xdist requires."""
    for item in items:
        if _demo_need(item):
            item.add_marker(pytest.mark.demo)
        if item.nodeid.startswith(HEAVY):
            item.add_marker(pytest.mark.heavy)

    def rank(item) -> tuple[int, int]:
        need = _demo_need(item)
        if need < 2:
            return need, 0
        # A long test started last runs alone at the end (tests/demo/test_demo.py).
        return 2, 0 if item.get_closest_marker("heavy") else 1

    items.sort(key=rank)  # stable: collection order within each rank


def pytest_configure(config):
    """Refuse `--dist loadgroup` where pytest-xdist cannot group: pytest 9.2 no longer lets
    xdist (3.8 and older) write a test's group into its node id, so every `xdist_group`
    mark is silently ignored (pytest-dev/pytest-xdist#1386) and each grouped module runs
    on both workers, building what it builds twice (a Slurm cluster). constraints.txt pins
    pytest below 9.2."""
    # Tests allocate head-sized arrays by the thousand, in the main thread: keep freed
    # memory for the next one, as the run's workers do, rather than fault it in again
    # page by page (a tenth of the suite's CPU went to the kernel).
    keep_freed_memory()
    if config.getoption("dist", "no") != "loadgroup" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from importlib.metadata import version

    from packaging.version import Version

    if Version(pytest.__version__) >= Version("9.2") and Version(version("pytest-xdist")) \
            <= Version("3.8.0"):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {version('pytest-xdist')} ignores "
            "xdist_group marks under --dist loadgroup (pytest-dev/pytest-xdist#1386): "
            "install the pinned versions with make install (pip install -c constraints.txt "
            "-e '.[dev]')")


@pytest.fixture(scope="session", autouse=True)
def _people_built_once(tmp_path_factory):
    """Synthetic people are built by one xdist worker and read back by the others."""
    share_people(shared_folder(tmp_path_factory))


@pytest.fixture(scope="session", autouse=True)
def _demo_build_in_background(request, tmp_path_factory):
    """Start the demo build as the session starts, when a selected test needs it."""
    if not any(item.get_closest_marker("demo") for item in request.session.items):
        yield
        return
    # The cohort alone when no selected test reads a cache built from it (the ANTs test
    # of `make test-calibration`): the default pipeline over it is a minute of both cores.
    cache = any(_demo_need(item) == 2 for item in request.session.items)
    process = start_background_build(shared_folder(tmp_path_factory), cache=cache)
    # No os.nice for the workers to step back for it: under it the tests that time a
    # run (Ctrl-C on Slurm) starved and failed, and the whole run was no shorter.
    yield
    if process is None:
        return
    if request.session.shouldstop or request.session.shouldfail:
        stop_background_build(process)  # -x or Ctrl-C: nobody will use it
    else:
        process.wait()  # another worker may still be waiting for it


@pytest.fixture(scope="session")
def demo_cohort(tmp_path_factory):
    """The full demo cohort: synthetic people in known poses, planted defects and scans
    registration must refuse (see :mod:`mriprep.demo.cohort`)."""
    return demo_cohort_in(shared_folder(tmp_path_factory))


@pytest.fixture(scope="session")
def demo_cache(demo_cohort, tmp_path_factory) -> DemoCache:
    """The demo cohort through ``t1w_mni_rigid`` (the default pipeline), run once.

    This is what ``make demo`` preprocesses: the planted broken subjects fail, the rest
    are cached, and the planted leak (sub-11, a copy of sub-01 in another split) is in
    the cache. The run takes about 60 s, so the whole session shares it: tests only read
    it, and a test that changes a cache changes a clone (``tests/cache_clone.py``).
    """
    return demo_cache_in(shared_folder(tmp_path_factory))
