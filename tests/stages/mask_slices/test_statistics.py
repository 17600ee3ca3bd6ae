"""mask_slices' slice statistics: computed for every axis at once, they equal the
per-axis ones."""

from __future__ import annotations

import numpy as np

from mriprep.stages.mask_slices.statistics import slice_profile, slice_profiles
from tests.stages.mask_slices.planting import plant


def test_slice_statistics_shared_across_axes_equal_the_per_axis_ones(iso):
    volume = plant(iso, 0, 20, lambda s: np.zeros_like(s))  # a zero slice counts
    usable = np.ones(volume.shape, dtype=bool)
    shared = slice_profiles(volume.data, usable)
    for axis in range(3):
        alone = slice_profile(volume.data, usable, axis)
        for name in ("invalid_fraction", "lowest", "highest", "has_values"):
            np.testing.assert_array_equal(getattr(shared[axis], name), getattr(alone, name))
    assert shared[0].lowest[20] == shared[0].highest[20] == 0.0
