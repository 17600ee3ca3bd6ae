"""qc.metrics: MRIQC-style image-quality metrics on phantoms whose answers are known.

The phantom is a spherical head in a box: three concentric tissue shells (WM bright in
the middle, then GM, then dark CSF) inside a scalp, Gaussian noise of a known sigma in
the head and, in the air, the magnitude of complex Gaussian noise of the same sigma
(Rayleigh distributed), as a magnitude MR image has.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import ndimage as ndi

from mriprep.qc.metrics import (TissueMasks, cjv, cnr, efc, fber, head_mask, image_quality,
                                snr, snr_dietrich, tissue_masks, wm2max)

MEANS = {"wm": 1000.0, "gm": 600.0, "csf": 250.0, "scalp": 450.0}
# Radii (mm, 1 mm voxels) of the WM, GM, CSF and head spheres.
RADII = {"wm": 10.0, "gm": 16.0, "csf": 20.0, "head": 26.0}
# Standard deviation of a Rayleigh variable over its sigma.
RAYLEIGH_SD = math.sqrt((4 - math.pi) / 2)
AIR_METRICS = ("snr_dietrich", "cnr", "fber")


def _radius(shape):
    centre = [(s - 1) / 2 for s in shape]
    return np.sqrt(sum((g - c) ** 2 for g, c in zip(np.ogrid[tuple(map(slice, shape))], centre)))


def phantom(sigma=20.0, seed=0, air_sigma=None, n=64):
    """The phantom's data (float32) and its true regions."""
    rng = np.random.default_rng(seed)
    r = _radius((n, n, n))
    truth = {"wm": r < RADII["wm"], "gm": (r >= RADII["wm"]) & (r < RADII["gm"]),
             "csf": (r >= RADII["gm"]) & (r < RADII["csf"]), "brain": r < RADII["csf"],
             "head": r < RADII["head"], "radius": r}
    mean = np.select([truth["wm"], truth["gm"], truth["csf"], truth["head"]],
                     [MEANS["wm"], MEANS["gm"], MEANS["csf"], MEANS["scalp"]], 0.0)
    tissue = mean + rng.normal(0.0, sigma, mean.shape)
    air_sigma = sigma if air_sigma is None else air_sigma
    air = np.hypot(rng.normal(0.0, air_sigma, mean.shape), rng.normal(0.0, air_sigma, mean.shape))
    return np.where(truth["head"], tissue, air).astype(np.float32), truth


def dice(a, b):
    return 2 * np.count_nonzero(a & b) / (np.count_nonzero(a) + np.count_nonzero(b))


def quality(data, valid=None, **kwargs):
    valid = np.ones(data.shape, dtype=bool) if valid is None else valid
    return image_quality(data, valid, tissue_masks(data, valid, **kwargs))


@pytest.fixture(scope="module")
def clean():
    return phantom(sigma=20.0)


# -- masks --------------------------------------------------------------------------------

def test_head_mask_is_the_sphere_without_air_speckle_and_with_its_cavities(clean):
    data, truth = clean
    data = data.copy()
    data[truth["radius"] < 4] = 0.0                  # a dark cavity deep inside
    data[2, 2, 2] = data[60, 5, 30] = 1000.0          # bright voxels in the air
    head = head_mask(data, np.ones(data.shape, dtype=bool))
    assert dice(head, truth["head"]) > 0.97
    assert head[truth["radius"] < 4].all()
    assert not head[2, 2, 2] and not head[60, 5, 30]


def test_tissue_masks_find_the_three_shells(clean):
    data, truth = clean
    valid = np.ones(data.shape, dtype=bool)
    given = tissue_masks(data, valid, brain=truth["brain"], source="template")
    assert given.source == "template"
    for name in ("csf", "gm", "wm"):
        assert dice(getattr(given, name), truth[name]) > 0.9
    # Without a brain mask the classes are fitted in the eroded head, which here holds
    # WM, GM and the inner part of the CSF shell but not the scalp.
    found = tissue_masks(data, valid)
    assert found.source == "head (no brain mask)"
    assert not (found.brain & ~truth["brain"]).any() and found.brain[truth["gm"]].all()
    for name in ("csf", "gm", "wm"):
        assert dice(getattr(found, name), truth[name] & found.brain) > 0.9
    assert not (found.csf & found.gm).any() and not (found.gm & found.wm).any()
    # Air keeps away from the head (at least a few mm beyond its edge), but not far.
    assert truth["radius"][found.air].min() > RADII["head"] + 4
    assert truth["radius"][found.air].min() < RADII["head"] + 12


# -- SNR, CNR, CJV ------------------------------------------------------------------------

def test_formulas_on_known_numbers():
    assert snr(10.0, 2.0, 5) == pytest.approx(10.0 / (2.0 * math.sqrt(5 / 4)))
    assert snr_dietrich(100.0, 10.0) == pytest.approx(100.0 / (10.0 * math.sqrt(2 / (4 - math.pi))))
    assert cnr(1000.0, 600.0, 3.0, 4.0, 0.0) == pytest.approx(80.0)
    assert cjv(600.0, 1000.0, 10.0, 30.0) == pytest.approx(0.1)
    for value in (snr(1.0, 0.0, 10), snr(1.0, 1.0, 1), snr_dietrich(1.0, 0.0),
                  cnr(1.0, 1.0, 0.0, 0.0, 0.0), cjv(5.0, 5.0, 1.0, 1.0)):
        assert math.isnan(value)


def test_snr_is_mean_over_sigma_in_tissue_and_from_the_air(clean):
    metrics = quality(clean[0])
    expected = MEANS["wm"] / 20.0
    assert metrics["snr_wm"] == pytest.approx(expected, rel=0.03)
    assert metrics["snr_gm"] == pytest.approx(MEANS["gm"] / 20.0, rel=0.03)
    # The Rayleigh correction recovers the noise sigma from the air's spread.
    assert metrics["snr_dietrich"] == pytest.approx(expected, rel=0.03)
    tissue = [metrics[f"snr_{k}"] for k in ("csf", "gm", "wm")]
    assert metrics["snr_total"] == pytest.approx(np.mean(tissue))


def test_snr_halves_when_the_noise_doubles(clean):
    low, high = quality(clean[0]), quality(phantom(sigma=40.0, seed=1)[0])
    for name in ("snr_wm", "snr_gm", "snr_dietrich"):
        assert low[name] / high[name] == pytest.approx(2.0, rel=0.05)


@pytest.mark.parametrize("sigma", [20.0, 40.0])
def test_cnr_and_cjv_match_their_formulas(sigma):
    metrics = quality(phantom(sigma=sigma, seed=2)[0])
    contrast = MEANS["wm"] - MEANS["gm"]
    air_sd = RAYLEIGH_SD * sigma
    assert metrics["cnr"] == pytest.approx(contrast / math.sqrt(air_sd ** 2 + 2 * sigma ** 2),
                                           rel=0.04)
    assert metrics["cjv"] == pytest.approx(2 * sigma / contrast, rel=0.05)


# -- EFC, FBER, WM2MAX --------------------------------------------------------------------

def test_efc_is_one_for_a_constant_image_and_zero_for_one_bright_voxel():
    assert efc(np.full((20, 20, 20), 37.5, dtype=np.float32)) == pytest.approx(1.0, abs=1e-6)
    spike = np.zeros((20, 20, 20), dtype=np.float32)
    spike[3, 4, 5] = 900.0
    assert efc(spike) == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(efc(np.zeros((4, 4, 4), dtype=np.float32)))


def test_efc_rises_when_a_structured_image_is_blurred_or_noisy():
    image = np.zeros((40, 40, 40), dtype=np.float32)
    image[10:30, 12:28, 15:25] = 800.0
    image[16:24, 16:24, 18:22] = 300.0
    sharp = efc(image)
    assert efc(ndi.gaussian_filter(image, 2.0)) > sharp + 0.01
    rng = np.random.default_rng(3)
    noisy = np.abs(image + rng.normal(0.0, 30.0, image.shape)).astype(np.float32)
    assert efc(noisy) > sharp + 0.01


def test_efc_leaves_out_the_frame_and_nan():
    image = np.random.default_rng(4).gamma(2.0, 100.0, (16, 16, 16)).astype(np.float32)
    frame = np.zeros(image.shape, dtype=bool)
    frame[:3] = True
    planted = image.copy()
    planted[:3] = np.nan
    assert efc(image, frame) == pytest.approx(efc(image[3:]), rel=1e-6)
    assert efc(planted) == pytest.approx(efc(image[3:]), rel=1e-6)


def test_fber_is_higher_with_less_air_noise(clean):
    _, truth = clean
    quiet, _ = phantom(sigma=20.0, air_sigma=5.0)
    noisy, _ = phantom(sigma=20.0, air_sigma=40.0)
    air = truth["radius"] > RADII["head"] + 6
    ratio = fber(quiet, truth["head"], air) / fber(noisy, truth["head"], air)
    assert ratio == pytest.approx(64.0, rel=0.1)   # median energy scales with sigma^2


def test_fber_is_nan_over_zero_air_and_without_air(clean):
    data, truth = clean
    zeroed = np.where(truth["head"], data, 0.0).astype(np.float32)  # skull-stripped
    assert math.isnan(fber(zeroed, truth["head"], ~truth["head"]))
    assert math.isnan(fber(data, truth["head"], np.zeros(data.shape, dtype=bool)))
    assert math.isnan(fber(np.zeros_like(data), truth["head"], ~truth["head"]))


def test_wm2max_is_the_wm_median_over_the_top_of_the_image():
    image = np.zeros(10_000, dtype=np.float32)
    wm = np.zeros(image.shape, dtype=bool)
    wm[:4000] = True
    image[:4000] = 700.0
    image[4000:4500] = 400.0
    image[-6:] = 1000.0    # ranks 9994-9999 hold the 99.95th percentile
    assert wm2max(image, wm) == pytest.approx(0.7)
    image[10:20] = np.nan  # NaN WM voxels are left out everywhere
    assert wm2max(image, wm) == pytest.approx(0.7)
    assert math.isnan(wm2max(image, np.zeros(image.shape, dtype=bool)))


# -- image_quality ------------------------------------------------------------------------

def test_invalid_voxels_never_change_a_metric(clean):
    data, _ = clean
    valid = np.ones(data.shape, dtype=bool)
    valid[:, :, :6] = False                                    # a slab of air and scalp
    valid[np.random.default_rng(5).random(data.shape) < 0.02] = False   # scattered voxels
    results, masks = [], []
    for planted in (np.nan, 5000.0, -1e6):
        junk = np.where(valid, data, planted).astype(np.float32)
        found = tissue_masks(junk, valid, spacing=1.0)
        masks.append(found)
        results.append(image_quality(junk, valid, found))
    for result in results[1:]:
        assert result.keys() == results[0].keys()
        for name, value in result.items():
            assert value == results[0][name] or (math.isnan(value) and math.isnan(results[0][name]))
    for found in masks:
        for name in ("head", "air", "brain", "csf", "gm", "wm"):
            assert not (getattr(found, name) & ~valid).any()
            np.testing.assert_array_equal(getattr(found, name), getattr(masks[0], name))
    assert math.isfinite(results[0]["snr_wm"]) and results[0]["air_voxels"] > 0


def test_every_metric_is_reported(clean):
    metrics = quality(clean[0])
    assert set(metrics) == {"snr_csf", "snr_gm", "snr_wm", "snr_total", "snr_dietrich", "cnr",
                            "cjv", "efc", "fber", "wm2max", "head_fraction", "air_voxels"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert metrics["head_fraction"] == pytest.approx(clean[1]["head"].mean(), rel=0.03)


def head_filling_the_box(n=48, seed=6):
    """A head that fills its box: the darkest shell (CSF) is below the head threshold
    but enclosed, so it is filled in, and there is no background at all."""
    rng = np.random.default_rng(seed)
    r = _radius((n, n, n))
    data = np.select([r < 8, r < 13, r < 15], [1000.0, 600.0, 250.0], 450.0)
    return (data + rng.normal(0.0, 20.0, data.shape)).astype(np.float32)


def test_no_air_gives_nan_air_metrics_without_warnings():
    data = head_filling_the_box()
    valid = np.ones(data.shape, dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        masks = tissue_masks(data, valid)
        metrics = image_quality(data, valid, masks)
        assert masks.head.all() and not masks.air.any()
        assert metrics["air_voxels"] == 0 and metrics["head_fraction"] == 1.0
        assert all(math.isnan(metrics[name]) for name in AIR_METRICS)
        assert all(math.isfinite(metrics[name]) for name in ("snr_wm", "cjv", "efc", "wm2max"))


@pytest.mark.parametrize("fill", [0.0, 300.0])
def test_degenerate_images_give_nan_not_errors(fill):
    data = np.full((24, 24, 24), fill, dtype=np.float32)
    valid = np.ones(data.shape, dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = image_quality(data, valid, tissue_masks(data, valid))
        empty = np.zeros(data.shape, dtype=bool)
        nothing = image_quality(data, valid, TissueMasks(*(empty,) * 6, source="label map"))
    assert all(math.isnan(metrics[k]) for k in ("snr_wm", "snr_total", "cnr", "cjv", "fber"))
    assert all(math.isnan(v) for k, v in nothing.items() if k not in {"efc", "head_fraction",
                                                                       "air_voxels"})
    assert nothing["head_fraction"] == 0.0 and nothing["air_voxels"] == 0.0
