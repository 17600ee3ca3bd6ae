"""resample's general path: the anisotropic B-spline kernel (cubic in-plane, linear along
the thick axis)."""

from __future__ import annotations

import numpy as np

from mriprep.core.volume import Volume
from mriprep.stages import get_stage


def test_bspline_on_thick_slices_does_not_overshoot_a_step():
    # Intensity jumps between two 5 mm slices: cubic along the slices would ring, the
    # anisotropic rule (linear along the thick axis) stays within the data's range.
    data = np.zeros((20, 20, 12), dtype=np.float32)
    data[:, :, 6:] = 1000.0
    step = Volume.from_array(data, np.diag([1.0, 1.0, 5.0, 1.0]))
    mixed = get_stage("resample")(step, interpolation="bspline")
    assert mixed.data[mixed.valid].min() >= -1e-3 and mixed.data[mixed.valid].max() <= 1000.001
    full_cubic = get_stage("resample")(step, interpolation="bspline", anisotropy_threshold=10.0)
    assert full_cubic.data[full_cubic.valid].max() > 1010.0
