"""normalize: z-score in the foreground with robust clipping, or FastSurfer's 0-255 scaling;
constant images are errors, invalid voxels end at a fixed finite value.

Volumes are the MNI152 brain on a 2 mm grid with a bias field and Rician noise.
"""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.volume import Volume
from mriprep.demo.fastsurfer_conform import conform_scale
from mriprep.stages import get_stage
from mriprep.stages import intensity
from mriprep.stages.intensity import foreground_mask, percentiles
from mriprep.stages.normalize import NormalizeParams, normalize
from mriprep.stages.sanitize import sanitize


@pytest.fixture(scope="module")
def head(head_builder) -> Volume:
    return sanitize(head_builder())


def test_zscore_gives_the_foreground_mean_zero_and_unit_spread(head):
    out = normalize(head)
    brain = foreground_mask(head.data, head.valid)
    assert 0.1 < brain.mean() < 0.5  # the head, not the noisy background
    assert out.data[brain].mean() == pytest.approx(0.0, abs=0.02)
    assert out.data[brain].std() == pytest.approx(1.0, abs=0.02)
    assert out.data.dtype == np.float32 and np.isfinite(out.data).all()
    metrics = out.record_of("normalize").metrics
    low, high = metrics["clip_range"]
    expected = (np.clip(head.data, low, high) - metrics["mean"]) / metrics["std"]
    np.testing.assert_allclose(out.data, expected, rtol=1e-5, atol=1e-5)
    # The background keeps its contrast: it sits well below the brain, and its noise
    # varies (Rician sigma 15 over a head spread of ~330: about 0.045), not flattened.
    background = ~brain
    assert out.data[background].mean() < -2.0 and out.data[background].std() > 0.02


def test_clipping_keeps_a_few_bright_voxels_from_flattening_the_brain(head):
    data = head.data.copy()
    rng = np.random.default_rng(0)
    bright = rng.choice(data.size, size=200, replace=False)
    data.flat[bright] = 20000.0  # 20x white matter
    out = normalize(head.replace(data=data))
    reference = normalize(head)
    brain = foreground_mask(head.data, head.valid)
    brain.flat[bright] = False
    np.testing.assert_allclose(out.data[brain], reference.data[brain], atol=0.05)
    assert out.record_of("normalize").metrics["clipped_high"] >= 200


def test_invalid_voxels_end_at_the_invalid_value_never_nan(head):
    data = head.data.copy()
    valid = head.valid.copy()
    data[40:44] = np.nan  # not sanitised on purpose: marked invalid, values unusable
    valid[40:44] = False
    out = normalize(head.replace(data=data, valid=valid))
    assert np.isfinite(out.data).all()
    assert (out.data[40:44] == 0.0).all()
    np.testing.assert_array_equal(out.valid, valid)
    custom = normalize(head.replace(data=data, valid=valid), invalid_value=-3.0)
    assert (custom.data[40:44] == -3.0).all()


def test_filled_invalid_voxels_can_keep_their_normalised_values(head):
    valid = head.valid.copy()
    valid[40:44] = False  # e.g. slices mask_slices flagged and filled from neighbours
    data = head.data.copy()
    data[50, 50, 50] = np.nan  # unsanitised: still gets a finite value
    volume = head.replace(data=data, valid=valid)
    kept = normalize(volume, invalid_value=None)
    fixed = normalize(volume)
    assert np.isfinite(kept.data).all() and kept.data[50, 50, 50] == 0.0
    np.testing.assert_array_equal(kept.valid, fixed.valid)
    np.testing.assert_array_equal(kept.data[fixed.valid], fixed.data[fixed.valid])
    metrics = kept.record_of("normalize").metrics
    low, high = metrics["clip_range"]
    expected = (np.clip(head.data[40:44], low, high) - metrics["mean"]) / metrics["std"]
    np.testing.assert_allclose(kept.data[40:44], expected, rtol=1e-5, atol=1e-5)


def test_non_finite_valid_voxels_become_invalid_with_a_warning(head):
    data = head.data.copy()
    data[10, 10, 10] = np.inf
    out = normalize(head.replace(data=data))
    assert not out.valid[10, 10, 10] and out.data[10, 10, 10] == 0.0
    assert np.isfinite(out.data).all()
    assert "run the sanitize stage" in out.record_of("normalize").warnings[0]


def test_mask_valid_uses_every_valid_voxel(head):
    out = normalize(head, mask="valid")
    low, high = out.record_of("normalize").metrics["clip_range"]
    clipped = np.clip(head.data.astype(np.float64), low, high)
    assert out.data.mean() == pytest.approx(0.0, abs=1e-4)
    assert out.record_of("normalize").metrics["std"] == pytest.approx(clipped.std(), rel=1e-6)


def test_conform_takes_fastsurfers_range_and_maps_it_onto_0_255(head):
    out = normalize(head, mode="conform")
    low, high = out.record_of("normalize").metrics["clip_range"]
    # The referee restates FastSurfer's getscale on every voxel (all valid here).
    their_low, their_scale = conform_scale(head.data)
    assert low == their_low == head.data.min()
    assert 255.0 / (high - low) == pytest.approx(their_scale, rel=1e-9)
    # FastSurfer's cut keeps all but 0.1% of the non-zero voxels below it, give or take
    # the two histogram bins it steps back.
    assert 0.001 < np.mean(head.data > high) < 0.01
    assert out.data.min() == 0.0 and out.data.max() == pytest.approx(255.0)
    # Monotonic: brighter input, brighter output.
    order = np.argsort(head.data.ravel()[::97])
    assert np.all(np.diff(out.data.ravel()[::97][order]) >= 0)


# A float32 volume holds 1e308 as Inf; numpy warns of the cast, which is the point.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.parametrize("extreme", [1e308, 3e38, 1e30])
def test_conform_is_not_ruined_by_one_extreme_voxel(head, extreme):
    """FastSurfer's histogram would run from the minimum to the extreme and put the
    whole head into its first bin. A float32 volume holds 1e308 as Inf, which normalize
    treats as invalid; a finite extreme counts in the top bin. Either way the range
    moves by less than a grey level."""
    clean = normalize(head, mode="conform")
    spiked_data = head.data.astype(np.float64)
    spiked_data[40, 50, 30] = extreme
    spiked = normalize(head.replace(data=spiked_data), mode="conform")
    low, high = spiked.record_of("normalize").metrics["clip_range"]
    assert np.isfinite(high) and high < 2 * head.data.max()
    changed = np.abs(spiked.data - clean.data)
    changed[40, 50, 30] = 0.0
    assert changed.max() < 1.0
    assert spiked.data[40, 50, 30] == pytest.approx(255.0 if extreme < 1e39 else 0.0)


def test_conform_keeps_zero_at_zero_as_fastsurfer_does(head):
    shifted = head.data - 50.0  # the darkest voxels now negative
    shifted[:4] = 0.0
    out = normalize(head.replace(data=shifted.astype(np.float32)), mode="conform")
    assert (out.data[:4] == 0.0).all() and out.data[4:].max() == pytest.approx(255.0)
    assert out.data[4:].mean() > 5.0


@pytest.mark.parametrize("mode", ["zscore", "conform"])
def test_a_constant_image_is_an_error_not_a_division_by_zero(head, mode):
    dead = head.replace(data=np.full(head.shape, 100.0, dtype=np.float32))
    with pytest.raises(StageError, match=r"the image is constant .*100") as info:
        normalize(dead, mode=mode)
    assert info.value.stage == "normalize" and info.value.subject == "test-head"


def test_a_nearly_constant_foreground_is_refused_by_eps(head):
    rng = np.random.default_rng(1)
    flat = 500.0 + rng.normal(0, 1e-4, head.shape)  # spread 2e-7 of the level
    volume = head.replace(data=flat.astype(np.float32))
    with pytest.raises(StageError, match="constant"):
        normalize(volume, eps=1e-5)
    out = normalize(volume, eps=1e-9, mask="valid")
    assert np.isfinite(out.data).all()


def test_a_volume_with_no_valid_voxel_is_refused(head):
    nothing = head.replace(valid=np.zeros(head.shape, dtype=bool))
    with pytest.raises(StageError, match="no valid voxel is left"):
        normalize(nothing)


def test_a_dead_volume_masked_by_mask_slices_is_reported_as_constant(head):
    # sanitize refuses a constant image itself (see test_sanitize); straight from the
    # loader, mask_slices marks it invalid and normalize must still name the value.
    dead = head.replace(data=np.full(head.shape, 7.0, dtype=np.float32))
    masked = get_stage("mask_slices")(dead)
    assert not masked.valid.any()
    with pytest.raises(StageError, match=r"constant \(every finite voxel is 7\)"):
        normalize(masked)


@pytest.mark.parametrize("bracket_sigmas", [6.0, 0.0])
def test_percentiles_are_numpys_bit_for_bit(head, monkeypatch, bracket_sigmas):
    """The sampled brackets only save time: with no margin at all (every rank falls
    outside its bracket and the full partition runs) the values are the same."""
    monkeypatch.setattr(intensity, "_BRACKET_SIGMAS", bracket_sigmas)
    q = [0.0, 0.5, 2.0, 25.0, 50.0, 75.0, 98.0, 99.5, 100.0, 37.3]
    coarse = np.round(head.data / 50.0).astype(np.float32)  # many ties
    for values in (head.data, head.data[head.valid], coarse, head.data[:3, :4, :5]):
        for method in ("linear", "lower"):
            expected = np.percentile(values.astype(np.float64), q, method=method)
            np.testing.assert_array_equal(percentiles(values, q, method), expected)


def test_conform_is_the_float64_formula_up_to_float32_rounding(head):
    out = normalize(head, mode="conform")
    metrics = out.record_of("normalize").metrics
    low, high = metrics["clip_range"]
    values = head.data.astype(np.float64)
    expected = (np.clip(values, low, high) - low) * (255.0 / (high - low))
    np.testing.assert_allclose(out.data, expected, rtol=0, atol=4e-5)
    assert metrics["clipped_low"] == int(np.count_nonzero(values < low))
    assert metrics["clipped_high"] == int(np.count_nonzero(values > high))


def test_invalid_parameters_are_refused():
    with pytest.raises(PipelineConfigError, match="clip_low_percentile < clip_high"):
        NormalizeParams(clip_low_percentile=99.0, clip_high_percentile=1.0)
    with pytest.raises(PipelineConfigError, match="eps must be positive"):
        NormalizeParams(eps=0.0)
    with pytest.raises(PipelineConfigError, match="invalid_value must be finite"):
        NormalizeParams(invalid_value=float("nan"))


def test_registered_under_its_pipeline_name():
    assert get_stage("normalize") is normalize


def test_conform_without_clipping_leaves_the_clip_to_a_later_step(head):
    """conform_min clips after its interpolation, as FastSurfer does: the scale is the
    same, and only the values beyond the range differ from the clipped ones."""
    clipped = normalize(head, mode="conform")
    unclipped = normalize(head, mode="conform", clip=False)
    scale = unclipped.record_of("normalize").metrics["scale"]
    assert scale == clipped.record_of("normalize").metrics["scale"]
    assert unclipped.data.max() > 255
    np.testing.assert_allclose(np.clip(unclipped.data, 0, 255), clipped.data, atol=1e-3)
    with pytest.raises(PipelineConfigError, match="applies to mode: conform"):
        NormalizeParams(mode="zscore", clip=False)
    # Zero stays zero, as FastSurfer maps it, when the range starts below zero too.
    data = head.data - np.float32(20.0)
    data[:4] = 0.0
    out = normalize(head.replace(data=data), mode="conform", clip=False)
    assert data.min() < 0 and out.data[:4].max() == 0.0  # not (0 - min) * scale > 0
