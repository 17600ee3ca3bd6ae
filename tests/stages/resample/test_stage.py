"""resample, the stage: exactness, accuracy against analytic ground truth, conservative
validity, labels, parameters and the output orientation."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.volume import PendingTransform
from mriprep.stages import get_stage
from mriprep.stages.registration.geometry import rigid_matrix as rotation
from tests.stages.resample.reference import ANALYTIC_BOUND, analytic, world_of


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


def test_bad_parameters_are_refused():
    with pytest.raises(PipelineConfigError, match="spacing must be three positive"):
        get_stage("resample").params_type(spacing=(1.0, 0.0, 1.0))
    with pytest.raises(PipelineConfigError, match="anisotropy_threshold"):
        get_stage("resample").params_type(anisotropy_threshold=0.5)


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
