"""resample's rotating path (SimpleITK): analytic accuracy through a rotation, the blob
centroid, and the point-by-point rule with scattered invalid voxels."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.volume import PendingTransform, Volume
from mriprep.stages import get_stage
from mriprep.stages.registration.geometry import rigid_matrix as rotation
from tests.stages.resample.reference import ANALYTIC_BOUND, analytic, trilinear_reference, world_of


def test_analytic_field_through_a_rotation_matches(thick_field):
    # One interpolation applies the transform and the grid: a rotated 1 mm target grid.
    moved = rotation((0.0, 0.0, 20.0), (1.5, -2.0, 0.5))
    shape, affine = (40, 40, 50), np.diag([1.0, 1.0, 1.0, 1.0])
    affine[:3, 3] = (-20.0, -20.0, -25.0)
    pending = PendingTransform(moved, shape, affine)
    out = get_stage("resample")(thick_field.replace(pending=pending))
    assert out.pending is None
    world = world_of(shape, affine)
    truth = analytic(world @ moved[:3, :3].T + moved[:3, 3])
    error = np.abs(out.data - truth)[out.valid]
    assert out.valid.mean() > 0.9
    assert error.max() <= ANALYTIC_BOUND + 1e-5, error.max()


@pytest.mark.parametrize("spacing", [(1.0, 1.0, 1.0), (1.0, 1.0, 3.0)])
def test_blob_centroid_moves_less_than_a_tenth_of_a_voxel(spacing):
    centre = np.array([3.3, -4.7, 6.1])
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = (-30.0, -30.0, -30.0)
    shape = tuple(int(61 / s) for s in spacing)
    distance2 = ((world_of(shape, affine) - centre) ** 2).sum(-1)
    blob = Volume.from_array(np.exp(-distance2 / (2 * 4.0**2)).astype(np.float32), affine)
    moved = rotation((10.0, -8.0, 15.0), (2.2, 1.3, -0.8))
    out_affine = np.eye(4)
    out_affine[:3, 3] = (-25.0, -25.0, -25.0)
    out = get_stage("resample")(
        blob.replace(pending=PendingTransform(moved, (51, 51, 51), out_affine))
    )
    weights = out.data.astype(np.float64)
    centroid = (world_of(out.shape, out.affine) * weights[..., None]).sum((0, 1, 2))
    centroid /= weights.sum()
    expected = np.linalg.solve(moved[:3, :3], centre - moved[:3, 3])
    assert np.linalg.norm(centroid - expected) < 0.1  # output voxels are 1 mm


@pytest.mark.parametrize("angles, shift", [
    ((0.0, 0.0, 20.0), (1.5, -2.0, 0.5)),
    ((7.0, -11.0, 3.0), (-4.2, 3.3, 1.1)),  # oblique: every axis moves along every row
])
def test_a_rotating_map_matches_the_point_by_point_rule(head, angles, shift):
    # The rotating path (SimpleITK's resampler with the field of view computed per row)
    # against the rule evaluated voxel by voxel: values, validity with scattered invalid
    # voxels, labels, and the field of view's edge.
    rng = np.random.default_rng(5)
    volume = head.replace(valid=head.valid & (rng.random(head.shape) > 0.003))
    moved = rotation(angles, shift)
    out_affine = head.affine.copy()
    out_affine[:3, 3] += (3.0, -5.0, 4.0)
    shape = (100, 110, 95)
    out = get_stage("resample")(volume.replace(pending=PendingTransform(moved, shape,
                                                                        out_affine)))
    data, valid, label = trilinear_reference(volume, shape, out_affine, moved)
    assert out.record_of("resample").metrics["kernel"] == "trilinear"
    assert 0.05 < (~out.valid).mean() < 0.6  # both the edge and invalid voxels are in play
    np.testing.assert_allclose(out.data, data, rtol=0, atol=2e-6 * float(head.data.max()))
    np.testing.assert_array_equal(out.valid, valid)
    np.testing.assert_array_equal(out.label, label)
    vox_map = np.linalg.inv(volume.affine) @ moved @ out_affine
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    coords = ijk @ vox_map[:3, :3].T + vox_map[:3, 3]
    inside = np.all((coords >= -1e-6) & (coords <= np.asarray(head.shape) - 1 + 1e-6), -1)
    outside = out.record_of("resample").metrics["outside_fraction"] * inside.size
    assert round(outside) == inside.size - np.count_nonzero(inside)
