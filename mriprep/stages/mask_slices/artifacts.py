"""Artifact slices: slices whose measurement disagrees with their neighbours.

The artifact score of slice ``s`` compares it with the average of its nearest usable
neighbours ``a`` and ``b``, voxel by voxel, inside the head (10 mm in from its edge in
the slice's plane), where the neighbours agree with each other within 10%: there the
average predicts ``s``. The score is the log-ratio of ``s`` to that prediction that most
in-plane blocks (32 mm squares) of the slice agree on: a spike or a dropout scales the
whole slice, while anatomy that changes fast between thick slices changes part of it.
Where the head ends, slices cut scalp, skull and cortex tangentially and their neighbours
agree on little; such slices, and slices whose neighbours differ by a scale factor (next
to an artifact), are not ratio-scored. A clean slice scores about 0, a x4 spike log 4, a
50% dropout log 0.5. A second score, the neighbour-correlation deficit, catches
structural corruption that a scale factor cannot: ``corr(a, b)`` minus the mean of
``corr(a, s)`` and ``corr(s, b)``. Slices are flagged one at a time, worst first, and each
flagged slice stops serving as a neighbour, so a spike cannot make its neighbours look
dark.

Slices are scored on the lattice of :mod:`~mriprep.stages.mask_slices.lattice`. A slice
is flagged when one of its scores passes both its limit (``intensity_ratio``,
``correlation_deficit``) and ``z_threshold`` robust deviations from the median score of
the axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mriprep.stages.mask_slices.lattice import Lattice, SliceStack, scoring_lattice, slice_stack
from mriprep.stages.mask_slices.statistics import MAX_NEIGHBOUR_DISTANCE, neighbours, prepare

if TYPE_CHECKING:
    from mriprep.stages.mask_slices.params import MaskSlicesParams

# Voxels where the two neighbours differ by more than this (log-ratio, ~10%) are left out
# of the artifact score: there the anatomy changes too fast for the neighbours' average
# to predict the slice.
_NEIGHBOUR_AGREEMENT = 0.1
# Neighbours whose typical log-ratio exceeds this (a factor 1.5) differ by a scale
# factor, not by anatomy: one of them is an artifact, and the slice between them is not
# ratio-scored until that artifact is flagged and stops serving as a neighbour.
_NEIGHBOUR_SCALE_OFFSET = float(np.log(1.5))
# ... and at least this share of their voxels sit within _NEIGHBOUR_AGREEMENT of that
# factor: a spike or a dropout scales a slice uniformly, while slices at the head's edge
# differ voxel by voxel. (Calibration set: the steady side's prediction, used for any
# neighbours a factor 1.5 apart, flagged 24 clean slices at the head's edge; used only
# across a uniform factor, none, and a spike next to a dropout is still found.)
_UNIFORM_SCALE_SHARE = 0.5
# What a two-sided prediction returns when its neighbours are a scale factor apart.
_SCALED_APART = object()
# Fewer comparable voxels than this and a slice is not scored: a median over a few
# hundred voxels grazing the edge of the head is anatomy, not evidence. These two floors
# were set on the first build's demo (copies of the template); on the calibration set
# (other people, real Colin27) they are not what keeps clean slices clean: halved (250
# and 500), they still flagged none of its 40,752 clean slices. They stay as margin.
_MIN_SCORED_VOXELS = 500  # counted on the full grid (lattice samples x their area)
# Correlations need more voxels than a median.
_MIN_CORRELATION_VOXELS = 1000  # likewise
# A block is scored when its comparable voxels cover this much of the slice (mm^2).
_MIN_BLOCK_AREA_MM2 = 100.0
# A slice is ratio-scored only where its neighbours agree (within _NEIGHBOUR_AGREEMENT)
# on at least this share of the head's inside. Where the head ends, slices cut scalp,
# skull and cortex tangentially and the profile through three thick slices is far from
# linear: there the neighbours agree on little, and clean slices reached log-ratios of
# -1.4 (measured on the calibration set, 3 and 5 mm, all slicings: 18 false positives in
# about 40,700 clean slices without this rule, none with it; recall unchanged).
_MIN_AGREEMENT_SHARE = 0.15
# A slice's ratio score needs this many scored blocks; with fewer it is not scored.
_MIN_BLOCKS = 4
# The ratio score is the deviation that this share of the blocks reaches or exceeds,
# in the direction of their median: a uniform x4 spike scores log 4 in every block.
_BLOCK_CONSENSUS = 0.75
# Floors of the robust spread (1.4826 MAD) of scores across slices: a perfectly smooth
# volume must not turn a tiny deviation into a huge z-score.
_MIN_RATIO_SPREAD = 0.01
_MIN_CORRELATION_SPREAD = 0.01
# Ratios are clipped here so that a zero slice has a finite log-ratio.
_RATIO_CLIP = 1e-3


@dataclass
class AxisFindings:
    """Flagged slices along one axis: incomplete ones by kind, artifact ones by score."""

    axis: int
    incomplete: dict[int, str] = field(default_factory=dict)
    artifacts: dict[int, dict[str, float | None]] = field(default_factory=dict)
    scored: int = 0
    lattice_step: tuple[int, ...] = ()  # in-plane steps of the scoring lattice
    ratio_center: float = 0.0
    ratio_spread: float = 0.0
    correlation_center: float = 0.0
    correlation_spread: float = 0.0
    # The worst scores left unflagged: how close the clean slices came to the limits.
    max_unflagged_abs_log_ratio: float | None = None
    max_unflagged_correlation_deficit: float | None = None

    @property
    def flagged(self) -> list[int]:
        return sorted(set(self.incomplete) | set(self.artifacts))

    def to_metrics(self) -> dict:
        return {
            "incomplete": {str(i): kind for i, kind in sorted(self.incomplete.items())},
            "artifact": {str(i): s for i, s in sorted(self.artifacts.items())},
            "flagged": self.flagged,
            "scored_slices": self.scored,
            "score_lattice_step": list(self.lattice_step),
            "log_ratio_median": self.ratio_center,
            "log_ratio_spread": self.ratio_spread,
            "correlation_deficit_median": self.correlation_center,
            "correlation_deficit_spread": self.correlation_spread,
            "max_unflagged_abs_log_ratio": self.max_unflagged_abs_log_ratio,
            "max_unflagged_correlation_deficit": self.max_unflagged_correlation_deficit,
        }


def _one_sided(s: int, n: int, excluded: set[int]) -> list[tuple[int, int]]:
    """Pairs of contiguous usable slices right next to ``s`` on each side, nearest first."""
    pairs = []
    for step in (-1, 1):
        pair = (s + step, s + 2 * step)
        if all(0 <= i < n and i not in excluded for i in pair):
            pairs.append(pair)
    return pairs


def _log_ratio_score(stack: SliceStack, s: int, excluded: set[int]) -> float | None:
    """Median log-ratio of slice ``s`` to its neighbours' prediction, or None.

    The prediction interpolates the nearest usable neighbours on both sides. At the
    border of the volume or of an excluded run, the adjacent slice on one side predicts
    and the next one on that side checks that the anatomy is steady there. Where the two
    neighbours differ by one scale factor (:func:`_scaled_apart`), one of them is an
    artifact: the side that is steady predicts, and with two steady sides nothing does.
    """
    a, b = neighbours(s, stack.n, excluded)
    scaled_apart = False
    if a is not None and b is not None:
        # Linear interpolation at s between a and b (they may be at unequal distance).
        score = _ratio_to_prediction(stack, s, a, b, (b - s) / (b - a))
        if score is not _SCALED_APART:
            return score
        scaled_apart = True
    sides = [_ratio_to_prediction(stack, s, a, b, 1.0)
             for a, b in _one_sided(s, stack.n, excluded)]
    sides = [r for r in sides if r is not None and r is not _SCALED_APART]
    if scaled_apart:
        # The neighbours differ by one factor: one side holds an artifact (a spike next
        # to a dropout hides both otherwise), and the steady side predicts the slice.
        return sides[0] if len(sides) == 1 else None
    # Extrapolation is less reliable than interpolation: the milder side counts.
    return min(sides, key=abs) if sides else None


def _ratio_to_prediction(stack: SliceStack, s: int, a: int, b: int, wa: float) -> float | None:
    """Log-ratio of slice ``s`` to ``wa * x[a] + (1 - wa) * x[b]`` over the voxels
    inside the head where ``a`` and ``b`` agree, as most of the slice's blocks see it
    (:func:`_block_consensus`); None when the neighbours do not predict ``s`` (too few
    agreeing voxels, or too small a share of them), and :data:`_SCALED_APART` when they
    differ by a scale factor: scoring ``s`` against a neighbour that is itself a spike
    would flag ``s`` as a dropout.
    """
    common = stack.interior[a] & stack.interior[b]
    if not stack.all_usable:
        common &= stack.usable[s]
    # Voxel indices, gathered once and then narrowed: cheaper than boolean masks.
    index = np.flatnonzero(common)
    if index.size * stack.voxels_per_sample < _MIN_SCORED_VOXELS:
        return None
    xa, xb = _flat(stack.x, a).take(index), _flat(stack.x, b).take(index)
    # Foreground voxels are positive, so the log-ratios are defined.
    log_ab = np.log(xa / xb)
    if _scaled_apart(log_ab):
        return _SCALED_APART
    comparable = np.abs(log_ab) < _NEIGHBOUR_AGREEMENT
    if np.count_nonzero(comparable) < _MIN_AGREEMENT_SHARE * comparable.size:
        return None
    index = index[comparable]
    if index.size * stack.voxels_per_sample < _MIN_SCORED_VOXELS:
        return None
    predicted = xa[comparable].astype(np.float64)
    predicted *= wa
    predicted += (1 - wa) * xb[comparable]
    ratio = _flat(stack.x, s).take(index) / predicted
    log_ratio = np.log(np.clip(ratio, _RATIO_CLIP, 1 / _RATIO_CLIP))
    return _block_consensus(stack, index, log_ratio)


def _block_consensus(stack: SliceStack, index: np.ndarray, log_ratio: np.ndarray
                     ) -> float | None:
    """The deviation most blocks of the slice agree on (see :data:`_BLOCK_CONSENSUS`),
    or None when fewer than :data:`_MIN_BLOCKS` blocks hold enough comparable voxels.

    ``index`` are flat in-plane indices of the comparable voxels, ``log_ratio`` their
    log-ratios to the neighbours' prediction.
    """
    rows, cols = np.divmod(index, stack.x.shape[2])
    blocks_across = int(stack.block_of_col.max()) + 1
    block = stack.block_of_row[rows] * blocks_across + stack.block_of_col[cols]
    order = np.argsort(block, kind="stable")
    block, log_ratio = block[order], log_ratio[order]
    starts = np.flatnonzero(np.r_[True, block[1:] != block[:-1]])
    ends = np.r_[starts[1:], block.size]
    needed = _MIN_BLOCK_AREA_MM2 / stack.sample_area_mm2
    medians = [float(np.median(log_ratio[a:b])) for a, b in zip(starts, ends) if b - a >= needed]
    if len(medians) < _MIN_BLOCKS:
        return None
    medians = np.asarray(medians)
    centre = float(np.median(medians))
    if centre < 0:  # the deviation at least the consensus share of blocks reach
        return min(float(np.quantile(medians, _BLOCK_CONSENSUS)), 0.0)
    return max(float(np.quantile(medians, 1.0 - _BLOCK_CONSENSUS)), 0.0)


def _flat(array: np.ndarray, s: int) -> np.ndarray:
    """Slice ``s`` of a contiguous stack as a flat view."""
    return array[s].reshape(-1)


def _scaled_apart(log_ab: np.ndarray) -> bool:
    """Whether two neighbours differ by one scale factor of at least 1.5: their median
    |log-ratio| reaches log(1.5) and most voxels (:data:`_UNIFORM_SCALE_SHARE`) sit
    within :data:`_NEIGHBOUR_AGREEMENT` of it, as across a spike or a dropout. Where the
    head ends, neighbours differ by more than that too, but voxel by voxel, not by one
    factor.

    Counting the values beyond +/-log(1.5) settles the first part without ordering
    anything: the median reaches log(1.5) only if the upper middle value does, i.e. if
    ``n - n // 2`` values do, and likewise downwards.
    """
    needed = log_ab.size - log_ab.size // 2
    limit = np.float64(_NEIGHBOUR_SCALE_OFFSET)
    if not (np.count_nonzero(log_ab >= limit) >= needed
            or np.count_nonzero(log_ab <= -limit) >= needed):
        return False
    offset = np.median(log_ab)
    uniform = np.count_nonzero(np.abs(log_ab - offset) < _NEIGHBOUR_AGREEMENT)
    return bool(uniform >= _UNIFORM_SCALE_SHARE * log_ab.size)


def _correlation_deficit(stack: SliceStack, s: int, excluded: set[int]) -> float | None:
    """``corr(a, b) - mean(corr(a, s), corr(s, b))`` over the neighbours' foreground."""
    a, b = neighbours(s, stack.n, excluded)
    if a is None or b is None:
        return None
    region = stack.foreground[a] | stack.foreground[b]
    if not stack.all_usable:
        region &= stack.usable[s]
    index = np.flatnonzero(region)
    if index.size * stack.voxels_per_sample < _MIN_CORRELATION_VOXELS:
        return None
    # Each slice centred once and its squared norm taken once, for the three pairs.
    pa, ps, pb = (_centred(_flat(stack.x, i).take(index)) for i in (a, s, b))
    c_ab, c_as, c_sb = _pearson(pa, pb), _pearson(pa, ps), _pearson(ps, pb)
    if c_ab is None or c_as is None or c_sb is None:
        return None
    return c_ab - 0.5 * (c_as + c_sb)


def _centred(values: np.ndarray) -> tuple[np.ndarray, float]:
    """float64 values minus their mean, and the sum of their squares."""
    p = values.astype(np.float64)
    p -= p.mean()
    return p, np.dot(p, p)


def _pearson(p: tuple[np.ndarray, float], q: tuple[np.ndarray, float]) -> float | None:
    """Pearson correlation of two :func:`_centred` vectors; None if either is flat."""
    norm = np.sqrt(p[1] * q[1])
    if norm <= 0:
        return None
    return float(np.dot(p[0], q[0]) / norm)


def _robust_center_spread(values: list[float], floor: float) -> tuple[float, float]:
    if not values:
        return 0.0, floor
    v = np.asarray(values)
    center = float(np.median(v))
    return center, max(1.4826 * float(np.median(np.abs(v - center))), floor)


def find_artifacts(
    data: np.ndarray,
    usable: np.ndarray,
    axis: int,
    excluded: set[int],
    threshold: float,
    params: MaskSlicesParams,
    affine=None,
) -> AxisFindings:
    """Artifact slices along ``axis`` (incomplete slices in ``excluded`` are skipped).

    Parameters
    ----------
    data, usable : ndarray
        Intensities and the voxels that may be looked at.
    axis : int
    excluded : set of int
        Slices already known to be bad: neither scored nor used as neighbours.
    threshold : float
        Foreground threshold of the volume.
    params : MaskSlicesParams
    affine : ndarray, shape (4, 4), optional
        The volume's affine, for the scoring lattice (``params.score_spacing_mm``);
        without it every voxel is scored.

    Returns
    -------
    AxisFindings
        ``artifacts`` maps each flagged index to its scores (``log_ratio``, ``ratio_z``,
        ``correlation_deficit``, ``correlation_z``), in the order they were found.
    """
    lattice = Lattice() if affine is None else \
        scoring_lattice(data.shape, affine, axis, params.score_spacing_mm)
    stack = slice_stack(prepare(data, usable, threshold), axis, lattice)
    return score_axis(stack, axis, excluded, params)


def score_axis(
    stack: SliceStack, axis: int, excluded: set[int], params: MaskSlicesParams
) -> AxisFindings:
    """:func:`find_artifacts` on a prepared stack."""
    excluded = set(excluded)
    candidates = [s for s in range(stack.n) if s not in excluded]
    ratios = {s: _log_ratio_score(stack, s, excluded) for s in candidates}
    deficits = {s: _correlation_deficit(stack, s, excluded) for s in candidates}
    ratio_center, ratio_spread = _robust_center_spread(
        [r for r in ratios.values() if r is not None], _MIN_RATIO_SPREAD
    )
    corr_center, corr_spread = _robust_center_spread(
        [d for d in deficits.values() if d is not None], _MIN_CORRELATION_SPREAD
    )
    findings = AxisFindings(
        axis=axis,
        scored=sum(r is not None for r in ratios.values()),
        ratio_center=ratio_center,
        ratio_spread=ratio_spread,
        correlation_center=corr_center,
        correlation_spread=corr_spread,
    )
    log_limit = float(np.log(params.intensity_ratio))

    def severity(s: int) -> float:
        """How far past its limits slice s is (> 1 means flagged); 0 if unscored."""
        worst = 0.0
        r, d = ratios.get(s), deficits.get(s)
        if r is not None:
            z = abs(r - ratio_center) / ratio_spread
            worst = max(worst, min(abs(r) / log_limit, z / params.z_threshold))
        if d is not None:
            z = (d - corr_center) / corr_spread
            worst = max(worst, min(d / params.correlation_deficit, z / params.z_threshold))
        return worst

    while ratios:
        worst = max(ratios, key=severity)
        if severity(worst) <= 1.0:
            break
        r, d = ratios.pop(worst), deficits.pop(worst)
        findings.artifacts[worst] = {
            "log_ratio": r,
            "ratio_z": None if r is None else (r - ratio_center) / ratio_spread,
            "correlation_deficit": d,
            "correlation_z": None if d is None else (d - corr_center) / corr_spread,
        }
        excluded.add(worst)
        # Only slices that used the flagged one as a neighbour change their scores.
        for s in range(worst - MAX_NEIGHBOUR_DISTANCE, worst + MAX_NEIGHBOUR_DISTANCE + 1):
            if s in ratios:
                ratios[s] = _log_ratio_score(stack, s, excluded)
                deficits[s] = _correlation_deficit(stack, s, excluded)
    left_ratios = [abs(r) for r in ratios.values() if r is not None]
    left_deficits = [d for d in deficits.values() if d is not None]
    findings.max_unflagged_abs_log_ratio = max(left_ratios, default=None)
    findings.max_unflagged_correlation_deficit = max(left_deficits, default=None)
    return findings
