"""``conform_min`` gives what FastSurfer's own ``conform`` gives with the same options
(``--vox_size min``, ``conform_to_1mm_threshold`` 0.98), voxel by voxel, on 0.5-1 mm and
thick scans: the same grid, size and affine, at least 99.5% of the voxels equal and the
rest within one grey level.

The referee is FastSurfer's code itself (``MRIPREP_FASTSURFER``, set by ``.ci/run``); a
restatement would only test a reading of it. What is compared, and over which voxels:
:mod:`mriprep.demo.fastsurfer_checkout` (the conform without mriprep's additions that
change what they touch by design: the measured resolution, the artifact-slice masking).
"""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.demo.calibration import person
from mriprep.demo.fastsurfer_checkout import (
    HOW_TO_ENABLE,
    MIN_FIDELITY_CASES,
    compare_with_fastsurfer,
    fastsurfer_module,
    min_fidelity_scan,
)
from mriprep.demo.real_scans import HOW_TO_GET
from mriprep.demo.scanner import Acquisition, acquire, random_pose
from tests.stages.conftest import TEST_PERSON

pytestmark = pytest.mark.xdist_group("conform_min_fidelity")


@pytest.fixture(scope="module")
def fastsurfer():
    """Skips the module where FastSurfer's checkout is not at hand."""
    if fastsurfer_module("FastSurferCNN.data_loader.conform") is None:
        pytest.skip(HOW_TO_ENABLE)


def _check(data, affine, expected_size: float):
    got = compare_with_fastsurfer(data, affine)
    volume, ours, theirs, found = got.volume, got.ours, got.theirs, got.agreement
    assert found.same_grid, (ours.shape, theirs.shape, found.max_affine_mm)
    assert found.max_affine_mm == 0.0, found  # the same float32 header arithmetic
    assert volume.spacing[0] == pytest.approx(expected_size)
    # Every valid voxel, the field of view's edge planes included (fastsurfer_path).
    assert found.equal >= 0.995 and found.within_one == 1.0, found
    # Nothing was left out: only the grid's outside is invalid, and there both are 0.
    assert volume.record_of("sanitize").metrics["replaced"] == 0
    assert found.invalid_nonzero == 0, found
    assert not ours[~volume.valid].any()


def test_a_tilted_08mm_scan_of_a_synthetic_person(fastsurfer):
    rng = np.random.default_rng([TEST_PERSON, 48])
    scan = acquire(person(TEST_PERSON), random_pose(rng, 10.0, 10.0),
                   Acquisition(spacing=(0.8, 0.8, 0.8), tilt_deg=12.0), rng)
    _check(scan.data, scan.affine, 0.8)


@pytest.mark.calibration  # real heads on 256-390 voxel cubes: seconds each
@pytest.mark.parametrize("case", MIN_FIDELITY_CASES)
def test_real_scans(fastsurfer, case):
    found = min_fidelity_scan(case)
    if found is None:
        pytest.skip(HOW_TO_GET)
    data, affine, size = found
    _check(data, affine, size)
