"""The registration pyramid's shortcuts equal the computations they replace.

Levels are resampled one axis at a time and the bias flattening's wide Gaussian runs on
block means; both replaced scipy calls that cost most of a registration's second on a
2 mm head. Here each is held against the computation it replaces, on a real level of a
synthetic person (not the template). Then what the levels promise the metric: invalid
voxels continued, not read as zeros, and a flattening that a region makes blind to what
lies outside it (the finest level's, within the brain), with that region placed where
the fit puts the template's brain.
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


# --- invalid voxels: continued, not read as zeros ------------------------------------------

def _slab_level(spacing=2.0):
    """A smooth level with a masked slab of 3 slices across its middle."""
    x = np.linspace(0, 1, 30, dtype=np.float32)
    data = (100 + 50 * x[:, None, None] + 30 * x[None, :, None] + 20 * x[None, None, :]
            ).astype(np.float32) * np.ones((30, 30, 30), np.float32)
    mask = np.ones(data.shape, bool)
    mask[:, :, 14:17] = False
    data[~mask] = 0.0  # what a level holds where no valid voxel contributed
    return pyramid.Level(data, np.diag([spacing] * 3 + [1.0]), mask, spacing)


def test_values_are_continued_past_the_mask_where_the_metric_reads_them():
    level = _slab_level()
    out = pyramid.continued_past(level.data, level.mask)
    np.testing.assert_array_equal(out[level.mask], level.data[level.mask])
    # The masked slab's values now continue the image's smooth ramp (no step to 0) ...
    inside = out[:, :, 15]
    expected = (level.data[:, :, 13] + level.data[:, :, 17]) / 2
    np.testing.assert_allclose(inside, expected, rtol=0.02)
    # ... and a mask with nothing to continue returns the input itself.
    assert pyramid.continued_past(level.data, np.ones_like(level.mask)) is level.data


def test_masked_slices_of_a_scan_are_inside_its_field_of_view():
    from mriprep.stages.registration.checks import field_of_view

    level = _slab_level()
    assert field_of_view(level.mask, 2.0).all()  # the slab lies between valid slices
    cut = level.mask.copy()
    cut[:, :, 25:] = False  # slices written as zeros at the edge: not covered
    seen = field_of_view(cut, 2.0)
    assert seen[:, :, :25].all() and not seen[:, :, 25:].any()
    # Two valid slices far apart enclose no field of view between them.
    apart = np.zeros_like(level.mask)
    apart[:, :, [2, 27]] = True
    assert field_of_view(apart, 2.0).sum() == apart.sum()
    seen = field_of_view(apart, (2.0, 2.0, 0.5))  # 12 mm apart at 0.5 mm: covered
    assert seen[:, :, 2:28].all() and not seen[:, :, :2].any()


def test_bright_outliers_leave_the_metric_and_clean_levels_are_untouched():
    rng = np.random.default_rng(0)
    head = np.zeros((40, 40, 40), np.float32)
    head[5:35, 5:35, 5:35] = rng.uniform(300, 1000, (30, 30, 30))  # a head's tissues
    clean = pyramid.Level(head, np.eye(4) * [2, 2, 2, 1], np.ones(head.shape, bool), 2.0)
    (same,), excluded = pyramid.without_bright_outliers([clean])
    assert excluded == 0 and same is clean
    spiked = head.copy()
    spiked[:, :, 20] *= 4.0  # a spike slice that slice masking missed
    level = pyramid.Level(spiked, clean.affine, clean.mask, 2.0)
    (out,), excluded = pyramid.without_bright_outliers([level])
    tissue = spiked > pyramid.HEAD_FRACTION * np.percentile(spiked[spiked > 0], 99)
    bright = spiked > pyramid.BRIGHT_OUTLIER_FACTOR * np.percentile(spiked[tissue], 90)
    assert excluded == np.count_nonzero(bright) > 100
    assert not out.mask[bright].any() and out.mask[~bright].all()
    assert bright[:, :, 20].sum() == excluded  # the spike slice only


def test_short_runs_of_missing_slices_are_bridged_between_their_neighbours():
    affine = np.diag([1.0, 1.0, 3.0, 1.0])  # 3 mm axial slices
    ramp = np.broadcast_to(np.arange(30, dtype=np.float32) * 10.0, (8, 8, 30)).copy()
    valid = np.ones(ramp.shape, bool)
    valid[:, :, 10:13] = False  # 9 mm of missing slices: bridged
    valid[:, :, 20:26] = False  # 18 mm: a lost slab, left without weight
    valid[:, :, 0] = False  # at the edge: nothing to interpolate from
    valid[2, 2, 15] = False  # one invalid voxel, not a slice
    data = np.where(valid, ramp, 0.0).astype(np.float32)
    out, usable = pyramid.bridged_slice_gaps(data, valid, affine)
    np.testing.assert_allclose(out[:, :, 10:13], ramp[:, :, 10:13], rtol=1e-6)
    assert usable[:, :, 10:13].all()
    assert not usable[:, :, 20:26].any() and not usable[:, :, 0].any() and not usable[2, 2, 15]
    np.testing.assert_array_equal(out[valid], data[valid])
    # A bridged voxel counts only where both neighbouring slices are valid there.
    valid[4, 4, 9] = False
    _, usable = pyramid.bridged_slice_gaps(np.where(valid, ramp, 0.0), valid, affine)
    assert not usable[4, 4, 10:13].any() and usable[3, 4, 10:13].all()
    # Nothing to bridge: the inputs themselves.
    whole = np.ones(ramp.shape, bool)
    assert pyramid.bridged_slice_gaps(ramp, whole, affine)[0] is ramp


# --- the finest level flattened within the brain -------------------------------------------

def test_a_region_makes_the_flattening_blind_to_what_lies_outside_it(levels):
    # What defacing or skull stripping takes away lies outside the brain: within a region
    # the brain's flattened values are the same with and without it; over the whole
    # head they are not.
    level = levels[2]
    centre = np.asarray(level.data.shape) // 2
    region = np.zeros(level.data.shape, bool)
    region[tuple(slice(c - 15, c + 15) for c in centre)] = True
    stripped = np.where(region, level.data, np.float32(0.0))
    within = [pyramid.flatten_bias(data, level.mask, level.affine, 20.0, region)
              for data in (level.data, stripped)]
    np.testing.assert_array_equal(within[0][region], within[1][region])
    whole = [pyramid.flatten_bias(data, level.mask, level.affine, 20.0)
             for data in (level.data, stripped)]
    assert np.abs(whole[0][region] / whole[1][region] - 1.0).max() > 0.05


def test_the_template_brain_region_follows_the_transform_that_places_it():
    from mriprep.inputs.templates import load_template
    from mriprep.stages.registration.template import (
        template_brain_distance,
        template_brain_region,
    )

    distance, affine = template_brain_distance("mni152", 2.0)
    brain = distance <= 0
    level = pyramid.Level(np.zeros(distance.shape, np.float32), affine,
                          np.ones(distance.shape, bool), 2.0)
    placed = template_brain_region(level, np.eye(4), "mni152", 2.0, 0.0)
    np.testing.assert_array_equal(placed, brain)
    # Moved 10 mm to the right (+x in RAS), the brain is found 5 voxels further along
    # the grid's x axis (MNI152's grid runs along +x), and a margin grows it.
    moved = np.eye(4)
    moved[0, 3] = 10.0
    shifted = template_brain_region(level, moved, "mni152", 2.0, 0.0)
    assert affine[0, 0] > 0 and load_template("mni152").affine[0, 0] > 0
    np.testing.assert_array_equal(shifted[5:], brain[:-5])
    grown = template_brain_region(level, np.eye(4), "mni152", 2.0, 4.0)
    assert grown.sum() > brain.sum() and grown[brain].all()
