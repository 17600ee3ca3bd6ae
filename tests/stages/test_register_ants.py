"""register's ants backend: on one coarse level it lands where the sitk backend lands;
on the demo cohort's thick grids, on the truth and bit for bit the same when run again
(the calibration tier; the sitk backend: tests/stages/test_register.py)."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.demo.verify import TRUTH_MAX_LIMIT_MM, TRUTH_MEAN_LIMIT_MM
from mriprep.stages import get_stage
from mriprep.stages.register import RegisterParams, register_volume
from mriprep.stages.registration.geometry import target_registration_error
from mriprep.stages.registration.template import template_brain_points


@pytest.fixture(scope="module")
def brain_points():
    return template_brain_points("mni152")


def _demo_scan_before_register(demo_cohort, name: str):
    from mriprep.inputs.readers import load_volume

    volume = load_volume(demo_cohort.image_path(name), subject_id=name)
    for stage in ("reorient", "sanitize", "mask_slices"):
        volume = get_stage(stage)(volume)
    return volume


def test_on_one_coarse_level_the_ants_backend_lands_where_the_sitk_backend_lands(
        head_builder, brain_points):
    """Both backends from the same search start, on one 6 mm level (ANTs: 2 CPU-seconds):
    two implementations of the same fit, so the ants backend's command, log and transform
    conversions are checked without a full registration."""
    volume = get_stage("sanitize")(head_builder((2.0, 2.0, 2.0), seed=4))
    found = {backend: register_volume(volume, RegisterParams(
        backend=backend, level_spacings_mm=(6.0, 6.0, 6.0))) for backend in ("sitk", "ants")}
    ants = found["ants"]
    assert len(ants.iterations) == 2 and all(n >= 1 for n in ants.iterations)  # Rigid, Affine
    assert np.isfinite(ants.metric_value) and ants.details["ants_threads"] >= 1
    assert abs(ants.similarity - found["sitk"].similarity) < 0.02
    mean_mm, worst_mm = target_registration_error(
        ants.template_to_subject, found["sitk"].template_to_subject, brain_points)
    assert mean_mm < 0.5 and worst_mm < 1.0, (mean_mm, worst_mm)


@pytest.mark.calibration
@pytest.mark.slow
def test_the_ants_backend_lands_on_the_truth_on_the_demo_grids_and_repeats_bit_for_bit(
        demo_cohort, brain_points):
    """The sitk backend is scored on every demo scan by the demo run's referee
    (tests/test_demo_verify.py); the ants backend here on the two thick grids that differ
    most from a 1 mm scan: oblique 5 mm axial, and 5 mm coronal stored backwards, the
    first of them twice. (Each ANTs run costs about 10 s; ``make bench`` registration
    compares the backends on every grid.)"""
    volumes = {name: _demo_scan_before_register(demo_cohort, name)
               for name in ("sub-06", "sub-08")}
    results = {name: register_volume(volume, RegisterParams(backend="ants"))
               for name, volume in volumes.items()}
    errors = {}
    for name, result in results.items():
        # The Rigid stage on the 4 and 2 mm levels, then the Affine stage on both.
        assert len(result.iterations) == 4 and all(n >= 1 for n in result.iterations)
        assert np.isfinite(result.metric_value) and 0.45 < result.similarity < 0.9
        errors[name] = target_registration_error(
            result.template_to_subject,
            np.asarray(demo_cohort.subjects[name]["template_to_subject"]), brain_points)
    too_far = {s: e for s, e in errors.items()
               if e[0] > TRUTH_MEAN_LIMIT_MM or e[1] > TRUTH_MAX_LIMIT_MM}
    assert not too_far, too_far
    if results["sub-06"].details["ants_threads"] != 1:
        pytest.skip("ANTs was loaded with more than one thread: its Mattes MI sums in "
                    "thread-arrival order (see mriprep.stages.register)")
    again = register_volume(volumes["sub-06"], RegisterParams(backend="ants"))
    np.testing.assert_array_equal(results["sub-06"].template_to_subject,
                                  again.template_to_subject)
