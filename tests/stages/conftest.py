"""Fixtures shared by the stage tests: heads of a person who is not the template.

The person is MNI152 warped nonlinearly, rescaled and recontrasted, with a synthesized
scalp and neck (:mod:`mriprep.demo.anatomy`), scanned by :mod:`mriprep.demo.scanner`:
thresholds tested here are never tested on the registration template's own voxels.
"""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.volume import Volume
from mriprep.demo.calibration import person
from mriprep.demo.scanner import Acquisition, acquire, random_pose
from mriprep.stages import get_stage

# The person every stage test scans; calibration uses other seeds.
TEST_PERSON = 41


def build_head(spacing=(2.0, 2.0, 2.0), noise=0.015, seed=0, skull_stripped=False,
               slicing="axial") -> Volume:
    """The test person scanned on a grid of ``spacing`` (mm), slices along the last
    axis, in a small random pose, with a ±15% bias field and Rician noise.

    Parameters
    ----------
    spacing : (float, float, float)
        Voxel size in mm; a thick voxel averages its slab, as a thick acquisition does.
    noise : float
        Rician noise sigma relative to white matter; 0 for none.
    seed : int
        Seed of the pose, the bias field and the noise.
    skull_stripped : bool
        Keep the brain only (zero background), as a brain-extracted image.
    slicing : {"axial", "coronal", "sagittal"}

    Returns
    -------
    Volume
        float32 data stored in RAS+ order (white matter near 1000), subject ``test-head``.
    """
    rng = np.random.default_rng([TEST_PERSON, seed])
    acquisition = Acquisition(tuple(float(s) for s in spacing), slicing,
                              noise=0.0 if skull_stripped else noise)
    scan = acquire(person(TEST_PERSON), random_pose(rng, 5.0, 5.0), acquisition, rng)
    data = scan.data if not skull_stripped else np.where(scan.labels > 0, scan.data, 0.0)
    volume = Volume.from_array(data.astype(np.float32), scan.affine, subject_id="test-head")
    return get_stage("reorient")(volume)


@pytest.fixture(scope="session")
def head_builder():
    """:func:`build_head`, for fixtures and tests that scan their own heads."""
    return build_head
