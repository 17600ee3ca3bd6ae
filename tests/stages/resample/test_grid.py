"""resample's grid: covering and centring the field of view, and the snap onto the
input's lattice that turns a same-spacing grid into an exact crop/pad."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.volume import Volume
from mriprep.inputs.templates import load_template
from mriprep.stages import get_stage
from mriprep.stages.resample.grid import target_grid
from tests.stages.resample.reference import world_of


def test_outside_the_field_of_view_is_invalid_zero_and_background(head):
    out = get_stage("resample")(head, spacing=(2.0, 2.0, 2.0), shape=(128, 128, 128))
    centre_in = head.affine @ np.r_[(np.asarray(head.shape) - 1) / 2, 1]
    centre_out = out.affine @ np.r_[(np.asarray(out.shape) - 1) / 2, 1]
    # Same spacing and axes: the grid is snapped onto the input's lattice, so the centres
    # differ by at most half a voxel per axis (and the shift is recorded).
    assert np.all(np.abs(centre_out - centre_in)[:3] <= 0.5 * np.asarray(head.spacing) + 1e-9)
    shift = out.record_of("resample").metrics["grid_shift_mm"]
    np.testing.assert_allclose(np.abs(shift), np.abs(centre_out - centre_in)[:3], atol=1e-9)
    world = world_of(out.shape, out.affine)
    inside_vox = (world - head.affine[:3, 3]) / 2.0
    outside = np.any((inside_vox < -1e-6) | (inside_vox > np.asarray(head.shape) - 1 + 1e-6), -1)
    assert outside.any()
    assert not out.valid[outside].any()
    assert (out.data[outside] == 0).all() and (out.label[outside] == 0).all()
    assert out.record_of("resample").metrics["outside_fraction"] == pytest.approx(
        outside.mean()
    )


def test_target_grid_covers_the_field_of_view():
    shape, affine = target_grid(np.diag([0.9, 0.9, 5.0, 1.0]), (200, 200, 30), (1, 1, 1))
    assert shape == (180, 180, 150)
    assert affine[2, 3] == pytest.approx((29 * 5.0 - 149) / 2)


def test_same_spacing_conform_is_an_exact_crop_or_pad(conformed_1mm):
    volume = conformed_1mm
    out = get_stage("resample")(volume, spacing=(1.0, 1.0, 1.0), shape=(256, 256, 256))
    metrics = out.record_of("resample").metrics
    assert metrics["kernel"].startswith("exact copy, integer crop/pad")
    shift = np.asarray(metrics["grid_shift_mm"])
    # Odd input against even output on every axis: centring is half a voxel off lattice.
    np.testing.assert_allclose(np.abs(shift), 0.5, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(metrics["affine"]), out.affine)
    # Each input voxel lands on one output voxel, at the same world point.
    offset = np.linalg.solve(out.affine[:3, :3], volume.affine[:3, 3] - out.affine[:3, 3])
    start = np.rint(offset).astype(int)
    np.testing.assert_allclose(offset, start, rtol=0, atol=1e-9)
    corners = np.array([[0, 0, 0, 1], [*(np.asarray(volume.shape) - 1), 1]], dtype=float).T
    shifted = corners.copy()
    shifted[:3] += start[:, None]
    np.testing.assert_allclose(out.affine @ shifted, volume.affine @ corners, atol=1e-9)
    inside = tuple(slice(a, a + n) for a, n in zip(start, volume.shape))
    np.testing.assert_array_equal(out.data[inside], volume.data)
    np.testing.assert_array_equal(out.valid[inside], volume.valid)
    np.testing.assert_array_equal(out.label[inside], volume.label)
    padded = np.ones(out.shape, dtype=bool)
    padded[inside] = False
    assert not out.valid[padded].any()
    assert (out.data[padded] == 0).all() and (out.label[padded] == 0).all()
    assert metrics["outside_fraction"] == pytest.approx(padded.mean())


def test_a_change_of_spacing_still_interpolates():
    # 1 x 1 x 3 mm to 1 mm: no shared lattice, the centred grid and trilinear kernel.
    template = load_template("mni152")
    data = template.data[40:140:, 50:160, 30:150:3] * 1000.0
    affine = template.affine @ np.diag([1.0, 1.0, 3.0, 1.0])
    thick = Volume.from_array(data, affine, subject_id="thick")
    out = get_stage("resample")(thick, spacing=(1.0, 1.0, 1.0), shape=(128, 128, 128))
    metrics = out.record_of("resample").metrics
    assert metrics["kernel"] == "trilinear" and metrics["grid_shift_mm"] is None
    centre_in = thick.affine @ np.r_[(np.asarray(thick.shape) - 1) / 2, 1]
    centre_out = out.affine @ np.r_[(np.asarray(out.shape) - 1) / 2, 1]
    np.testing.assert_allclose(centre_out, centre_in, atol=1e-9)
