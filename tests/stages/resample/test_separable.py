"""resample's separable path: axis-aligned maps against the point-by-point rule, and its
validity never less conservative than the rule's."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.volume import PendingTransform
from mriprep.stages import get_stage
from mriprep.stages.registration.geometry import rigid_matrix as rotation
from mriprep.stages.resample.separable import axis_sources
from tests.stages.resample.reference import trilinear_reference


@pytest.mark.parametrize("spacing, shape", [
    ((1.3, 1.7, 1.1), (90, 60, 120)),  # part of the field of view: cropped
    ((1.5, 1.5, 1.5), (130, 150, 130)),  # larger than the field of view, as conform's
])
def test_axis_aligned_grids_match_the_point_by_point_rule(head, spacing, shape):
    out = get_stage("resample")(head, spacing=spacing, shape=shape)
    data, valid, label = trilinear_reference(head, out.shape, out.affine)
    scale = float(np.abs(head.data).max())
    np.testing.assert_allclose(out.data, data, rtol=0, atol=2e-6 * scale)
    np.testing.assert_array_equal(out.valid, valid)
    np.testing.assert_array_equal(out.label, label)
    assert out.record_of("resample").metrics["kernel"] == "trilinear"


def test_an_axis_permuting_transform_is_resampled_axis_by_axis(head):
    # 90 degrees about z maps each output axis onto one input axis (cos 90 = 6e-17 is
    # far below a voxel): the separable path, with the input axes permuted.
    moved = rotation((0.0, 0.0, 90.0), (3.3, -1.7, 2.1))
    out_affine = head.affine.copy()
    out_affine[:3, 3] += (1.0, -3.0, 2.0)
    shape = (100, 90, 95)
    vox_map = np.linalg.inv(head.affine) @ moved @ out_affine
    assert axis_sources(vox_map, shape) == (1, 0, 2)
    assert axis_sources(np.linalg.inv(head.affine) @ rotation((0, 0, 30), (0, 0, 0))
                         @ out_affine, shape) is None
    pending = PendingTransform(moved, shape, out_affine)
    out = get_stage("resample")(head.replace(pending=pending))
    data, valid, label = trilinear_reference(head, shape, out_affine, moved)
    np.testing.assert_allclose(out.data, data, rtol=0, atol=2e-6 * float(head.data.max()))
    np.testing.assert_array_equal(out.valid, valid)
    np.testing.assert_array_equal(out.label, label)


def test_axis_aligned_validity_is_never_less_conservative(head):
    """Random invalid voxels and sub-voxel shifts, some within 1e-7 voxel of a grid
    plane: every output voxel the summed-weight rule marks invalid stays invalid."""
    rng = np.random.default_rng(11)
    valid = rng.random(head.shape) > 0.002
    volume = head.replace(valid=valid)
    for shift in ([0.25, 0.5, 0.75], [1e-7, 0.5, 1 - 1e-7], [0.0, 0.3, 0.0]):
        out_affine = head.affine.copy()
        out_affine[:3, 3] += head.affine[:3, :3] @ np.asarray(shift)
        pending = PendingTransform(np.eye(4), head.shape, out_affine)
        out = get_stage("resample")(volume.replace(pending=pending))
        _, reference, _ = trilinear_reference(volume, head.shape, out_affine)
        assert not (out.valid & ~reference).any()
        assert (out.valid != reference).mean() < 0.01
