"""The scans the split tests' manifests point at (see :mod:`tests.splits.manifests`)."""

from __future__ import annotations

import shutil

import pytest

from mriprep.inputs.writing import save_volume
from tests.splits.manifests import scan


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    """Eight uncompressed scans of equal size (so every file must be hashed)."""
    folder = tmp_path_factory.mktemp("cohort")
    for i in range(1, 9):
        save_volume(scan(3 * i), folder / "images" / f"sub-0{i}.nii")
    return folder


@pytest.fixture
def cohort(scans, tmp_path):
    """A private copy of the scans, so a test can add files next to them."""
    folder = tmp_path / "cohort"
    shutil.copytree(scans, folder)
    return folder
