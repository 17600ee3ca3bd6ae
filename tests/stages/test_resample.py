"""resample: exactness, accuracy against analytic ground truth, conservative validity."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.stages import get_stage
from mriprep.stages.resample import _axis_aligned, target_grid
from mriprep.inputs.templates import load_mni152_tissue, load_template
from mriprep.stages.registration.geometry import rigid_matrix as rotation
from mriprep.core.volume import PendingTransform, Volume


def world_of(shape, affine) -> np.ndarray:
    """World coordinates (mm) of every voxel centre, shape (*shape, 3)."""
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    return ijk @ affine[:3, :3].T + affine[:3, 3]


@pytest.fixture(scope="module")
def head() -> Volume:
    """The MNI152 head at 2 mm with its tissue labels (0 background, 1 GM, 2 WM) and a
    few invalid voxels, as the stages before resample leave it."""
    template = load_template("mni152")
    tissue = load_mni152_tissue()
    data = template.data[::2, ::2, ::2] * 1000.0
    label = np.zeros(data.shape, dtype=np.int16)
    label[tissue["gm"][::2, ::2, ::2] > 0.5] = 1
    label[tissue["wm"][::2, ::2, ::2] > 0.5] = 2
    affine = template.affine @ np.diag([2.0, 2.0, 2.0, 1.0])
    valid = np.ones(data.shape, dtype=bool)
    valid[40:44, 50:52, 45] = False
    return Volume(data=data, affine=affine, valid=valid, label=label, subject_id="head")


# Smooth analytic field (world mm). Its second derivatives bound the error of linear
# interpolation along an axis of spacing h by h^2/8 * max|f''|: here 1^2/8 * (2pi/40)^2 +
# 1^2/8 * (2pi/50)^2 in-plane and 5^2/8 * 0.5 * (2pi/60)^2 along the 5 mm axis, 0.022 in all.
ANALYTIC_BOUND = (1 / 8) * (2 * np.pi / 40) ** 2 + (1 / 8) * (2 * np.pi / 50) ** 2 + (
    25 / 8
) * 0.5 * (2 * np.pi / 60) ** 2


def analytic(points: np.ndarray) -> np.ndarray:
    x, y, z = points[..., 0], points[..., 1], points[..., 2]
    return np.sin(2 * np.pi * x / 40) * np.cos(2 * np.pi * y / 50) + 0.5 * np.sin(
        2 * np.pi * z / 60 + 0.3
    )


@pytest.fixture(scope="module")
def thick_field() -> Volume:
    """The analytic field sampled on a 1 x 1 x 5 mm grid."""
    affine = np.diag([1.0, 1.0, 5.0, 1.0])
    affine[:3, 3] = (-30.0, -35.0, -40.0)
    shape = (60, 70, 17)
    values = analytic(world_of(shape, affine)).astype(np.float32)
    return Volume.from_array(values, affine, subject_id="field")


def test_same_grid_returns_the_input_exactly(head):
    for interpolation in ("linear", "bspline"):
        out = get_stage("resample")(head, spacing=(2.0, 2.0, 2.0), interpolation=interpolation)
        np.testing.assert_array_equal(out.data, head.data)
        np.testing.assert_array_equal(out.valid, head.valid)
        np.testing.assert_array_equal(out.label, head.label)
        np.testing.assert_allclose(out.affine, head.affine, rtol=0, atol=1e-12)
        assert out.record_of("resample").metrics["kernel"].startswith("exact copy")


@pytest.mark.parametrize("interpolation", ["linear", "bspline"])
def test_analytic_field_on_thick_slices_matches_at_1mm(thick_field, interpolation):
    out = get_stage("resample")(thick_field, interpolation=interpolation)
    assert out.spacing == pytest.approx((1.0, 1.0, 1.0), abs=1e-12)
    assert out.shape == (60, 70, 85)
    metrics = out.record_of("resample").metrics
    if interpolation == "bspline":  # 5/1 > 3: cubic in-plane, linear along the slices
        assert metrics["anisotropic_axis"] == 2 and "linear along axis 2" in metrics["kernel"]
    truth = analytic(world_of(out.shape, out.affine))
    error = np.abs(out.data - truth)[out.valid]
    assert out.valid.mean() > 0.9
    assert error.max() <= ANALYTIC_BOUND + 1e-5, error.max()


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


@pytest.mark.parametrize("interpolation, touched", [("linear", 2), ("bspline", 4)])
def test_one_invalid_voxel_invalidates_exactly_its_kernel_support(head, interpolation, touched):
    valid = np.ones(head.shape, dtype=bool)
    v = np.array([48, 60, 40])
    valid[tuple(v)] = False
    half_shifted = head.affine.copy()
    half_shifted[:3, 3] += head.affine[:3, :3] @ np.full(3, 0.5)
    pending = PendingTransform(np.eye(4), head.shape, half_shifted)
    out = get_stage("resample")(
        head.replace(valid=valid, pending=pending), interpolation=interpolation
    )
    inner = ~out.valid[:-1, :-1, :-1]  # the last planes lie outside the field of view
    assert (~out.valid[-1]).all() and (~out.valid[:, -1]).all() and (~out.valid[:, :, -1]).all()
    expected = np.zeros_like(inner)
    lo = v - touched // 2
    expected[tuple(slice(a, a + touched) for a in lo)] = True
    np.testing.assert_array_equal(inner, expected)


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


def test_conform_grid_is_recorded_exactly(head):
    out = get_stage("resample")(head, spacing=(1.0, 1.0, 1.0), shape=(256, 256, 256))
    metrics = out.record_of("resample").metrics
    assert out.shape == (256, 256, 256) and metrics["shape"] == [256, 256, 256]
    assert metrics["spacing"] == [1.0, 1.0, 1.0] and metrics["grid"] == "spacing"
    np.testing.assert_array_equal(np.asarray(metrics["affine"]), out.affine)
    np.testing.assert_allclose(out.affine[:3, :3], np.eye(3), atol=1e-15)


@pytest.mark.parametrize("mode", ["nearest", "label_linear"])
def test_labels_keep_their_values_through_a_rotation(head, mode):
    moved = rotation((5.0, -7.0, 9.0), (3.0, -2.0, 1.0))
    pending = PendingTransform(moved, head.shape, head.affine)
    out = get_stage("resample")(head.replace(pending=pending), label_interpolation=mode)
    assert out.label.dtype == head.label.dtype
    assert set(np.unique(out.label)) == {0, 1, 2}
    if mode == "label_linear":
        nearest = get_stage("resample")(head.replace(pending=pending)).label
        brain = (nearest > 0) | (out.label > 0)
        assert (nearest == out.label)[brain].mean() > 0.9


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


def test_nan_is_refused_for_bspline_and_masked_for_linear(head):
    data = head.data.copy()
    data[30, 30, 30] = np.nan
    valid = head.valid.copy()
    valid[30, 30, 30] = False
    holed = head.replace(data=data, valid=valid)
    with pytest.raises(StageError, match=r"1 voxel\(s\) are NaN or infinite and B-spline"):
        get_stage("resample")(holed, interpolation="bspline", spacing=(1.5, 1.5, 1.5))
    out = get_stage("resample")(holed, spacing=(1.5, 1.5, 1.5))
    assert np.isfinite(out.data).all()
    with pytest.raises(StageError, match=r"marked valid are NaN or infinite.*'sanitize'"):
        get_stage("resample")(head.replace(data=data), spacing=(1.5, 1.5, 1.5))


def trilinear_reference(volume: Volume, out_shape, out_affine, template_to_subject=None):
    """The resample rule computed the plain way, point by point with scipy: trilinear at
    each output voxel's input position (0 outside), invalid where outside or where the
    invalid voxels' interpolation weight exceeds 1e-6, labels from the nearest voxel."""
    world = np.eye(4) if template_to_subject is None else template_to_subject
    vox_map = np.linalg.inv(volume.affine) @ world @ out_affine
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in out_shape], indexing="ij"))
    coords = np.tensordot(vox_map[:3, :3], ijk, axes=1) + vox_map[:3, 3, None, None, None]
    upper = (np.asarray(volume.shape) - 1)[:, None, None, None]
    inside = np.all((coords >= -1e-6) & (coords <= upper + 1e-6), axis=0)
    clipped = np.clip(coords, 0, upper)
    data = ndimage.map_coordinates(volume.data, clipped, order=1, mode="nearest")
    touched = ndimage.map_coordinates((~volume.valid).astype(np.float32), clipped, order=1,
                                      mode="nearest")
    label = volume.label[tuple(np.rint(clipped).astype(int))]
    return (np.where(inside, data, 0), inside & (touched <= 1e-6),
            np.where(inside, label, 0))


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


def test_an_axis_permuting_transform_is_resampled_axis_by_axis(head):
    # 90 degrees about z maps each output axis onto one input axis (cos 90 = 6e-17 is
    # far below a voxel): the separable path, with the input axes permuted.
    moved = rotation((0.0, 0.0, 90.0), (3.3, -1.7, 2.1))
    out_affine = head.affine.copy()
    out_affine[:3, 3] += (1.0, -3.0, 2.0)
    shape = (100, 90, 95)
    vox_map = np.linalg.inv(head.affine) @ moved @ out_affine
    assert _axis_aligned(vox_map, shape) == (1, 0, 2)
    assert _axis_aligned(np.linalg.inv(head.affine) @ rotation((0, 0, 30), (0, 0, 0))
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


def test_target_grid_covers_the_field_of_view():
    shape, affine = target_grid(np.diag([0.9, 0.9, 5.0, 1.0]), (200, 200, 30), (1, 1, 1))
    assert shape == (180, 180, 150)
    assert affine[2, 3] == pytest.approx((29 * 5.0 - 149) / 2)


def test_bad_parameters_are_refused():
    with pytest.raises(PipelineConfigError, match="spacing must be three positive"):
        get_stage("resample").params_type(spacing=(1.0, 0.0, 1.0))
    with pytest.raises(PipelineConfigError, match="anisotropy_threshold"):
        get_stage("resample").params_type(anisotropy_threshold=0.5)


@pytest.fixture(scope="module")
def conformed_1mm() -> Volume:
    """The 1 mm MNI152 head cropped to an odd shape (every axis of the other parity than
    256), in FastSurfer's LIA order as the reorient stage leaves it, with labels and a
    block of invalid voxels."""
    template = load_template("mni152")
    box = (slice(20, 171), slice(30, 211), slice(10, 181))  # 151 x 181 x 171
    data = template.data[box] * 1000.0
    label = (load_mni152_tissue()["wm"][box] > 0.5).astype(np.int16) * 2
    affine = template.affine.copy()
    affine[:3, 3] += [b.start for b in box]
    valid = np.ones(data.shape, dtype=bool)
    valid[70:75, 80:83, 60] = False
    volume = Volume(data=data, affine=affine, valid=valid, label=label, subject_id="conf")
    return get_stage("reorient")(volume, orientation="LIA")


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


def test_an_output_orientation_reorders_in_the_same_pass(conformed_1mm):
    # The same head stored RAS: resample's orientation gives exactly what reorient to
    # LIA followed by resample gives, without the reorient copy.
    ras = get_stage("reorient")(conformed_1mm, orientation="RAS")
    grid = {"spacing": (1.0, 1.0, 1.0), "shape": (256, 256, 256)}
    direct = get_stage("resample")(ras, orientation="lia", **grid)
    two_steps = get_stage("resample")(conformed_1mm, **grid)
    for name in ("data", "valid", "label", "affine"):
        np.testing.assert_array_equal(getattr(direct, name), getattr(two_steps, name))
    metrics = direct.record_of("resample").metrics
    assert metrics["orientation"] == "LIA"
    assert metrics["kernel"].startswith("exact copy, integer crop/pad")
    assert direct.data.flags.c_contiguous and not np.shares_memory(direct.data, ras.data)


def test_an_output_orientation_is_refused_after_a_registration(head):
    with pytest.raises(PipelineConfigError, match="orientation 'RXS'"):
        get_stage("resample").params_type(orientation="RXS")
    registered = head.replace(pending=PendingTransform(np.eye(4), head.shape, head.affine))
    with pytest.raises(StageError, match="template's grid"):
        get_stage("resample")(registered, orientation="LIA")


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
