"""register across a population: head sizes, strong receive fields, skull-stripped
inputs, and what the output applies of the fit (rigid or similarity).

The subjects are the stage tests' synthetic person (not the template) made smaller and
larger, under a 10x receive field, and brain-extracted; the rigid truth of each is the
unvaried person's, so the rotation found must stay the same whatever varies.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import SimpleITK as sitk

from mriprep.core.errors import PipelineConfigError
from mriprep.demo.calibration import person
from mriprep.demo.population import scaled_anatomy, skull_stripped, with_bias
from mriprep.demo.scanner import Acquisition, acquire
from mriprep.stages import get_stage
from mriprep.stages.register import RegisterParams, register_volume
from mriprep.stages.registration.geometry import decompose_linear, itk_transform_text
from mriprep.stages.registration.search import rotation_angle_deg

from .conftest import TEST_PERSON
from .test_register import POSE, prepared

# How far apart two registrations of one head in one pose may turn it (degrees): the
# calibration set's consistency is about 0.1 mm over the brain, about 0.05 degrees.
SAME_POSE_DEG = 0.5


@functools.lru_cache(maxsize=4)
def _scan(scale: float = 1.0):
    anatomy = person(TEST_PERSON)
    if scale != 1.0:
        anatomy = scaled_anatomy(anatomy, scale)
    return acquire(anatomy, POSE, Acquisition(), np.random.default_rng([TEST_PERSON, 5]))


@functools.lru_cache(maxsize=1)
def _reference():
    return register_volume(prepared(_scan()), RegisterParams())


def _own_scale() -> float:
    """The person's own size relative to MNI152 (its warp's per-axis scales)."""
    return float(np.prod(person(TEST_PERSON).details["head_scale"]) ** (1 / 3))


def _turn_between(a: np.ndarray, b: np.ndarray) -> float:
    return rotation_angle_deg(decompose_linear(a)[0].T @ decompose_linear(b)[0])


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


def test_a_skull_stripped_input_is_detected_and_reported():
    stripped = register_volume(prepared(skull_stripped(_scan())), RegisterParams())
    assert stripped.details["skull_stripped"] is True
    assert stripped.details["scalp_share"] < 0.2
    whole = _reference()
    assert whole.details["skull_stripped"] is False
    assert whole.details["scalp_share"] > 0.5
    assert _turn_between(stripped.template_to_subject, whole.template_to_subject) < 1.0


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


def test_transform_is_a_checked_parameter():
    with pytest.raises(PipelineConfigError, match="transform must be rigid or similarity"):
        RegisterParams(transform="warp")
