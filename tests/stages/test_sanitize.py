"""sanitize: every NaN, Inf and extreme value is found, counted, filled and marked invalid;
every other voxel keeps its exact bits.

Volumes are the MNI152 brain on a 2 mm grid with a bias field and Rician noise (a noisy
background, as real scans have); the demo-cohort tests use the planted defects.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.volume import Volume
from mriprep.inputs.readers import load_volume
from mriprep.stages import get_stage
from mriprep.stages.sanitize import (
    FLOAT16_MAX,
    SanitizeParams,
    constant_level,
    fill_local,
    robust_limits,
    sanitize,
)

STRATEGIES = ("zero", "mean", "median", "local")


@pytest.fixture(scope="module")
def head(head_builder) -> Volume:
    return head_builder()


def _brain_points(volume: Volume, n: int, seed: int) -> tuple[np.ndarray, ...]:
    """``n`` distinct voxel indices inside the brain (well above background)."""
    candidates = np.flatnonzero(volume.data.ravel() > 500)
    chosen = np.random.default_rng(seed).choice(candidates, size=n, replace=False)
    return np.unravel_index(chosen, volume.shape)


def _ball(shape, center, radius) -> np.ndarray:
    grids = np.ogrid[tuple(slice(0, n) for n in shape)]
    return sum((g - c) ** 2 for g, c in zip(grids, center)) <= radius**2


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) == b.view(np.uint32)


@pytest.fixture(scope="module")
def corrupted(head):
    """The head with a NaN ball, +/-Inf voxels and extreme values; and where they are."""
    data = head.data.copy()
    nan = _ball(head.shape, (53, 62, 51), 4)
    points = _brain_points(head.replace(data=np.where(nan, 0, data)), 33, seed=1)
    planted = {
        "posinf": (slice(0, 10), np.inf),
        "neginf": (slice(10, 20), -np.inf),
        "extreme": (slice(20, 30), 1e30),
        "lowest": (slice(30, 33), -3e38),  # near float32's lowest: extreme as well
    }
    where = {"nan": nan}
    data[nan] = np.nan
    for kind, (part, value) in planted.items():
        mask = np.zeros(head.shape, dtype=bool)
        mask[tuple(p[part] for p in points)] = True
        data[mask] = value
        where[kind] = mask
    where["extreme"] = where["extreme"] | where.pop("lowest")
    return head.replace(data=data), where


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_bad_voxel_is_counted_filled_and_marked_invalid(corrupted, strategy):
    volume, where = corrupted
    out = sanitize(volume, strategy=strategy)
    bad = where["nan"] | where["posinf"] | where["neginf"] | where["extreme"]

    assert np.isfinite(out.data).all()
    np.testing.assert_array_equal(out.valid, ~bad)
    assert _same_bits(out.data, volume.data)[~bad].all()  # untouched: bit for bit
    metrics = out.record_of("sanitize").metrics
    for kind in ("nan", "posinf", "neginf", "extreme"):
        assert metrics[kind] == int(where[kind].sum()), kind
    assert metrics["replaced"] == int(bad.sum())
    assert metrics["invalid_fraction"] == pytest.approx(bad.mean())
    lo, hi = metrics["limits"]
    assert out.data.min() >= lo and out.data.max() <= hi
    assert "replaced" in out.record_of("sanitize").warnings[0]


def test_global_strategies_fill_with_a_foreground_statistic(corrupted):
    volume, where = corrupted
    filled = {}
    for strategy in ("zero", "mean", "median"):
        out = sanitize(volume, strategy=strategy)
        value = out.record_of("sanitize").metrics["fill_value"]
        assert np.all(out.data[~out.valid] == np.float32(value))
        filled[strategy] = value
    assert filled["zero"] == 0.0
    # The foreground is brain tissue (WM ~1000, GM darker), not the noisy background.
    assert 500 < filled["mean"] < 1100 and 500 < filled["median"] < 1100
    assert filled["mean"] != filled["median"]


def _deep_white_matter(volume) -> tuple[int, int, int]:
    """The centre of the most uniform white-matter-bright 18 mm cube of the head."""
    from scipy import ndimage

    mean = ndimage.uniform_filter(volume.data.astype(np.float64), 9)
    spread = np.sqrt(np.maximum(ndimage.uniform_filter(volume.data.astype(np.float64) ** 2, 9)
                                - mean**2, 0))
    score = np.abs(mean - 1000.0) + spread  # white matter sits near 1000
    return tuple(int(i) for i in np.unravel_index(np.argmin(score), score.shape))


def test_local_fill_follows_the_anatomy_better_than_a_global_value(head):
    data = head.data.copy()
    hole = _ball(head.shape, _deep_white_matter(head), 4)  # 8 mm radius in white matter
    data[hole] = np.nan
    volume = head.replace(data=data)
    local = sanitize(volume, strategy="local").data[hole]
    median = sanitize(volume, strategy="median").data[hole]
    truth = head.data[hole]
    local_error = np.abs(local - truth).mean()
    assert local_error < 0.5 * np.abs(median - truth).mean()
    assert local_error < 0.05 * truth.mean()


def test_local_fill_reaches_the_middle_of_a_large_hole(head):
    data = head.data.copy()
    hole = _ball(head.shape, (53, 62, 51), 9)  # wider than several kernel widths
    data[hole] = np.nan
    out = sanitize(head.replace(data=data), strategy="local", max_invalid_fraction=0.5)
    assert np.isfinite(out.data).all()
    assert 300 < out.data[53, 62, 51] < 1300


def test_a_clean_volume_passes_through_unchanged(head):
    out = sanitize(head)
    assert out.data is head.data or _same_bits(out.data, head.data).all()
    assert out.valid.all()
    metrics = out.record_of("sanitize").metrics
    assert metrics["replaced"] == 0 and metrics["invalid_fraction"] == 0.0
    assert out.record_of("sanitize").warnings == ()


def test_slice_spikes_and_bright_tissue_are_not_extreme(head):
    """A x4 slice spike is mask_slices' business; it overlaps the intensity bulk."""
    data = head.data.copy()
    data[:, :, 50] *= 4.0
    data[_brain_points(head, 20, seed=3)] *= 2.5  # bright vessels
    out = sanitize(head.replace(data=data))
    assert out.record_of("sanitize").metrics["extreme"] == 0


def test_extreme_values_are_found_even_when_they_are_many(head):
    """10% of the voxels at 1e30 would defeat a 99th-percentile limit."""
    rng = np.random.default_rng(4)
    bad = rng.random(head.shape) < 0.10
    data = head.data.copy()
    data[bad] = np.where(rng.random(int(bad.sum())) < 0.5, 1e30, -1e30)
    out = sanitize(head.replace(data=data))
    np.testing.assert_array_equal(out.valid, ~bad)
    assert out.record_of("sanitize").metrics["extreme"] == int(bad.sum())


def test_float16_cache_also_rejects_values_beyond_float16(head):
    data = head.data * np.float32(60.0)  # WM ~60000: brightest tissue beyond 65504
    beyond = np.abs(data) > FLOAT16_MAX
    assert 0 < beyond.sum() < 0.05 * data.size
    volume = head.replace(data=data)
    assert sanitize(volume).record_of("sanitize").metrics["extreme"] == 0
    out = sanitize(volume, output_dtype="float16")
    np.testing.assert_array_equal(out.valid, ~beyond)
    assert np.abs(out.data).max() <= FLOAT16_MAX


def test_too_many_invalid_voxels_fail_the_subject_with_the_fraction(head):
    data = head.data.copy()
    n_slabs = int(0.2 * head.shape[0])
    data[:n_slabs] = np.nan
    with pytest.raises(StageError) as info:
        sanitize(head.replace(data=data))
    err = info.value
    assert err.stage == "sanitize" and err.subject == "test-head"
    assert f"{n_slabs / head.shape[0]:.1%} of voxels are invalid" in str(err)
    assert f"nan={n_slabs * head.shape[1] * head.shape[2]}" in str(err)
    assert "max_invalid_fraction=0.15" in str(err)
    assert sanitize(head.replace(data=data), max_invalid_fraction=0.25).valid.mean() == (
        pytest.approx(0.8, abs=0.01)
    )


def test_limits_come_from_the_bulk_not_the_outliers(head):
    finite = np.isfinite(head.data)
    lo, hi = robust_limits(head.data, finite, factor=20.0)
    assert lo == 0.0 and hi == pytest.approx(head.data.max())
    data = head.data.copy()
    data[_brain_points(head, 5, seed=5)] = 1e30
    assert robust_limits(data, finite, factor=20.0) == (lo, hi)


def test_nothing_finite_means_no_limits():
    data = np.full((4, 4, 4), np.nan, dtype=np.float32)
    assert robust_limits(data, np.isfinite(data), 20.0) == (-np.inf, np.inf)


@pytest.mark.parametrize("level", [100.0, 0.0, -3.5])
def test_a_constant_image_fails_here_naming_its_value_and_the_fix(head, level):
    dead = head.replace(data=np.full(head.shape, level, dtype=np.float32))
    with pytest.raises(StageError) as info:
        sanitize(dead)
    err = info.value
    assert err.stage == "sanitize" and err.subject == "test-head"
    assert f"the image is constant (every voxel = {level!r})" in err.reason
    assert "dead or empty scan" in err.reason
    assert "check the acquisition or the export" in err.reason


def test_a_constant_image_with_filled_holes_is_still_constant(head):
    data = np.full(head.shape, 100.0, dtype=np.float32)
    data[_ball(head.shape, (53, 62, 51), 3)] = np.nan
    data[5, 5, 5] = 1e30
    with pytest.raises(StageError, match=r"every usable voxel = 100\.0"):
        sanitize(head.replace(data=data))


def test_one_differing_voxel_off_the_coarse_grid_is_not_constant(head):
    # (3, 4, 5) is not on the 7-voxel grid the quick look samples: the full check runs.
    data = np.full(head.shape, 100.0, dtype=np.float32)
    data[3, 4, 5] = 101.0
    assert constant_level(data, np.ones(head.shape, dtype=bool)) is None
    out = sanitize(head.replace(data=data))
    assert out.valid.all() and out.data[3, 4, 5] == 101.0
    # Only the usable voxels count: masking the odd one out leaves a constant image.
    usable = np.ones(head.shape, dtype=bool)
    usable[3, 4, 5] = False
    assert constant_level(data, usable) == 100.0


def test_local_fill_in_small_boxes_equals_one_whole_volume_convolution(head):
    """Scattered targets are filled box by box; each value only needs its kernel's reach,
    so it must equal the normalised convolution of the whole volume, bit for bit."""
    from scipy import ndimage

    targets = np.zeros(head.shape, dtype=bool)
    targets[_brain_points(head, 12, seed=7)] = True  # scattered: one box each
    targets[_ball(head.shape, (30, 40, 50), 2)] = True  # a blob: one box
    targets[0, 0, 0] = True  # at the border, where the kernel leaves the volume
    known = ~targets
    sigma = np.array([1.0, 1.5, 1.0])
    values = np.where(known, head.data, 0.0).astype(np.float64)
    numerator = ndimage.gaussian_filter(values, sigma, mode="constant")
    denominator = ndimage.gaussian_filter(known.astype(np.float64), sigma, mode="constant")
    expected = numerator[targets] / denominator[targets]
    np.testing.assert_array_equal(fill_local(head.data, known, targets, sigma), expected)


def test_demo_dead_volume_fails_at_sanitize(demo_cohort):
    dead = [sid for sid, t in demo_cohort.subjects.items()
            if any(d["kind"] == "dead_volume" for d in t["defects"])]
    assert dead
    for subject_id in dead:
        volume = load_volume(demo_cohort.image_path(subject_id), subject_id=subject_id)
        level = float(volume.data.flat[0])
        with pytest.raises(StageError) as info:
            sanitize(volume)
        assert info.value.stage == "sanitize" and info.value.subject == subject_id
        assert f"the image is constant (every voxel = {level!r})" in info.value.reason


def test_invalid_parameters_are_refused():
    with pytest.raises(PipelineConfigError, match="extreme_factor must be positive"):
        SanitizeParams(extreme_factor=0.0)
    with pytest.raises(PipelineConfigError, match="max_invalid_fraction must lie in"):
        SanitizeParams(max_invalid_fraction=1.5)


def test_registered_under_its_pipeline_name():
    assert get_stage("sanitize") is sanitize
    assert sanitize.params_type is SanitizeParams


# -- the property: any pattern of bad values, through sanitize -> normalize -> validate --

BAD_VALUES = (np.nan, np.inf, -np.inf, 1e30, -1e30, 3e38, -3e38, 1e25)


@pytest.fixture(scope="module")
def brain_block(head) -> Volume:
    """A 24^3 block through the middle of the head: brain, CSF and a little background."""
    box = tuple(slice(c - 12, c + 12) for c in (53, 62, 51))
    return Volume.from_array(np.ascontiguousarray(head.data[box]), head.affine,
                             subject_id="block")


@settings(max_examples=40, deadline=None, database=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    fraction=st.floats(0.0, 0.12),
    kinds=st.lists(st.sampled_from(range(len(BAD_VALUES))), min_size=1, max_size=4,
                   unique=True),
    strategy=st.sampled_from(STRATEGIES),
    output_dtype=st.sampled_from(("float32", "float16")),
)
def test_property_any_bad_pattern_ends_finite_and_masked(
    brain_block, seed, fraction, kinds, strategy, output_dtype
):
    rng = np.random.default_rng(seed)
    data = brain_block.data.copy()
    bad = rng.random(data.shape) < fraction
    data[bad] = np.asarray(BAD_VALUES)[rng.choice(kinds, size=int(bad.sum()))]
    volume = brain_block.replace(data=data)

    cleaned = sanitize(volume, strategy=strategy, output_dtype=output_dtype,
                       max_invalid_fraction=0.5)
    assert np.isfinite(cleaned.data).all()
    assert not cleaned.valid[bad].any()  # every replaced voxel is marked
    assert _same_bits(cleaned.data, data)[cleaned.valid].all()  # the rest is untouched

    normalized = get_stage("normalize")(cleaned)
    assert np.isfinite(normalized.data).all()
    assert not normalized.valid[bad].any()
    get_stage("validate")(normalized, output_dtype=output_dtype)


# -- the demo cohort: planted NaN and extreme values -------------------------------------


def _planted_positions(truth: dict, shape) -> np.ndarray | None:
    mask = np.zeros(shape, dtype=bool)
    found = False
    for defect in truth["defects"]:
        if defect["kind"] == "extreme_values":
            mask[tuple(np.asarray(defect["ijk"]).T)] = True
            found = True
        elif defect["kind"] == "nan_blob":
            found = True
    return mask if found else None


def test_demo_planted_values_are_filled_exactly_where_they_were(demo_cohort):
    checked = 0
    for subject_id, truth in demo_cohort.subjects.items():
        kinds = {d["kind"] for d in truth["defects"]}
        if not kinds & {"nan_blob", "extreme_values"}:
            continue
        volume = load_volume(demo_cohort.image_path(subject_id), subject_id=subject_id)
        planted = _planted_positions(truth, volume.shape) | ~np.isfinite(volume.data)
        out = sanitize(volume)
        np.testing.assert_array_equal(~out.valid, planted)
        assert np.isfinite(out.data).all()
        assert _same_bits(out.data, volume.data)[~planted].all()
        metrics = out.record_of("sanitize").metrics
        for defect in truth["defects"]:
            if defect["kind"] == "nan_blob":
                assert metrics["nan"] == defect["n_voxels"]
            if defect["kind"] == "extreme_values":
                # 1e308 does not fit float32: the loader made it +Inf.
                assert metrics["posinf"] == sum(v > 3.4e38 for v in defect["values"])
                assert metrics["posinf"] + metrics["neginf"] + metrics["extreme"] == len(
                    defect["values"]
                )
        final = get_stage("validate")(get_stage("normalize")(out))
        assert np.isfinite(final.data).all()
        np.testing.assert_array_equal(~final.valid, planted)
        checked += 1
    assert checked == 2
