"""mask_slices' artifact slices: the scores say how a slice is wrong, adjacent bad slices
do not hide each other, and the fast scores equal the direct formula."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.stages.intensity import robust_threshold
from mriprep.stages.mask_slices import artifacts, mask_slices
from mriprep.stages.mask_slices.lattice import slice_stack
from mriprep.stages.mask_slices.statistics import prepare
from mriprep.stages.sanitize import sanitize
from tests.stages.mask_slices.planting import ARTIFACTS, flagged_slices, plant


def test_scores_say_how_a_slice_is_wrong(iso):
    spike = mask_slices(sanitize(plant(iso, 2, 40, lambda s: s * np.float32(4.0))))
    scores = flagged_slices(spike)[2]["artifact"][40]
    assert scores["log_ratio"] == pytest.approx(np.log(4.0), abs=0.02)
    assert scores["ratio_z"] > 5.0
    moved = mask_slices(sanitize(plant(iso, 2, 40, ARTIFACTS["motion"][0])))
    scores = flagged_slices(moved)[2]["artifact"][40]
    assert abs(scores["log_ratio"]) < np.log(1.25)  # same intensities ...
    assert scores["correlation_deficit"] > 0.2  # ... but not the neighbours' anatomy


def test_adjacent_bad_slices_do_not_hide_each_other_or_smear(iso):
    volume = plant(iso, 2, 50, lambda s: s * np.float32(4.0))
    volume = plant(volume, 2, 51, lambda s: s * np.float32(0.5))
    found = flagged_slices(mask_slices(sanitize(volume)))
    assert sorted(found[2]["artifact"]) == [50, 51]


def _plain_log_ratio(stack, s, a, b, wa):
    """The two-sided log-ratio score written the direct way: boolean masks, np.median,
    a loop over the in-plane blocks."""
    common = stack.interior[a] & stack.interior[b]
    samples_needed = 500 / stack.voxels_per_sample
    if common.sum() < samples_needed:
        return None
    xa, xb, xs = stack.x[a], stack.x[b], stack.x[s]
    log_ab = np.log(xa[common] / xb[common])
    offset = np.median(log_ab)
    if abs(offset) >= np.log(1.5) and np.mean(np.abs(log_ab - offset) < 0.1) >= 0.5:
        return "scaled apart"
    comparable = common & (np.abs(np.log(np.where(common, xa / np.where(common, xb, 1), 1)))
                           < 0.1)
    if comparable.sum() < 0.15 * common.sum() or comparable.sum() < samples_needed:
        return None
    predicted = wa * xa.astype(np.float64) + (1 - wa) * xb
    log_ratio = np.log(np.clip(xs / predicted, 1e-3, 1e3))
    medians = []
    for r in np.unique(stack.block_of_row):
        for c in np.unique(stack.block_of_col):
            block = np.outer(stack.block_of_row == r, stack.block_of_col == c)
            inside = comparable & block
            if inside.sum() >= 100 / stack.sample_area_mm2:
                medians.append(np.median(log_ratio[inside]))
    if len(medians) < 4:
        return None
    if np.median(medians) < 0:
        return min(float(np.quantile(medians, 0.75)), 0.0)
    return max(float(np.quantile(medians, 0.25)), 0.0)


def test_fast_scores_equal_the_direct_formula(iso):
    """The scoring shortcuts (counting instead of a median, index gathers, sorted
    blocks) change no score: equal to the direct formula on a clean head and next to a
    x4 spike and a x0.4 dropout."""
    volume = plant(plant(iso, 1, 40, lambda s: s * 4.0), 1, 47, lambda s: s * 0.4)
    threshold = robust_threshold(volume.data)
    prepared = prepare(volume.data, np.ones(volume.shape, bool), threshold)
    stack = slice_stack(prepared, 1)
    scored = scaled_apart = 0
    for s in range(1, stack.n - 1):
        fast = artifacts._ratio_to_prediction(stack, s, s - 1, s + 1, 0.5)
        plain = _plain_log_ratio(stack, s, s - 1, s + 1, 0.5)
        if fast is artifacts._SCALED_APART:
            assert plain == "scaled apart", s
            scaled_apart += 1
        elif fast is None:
            assert plain is None, s
        else:
            assert fast == pytest.approx(plain, abs=1e-6), s
            scored += 1
    assert scored > 40
    assert scaled_apart == 4  # either side of each artifact
