"""Shared fixtures: the demo cohort (synthetic people made from nilearn's MNI152, offline).

``make test`` runs the suite on every core (pytest-xdist); the expensive session
fixtures are built once per run, not once per worker (:mod:`tests.built_once`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.built_once import built_once

if TYPE_CHECKING:
    from mriprep.run.cohort import RunResult

# Heavy libraries get one thread each: the CI machine has two cores and the tests must
# stay deterministic whatever the machine.
os.environ.setdefault("ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def demo_cohort(tmp_path_factory):
    """The full demo cohort: synthetic people in known poses, planted defects and scans
    registration must refuse (see :mod:`mriprep.demo.cohort`)."""
    from mriprep.demo import build_demo_cohort

    return built_once(tmp_path_factory, "demo_cohort",
                      lambda folder: build_demo_cohort(folder, seed=0))


@dataclass(frozen=True)
class DemoCache:
    """The demo cohort preprocessed by the default pipeline: the cache folder and the run."""

    path: Path
    run: "RunResult"


@pytest.fixture(scope="session")
def demo_cache(demo_cohort, tmp_path_factory) -> DemoCache:
    """The demo cohort through ``t1w_mni_rigid`` (the default pipeline), run once.

    This is what ``make demo`` preprocesses: the planted broken subjects fail, the rest
    are cached, and the planted leak (sub-11, a copy of sub-01 in another split) is in
    the cache. The run takes about 60 s, so the whole session shares it: tests only read
    it, and a test that changes a cache changes a clone (``tests/cache_clone.py``).
    """
    from mriprep.pipelines import load_pipeline
    from mriprep.run.cohort import run_cohort, cohort_rows

    def build(folder: Path) -> DemoCache:
        root = folder / "cache"
        run = run_cohort(
            cohort_rows(demo_cohort.manifest),
            root,
            load_pipeline("t1w_mni_rigid"),
            scheduler="processes",
            workers=2,
            manifest=demo_cohort.manifest,
        )
        return DemoCache(path=root, run=run)

    return built_once(tmp_path_factory, "demo_cache", build)
