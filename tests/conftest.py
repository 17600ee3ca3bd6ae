"""Shared fixtures: cohorts built from the MNI152 template that nilearn ships (offline)."""

from __future__ import annotations

import os

import pytest

# Heavy libraries get one thread each: the CI machine has two cores and the tests must
# stay deterministic whatever the machine.
os.environ.setdefault("ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def demo_cohort(tmp_path_factory):
    """The full 12-subject demo cohort (real anatomy, known transforms, planted defects)."""
    from mriprep.demo import build_demo_cohort

    return build_demo_cohort(tmp_path_factory.mktemp("demo_cohort"), n_subjects=12, seed=0)
