"""Mask slices: find incomplete and artifact slices and mark them invalid.

Two families of bad slices, both real scanner failures:

* **incomplete** slices carry no measurement: zero-filled (dropped k-space lines or
  reconstruction gaps), wholly or over part of the head, constant, dominated by invalid
  voxels (non-finite values the sanitize stage filled), or empty slices at the border
  that cut the head off. These are unambiguous, so they are searched along every axis.
  A partly zero-filled slice is measured against its neighbours: the share of the
  tissue both of them hold that is exactly zero in it, which no background (noise or
  the zeros of a skull-stripped image) can imitate. Empty slices beyond the end of the
  head are air, not a defect, and are left alone.
* **artifact** slices hold a measurement that disagrees with their neighbours: a slice
  whose intensity jumps (spike) or drops (signal dropout, as FSL eddy and DSI Studio
  detect it in diffusion data), or whose structure no longer matches its neighbours
  (motion within the slice, ghosting). They are searched along the acquisition (thickest)
  axis, and along every axis when the volume is isotropic and the acquisition axis is
  unknown.

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

Measured on the calibration set (:mod:`mriprep.demo.calibration`: four synthetic people
and three real Colin27 scans, each at 3 and 5 mm in axial, coronal and sagittal slicing,
straight and tilted by 20 degrees, fields of view cut at the vertex and the neck;
``make bench`` prints it, ``benchmarks/bench_slices.py``): no false positive in 40,688
clean slices of 84 scans, and 81/84 spikes (x2.5-4), 81/84 dropouts (x0.4-0.6), 84/84
zero-filled and 82/84 half zero-filled slices found in the bulk of the head
(cross-section at least half the largest).

Scores are computed on an in-plane lattice of about 2 mm (``score_spacing_mm``): every
second voxel of a 1 mm slice along each in-plane axis. The artifacts scored here span
the slice. The lattice is anchored to the anatomy (counted from the RAS+ end of each
axis), so a scan stored flipped or permuted scores the same voxels. Incomplete slices
are always judged on every voxel: an exact zero must be exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from nibabel import orientations
from scipy import ndimage

from mriprep.core.errors import PipelineConfigError
from mriprep.stages import StageOutput, stage
from mriprep.stages.intensity import foreground_mask, robust_threshold
from mriprep.core.volume import Volume

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
# A neighbour further than this many slices away predicts too little to be compared: a
# slice may be judged across one flagged neighbour, not across a slab.
_MAX_NEIGHBOUR_DISTANCE = 2
# An empty (zero or constant) slice at the border of the volume lies outside the head,
# and is no defect, when the nearest slice with content holds less head than this share
# of the largest slice's head: the head ended before the field of view did. A larger
# share there means the head was cut off by the empty slices.
_HEAD_END_FRACTION = 0.15
# Fewer voxels of the neighbours' common foreground than this and a slice's missing
# tissue is not measured (a slice grazing the top of the head).
_MIN_TISSUE_VOXELS = 500
# Artifact scores are judged block by block: a spike or a dropout scales the whole
# slice, while anatomy that changes fast between thick slices (the top of the head, an
# obliquely cut edge, the skull base) changes only part of it. Blocks are squares of
# this side (mm) in the slice's plane.
_BLOCK_MM = 32.0
# A block is scored when its comparable voxels cover this much of the slice (mm^2).
_MIN_BLOCK_AREA_MM2 = 100.0
# A slice is ratio-scored only where its neighbours agree (within _NEIGHBOUR_AGREEMENT)
# on at least this share of the head's inside. Where the head ends, slices cut scalp,
# skull and cortex tangentially and the profile through three thick slices is far from
# linear: there the neighbours agree on little, and clean slices reached log-ratios of
# -1.4 (measured on the calibration set, 3 and 5 mm, all slicings: 18 false positives in
# about 40,700 clean slices without this rule, none with it; recall unchanged).
_MIN_AGREEMENT_SHARE = 0.15
# Ratio scores look at the head's inside only: this far (mm, in-plane) from its edge.
_EDGE_MM = 10.0
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


@dataclass(frozen=True)
class MaskSlicesParams:
    """Parameters of the mask_slices stage.

    Attributes
    ----------
    axes : {"auto", "acquisition", "all"}
        Axes searched for artifact slices: ``"acquisition"`` is the thickest axis only,
        ``"all"`` every axis, ``"auto"`` the thickest axis of an anisotropic volume and
        every axis of an isotropic one. Incomplete slices are searched along every axis.
    isotropy_tolerance : float
        A volume whose largest spacing is at most this times its smallest is isotropic.
    max_invalid_slice_fraction : float
        A slice with at least this fraction of invalid or non-finite voxels is incomplete.
    zero_excess_fraction : float
        A slice is zero-filled when at least this share of the tissue both its
        neighbours hold is exactly zero in it (or when it is all zero).
    intensity_ratio : float
        A slice brighter than this times, or darker than 1/this times, the average of its
        neighbours (median over the comparable voxels) is an artifact.
    correlation_deficit : float
        A slice whose correlation with its neighbours falls this far below theirs with
        each other is an artifact.
    z_threshold : float
        An artifact score must also lie this many robust standard deviations (1.4826 MAD
        over the slices of the axis) from the median score, so that a scan whose slices
        all vary a lot is judged against its own variation. 4 finds a 16 mm in-plane
        shift of a sagittal or coronal slice (z 4.4 at 5 it was missed) and leaves every
        clean slice of the calibration set unflagged.
    score_spacing_mm : float
        Artifact scores use every k-th voxel along each in-plane axis, k the largest whole
        number with k * spacing <= this (at least 1): a lattice of about this spacing.
        0 scores every voxel.
    fill : {"none", "neighbours"}
        ``"neighbours"`` replaces flagged slices by linear interpolation between the
        nearest unflagged slices (they stay invalid); ``"none"`` keeps their values.
    """

    axes: Literal["auto", "acquisition", "all"] = "auto"
    isotropy_tolerance: float = 1.2
    max_invalid_slice_fraction: float = 0.5
    zero_excess_fraction: float = 0.3
    intensity_ratio: float = 1.25
    correlation_deficit: float = 0.2
    z_threshold: float = 4.0
    score_spacing_mm: float = 2.0
    fill: Literal["none", "neighbours"] = "none"

    def __post_init__(self):
        checks = [
            (self.isotropy_tolerance >= 1.0, "isotropy_tolerance", "at least 1"),
            (0.0 < self.max_invalid_slice_fraction <= 1.0, "max_invalid_slice_fraction",
             "in (0, 1]"),
            (0.0 < self.zero_excess_fraction <= 1.0, "zero_excess_fraction", "in (0, 1]"),
            (self.intensity_ratio > 1.0, "intensity_ratio", "above 1"),
            (0.0 < self.correlation_deficit <= 2.0, "correlation_deficit", "in (0, 2]"),
            (self.z_threshold > 0.0, "z_threshold", "positive"),
            (0.0 <= self.score_spacing_mm < np.inf, "score_spacing_mm", "finite and >= 0"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise PipelineConfigError(
                    f"{name} must be {expected}, got {getattr(self, name)}"
                )


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


def artifact_axes(spacing, params: MaskSlicesParams) -> tuple[int, ...]:
    """The axes searched for artifact slices (see :attr:`MaskSlicesParams.axes`)."""
    spacing = np.asarray(spacing, dtype=np.float64)
    thickest = int(np.argmax(spacing))
    if params.axes == "all":
        return (0, 1, 2)
    if params.axes == "acquisition":
        return (thickest,)
    isotropic = spacing.max() <= params.isotropy_tolerance * spacing.min()
    return (0, 1, 2) if isotropic else (thickest,)


@dataclass
class _SliceProfile:
    """Per-slice statistics of the usable voxels along one axis."""

    invalid_fraction: np.ndarray
    lowest: np.ndarray  # float64; +inf for a slice without usable voxels
    highest: np.ndarray
    has_values: np.ndarray


def _slice_profile(data: np.ndarray, usable: np.ndarray, axis: int) -> _SliceProfile:
    x = np.moveaxis(data, axis, 0)
    ok = np.moveaxis(usable, axis, 0)
    flat_axes = tuple(range(1, x.ndim))
    per_slice = ok[0].size
    return _SliceProfile(
        invalid_fraction=1.0 - np.count_nonzero(ok, axis=flat_axes) / per_slice,
        lowest=np.where(ok, x, np.float32(np.inf)).min(axis=flat_axes).astype(np.float64),
        highest=np.where(ok, x, np.float32(-np.inf)).max(axis=flat_axes).astype(np.float64),
        has_values=ok.any(axis=flat_axes),
    )


def _slice_profiles(data: np.ndarray, usable: np.ndarray) -> list[_SliceProfile]:
    """:func:`_slice_profile` along every axis of a 3D volume.

    When every voxel is usable there is nothing to mask, and the three axes share their
    passes: one reduction along the last axis gives a plane whose rows and columns
    reduce to the first two axes' slices; one more pass gives the last axis'.
    """
    if not usable.all() or data.ndim != 3 or data.size == 0:
        return [_slice_profile(data, usable, axis) for axis in range(data.ndim)]
    plane_low, plane_high = data.min(axis=2), data.max(axis=2)
    lows = (plane_low.min(axis=1), plane_low.min(axis=0), data.min(axis=(0, 1)))
    highs = (plane_high.max(axis=1), plane_high.max(axis=0), data.max(axis=(0, 1)))
    profiles = []
    for axis in range(3):
        n = data.shape[axis]
        profiles.append(_SliceProfile(
            invalid_fraction=np.zeros(n),
            lowest=lows[axis].astype(np.float64),
            highest=highs[axis].astype(np.float64),
            has_values=np.ones(n, dtype=bool),
        ))
    return profiles


def find_incomplete(
    data: np.ndarray,
    usable: np.ndarray,
    axis: int,
    params: MaskSlicesParams,
    profile: _SliceProfile | None = None,
    foreground: np.ndarray | None = None,
) -> dict[int, str]:
    """Incomplete slices along ``axis``: index -> kind.

    Kinds: ``"invalid"`` (mostly invalid or non-finite), ``"zero"`` (zero-filled: wholly,
    or over at least ``zero_excess_fraction`` of the tissue both neighbours hold),
    ``"constant"`` (one non-zero value), and ``"outside_fov"`` for empty slices at the
    border of the volume that cut the head off. Empty slices beyond the end of the head
    (air, or the zero background of a skull-stripped image) are no defect and are not
    returned.

    Parameters
    ----------
    data : ndarray
        Intensities; non-usable voxels are ignored (they may be NaN).
    usable : ndarray of bool
        Valid and finite voxels.
    axis : int
    params : MaskSlicesParams
    profile : optional
        The slices' statistics when the caller computed them for every axis at once.
    foreground : ndarray of bool, optional
        The head (usable voxels above the volume's foreground threshold); computed here
        when not given.
    """
    if profile is None:
        profile = _slice_profile(data, usable, axis)
    if foreground is None:
        foreground = foreground_mask(data, usable)
    n = data.shape[axis]
    invalid_fraction = profile.invalid_fraction
    lowest, highest, has_values = profile.lowest, profile.highest, profile.has_values
    if has_values.any():
        # Slices count as constant up to float32 rounding of the volume's range.
        tolerance = 1e-6 * (highest[has_values].max() - lowest[has_values].min())
    else:
        tolerance = 0.0

    kinds: dict[int, str] = {}
    for s in range(n):
        if invalid_fraction[s] >= params.max_invalid_slice_fraction:
            kinds[s] = "invalid"
        elif has_values[s] and highest[s] - lowest[s] <= tolerance:
            kinds[s] = "zero" if abs(lowest[s]) <= tolerance else "constant"
    if len(kinds) == n:
        return kinds  # nothing but empty slices: a dead volume, not padding
    x = np.moveaxis(data, axis, 0)
    ok = np.moveaxis(usable, axis, 0)
    head = np.moveaxis(foreground, axis, 0)
    for s, fraction in enumerate(_missing_tissue(x, ok, head, set(kinds))):
        if fraction >= params.zero_excess_fraction:
            kinds[s] = "zero"

    # Empty slices at the border: outside the head, unless the head runs into them.
    head_area = np.count_nonzero(head, axis=(1, 2))
    largest = max(int(head_area.max()), 1)
    for border_run in (range(n), range(n - 1, -1, -1)):
        run = []
        for s in border_run:
            if kinds.get(s) not in ("zero", "constant"):
                break
            run.append(s)
        if not run or len(run) == n:
            continue
        inner = border_run[len(run)]
        cut_off = head_area[inner] >= _HEAD_END_FRACTION * largest
        for s in run:
            if cut_off:
                kinds[s] = "outside_fov"
            else:
                del kinds[s]
    return kinds


def _missing_tissue(x: np.ndarray, ok: np.ndarray, head: np.ndarray, empty: set[int]):
    """Per slice of a stack: the share of the tissue both nearest non-empty neighbours
    hold that is exactly zero in the slice (NaN where there is too little of it).

    A slice half zero-filled loses half the head; a clean slice loses nothing, whatever
    its background. Counting zeros within the neighbours' head, not within the whole
    plane, makes a skull-stripped image's zero background irrelevant.
    """
    n = x.shape[0]
    out = np.full(n, np.nan)
    for s in range(n):
        if s in empty:
            continue
        below, above = _neighbours(s, n, empty)
        if below is None or above is None:
            continue
        common = head[below] & head[above] & ok[s]
        count = int(np.count_nonzero(common))
        if count >= _MIN_TISSUE_VOXELS:
            out[s] = np.count_nonzero(common & (x[s] == 0)) / count
    return out


@dataclass
class _SliceStack:
    """One axis of a volume as a stack of slices, with what scoring needs."""

    x: np.ndarray  # [n, ...] intensities, non-usable voxels set to 0
    usable: np.ndarray  # [n, ...]
    foreground: np.ndarray  # [n, ...]
    interior: np.ndarray  # [n, ...] the head's inside, away from scalp and skull
    all_usable: bool = False  # every voxel usable: ``usable`` need not be consulted
    voxels_per_sample: int = 1  # full-grid voxels each lattice sample stands for
    # The ratio score's in-plane block of each sample row and column (see _BLOCK_MM),
    # counted from the RAS+ end of the axis like the lattice: a flipped scan groups
    # the same voxels.
    block_of_row: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    block_of_col: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    sample_area_mm2: float = 1.0  # in-plane area each sample stands for

    @property
    def n(self) -> int:
        return self.x.shape[0]


@dataclass
class _Prepared:
    """What the stacks of every axis are cut from, computed once per volume."""

    x: np.ndarray
    usable: np.ndarray
    foreground: np.ndarray
    all_usable: bool
    extent: tuple[slice, slice, slice]  # the foreground's bounding box


def _prepare(data, usable, threshold) -> _Prepared:
    all_usable = bool(usable.all())
    x = data if all_usable else np.where(usable, data, np.float32(0))
    # Scores are ratios of magnitudes: only positive voxels can be foreground.
    foreground = x > max(threshold, 0.0)
    if not all_usable:
        foreground &= usable
    plane = foreground.any(axis=0)
    along = (foreground.any(axis=(1, 2)), plane.any(axis=1), plane.any(axis=0))
    extent = []
    for present in along:
        where = np.flatnonzero(present)
        extent.append(slice(int(where[0]), int(where[-1]) + 1) if where.size else slice(None))
    return _Prepared(x=x, usable=usable, foreground=foreground, all_usable=all_usable,
                     extent=tuple(extent))


@dataclass(frozen=True)
class _Lattice:
    """Which voxels of each in-plane axis are scored: every ``step``-th, those whose index
    counted from the RAS+ end of the axis is a multiple of it. Anchored to the anatomy,
    not to the storage order, so a scan stored flipped or permuted scores the same
    voxels."""

    steps: tuple[int, int, int] = (1, 1, 1)
    phases: tuple[int, int, int] = (0, 0, 0)  # required index modulo step, per axis
    sample_mm: tuple[float, float, float] = (1.0, 1.0, 1.0)  # mm between samples, per axis
    flipped: tuple[bool, bool, bool] = (False, False, False)  # axis runs from the RAS+ end
    spacing_mm: tuple[float, float, float] = (1.0, 1.0, 1.0)  # voxel size, per axis


def scoring_lattice(volume_shape, affine, axis: int, score_spacing_mm: float) -> _Lattice:
    """The lattice of slices along ``axis``: steps of about ``score_spacing_mm`` in-plane,
    every slice along ``axis`` itself."""
    spacing = np.linalg.norm(np.asarray(affine, dtype=np.float64)[:3, :3], axis=0)
    steps = [max(1, int(np.floor(score_spacing_mm / s + 1e-6))) if score_spacing_mm else 1
             for s in spacing]
    steps[axis] = 1
    flipped = orientations.io_orientation(np.asarray(affine, dtype=np.float64))[:, 1] < 0
    phases = [(n - 1) % k if flip else 0 for n, k, flip in zip(volume_shape, steps, flipped)]
    sample_mm = tuple(float(k * s) for k, s in zip(steps, spacing))
    return _Lattice(tuple(steps), tuple(phases), sample_mm,
                    tuple(bool(f) for f in flipped), tuple(float(s) for s in spacing))


def _stack(prepared: _Prepared, axis: int, lattice: _Lattice = _Lattice()) -> _SliceStack:
    # Scores only look at the neighbours' foreground, so the slices can be cropped to
    # its in-plane bounding box: the same scores, at half the cost on a typical head.
    box = []
    for extent, step, phase in zip(prepared.extent, lattice.steps, lattice.phases):
        start = extent.start or 0
        box.append(slice(start + (phase - start) % step, extent.stop, step))
    box[axis] = slice(None)
    box = tuple(box)

    # Slice by slice work wants each slice contiguous: along the last axes of a C-ordered
    # volume, a slice's voxels otherwise lie a whole row or plane apart in memory.
    def cut(array):
        return np.ascontiguousarray(np.moveaxis(array[box], axis, 0))

    x = cut(prepared.x)
    plane = [a for a in range(3) if a != axis]
    foreground = cut(prepared.foreground)
    sample_mm = [lattice.sample_mm[a] for a in plane]
    interior = _head_inside(foreground, sample_mm)
    return _SliceStack(
        x=x,
        usable=np.broadcast_to(True, x.shape) if prepared.all_usable else cut(prepared.usable),
        foreground=foreground,
        interior=interior,
        all_usable=prepared.all_usable,
        voxels_per_sample=int(np.prod(lattice.steps)),
        block_of_row=_blocks_along(box[plane[0]], prepared.x.shape[plane[0]], lattice, plane[0]),
        block_of_col=_blocks_along(box[plane[1]], prepared.x.shape[plane[1]], lattice, plane[1]),
        sample_area_mm2=float(np.prod(sample_mm)),
    )


def _blocks_along(cut: slice, n: int, lattice: _Lattice, axis: int) -> np.ndarray:
    """The block of each sample the ``cut`` keeps of an axis of ``n`` voxels."""
    index = np.arange(n)[cut]
    if lattice.flipped[axis]:
        index = n - 1 - index
    size = max(1, int(round(_BLOCK_MM / lattice.spacing_mm[axis])))
    return index // size


def _head_inside(foreground: np.ndarray, sample_mm) -> np.ndarray:
    """Per slice, the head's inside: the foreground within the filled head eroded by
    :data:`_EDGE_MM` in the slice's plane (away from scalp and skull). Holes are filled
    before eroding so that dark ventricles or sinuses do not eat into the inside; their
    own voxels stay out (a skull-stripped image holds zeros there)."""
    flat = np.zeros((1, 3, 3), dtype=bool)
    flat[0, 1, :] = flat[0, :, 1] = True
    filled = ndimage.binary_fill_holes(foreground, structure=flat)
    steps = max(1, int(round(_EDGE_MM / max(min(sample_mm), 1e-6))))
    inside = ndimage.binary_erosion(filled, structure=flat, iterations=steps)
    inside &= foreground
    return inside


def _neighbours(s: int, n: int, excluded: set[int]) -> tuple[int | None, int | None]:
    """The nearest usable slices below and above ``s`` within reach (or None)."""
    below = next((i for i in range(s - 1, max(s - 1 - _MAX_NEIGHBOUR_DISTANCE, -1), -1)
                  if i not in excluded), None)
    above = next((i for i in range(s + 1, min(s + 1 + _MAX_NEIGHBOUR_DISTANCE, n))
                  if i not in excluded), None)
    return below, above


def _one_sided(s: int, n: int, excluded: set[int]) -> list[tuple[int, int]]:
    """Pairs of contiguous usable slices right next to ``s`` on each side, nearest first."""
    pairs = []
    for step in (-1, 1):
        pair = (s + step, s + 2 * step)
        if all(0 <= i < n and i not in excluded for i in pair):
            pairs.append(pair)
    return pairs


def _log_ratio_score(stack: _SliceStack, s: int, excluded: set[int]) -> float | None:
    """Median log-ratio of slice ``s`` to its neighbours' prediction, or None.

    The prediction interpolates the nearest usable neighbours on both sides. At the
    border of the volume or of an excluded run, the adjacent slice on one side predicts
    and the next one on that side checks that the anatomy is steady there. Where the two
    neighbours differ by one scale factor (:func:`_scaled_apart`), one of them is an
    artifact: the side that is steady predicts, and with two steady sides nothing does.
    """
    a, b = _neighbours(s, stack.n, excluded)
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


def _ratio_to_prediction(stack: _SliceStack, s: int, a: int, b: int, wa: float) -> float | None:
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


def _block_consensus(stack: _SliceStack, index: np.ndarray, log_ratio: np.ndarray
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


def _correlation_deficit(stack: _SliceStack, s: int, excluded: set[int]) -> float | None:
    """``corr(a, b) - mean(corr(a, s), corr(s, b))`` over the neighbours' foreground."""
    a, b = _neighbours(s, stack.n, excluded)
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
    lattice = _Lattice() if affine is None else \
        scoring_lattice(data.shape, affine, axis, params.score_spacing_mm)
    stack = _stack(_prepare(data, usable, threshold), axis, lattice)
    return _score_axis(stack, axis, excluded, params)


def _score_axis(
    stack: _SliceStack, axis: int, excluded: set[int], params: MaskSlicesParams
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
        for s in range(worst - _MAX_NEIGHBOUR_DISTANCE, worst + _MAX_NEIGHBOUR_DISTANCE + 1):
            if s in ratios:
                ratios[s] = _log_ratio_score(stack, s, excluded)
                deficits[s] = _correlation_deficit(stack, s, excluded)
    left_ratios = [abs(r) for r in ratios.values() if r is not None]
    left_deficits = [d for d in deficits.values() if d is not None]
    findings.max_unflagged_abs_log_ratio = max(left_ratios, default=None)
    findings.max_unflagged_correlation_deficit = max(left_deficits, default=None)
    return findings


def fill_from_neighbours(data: np.ndarray, axis: int, flagged: list[int]) -> np.ndarray:
    """A copy of ``data`` whose ``flagged`` slices along ``axis`` are interpolated linearly
    from the nearest unflagged slices (copied from the one side where only one exists)."""
    out = data.copy()
    x = np.moveaxis(out, axis, 0)
    n = x.shape[0]
    bad = set(flagged)
    good = [i for i in range(n) if i not in bad]
    if not good:
        return out
    for s in flagged:
        below = [i for i in good if i < s]
        above = [i for i in good if i > s]
        if below and above:
            a, b = below[-1], above[0]
            wa = np.float32((b - s) / (b - a))
            x[s] = wa * x[a] + (np.float32(1) - wa) * x[b]
        else:
            x[s] = x[below[-1] if below else above[0]]
    return out


@stage("mask_slices", MaskSlicesParams)
def mask_slices(volume: Volume, params: MaskSlicesParams) -> StageOutput:
    """Flag incomplete and artifact slices; mark them invalid and optionally fill them.

    Parameters
    ----------
    volume : Volume
        Sanitised data (non-finite voxels are ignored, never used).
    params : MaskSlicesParams

    Returns
    -------
    StageOutput
        The volume with flagged slices ``valid=False`` (and filled if ``params.fill``).
        Metrics per axis (``axis_0`` ...): incomplete slices by kind, artifact slices with
        their scores, the robust centre and spread of the scores; plus the searched axes
        and the number of flagged slices.
    """
    data, valid = volume.data, volume.valid
    usable = valid & np.isfinite(data)
    all_usable = bool(usable.all())
    threshold = robust_threshold(data if all_usable else data[usable])
    searched = artifact_axes(volume.spacing, params)
    prepared = _prepare(data, usable, threshold)
    profiles = _slice_profiles(data, usable)
    findings: dict[int, AxisFindings] = {}
    for axis in range(3):
        incomplete = find_incomplete(data, usable, axis, params, profiles[axis],
                                     prepared.foreground)
        if axis in searched:
            lattice = scoring_lattice(data.shape, volume.affine, axis, params.score_spacing_mm)
            found = _score_axis(_stack(prepared, axis, lattice), axis, set(incomplete), params)
            found.lattice_step = tuple(st for i, st in enumerate(lattice.steps) if i != axis)
        else:
            found = AxisFindings(axis=axis)
        found.incomplete = incomplete
        findings[axis] = found

    warnings: list[str] = []
    new_valid = valid.copy()
    out = data
    for axis, found in findings.items():
        flagged = found.flagged
        if not flagged:
            continue
        np.moveaxis(new_valid, axis, 0)[flagged] = False
        if params.fill == "neighbours":
            out = fill_from_neighbours(out, axis, flagged)
        n = data.shape[axis]
        warnings.append(
            f"axis {axis}: {len(found.incomplete)} incomplete and {len(found.artifacts)} "
            f"artifact slice(s) of {n} marked invalid: {flagged}"
        )
        if len(flagged) > n // 4:
            warnings.append(
                f"axis {axis}: {len(flagged)} of {n} slices are bad; check the scan "
                "before training on it"
            )
    metrics = {
        "artifact_axes": list(searched),
        "n_flagged": sum(len(f.flagged) for f in findings.values()),
        "n_incomplete": sum(len(f.incomplete) for f in findings.values()),
        "n_artifact": sum(len(f.artifacts) for f in findings.values()),
        "invalid_fraction": 1.0 - np.count_nonzero(new_valid) / new_valid.size,
        **{f"axis_{axis}": f.to_metrics() for axis, f in findings.items()},
    }
    return StageOutput(volume.replace(data=out, valid=new_valid), metrics, warnings)
