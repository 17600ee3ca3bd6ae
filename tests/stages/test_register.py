"""register: accuracy on people who are not the template, determinism, masks, and
every kind of failure it must refuse, with the cause it must name.

Subjects are synthetic people (MNI152 warped nonlinearly, rescaled, recontrasted, with
scalp and neck; :mod:`mriprep.demo.anatomy`) scanned in known poses on 1 mm and thick
grids with a bias field and Rician noise. Accuracy is measured two ways over the
template's brain voxels: consistency (one person in two poses: the second transform
predicted from the first through the known motion, where the warp cancels) and against
the known rigid part of the person's warp (ambiguous by about a millimetre).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import SimpleITK as sitk

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.volume import Volume
from mriprep.demo.calibration import HEADER_ERRORS, person, slab_of, wrong_header
from mriprep.demo.scanner import Acquisition, Scan, acquire
from mriprep.demo.verify import (
    CONSISTENCY_MAX_LIMIT_MM,
    CONSISTENCY_MEAN_LIMIT_MM,
    TRUTH_MAX_LIMIT_MM,
    TRUTH_MEAN_LIMIT_MM,
)
from mriprep.inputs.templates import load_template
from mriprep.stages import get_stage
from mriprep.stages.register import RegisterParams, register_volume
from mriprep.stages.registration.geometry import (
    RAS_TO_LPS,
    matrix_from_sitk,
    target_registration_error,
    to_sitk_transform,
)
from mriprep.stages.registration.geometry import rigid_matrix as rigid
from mriprep.stages.registration.template import template_brain_points

from .conftest import TEST_PERSON

# One xdist worker runs the whole module (make test's --dist loadgroup), so that what it
# builds once per process (module fixtures, cached scans) is built once per run.
pytestmark = pytest.mark.xdist_group("register")
# The tests that register whole heads are the calibration tier (make test-calibration):
# the demo run of `make test` registers twelve scans of other people against their truth.
calibration = pytest.mark.calibration

POSE = rigid((7.0, -5.0, 8.0), (6.0, -8.0, 4.0))
SECOND_POSE = rigid((-6.0, 4.0, -12.0), (-5.0, 7.0, -3.0))


def scan_of(anatomy, pose=POSE, acquisition=Acquisition(), seed=0) -> Scan:
    return acquire(anatomy, pose, acquisition, np.random.default_rng([TEST_PERSON, seed]))


def prepared(scan: Scan, name="test-person") -> Volume:
    """What the default pipeline hands to register: reoriented, sanitized."""
    volume = Volume.from_array(scan.data, scan.affine, subject_id=name)
    return get_stage("sanitize")(get_stage("reorient")(volume))


@functools.lru_cache(maxsize=1)
def _test_person():
    return person(TEST_PERSON)


@pytest.fixture(scope="module")
def brain_points():
    return template_brain_points("mni152")


@pytest.fixture(scope="module")
def scan():
    return scan_of(_test_person())


@pytest.fixture(scope="module")
def subject(scan):
    return prepared(scan)


@pytest.fixture(scope="module")
def registered(subject):
    """The subject after the register stage (default parameters: sitk, 1 thread)."""
    return get_stage("register")(subject)


def _within_truth(estimated, truth, points):
    mean, worst = target_registration_error(estimated, truth, points)
    assert mean <= TRUTH_MEAN_LIMIT_MM and worst <= TRUTH_MAX_LIMIT_MM, (mean, worst)


@calibration
def test_registration_of_another_person_lands_on_the_known_rigid_truth(
        scan, registered, brain_points):
    _within_truth(registered.pending.template_to_subject, scan.template_to_subject,
                  brain_points)


@calibration
def test_two_poses_of_one_person_register_consistently_with_the_known_motion(
        scan, registered, brain_points):
    """A thick oblique scan of the same person in another pose: its transform agrees
    with the first one moved by the known motion (the warp's ambiguity cancels)."""
    thick = scan_of(_test_person(), SECOND_POSE,
                    Acquisition((1.0, 1.0, 4.0), "axial", tilt_deg=15.0), seed=1)
    second = register_volume(prepared(thick), RegisterParams()).template_to_subject
    motion = SECOND_POSE @ np.linalg.inv(POSE)
    predicted = motion @ registered.pending.template_to_subject
    mean, worst = target_registration_error(second, predicted, brain_points)
    assert mean <= CONSISTENCY_MEAN_LIMIT_MM and worst <= CONSISTENCY_MAX_LIMIT_MM, (
        mean, worst)
    _within_truth(second, thick.template_to_subject, brain_points)


@calibration
def test_stage_hands_the_transform_to_resample_and_records_it(subject, registered):
    template = load_template("mni152")
    assert registered.data is subject.data  # registration never resamples
    assert registered.pending.target_shape == template.shape
    np.testing.assert_array_equal(registered.pending.target_affine, template.affine)
    metrics = registered.record_of("register").metrics
    np.testing.assert_array_equal(
        np.asarray(metrics["template_to_subject"]), registered.pending.template_to_subject
    )
    # The fit (pose, size and shape) on the 4 and 2 mm levels.
    assert metrics["stop_condition"] and len(metrics["iterations"]) == 2
    assert all(n >= 1 for n in metrics["iterations"])
    assert np.isfinite(metrics["metric_value"]) and metrics["metric_value"] < 0
    # Another person scores well below a copy of the template (0.94-0.99), above the
    # failures (<= 0.17 on the calibration set).
    assert 0.45 < metrics["similarity"] < 0.9 and metrics["seconds"] > 0
    assert 150 < metrics["head_length_mm"] < 450
    assert metrics["search_best_ncc"] > 0.5 and metrics["rotation_deg"] < 45
    # The recorded ITK parameters rebuild the same transform (what a .tfm file holds).
    euler = sitk.Euler3DTransform()
    euler.SetFixedParameters(metrics["itk_transform"]["fixed_parameters"])
    euler.SetParameters(metrics["itk_transform"]["parameters"])
    np.testing.assert_allclose(
        matrix_from_sitk(euler), registered.pending.template_to_subject, atol=1e-9
    )


@calibration
def test_same_seed_and_threads_give_bit_identical_transforms(subject, registered):
    again = register_volume(subject, RegisterParams())
    first = registered.record_of("register").metrics
    np.testing.assert_array_equal(again.template_to_subject,
                                  registered.pending.template_to_subject)
    assert list(again.itk_parameters) == first["itk_transform"]["parameters"]
    assert list(again.iterations) == first["iterations"]


@calibration
def test_invalid_voxels_do_not_pull_the_registration(subject, brain_points):
    """A 20 mm slab of slices moved by 12 mm and 2.5x brighter (motion and a gain jump
    during part of the acquisition): marked invalid, it changes nothing, bit for bit,
    against the same mask over clean data; left valid, it drags the result away.

    (The reference is the masked clean scan, not the unmasked one: on a person who is
    not the template, the rigid optimum depends on which part of the brain is seen.)
    """
    inside = np.argwhere(subject.data > 300)
    start = int(np.median(inside[:, 2]))
    slab = (slice(None), slice(None), slice(start, start + 20))
    valid = np.ones(subject.shape, dtype=bool)
    valid[slab] = False
    corrupted = subject.data.copy()
    corrupted[slab] = np.roll(subject.data, 12, axis=1)[slab] * np.float32(2.5)
    reference = register_volume(subject.replace(valid=valid), RegisterParams())
    masked = register_volume(subject.replace(data=corrupted, valid=valid), RegisterParams())
    unmasked = register_volume(subject.replace(data=corrupted), RegisterParams())
    np.testing.assert_array_equal(masked.template_to_subject, reference.template_to_subject)
    moved = target_registration_error(unmasked.template_to_subject,
                                      reference.template_to_subject, brain_points)
    assert moved[0] > 1.0, moved


def _refusal(volume: Volume) -> StageError:
    with pytest.raises(StageError) as caught:
        get_stage("register")(volume)
    error = caught.value
    assert error.stage == "register" and error.subject == volume.subject_id
    return error


@calibration
@pytest.mark.parametrize("header_error", ["rot90_lr", "rot180_si", "flip_ap", "permuted"])
def test_a_wrong_header_orientation_is_refused_and_named(scan, header_error):
    """Quarter and half turns, a front-back flip, permuted axes: each registers well
    only when turned, so the stage names the header, not the anatomy."""
    wrong = wrong_header(lambda: scan, HEADER_ERRORS[header_error])
    error = _refusal(prepared(wrong, "wrong-header"))
    assert error.metrics["failure"] == "orientation", error.reason
    assert "header orientation is wrong" in str(error)
    assert "The directions the header calls R, A, S point" in str(error)
    # The failed subject keeps its register metrics for the report.
    assert error.metrics["rotation_deg"] > 45 and error.metrics["similarity"] > 0.45


@calibration
def test_a_partial_field_of_view_is_refused_as_such(scan):
    slab = slab_of(lambda: scan, 0.5, 40.0)
    error = _refusal(prepared(slab, "slab"))
    assert error.metrics["failure"] == "field_of_view", error.reason
    assert "covers only part of the brain" in str(error)


@calibration
def test_noise_without_a_head_is_refused_as_no_brain():
    rng = np.random.default_rng(3)
    shape = (120, 140, 120)
    noise = np.hypot(rng.normal(0, 15, shape), rng.normal(0, 15, shape)).astype(np.float32)
    affine = np.diag([1.5, 1.5, 1.5, 1.0])
    affine[:3, 3] = -0.75 * np.asarray(shape)
    error = _refusal(prepared(Scan(noise, None, affine, np.eye(4), None), "noise"))
    assert error.metrics["failure"] == "no_brain", error.reason
    assert "header" not in str(error)


@calibration
def test_a_head_of_another_species_size_is_refused_as_head_size():
    """A head shrunk to 0.45 keeps its neck (about 136 mm long) but is shorter than a
    small adult's brain alone (about 150 mm): its length names it."""
    from mriprep.demo.population import scaled_anatomy

    # A macaque brain is ~0.45 of ours. The test person made smaller, not another person:
    # one build fewer per test run.
    small = scaled_anatomy(_test_person(), 0.45, name="small-head")
    error = _refusal(prepared(scan_of(small), "small-head"))
    assert error.metrics["failure"] == "head_size", error.reason
    assert error.metrics["head_length_mm"] < RegisterParams().min_head_length_mm
    assert "outside the human range 142-450 mm" in str(error)


@calibration
def test_a_t2_contrast_is_refused_without_blaming_the_header():
    t2 = person(TEST_PERSON + 2, contrast="t2")
    error = _refusal(prepared(scan_of(t2), "t2-head"))
    assert error.metrics["failure"] == "not_t1", error.reason
    assert "T2" in str(error) and "header" not in str(error)


def test_left_right_flip_is_undetectable_with_the_symmetric_template():
    # Why the failure test above flips front-back: nilearn's MNI152 2009 template is its
    # own mirror image, so a left-right flipped head matches it exactly as well.
    template = load_template("mni152")
    np.testing.assert_array_equal(template.data, template.data[::-1])
    centre_x = template.affine[0, 3] + template.affine[0, 0] * (template.shape[0] - 1) / 2
    assert centre_x == 0.0


def test_non_finite_input_is_refused(subject):
    data = subject.data.copy()
    data[80, 100, 90] = np.nan
    with pytest.raises(StageError, match=r"1 voxel\(s\) are NaN or infinite.*'sanitize'"):
        get_stage("register")(subject.replace(data=data))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"seed": 0}, "seed must be at least 1"),
        ({"level_spacings_mm": (2.0, 4.0, 4.0)}, "from coarse to fine"),
        ({"sampling_fraction": 0.0}, r"sampling_fraction must lie in \(0, 1\]"),
        ({"min_similarity": 2.0}, r"must lie in \[0, 1\]"),
    ],
)
def test_bad_parameters_are_refused(changes, message):
    with pytest.raises(PipelineConfigError, match=message):
        RegisterParams(**changes)


def test_itk_transform_maps_points_like_the_ras_matrix(tmp_path):
    matrix = rigid((12.0, -3.0, 25.0), (4.0, 11.0, -7.0))
    path = str(tmp_path / "transform.tfm")
    sitk.WriteTransform(to_sitk_transform(matrix), path)
    transform = sitk.ReadTransform(path)
    flip = RAS_TO_LPS[:3, :3]  # RAS <-> LPS for points
    rng = np.random.default_rng(0)
    for point in rng.uniform(-80, 80, size=(5, 3)):
        expected = matrix[:3, :3] @ point + matrix[:3, 3]
        moved = np.asarray(transform.TransformPoint((flip @ point).tolist()))
        np.testing.assert_allclose(flip @ moved, expected, atol=1e-9)


def _result(similarity: float, wide: bool = False):
    """A registration result that the checks judge on its similarity alone."""
    from mriprep.stages.registration.params import RegistrationResult

    return RegistrationResult(
        template_to_subject=np.eye(4), fitted=np.eye(4), head_scale=1.0,
        head_axis_scales=(1.0, 1.0, 1.0), itk_type="Euler3DTransform_double_3_3",
        itk_parameters=(0.0,) * 6, itk_fixed_parameters=(0.0,) * 3, metric_value=-0.5,
        stop_condition="converged", iterations=(10, 10), similarity=similarity,
        overlap=1.0, seconds=1.0, backend="sitk", level_spacings_mm=(4.0, 2.0),
        details={"head_length_mm": 190.0, "search_best_ncc": 0.7,
                 "search_orientations": 24, "wide": wide})


@pytest.fixture
def tiny_volume():
    return Volume.from_array(np.ones((8, 8, 8), np.float32), np.eye(4), subject_id="tiny")


@pytest.mark.parametrize("retry_similarity, accepted", [(0.7, True), (0.2, False)])
def test_a_refusal_first_retries_a_wider_search_and_says_so(monkeypatch, tiny_volume,
                                                            retry_similarity, accepted):
    """A fit in the wrong basin (the similarity a failure would have) is retried with the
    wide search before the scan is refused; the retry is recorded, and an acceptance after
    it is a warning, so that nobody misses it."""
    import mriprep.stages.register as register_module

    calls = []

    def fake(volume, params, wide=False):
        calls.append(wide)
        return _result(retry_similarity if wide else 0.1, wide)

    monkeypatch.setattr(register_module, "register_volume", fake)
    if accepted:
        out = get_stage("register")(tiny_volume)
        metrics = out.record_of("register").metrics
        warnings = out.record_of("register").warnings
        assert metrics["search_retried"] is True and metrics["first_failure"] == "not_t1"
        assert metrics["wide"] is True and "a wider search" in warnings[0]
    else:
        error = _refusal(tiny_volume)
        assert error.metrics["failure"] == "not_t1"
        assert error.metrics["search_retried"] is True and error.metrics["wide"] is True
    assert calls == [False, True]


def test_a_scan_that_passes_is_not_retried(monkeypatch, tiny_volume):
    import mriprep.stages.register as register_module

    calls = []
    monkeypatch.setattr(register_module, "register_volume",
                        lambda volume, params, wide=False: calls.append(wide) or _result(0.7))
    metrics = get_stage("register")(tiny_volume).record_of("register").metrics
    assert calls == [False] and "search_retried" not in metrics


@pytest.mark.parametrize("details, failure", [
    ({"head_length_mm": 90.0, "head_extents_mm": [90.0, 70.0, 60.0]}, "head_size"),
    ({"search_orientations": 0}, "field_of_view")])
def test_a_refusal_measured_before_the_fit_is_not_retried(monkeypatch, tiny_volume, details,
                                                          failure):
    """A head too short, or a field of view that no orientation fits, is measured before
    any fit: a wider search would find it the same, so the scan is refused at once."""
    import dataclasses

    import mriprep.stages.register as register_module

    calls = []

    def fake(volume, params, wide=False):
        calls.append(wide)
        result = _result(0.7, wide)
        return dataclasses.replace(result, details={**result.details, **details})

    monkeypatch.setattr(register_module, "register_volume", fake)
    error = _refusal(tiny_volume)
    assert error.metrics["failure"] == failure, error.reason
    assert calls == [False] and "search_retried" not in error.metrics


# --- the finest level is flattened within the brain the coarse fit places ----------------

def _blob_level(spacing: float, shift_mm: float = 0.0):
    """A smooth, asymmetric blob in a 64 mm cube centred on the origin, sampled at
    ``spacing``, moved ``shift_mm`` along the first axis."""
    from mriprep.stages.registration.pyramid import Level

    n = int(round(64 / spacing))
    axis = (np.arange(n) - (n - 1) / 2) * spacing
    x, y, z = np.meshgrid(axis - shift_mm, axis, axis, indexing="ij")
    data = (np.exp(-(x**2 / 300 + y**2 / 150 + z**2 / 80))
            + 0.5 * np.exp(-((x - 8)**2 + (y + 6)**2 + z**2) / 40)).astype(np.float32)
    affine = np.diag([spacing] * 3 + [1.0])
    affine[:3, 3] = -(n - 1) / 2 * spacing
    return Level(data, affine, np.ones(data.shape, bool), spacing)


def test_the_finest_level_is_asked_for_once_with_the_coarse_levels_fit():
    from mriprep.stages.registration.sitk_backend import register_sitk

    params = RegisterParams(sampling_fraction=0.5, fine_sampling_fraction=0.5)
    fixed = (_blob_level(4.0), _blob_level(2.0))
    moving = [_blob_level(4.0, 3.0), _blob_level(2.0, 3.0)]
    centre = np.zeros(3)
    asked = []

    def finest(fit_lps):
        asked.append(fit_lps)
        return moving[-1]

    register_sitk(fixed, moving, fixed, np.eye(4), centre, params, finest)
    coarse = register_sitk(fixed[:1], moving[:1], fixed[:1], np.eye(4), centre, params)
    assert len(asked) == 1
    np.testing.assert_allclose(asked[0], coarse.transform_lps, atol=1e-9)
    # One level: nothing coarser to place the brain, so nothing is asked.
    asked.clear()
    register_sitk(fixed[1:], moving[1:], fixed[1:], np.eye(4), centre, params, finest)
    assert not asked


def test_the_coarse_levels_then_the_finest_alone_fit_as_every_level_at_once():
    """The wide retry chooses its start after the coarser levels and fits the finest one
    in a second call: for the SimpleITK backend that is the fit of every level from the
    chosen start, to the bit, each level at its own sampling share."""
    from mriprep.stages.registration.sitk_backend import register_sitk

    params = RegisterParams(sampling_fraction=0.3, fine_sampling_fraction=1.0)
    assert params.levels == (4.0, 2.0)
    fixed = (_blob_level(4.0), _blob_level(2.0))
    moving = [_blob_level(4.0, 3.0), _blob_level(2.0, 3.0)]
    centre = np.zeros(3)
    start = rigid((4.0, -2.0, 3.0), (1.0, 2.0, -1.0))
    whole = register_sitk(fixed, moving, fixed, start, centre, params, lambda _: moving[-1])
    coarse = register_sitk(fixed[:1], moving[:1], fixed[:1], start, centre, params)
    finest = register_sitk(fixed[1:], moving[1:], fixed[1:], coarse.transform_lps, centre,
                           params)
    np.testing.assert_array_equal(finest.transform_lps, whole.transform_lps)
    assert coarse.iterations + finest.iterations == whole.iterations


def test_the_wide_retry_fits_the_finest_level_from_the_best_coarse_start_only(monkeypatch):
    from mriprep.stages import register as register_module
    from mriprep.stages.registration.backend import BackendResult

    calls = []

    def backend(fixed, moving, shape_fixed, initial_lps, centre_lps, params,
                finest_moving=None):
        calls.append((fixed, moving, initial_lps[0, 3]))
        return BackendResult(initial_lps + 0.0, -0.5, "done", [len(fixed)],
                             {"stop_conditions": ["done"], "level_seconds": [0.1]})

    # Start n correlates n-th best: start 2 (x = 2 mm) is the best.
    scores = {0.0: 0.3, 1.0: np.nan, 2.0: 0.7, 3.0: 0.5}
    monkeypatch.setattr(register_module, "template_similarity",
                        lambda fixed, brain, moving, fit: scores[fit[0, 3]])
    monkeypatch.setattr(register_module, "ras_to_lps", lambda m: m)
    starts = []
    for x in scores:
        start = np.eye(4)
        start[0, 3] = x
        starts.append(start)
    levels = ("4 mm", "2 mm")
    found, similarities = register_module._best_start_then_finest(
        backend, levels, levels, list(levels), levels, starts, np.zeros(3),
        RegisterParams(), lambda fit: f"2 mm within the brain placed at x = {fit[0, 3]}")
    assert similarities == [0.3, None, 0.7, 0.5]
    # Every start on the coarse level, then the finest from the best one alone, on the
    # level flattened within the brain that the best coarse fit places.
    coarse = [(("4 mm",), ["4 mm"], x) for x in scores]
    assert calls == coarse + [(("2 mm",), ["2 mm within the brain placed at x = 2.0"], 2.0)]
    assert found.iterations == [1, 1] and found.details["level_seconds"] == [0.1, 0.1]


def test_the_brain_region_is_placed_by_the_fit_in_ras(monkeypatch):
    from mriprep.stages import register as register_module
    from mriprep.stages.registration.geometry import ras_to_lps

    placed = []

    def region(level, template_to_subject, *args):
        placed.append(template_to_subject)
        return np.ones(level.data.shape, bool)

    monkeypatch.setattr(register_module, "template_brain_region", region)
    fit_lps = rigid((5.0, -3.0, 10.0), (12.0, -4.0, 7.0))
    level = _blob_level(2.0)
    flattening = register_module._BrainFlattening(level, RegisterParams())
    out = flattening(fit_lps)
    np.testing.assert_allclose(placed[0], ras_to_lps(fit_lps))
    assert out.data.shape == level.data.shape and not np.array_equal(out.data, level.data)
    assert flattening.region == "brain"


def test_a_brain_placed_off_the_scan_falls_back_to_the_whole_head_and_says_so(monkeypatch):
    from mriprep.stages import register as register_module

    monkeypatch.setattr(register_module, "template_brain_region",
                        lambda level, *args: np.zeros(level.data.shape, bool))
    level = _blob_level(2.0)
    flattening = register_module._BrainFlattening(level, RegisterParams())
    assert flattening.region is None  # not asked yet
    out = flattening(np.eye(4))
    whole_head = register_module.flattened([level], RegisterParams().bias_sigma_mm)[0]
    np.testing.assert_array_equal(out.data, whole_head.data)
    assert flattening.region == "whole head"
