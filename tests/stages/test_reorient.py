"""reorient: exact (no interpolation), lossless round trips, every voxel keeps its place."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.errors import PipelineConfigError
from mriprep.core.volume import Volume
from mriprep.inputs.templates import load_mni152_tissue, load_template
from mriprep.stages import get_stage
from mriprep.stages.reorient import orientation_codes, reorient_arrays


@pytest.fixture(scope="module")
def head() -> Volume:
    """The MNI152 head (RAS, 2 mm) with tissue labels and a few invalid voxels."""
    template = load_template("mni152")
    data = template.data[::2, ::2, ::2] * 1000.0
    label = (load_mni152_tissue()["gm"][::2, ::2, ::2] > 0.5).astype(np.int16)
    valid = np.ones(data.shape, dtype=bool)
    valid[10:14, 20, 30:33] = False
    affine = template.affine @ np.diag([2.0, 2.0, 2.0, 1.0])
    return Volume(data=data, affine=affine, valid=valid, label=label, subject_id="head")


def stored_as(volume: Volume, orientation: str) -> Volume:
    """The same head stored in another axis order (what a scanner may write)."""
    (data, valid, label), affine = reorient_arrays(
        [volume.data, volume.valid, volume.label], volume.affine, orientation
    )
    return volume.replace(data=data, valid=valid, label=label, affine=affine)


def world_value_pairs(volume: Volume, voxels: np.ndarray):
    world = voxels @ volume.affine[:3, :3].T + volume.affine[:3, 3]
    return world, volume.data[tuple(voxels.T)]


@pytest.mark.parametrize("orientation", ["LAS", "LIA", "PSR", "ILP"])
def test_round_trip_is_lossless(head, orientation):
    stored = stored_as(head, orientation)
    assert orientation_codes(stored.affine) == orientation
    back = get_stage("reorient")(stored)
    np.testing.assert_array_equal(back.data, head.data)
    np.testing.assert_array_equal(back.valid, head.valid)
    np.testing.assert_array_equal(back.label, head.label)
    np.testing.assert_array_equal(back.affine, head.affine)
    metrics = back.record_of("reorient").metrics
    assert metrics == {"from": orientation, "to": "RAS", "shape_in": list(stored.shape),
                       "changed": True, "shape_out": list(head.shape)}


def test_every_voxel_keeps_its_world_position_and_value(head):
    out = get_stage("reorient")(head, orientation="LIA")
    assert orientation_codes(out.affine) == "LIA"
    rng = np.random.default_rng(0)
    voxels = np.stack([rng.integers(0, n, 50) for n in head.shape], axis=1)
    world, values = world_value_pairs(head, voxels)
    # Find the same points in the reoriented grid and read them there.
    out_voxels = np.rint(
        (world - out.affine[:3, 3]) @ np.linalg.inv(out.affine[:3, :3]).T
    ).astype(int)
    np.testing.assert_array_equal(out.data[tuple(out_voxels.T)], values)


def test_canonical_input_is_returned_untouched(head):
    out = get_stage("reorient")(head)
    assert out.data is head.data and out.valid is head.valid and out.label is head.label
    assert out.record_of("reorient").metrics["changed"] is False


def test_oblique_affine_keeps_its_obliquity(head):
    angle = np.deg2rad(12.0)
    tilt = np.eye(4)
    tilt[:3, :3] = [[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0],
                    [0, 0, 1]]
    oblique = stored_as(head, "LAS").replace(affine=tilt @ stored_as(head, "LAS").affine)
    out = get_stage("reorient")(oblique)
    assert orientation_codes(out.affine) == "RAS"
    np.testing.assert_allclose(out.affine, tilt @ head.affine, atol=1e-12)
    np.testing.assert_array_equal(out.data, head.data)


def test_bad_orientation_is_refused():
    with pytest.raises(PipelineConfigError, match=r"'RAR' must name each of the three"):
        get_stage("reorient").params_type(orientation="RAR")


def test_arrays_are_reordered_as_views_and_the_stage_hands_on_copies(head):
    # reorient_arrays copies nothing (resample reorders its input with it and writes the
    # new grid in the same pass); the stage makes the result contiguous, because later
    # stages walk it in memory order.
    (data, valid, label), _ = reorient_arrays(
        [head.data, head.valid, head.label], head.affine, "LIA")
    assert all(np.shares_memory(a, b) for a, b in
               ((head.data, data), (head.valid, valid), (head.label, label)))
    out = get_stage("reorient")(head, orientation="LIA")
    for before, after in ((head.data, out.data), (head.valid, out.valid),
                          (head.label, out.label)):
        assert after.flags.c_contiguous and not np.shares_memory(before, after)
