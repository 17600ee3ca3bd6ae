"""plausibility: every refusal by name with its measured value, on built and real scans;
good scans of people who are not the template pass; a check set to warn only warns; the
output's head coverage is validate's.

Built scans come from the calibration set's builders (:mod:`mriprep.demo.calibration`),
whose measured ranges set the limits; the real scans are Debian's mricron-data.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.volume import Volume
from mriprep.demo.calibration import (
    ACQUISITIONS,
    crop_of,
    expected_checks,
    noise_scan,
    plausibility_cases,
    real_head,
    slab_of,
)
from mriprep.demo.real_scans import HOW_TO_GET, real_scan
from mriprep.demo.scanner import Acquisition, Scan, acquire, random_pose
from mriprep.pipelines import load_pipeline
from mriprep.pipelines import run_stages
from mriprep.stages import get_stage
from mriprep.stages.plausibility import PlausibilityParams, shear_deg

from .conftest import TEST_PERSON

# One xdist worker runs the whole module (make test's --dist loadgroup), so that what it
# builds once per process (module fixtures, cached scans) is built once per run.
pytestmark = pytest.mark.xdist_group("plausibility")

plausibility = get_stage("plausibility")


def _volume(scan: Scan, sanitized: bool = True) -> Volume:
    volume = Volume.from_array(scan.data, scan.affine, subject_id="s")
    return get_stage("sanitize")(volume) if sanitized else volume


@functools.lru_cache(maxsize=1)
def _good_scan() -> Scan:
    from mriprep.demo.calibration import person

    rng = np.random.default_rng([TEST_PERSON, 3])
    return acquire(person(TEST_PERSON), random_pose(rng, 10.0, 10.0), ACQUISITIONS["1mm"],
                   rng)


def _conform_with_head_size_warned():
    """conform_1mm with the plausibility check head_size only warning."""
    pipeline = load_pipeline("conform_1mm")
    steps = tuple(
        dataclasses.replace(step, params=PlausibilityParams(warn=("head_size",)))
        if step.name == "plausibility" else step for step in pipeline.steps)
    return dataclasses.replace(pipeline, steps=steps)


def _refusal(scan: Scan, sanitized: bool = True) -> StageError:
    with pytest.raises(StageError) as info:
        plausibility(_volume(scan, sanitized))
    assert info.value.stage == "plausibility"
    return info.value


def test_a_good_head_of_another_person_passes_with_every_measure_reported():
    out = plausibility(_volume(_good_scan()))
    metrics = out.record_of("plausibility").metrics
    assert metrics["failed_checks"] == metrics["warned_checks"] == []
    assert metrics["voxel_size_mm"] == [1.0, 1.0, 1.0] and metrics["shear_deg"] < 1e-4
    assert 0.6 < metrics["large_scale_share"] and 0.4 < metrics["background_share"] < 0.7
    assert 180 < metrics["head_length_mm"] < 320 and min(metrics["head_extents_mm"]) > 140
    np.testing.assert_array_equal(out.data, _volume(_good_scan()).data)  # unchanged


@pytest.mark.calibration  # the calibration set's built failures: another person, seconds each
@pytest.mark.parametrize("case", plausibility_cases(), ids=lambda c: c.name)
def test_each_built_failure_is_refused_naming_its_check_and_value(case):
    expected = {"shear": "sheared", "voxel_size": "voxel size", "no_head": "no head",
                "field_of_view": "no head"}[case.kind]
    # sanitize refuses a blank (constant) volume itself; plausibility must too.
    error = _refusal(case.build(), sanitized=case.name != "blank")
    assert set(error.metrics["failed_checks"]) & expected_checks(case)
    assert expected in error.reason
    if case.kind == "shear":
        assert f"{error.metrics['shear_deg']:.2f} degrees" in error.reason


def test_noise_a_slab_and_a_small_head_are_refused():
    assert "no head" in _refusal(noise_scan([0, 70])).reason
    slab = _refusal(slab_of(_good_scan, 0.5, 40.0))
    assert slab.metrics["failed_checks"] == ["head_size"]
    assert "thinnest direction" in slab.reason and "at least 110" in slab.reason
    crop = _refusal(crop_of(_good_scan, 64.0))
    assert "no_head" in crop.metrics["failed_checks"], crop.metrics["failed_checks"]


def test_shear_is_measured_between_voxel_axes_in_degrees():
    affine = np.diag([0.9, 0.9, 5.0, 1.0])
    assert shear_deg(affine) == 0.0
    affine[1, 2] = 5.0 * np.tan(np.radians(2.0))
    assert shear_deg(affine) == pytest.approx(2.0, abs=1e-9)


def test_a_check_set_to_warn_warns_and_the_others_still_fail():
    scan = slab_of(_good_scan, 0.5, 40.0)
    out = plausibility(_volume(scan), warn=("head_size",))
    record = out.record_of("plausibility")
    assert record.metrics["warned_checks"] == ["head_size"]
    assert any(w.startswith("head_size: ") for w in record.warnings)
    with pytest.raises(PipelineConfigError, match="unknown check"):
        PlausibilityParams(warn=("head_sise",))


def test_a_head_covering_too_little_of_the_conform_grid_fails_validate():
    """The left 25 mm of a head passes plausibility when head_size only warns, and
    covers far too little of the 256^3 grid for validate."""
    scan = _good_scan()
    thin = Scan(scan.data[:25].copy(), None, scan.affine, scan.pose, None)
    warned = _conform_with_head_size_warned()
    with pytest.raises(StageError, match=r"head coverage: the head covers \d\.\d%") as info:
        run_stages(Volume.from_array(thin.data, thin.affine, subject_id="thin"), warned)
    assert info.value.stage == "validate" and info.value.metrics["head_coverage"] < 0.05


@pytest.mark.skipif(real_scan("macaque") is None, reason=HOW_TO_GET)
def test_a_real_macaque_brain_is_refused_as_head_size_and_real_colin27_passes():
    macaque = real_head("macaque")
    rng = np.random.default_rng(5)
    scan = acquire(macaque, np.eye(4), Acquisition((0.5, 0.5, 0.5)), rng)
    error = _refusal(scan)
    assert "head_size" in error.metrics["failed_checks"]
    assert "mm long" in error.reason and error.metrics["head_length_mm"] < 100
    colin = real_head("colin27")
    out = plausibility(_volume(acquire(colin, np.eye(4), ACQUISITIONS["ax5_chin"], rng)))
    assert out.record_of("plausibility").metrics["failed_checks"] == []


@pytest.mark.skipif(real_scan("colin27") is None, reason=HOW_TO_GET)
@pytest.mark.parametrize("damage", ["sheared_10deg", "voxels_in_cm", "crop64"])
def test_each_refusal_holds_on_the_real_colin27_file(damage):
    """The real file as Debian ships it, its header or its field of view damaged as the
    built failures are."""
    import nibabel as nib

    from mriprep.demo.calibration import wrong_header

    img = nib.load(real_scan("colin27"))
    stored = Scan(np.asarray(img.dataobj, dtype=np.float32), None, img.affine, np.eye(4),
                  None)
    assert plausibility(_volume(stored)).record_of("plausibility").metrics[
        "failed_checks"] == []
    if damage == "sheared_10deg":
        shear = np.eye(4)
        shear[0, 1] = np.tan(np.radians(10.0))
        error, check = _refusal(wrong_header(lambda: stored, shear)), "shear"
    elif damage == "voxels_in_cm":
        error = _refusal(wrong_header(lambda: stored, np.diag([10.0, 10.0, 10.0, 1.0])))
        check = "voxel_size"
    else:
        error, check = _refusal(crop_of(lambda: stored, 64.0)), "no_head"
    assert check in error.metrics["failed_checks"]


@pytest.mark.skipif(real_scan("macaque") is None, reason=HOW_TO_GET)
def test_the_real_macaque_covers_too_little_of_the_conform_grid():
    """With head_size only warning, the macaque brain as stored reaches validate, which
    refuses it for covering under 1% of the 256^3 grid."""
    import nibabel as nib

    img = nib.load(real_scan("macaque"))
    volume = Volume.from_array(np.asarray(img.dataobj, dtype=np.float32), img.affine,
                               subject_id="macaque")
    with pytest.raises(StageError, match="head coverage") as info:
        run_stages(volume, _conform_with_head_size_warned())
    assert info.value.stage == "validate" and info.value.metrics["head_coverage"] < 0.01
