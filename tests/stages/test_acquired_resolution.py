"""acquired_resolution: a scan written finer than it was acquired is found on the axes
that are, with the factor of its interpolation, and a genuine scan is left alone;
zero-filled slices, invalid voxels and 8-bit storage do not move the verdict; the
plausibility stage reports the measure and warns; on the frozen held-out set every
falsely fine scan is flagged and no genuine one (calibration tier).

The fast tests use phantoms: tissue classes cut from a smooth random field (edges as
sharp as the grid, as an acquisition's are) inside an ellipsoid, with white noise, made
on the grid they claim (genuine) or on a coarser one and written finer by
:func:`mriprep.demo.resolution_sets.written_finer` (falsely fine).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from scipy import ndimage

from mriprep.core.errors import StageError
from mriprep.core.volume import Volume
from mriprep.demo.real_scans import HOW_TO_GET
from mriprep.demo.resolution_sets import missing_sources, set_cases, written_finer
from mriprep.demo.scanner import Scan
from mriprep.stages import get_stage
from mriprep.stages.acquired_resolution import (
    CLAIMED_FINER_RATIO,
    AcquiredResolution,
    acquired_resolution,
    storage_step,
)
from mriprep.stages.plausibility import CHECKS, PlausibilityParams

# A phantom is no head the plausibility checks would accept: they only warn here.
_WARN_ALL = PlausibilityParams(warn=CHECKS)


@functools.lru_cache(maxsize=8)
def phantom(shape: tuple[int, int, int], seed: int = 0, noise: float = 20.0) -> np.ndarray:
    """A noisy three-tissue ball (cached: copy before changing it)."""
    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.normal(size=shape), 2.0)
    field /= field.std()
    tissue = np.select([field < -0.4, field < 0.4], [300.0, 700.0], 1000.0)
    grid = [np.linspace(-1.0, 1.0, n) for n in shape]
    x, y, z = np.meshgrid(*grid, indexing="ij", sparse=True)
    inside = x ** 2 + y ** 2 + z ** 2 < 0.85
    data = np.where(inside, tissue, 0.0) + rng.normal(0.0, noise, shape)
    return np.abs(data).astype(np.float32)  # a magnitude image


def _scan(data: np.ndarray, spacing) -> Scan:
    return Scan(data, None, np.diag([*spacing, 1.0]), np.eye(4), None)


def _spacing(scan: Scan) -> tuple[float, float, float]:
    return tuple(float(s) for s in np.linalg.norm(scan.affine[:3, :3], axis=0))


@functools.lru_cache(maxsize=8)
def _written(method: str, factors=(2.0, 2.0, 2.0), shape=(64, 64, 64), thick=1):
    """A phantom acquired on ``shape`` (with slabs of ``thick`` slices averaged along
    axis 2) and written ``factors`` finer by ``method``."""
    data = phantom((shape[0], shape[1], shape[2] * thick))
    if thick > 1:
        data = data.reshape(shape[0], shape[1], shape[2], thick).mean(axis=3)
    coarse = _scan(data, (1.0, 1.0, float(thick)))
    return written_finer(coarse, factors, method)


def test_a_genuine_scan_carries_its_claimed_resolution():
    result = acquired_resolution(phantom((96, 96, 96)), (0.8, 0.8, 0.8))
    assert isinstance(result, AcquiredResolution)
    assert result.sizes_mm == result.claimed_mm == (0.8, 0.8, 0.8)
    assert result.ratios == (1.0, 1.0, 1.0)
    assert result.falsely_fine_axes() == () and result.marks == ("", "", "")
    assert min(result.segments) >= 200


@pytest.mark.parametrize("method, mark", [("fft", "cliff"), ("linear", "notch"),
                                          ("cubic", "notch")])
def test_a_scan_written_twice_finer_is_flagged_on_every_axis_at_its_true_size(method, mark):
    scan = _written(method)
    result = acquired_resolution(scan.data, _spacing(scan))
    assert result.claimed_mm == (0.5, 0.5, 0.5)
    assert result.falsely_fine_axes() == (0, 1, 2)
    # a usable voxel size: the 1 mm it was acquired at, not 0.8 or 1.3
    assert all(0.9 <= s <= 1.1 for s in result.sizes_mm), result
    assert set(result.marks) == {mark}


def test_thick_slices_written_at_1mm_are_flagged_on_the_slice_axis_only():
    scan = _written("linear", (1.0, 1.0, 3.0), (96, 96, 32), thick=3)
    result = acquired_resolution(scan.data, _spacing(scan))
    assert result.claimed_mm == (1.0, 1.0, 1.0)
    assert result.falsely_fine_axes() == (2,)
    assert result.ratios[:2] == (1.0, 1.0) and 2.7 <= result.ratios[2] <= 3.3


def test_the_threshold_is_the_issues_and_a_lower_one_can_be_asked():
    assert CLAIMED_FINER_RATIO == 1.5
    result = AcquiredResolution((1.0, 1.4, 1.5), (1.0, 1.0, 1.0), (300,) * 3, ("",) * 3)
    assert result.falsely_fine_axes() == (2,)
    assert result.falsely_fine_axes(1.3) == (1, 2)


def test_zero_filled_slices_and_invalid_voxels_do_not_change_the_verdict():
    genuine = phantom((96, 96, 96)).copy()
    fake = _written("fft")
    fake_data = fake.data.copy()
    for data in (genuine, fake_data):
        middle = data.shape[2] // 2
        data[:, :, middle - 2:middle + 2] = 0.0  # a dropped packet, written as zeros
    valid = np.ones(genuine.shape, bool)
    valid[30:40, 30:40, :] = False  # filled by sanitize: any value may sit there
    genuine[~valid] = 12345.0
    result = acquired_resolution(genuine, (1.0, 1.0, 1.0), valid)
    assert result.falsely_fine_axes() == ()
    result = acquired_resolution(fake_data, _spacing(fake), None)
    assert result.falsely_fine_axes() == (0, 1, 2)
    assert all(0.9 <= s <= 1.1 for s in result.sizes_mm)


def test_8_bit_storage_does_not_hide_a_linear_interpolation():
    # White matter at 120 of 255: the rounding fills the notch unless taken out
    scan = _written("linear")
    stored = np.clip(np.round(scan.data * 120.0 / scan.data.max()), 0, 255)
    assert storage_step(stored[stored > 0]) == 1.0
    result = acquired_resolution(stored.astype(np.uint8), _spacing(scan))
    assert result.falsely_fine_axes() == (0, 1, 2) and set(result.marks) == {"notch"}
    # normalised after storage, as the resample stage sees it: still found
    normalised = (stored.astype(np.float32) - 3.0) * np.float32(255.0 / 110.0)
    assert acquired_resolution(normalised, _spacing(scan)).falsely_fine_axes() == (0, 1, 2)
    genuine = phantom((96, 96, 96))
    stored = np.round(genuine * 255.0 / genuine.max()).astype(np.uint8)
    assert acquired_resolution(stored, (1.0, 1.0, 1.0)).falsely_fine_axes() == ()


def test_the_storage_step_is_read_from_the_values():
    rng = np.random.default_rng(1)
    values = rng.uniform(0.0, 1000.0, 20000)
    slope = 1000.0 / 4095
    scaled = (np.round(values / slope) * slope).astype(np.float32)  # 12 bits, scl_slope
    assert storage_step(np.round(values)) == 1.0
    assert storage_step(scaled) == pytest.approx(slope, rel=1e-6)
    assert storage_step(values) == 0.0
    assert storage_step(np.array([7.0, 7.0])) == 0.0
    # an intensity normalisation after storage (an offset and a scale) keeps the grid
    normalised = (np.round(values) - 13.0) * np.float32(0.37) + 2.5
    assert storage_step(normalised.astype(np.float32)) == pytest.approx(0.37, rel=1e-5)


def test_a_volume_without_a_head_is_reported_not_measured_at_its_claimed_size():
    result = acquired_resolution(np.zeros((40, 40, 40), np.float32), (1.0, 2.0, 3.0))
    assert result.sizes_mm == (1.0, 2.0, 3.0) and result.segments == (0, 0, 0)
    assert result.marks == ("not measured",) * 3 and result.falsely_fine_axes() == ()


def test_an_axis_too_short_for_a_segment_is_not_measured():
    data = phantom((96, 96, 12))
    result = acquired_resolution(data, (1.0, 1.0, 5.0))
    assert result.marks[2] == "not measured" and result.sizes_mm[2] == 5.0
    assert result.marks[:2] == ("", "")


@pytest.mark.parametrize("data, spacing, valid, message", [
    (np.zeros((4, 4)), (1, 1, 1), None, "needs a 3-D image"),
    (np.zeros((4, 4, 4)), (1, 0, 1), None, "three positive voxel sizes"),
    (np.zeros((4, 4, 4)), (1, 1), None, "three positive voxel sizes"),
    (np.zeros((4, 4, 4)), (1, 1, 1), np.ones((4, 4, 3), bool), "valid has shape"),
])
def test_bad_input_is_named(data, spacing, valid, message):
    with pytest.raises(ValueError, match=message):
        acquired_resolution(data, spacing, valid)


# -- the plausibility stage -----------------------------------------------------------

def _volume(scan: Scan) -> Volume:
    return get_stage("sanitize")(Volume.from_array(scan.data, scan.affine, subject_id="s"))


def test_plausibility_reports_the_measure_and_warns_naming_axis_sizes_and_fix():
    scan = _written("linear", (1.0, 1.0, 3.0), (96, 96, 32), thick=3)
    out = get_stage("plausibility")(_volume(scan), _WARN_ALL)
    record = out.record_of("plausibility")
    metrics = record.metrics
    assert metrics["falsely_fine_axes"] == [2]
    assert metrics["acquired_resolution_mm"][:2] == [1.0, 1.0]
    assert 2.7 <= metrics["acquired_resolution_mm"][2] <= 3.3
    assert metrics["acquired_resolution_ratio"] == pytest.approx(
        metrics["acquired_resolution_mm"][2], rel=1e-3)
    (warning,) = [w for w in record.warnings if w.startswith("acquired_resolution")]
    assert "voxel axis 2 claims 1 mm but carries about 2.9 mm" in warning \
        or "voxel axis 2 claims 1 mm but carries about 3 mm" in warning
    assert "voxel axis 0" not in warning and "voxel axis 1" not in warning
    assert f"{CLAIMED_FINER_RATIO:g}x finer" in warning
    assert "voxel size to conform to" in warning and "re-export" in warning
    # the QC report's column reads the stage's declaration
    measures = get_stage("plausibility").qc.measures(metrics)
    assert measures["acquired_resolution_ratio"] == metrics["acquired_resolution_ratio"]
    assert any(m.name == "acquired_resolution_ratio" and m.column
               for m in get_stage("plausibility").qc.metrics)


def test_plausibility_does_not_warn_on_a_genuine_scan_nor_refuse_a_false_one():
    genuine = _scan(phantom((96, 96, 96)), (1.0, 1.0, 1.0))
    record = get_stage("plausibility")(_volume(genuine), _WARN_ALL).record_of("plausibility")
    assert record.metrics["falsely_fine_axes"] == []
    assert record.metrics["acquired_resolution_ratio"] == 1.0
    assert not any(w.startswith("acquired_resolution") for w in record.warnings)
    # a falsely fine scan is a warning, never a refusal: only the head checks refuse it
    fake = _written("fft")
    with pytest.raises(StageError) as info:
        get_stage("plausibility")(_volume(fake))
    assert "acquired_resolution" not in info.value.reason
    assert info.value.metrics["falsely_fine_axes"] == [0, 1, 2]


# -- the frozen held-out set ------------------------------------------------------------

@pytest.mark.calibration  # about 30 scans built and written finer: minutes
@pytest.mark.skipif(bool(missing_sources("heldout")),
                    reason=f"the held-out set's real scans are not here: {HOW_TO_GET}")
def test_on_the_held_out_set_every_falsely_fine_scan_is_flagged_and_no_genuine_one():
    wrong = {}
    for case in set_cases("heldout"):
        scan = case.build()
        result = acquired_resolution(scan.data, _spacing(scan))
        expected = case.row.fine_axes
        if result.falsely_fine_axes() != expected:
            wrong[case.name] = (case.row.kind, expected, result.ratios, result.marks)
        if expected:  # a usable voxel size: within a quarter of the true one or coarser
            truth = float(case.row.written.split(":")[1].split("x")[-1])
            assert min(result.ratios[a] for a in expected) >= 0.75 * truth, case.name
    assert wrong == {}


def test_the_sets_are_well_formed_and_frozen_apart():
    from mriprep.demo.resolution_sets import HELDOUT, TUNING, rows

    tuning, heldout = rows("tuning"), rows("heldout")
    assert not {r.case for r in tuning} & {r.case for r in heldout}
    people = {r.source for r in heldout if r.source.startswith("person-")}
    assert people and not people & {r.source for r in TUNING}
    assert {"s1", "robex"} <= {r.source for r in HELDOUT}
    for row in tuning + heldout:
        assert (row.kind == "falsely_fine") == bool(row.fine_axes)
    with pytest.raises(ValueError, match="unknown set"):
        rows("validation")
    assert dataclasses.is_dataclass(tuning[0])
