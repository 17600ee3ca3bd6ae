"""register across a population: head sizes and proportions, strong receive fields,
skull-stripped inputs, and what the output applies of the fit (rigid, similarity or
affine).

The subjects are the stage tests' synthetic person (not the template) made smaller and
larger, under a 10x receive field, and brain-extracted; the rigid truth of each is the
unvaried person's, so the rotation found must stay the same whatever varies.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import SimpleITK as sitk

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.demo.calibration import person
from mriprep.demo.population import scaled_anatomy, skull_stripped, with_bias
from mriprep.demo.scanner import Acquisition, acquire
from mriprep.stages import get_stage
from mriprep.stages.register import RegisterParams, register_volume
from mriprep.stages.registration.geometry import (
    decompose_linear,
    itk_transform_text,
    target_registration_error,
)
from mriprep.stages.registration.template import template_brain_points
from mriprep.stages.registration.search import rotation_angle_deg

from .conftest import TEST_PERSON
from .test_register import POSE, prepared

# One xdist worker runs the whole module (make test's --dist loadgroup), so that what it
# builds once per process (module fixtures, cached scans) is built once per run.
pytestmark = pytest.mark.xdist_group("register_population")
# Every test that registers a head is the calibration tier (make test-calibration).
calibration = pytest.mark.calibration

# How far apart two registrations of one head in one pose may turn it (degrees): the
# calibration set's consistency is about 0.1 mm over the brain, about 0.05 degrees.
SAME_POSE_DEG = 0.5
# How far apart a whole head and its skull-stripped copy may register (mean mm over the
# template brain): the bound.
STRIPPED_AGREEMENT_MM = 0.15


@functools.lru_cache(maxsize=6)
def _scan(scale: float | tuple[float, float, float] = 1.0):
    anatomy = person(TEST_PERSON)
    if scale != 1.0:
        anatomy = scaled_anatomy(anatomy, scale)
    return acquire(anatomy, POSE, Acquisition(), np.random.default_rng([TEST_PERSON, 5]))


@functools.lru_cache(maxsize=1)
def _reference():
    return register_volume(prepared(_scan()), RegisterParams())


def _own_scale() -> float:
    """The person's own size relative to MNI152 (its warp's per-axis scales)."""
    return float(np.prod(_own_axis_scales()) ** (1 / 3))


def _own_axis_scales() -> np.ndarray:
    """The person's own sizes along MNI152's x, y and z."""
    return np.asarray(person(TEST_PERSON).details["head_scale"], dtype=float)


def _turn_between(a: np.ndarray, b: np.ndarray) -> float:
    return rotation_angle_deg(decompose_linear(a)[0].T @ decompose_linear(b)[0])


@calibration
@pytest.mark.parametrize("scale", [0.82, 1.18])
def test_small_and_large_adult_heads_are_accepted_in_the_same_pose(scale):
    """A rigid fit of a head 18% smaller or larger than the template correlated like a
    failure (similarity 0.25-0.39: 'not a T1'); the fit now estimates the size and the
    output keeps the rigid pose, the one the head had at its own size."""
    out = get_stage("register")(prepared(_scan(scale)), RegisterParams())
    metrics = out.record_of("register").metrics
    assert metrics["similarity"] > 0.6, metrics["similarity"]
    assert metrics["head_scale"] == pytest.approx(scale * _own_scale(), rel=0.04)
    rigid = out.pending.template_to_subject
    np.testing.assert_allclose(rigid[:3, :3] @ rigid[:3, :3].T, np.eye(3), atol=1e-9)
    assert _turn_between(rigid, _reference().template_to_subject) < SAME_POSE_DEG


# A head of other proportions than the template's, along its left-right,
# front-back and up-down axes: long and narrow, as a dolichocephalic adult's.
PROPORTIONS = (0.9, 1.15, 0.88)


@calibration
def test_a_head_of_other_proportions_is_accepted_with_its_sizes_along_each_axis():
    """An isotropic fit of this head correlated like a failure (Colin27 at (0.9, 1.15,
    0.85): similarity 0.31, 'not a T1'); the affine part of the fit measures each
    axis, and the output keeps the rigid pose the head has at its own proportions."""
    out = get_stage("register")(prepared(_scan(PROPORTIONS)), RegisterParams())
    metrics = out.record_of("register").metrics
    assert metrics["similarity"] > 0.6, metrics["similarity"]
    expected = np.sort(np.asarray(PROPORTIONS) * _own_axis_scales())[::-1]
    np.testing.assert_allclose(metrics["head_axis_scales"], expected, rtol=0.04)
    assert metrics["head_scale"] == pytest.approx(np.prod(expected) ** (1 / 3), rel=0.03)
    assert _turn_between(out.pending.template_to_subject,
                         _reference().template_to_subject) < SAME_POSE_DEG


@calibration
def test_slices_declared_too_thin_are_refused_for_the_head_size_along_that_axis():
    """A header that gives the slices 0.6 of their real spacing squashes the head along
    one axis: its isotropic size (measured 0.82x) passes, its size along that axis
    (0.55x) does not."""
    with pytest.raises(StageError) as caught:
        get_stage("register")(prepared(_scan((1.0, 1.0, 0.6))), RegisterParams())
    metrics = caught.value.metrics
    assert metrics["failure"] == "head_size", caught.value.reason
    assert "principal axes" in caught.value.reason
    assert RegisterParams().min_head_scale <= metrics["head_scale"]
    assert min(metrics["head_axis_scales"]) < RegisterParams().min_head_scale


@calibration
def test_a_tenfold_receive_field_is_accepted_in_the_same_pose():
    """An uncorrected surface coil varies about 9x across the head; at 4x the search
    already chose the wrong orientation. N4 on the search level divides it out."""
    scan = with_bias(_scan(), 10.0, np.random.default_rng(3))
    out = get_stage("register")(prepared(scan), RegisterParams())
    metrics = out.record_of("register").metrics
    assert metrics["similarity"] > 0.6, metrics["similarity"]
    assert metrics["bias_ratio"] > 3.0
    assert _reference().details["bias_ratio"] < 2.0
    assert _turn_between(out.pending.template_to_subject,
                         _reference().template_to_subject) < SAME_POSE_DEG


@calibration
def test_a_skull_stripped_input_is_detected_and_reported():
    stripped = register_volume(prepared(skull_stripped(_scan())), RegisterParams())
    assert stripped.details["skull_stripped"] is True
    assert stripped.details["scalp_share"] < 0.2
    whole = _reference()
    assert whole.details["skull_stripped"] is False
    assert whole.details["scalp_share"] > 0.5
    # The same scan in the same pose: the transforms must agree over the brain within
    # the bound (0.55 mm mean on Colin27 before the fit's affine part moved to
    # the brain's interior).
    mean, _ = target_registration_error(stripped.template_to_subject,
                                        whole.template_to_subject,
                                        template_brain_points("mni152", step=4))
    assert mean <= STRIPPED_AGREEMENT_MM, mean


@calibration
def test_the_output_can_bring_the_brain_to_template_size(tmp_path):
    """``transform: similarity`` applies the fit with its scale; the ITK file holds that
    map (an AffineTransform), and the rigid default stays a rotation."""
    small = prepared(_scan(0.85))
    out = get_stage("register")(small, RegisterParams(transform="similarity"))
    metrics = out.record_of("register").metrics
    applied = out.pending.template_to_subject
    _, scale, axes = decompose_linear(applied)
    assert scale == pytest.approx(metrics["head_scale"], abs=1e-4)  # recorded to 4 places
    assert scale == pytest.approx(0.85 * _own_scale(), rel=0.05)
    np.testing.assert_allclose(axes, scale, rtol=1e-6)
    assert metrics["itk_transform"]["type"] == "AffineTransform_double_3_3"
    path = tmp_path / "t.tfm"
    path.write_text(itk_transform_text(applied))
    itk = sitk.ReadTransform(str(path))
    point = np.array([10.0, -20.0, 30.0])  # RAS; ITK works in LPS
    flip = np.array([-1.0, -1.0, 1.0])
    mapped = flip * np.asarray(itk.TransformPoint((flip * point).tolist()))
    np.testing.assert_allclose(mapped, applied[:3, :3] @ point + applied[:3, 3], atol=1e-6)


@calibration
def test_the_output_can_bring_the_brain_to_template_size_and_proportions(tmp_path):
    """``transform: affine`` applies the whole fit: its sizes along each axis are the
    head's, and the ITK file maps points as the matrix does."""
    out = get_stage("register")(prepared(_scan(PROPORTIONS)),
                                RegisterParams(transform="affine"))
    metrics = out.record_of("register").metrics
    applied = out.pending.template_to_subject
    np.testing.assert_allclose(applied, metrics["fitted_template_to_subject"], atol=1e-12)
    np.testing.assert_allclose(decompose_linear(applied)[2], metrics["head_axis_scales"],
                               atol=1e-4)
    assert metrics["itk_transform"]["type"] == "AffineTransform_double_3_3"
    path = tmp_path / "t.tfm"
    path.write_text(itk_transform_text(applied))
    itk = sitk.ReadTransform(str(path))
    point = np.array([-30.0, 12.0, 40.0])  # RAS; ITK works in LPS
    flip = np.array([-1.0, -1.0, 1.0])
    mapped = flip * np.asarray(itk.TransformPoint((flip * point).tolist()))
    np.testing.assert_allclose(mapped, applied[:3, :3] @ point + applied[:3, 3], atol=1e-6)


def test_transform_is_a_checked_parameter():
    with pytest.raises(PipelineConfigError,
                       match="transform must be one of rigid, similarity, affine"):
        RegisterParams(transform="warp")
