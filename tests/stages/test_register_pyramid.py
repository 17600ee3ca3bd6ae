"""The registration pyramid's shortcuts equal the computations they replace.

Levels are resampled one axis at a time and the bias flattening's wide Gaussian runs on
block means; both replaced scipy calls that cost most of a registration's second on a
2 mm head. Here each is held against the computation it replaces, on a real level of a
synthetic person (not the template).
"""

from __future__ import annotations

import numpy as np
import pytest
from nibabel.affines import voxel_sizes
from scipy import ndimage

from mriprep.demo.calibration import calibration_cases, preprocessed
from mriprep.stages.registration import pyramid


@pytest.fixture(scope="module")
def levels():
    case = next(c for c in calibration_cases(people=1, real=False)
                if c.name == "person-0/cor5_lps")
    return pyramid.build_levels(preprocessed(case.build(), case.name), (8.0, 4.0, 2.0))


@pytest.mark.parametrize("scale, offset", [
    ((0.5, 0.5, 0.25), (-0.25, -0.25, -0.375)),   # upsampling, as a field to a finer level
    ((2.0, 2.0, 0.4), (0.5, 0.5, 0.3)),           # downsampling one way, upsampling another
    ((1.3, 0.7, 1.0), (-2.0, 1.5, 0.0)),          # reaching past both edges
])
def test_resampling_one_axis_at_a_time_equals_scipys_affine_transform(levels, scale, offset):
    data = levels[1].data
    shape = tuple(int(n / s) for n, s in zip(data.shape, scale))
    expected = ndimage.affine_transform(data, np.diag(scale), offset, output_shape=shape,
                                        order=1, mode="nearest")
    got = pyramid.resample_axes(data, np.asarray(scale), np.asarray(offset), shape)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(data.max()))


def _flattened_on_the_full_grid(values, head, affine, sigma_mm):
    median = float(np.median(values[head]))
    sigma = sigma_mm / voxel_sizes(affine)
    weight = head.astype(np.float32)
    local_sum = ndimage.gaussian_filter(values * weight, sigma, mode="constant")
    local_weight = ndimage.gaussian_filter(weight, sigma, mode="constant")
    fallback = pyramid._BIAS_FALLBACK_WEIGHT
    return values / ((local_sum + fallback * median) / (local_weight + fallback))


@pytest.mark.parametrize("index", [1, 2])  # the 4 and 2 mm levels
def test_the_flattening_on_block_means_is_within_a_percent_of_the_full_grid(levels, index):
    level = levels[index]
    head = pyramid._head_voxels(level.data, level.mask)
    got = pyramid._divided_by_local_mean(level.data, head, level.affine, 20.0)
    expected = _flattened_on_the_full_grid(level.data, head, level.affine, 20.0)
    relative = np.abs(got / expected - 1.0)[head]
    assert relative.max() < 0.01, relative.max()
