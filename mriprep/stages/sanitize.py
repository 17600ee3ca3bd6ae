"""Sanitise: find NaN, +/-Inf and extreme values and fill them before anything interpolates.

This stage runs before registration because a single NaN voxel spreads through any
interpolator (ITK's B-spline turns one into a NaN volume) and ANTs refuses NaN input.

What counts as unusable:

* NaN, +Inf and -Inf (the loader turns values beyond float32's range, such as 1e308, into
  +/-Inf, so they arrive here as infinities);
* *extreme* finite values, far outside the foreground's robust intensity range: separated
  from the intensity bulk by a gap wider than ``extreme_factor`` inter-quartile ranges
  of the foreground. Metal and susceptibility artifacts write values such as 1e30 that
  are finite in float32 yet flatten the whole brain to zero under z-normalisation;
* with a float16 cache, any value beyond float16's range (65504).

Replaced voxels become invalid in ``valid``; every other voxel keeps its exact bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import ndimage

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.limits import FLOAT16_MAX
from mriprep.core.volume import Volume
from mriprep.stages import StageOutput, stage
from mriprep.stages.intensity import foreground_mask, percentiles
from mriprep.stages.qc_declaration import FILLED_COUNTS, InvalidCause, QCMetric, StageQC


# A local-fill estimate is trusted once the Gaussian weights of known neighbours sum to
# this much; below it the kernel is widened. Any positive weight gives a true weighted
# mean of known voxels; the floor only keeps the estimate from resting on a far tail.
_MIN_LOCAL_WEIGHT = 1e-2
_MAX_LOCAL_ROUNDS = 5


@dataclass(frozen=True)
class SanitizeParams:
    """Parameters of the sanitize stage.

    Attributes
    ----------
    strategy : {"local", "median", "mean", "zero"}
        How replaced voxels are filled: a Gaussian-weighted mean of valid neighbours
        (normalised convolution), the median or mean of the valid foreground, or zero.
    extreme_factor : float
        A finite value is extreme when a gap wider than this many inter-quartile ranges of
        the foreground (finite, non-zero voxels) separates it from the intensity bulk
        (see :func:`robust_limits`). Bright vessels, fat and slice-intensity artifacts
        (mask_slices handles those) stay connected to the bulk; 1e30 does not.
    output_dtype : {"float32", "float16", "uint8"}
        The cache's dtype. With float16, values beyond +/-65504 are extreme as well.
    max_invalid_fraction : float
        The subject fails when more than this fraction of its voxels is invalid.
    local_sigma_mm : float
        Width (Gaussian sigma, mm) of the neighbourhood used by the ``local`` strategy; it
        doubles where a hole is too large for it.
    """

    strategy: Literal["local", "median", "mean", "zero"] = "local"
    extreme_factor: float = 20.0
    output_dtype: Literal["float32", "float16", "uint8"] = "float32"
    max_invalid_fraction: float = 0.15
    local_sigma_mm: float = 2.0

    def __post_init__(self):
        if not self.extreme_factor > 0:
            raise PipelineConfigError(
                f"extreme_factor must be positive, got {self.extreme_factor}"
            )
        if not 0.0 <= self.max_invalid_fraction <= 1.0:
            raise PipelineConfigError(
                "max_invalid_fraction must lie in [0, 1], got "
                f"{self.max_invalid_fraction}"
            )
        if not self.local_sigma_mm > 0:
            raise PipelineConfigError(
                f"local_sigma_mm must be positive, got {self.local_sigma_mm}"
            )


def robust_limits(data: np.ndarray, finite: np.ndarray, factor: float) -> tuple[float, float]:
    """The range of the intensity bulk: extreme values lie beyond it, across a wide gap.

    The spread is the inter-quartile range (IQR) of the finite, non-zero voxels (zeros are
    padding or skull-stripped background and would collapse it). Walking up from the third
    quartile through the sorted values, the bulk ends at the first gap between consecutive
    values wider than ``factor`` IQRs; likewise downwards from the first quartile. Real
    intensities form a continuum (a x4 slice spike overlaps the bulk), while 1e30 from a
    metal artifact sits orders of magnitude away. Unlike a percentile limit, which breaks
    once more voxels than its tail are corrupt, this holds until a quarter of the
    foreground is corrupt: far beyond the fraction at which a subject fails anyway.

    Parameters
    ----------
    data : ndarray
        The intensities (any shape).
    finite : ndarray of bool
        ``np.isfinite(data)``, passed in because the caller has it already.
    factor : float
        The widest gap, in IQRs, that the bulk may contain.

    Returns
    -------
    (float, float)
        Lowest and highest value of the bulk, widened to include zero; ``(-inf, inf)``
        when nothing is finite and non-zero.
    """
    # != is a quiet comparison: NaN needs no masking for it.
    values = data[finite & (data != 0)]
    if values.size == 0:
        return -np.inf, np.inf
    # "lower" picks data values, so no interpolation arithmetic can overflow float32.
    q1, q3 = (float(q) for q in percentiles(values, [25.0, 75.0], method="lower"))
    spread = q3 - q1
    if spread <= 0:
        # A (nearly) constant foreground: any other value is implausible. Scale to its
        # level so that float32 rounding of the constant never counts as extreme.
        spread = 1e-3 * max(abs(q1), abs(q3))
    gap = factor * spread
    upper = _bulk_end(values, q3, gap, direction=1)
    lower = _bulk_end(values, q1, gap, direction=-1)
    # Zero (padding, skull-stripped background) is always plausible.
    return min(lower, 0.0), max(upper, 0.0)


def _bulk_end(values: np.ndarray, start: float, gap: float, direction: int) -> float:
    """Walking from ``start`` (up or down), the last value before a step wider than ``gap``.

    A step wider than ``gap`` cannot fit between ``start`` and ``start +/- gap``, so it
    must land on a value beyond that: only those few need sorting, after the value
    nearest to them inside. ``start`` is one of ``values`` (a quartile), so the values
    within the edge reach at least ``start``.
    """
    # float64 scalars and arrays: no overflow when stepping near float32's maximum.
    edge = np.float64(start + direction * gap)
    # The common case, nothing beyond the edge, costs one pass.
    furthest = np.float64(values.max() if direction > 0 else values.min())
    if (furthest <= edge) if direction > 0 else (furthest >= edge):
        return float(furthest)
    beyond = values > edge if direction > 0 else values < edge
    if direction > 0:
        nearest = np.max(values, where=~beyond, initial=start)
    else:
        nearest = np.min(values, where=~beyond, initial=start)
    walk = np.concatenate([[nearest], np.sort(values[beyond].astype(np.float64))[::direction]])
    jumps = np.flatnonzero(np.abs(np.diff(walk)) > gap)
    return float(walk[jumps[0]] if jumps.size else walk[-1])


@dataclass(frozen=True)
class _Findings:
    nan: np.ndarray
    posinf: np.ndarray
    neginf: np.ndarray
    extreme: np.ndarray
    limits: tuple[float, float]
    all_finite: bool = False

    @property
    def replaced(self) -> np.ndarray:
        if self.all_finite:
            return self.extreme
        return self.nan | self.posinf | self.neginf | self.extreme

    def counts(self) -> dict[str, int]:
        return {
            "nan": int(np.count_nonzero(self.nan)),
            "posinf": int(np.count_nonzero(self.posinf)),
            "neginf": int(np.count_nonzero(self.neginf)),
            "extreme": int(np.count_nonzero(self.extreme)),
        }


def find_unusable(data: np.ndarray, params: SanitizeParams) -> _Findings:
    """Locate NaN, +/-Inf and extreme values (see :class:`SanitizeParams`)."""
    finite = np.isfinite(data)
    lo, hi = robust_limits(data, finite, params.extreme_factor)
    if params.output_dtype == "float16":
        lo, hi = max(lo, -FLOAT16_MAX), min(hi, FLOAT16_MAX)
    # Compare finite values only: an ordered comparison with NaN may raise under the
    # strict error settings the stage runs with.
    if finite.all():
        none = np.zeros(data.shape, dtype=bool)
        return _Findings(nan=none, posinf=none, neginf=none,
                         extreme=(data < lo) | (data > hi), limits=(lo, hi), all_finite=True)
    values = data[finite]
    extreme = np.zeros(data.shape, dtype=bool)
    extreme[finite] = (values < lo) | (values > hi)
    return _Findings(
        nan=np.isnan(data),
        posinf=np.isposinf(data),
        neginf=np.isneginf(data),
        extreme=extreme,
        limits=(lo, hi),
    )


def fill_local(
    data: np.ndarray, known: np.ndarray, targets: np.ndarray, sigma_vox: np.ndarray
) -> np.ndarray:
    """Values for ``targets`` from known neighbours, by normalised convolution.

    Each target gets ``G*(x known) / G*(known)``: the Gaussian-weighted mean of the known
    voxels around it. Where a hole is wider than the kernel, the kernel doubles (up to
    five times); a target still out of reach gets the median of all known voxels.

    Parameters
    ----------
    data : ndarray
        Intensities; values outside ``known`` are ignored (they may be NaN).
    known : ndarray of bool
        Voxels whose values may be used.
    targets : ndarray of bool
        Voxels to fill.
    sigma_vox : ndarray
        Gaussian sigma per axis, in voxels.

    Returns
    -------
    ndarray
        float64 values, one per target voxel in C order (as ``data[targets]``).
    """
    target_index = np.flatnonzero(targets)  # C order, as data[targets]
    if not known.any():
        return np.zeros(target_index.size)
    sigma = np.asarray(sigma_vox, dtype=np.float64)
    points = np.stack(np.unravel_index(target_index, data.shape), axis=1)
    filled = np.full(target_index.size, np.nan)
    remaining = np.ones(target_index.size, dtype=bool)
    for _ in range(_MAX_LOCAL_ROUNDS):
        todo = np.flatnonzero(remaining)
        margin = np.ceil(4 * sigma).astype(int)
        for box, members in _target_boxes(points[todo], margin, data.shape):
            weights = known[box].astype(np.float64)
            # float64: products of values up to float32's maximum cannot overflow.
            values = np.where(known[box], data[box], 0.0).astype(np.float64)
            numerator = ndimage.gaussian_filter(values, sigma, mode="constant")
            denominator = ndimage.gaussian_filter(weights, sigma, mode="constant")
            ids = todo[members]
            local = tuple((points[ids] - [b.start for b in box]).T)
            weight = denominator[local]
            reached = weight > _MIN_LOCAL_WEIGHT
            filled[ids[reached]] = numerator[local][reached] / weight[reached]
            remaining[ids[reached]] = False
        if not remaining.any():
            break
        sigma = 2 * sigma
    if remaining.any():
        filled[remaining] = np.median(data[known].astype(np.float64))
    return filled


def _target_boxes(points: np.ndarray, margin: np.ndarray, shape):
    """Boxes to filter, each with the rows of ``points`` it serves.

    A target's value needs only the voxels within the kernel's reach (``margin``) around
    it, and the box includes them, so any grouping gives the same values. Scattered
    targets (a few extreme voxels across the brain) get one small box per cluster of
    touching targets; a blob, or targets so many that their boxes would cover more than
    the box around them all, get that one box.
    """
    low, high = points.min(axis=0), points.max(axis=0) + 1
    mask = np.zeros(tuple(high - low), dtype=bool)
    mask[tuple((points - low).T)] = True
    clusters, count = ndimage.label(mask, structure=np.ones((3,) * mask.ndim, dtype=bool))

    def expanded(lo, hi):
        return tuple(slice(max(int(a) - int(m), 0), min(int(b) + int(m), int(n)))
                     for a, b, m, n in zip(lo, hi, margin, shape))

    def size(box):
        return int(np.prod([b.stop - b.start for b in box]))

    whole = expanded(low, high)
    parts = [expanded(low + [c.start for c in obj], low + [c.stop for c in obj])
             for obj in ndimage.find_objects(clusters)]
    if count <= 1 or sum(size(b) for b in parts) >= size(whole):
        return [(whole, np.arange(points.shape[0]))]
    member_of = clusters[tuple((points - low).T)] - 1
    return [(box, np.flatnonzero(member_of == i)) for i, box in enumerate(parts)]


def fill_values(volume: Volume, known: np.ndarray, targets: np.ndarray,
                params: SanitizeParams) -> tuple[np.ndarray, float | None]:
    """Replacement values for ``targets`` under ``params.strategy``.

    Returns the values (in ``data[targets]`` order) and, for the global strategies, the
    single fill value used (None for ``local``).
    """
    data = volume.data
    if params.strategy == "local":
        sigma_vox = params.local_sigma_mm / np.asarray(volume.spacing)
        return fill_local(data, known, targets, sigma_vox), None
    if params.strategy == "zero":
        value = 0.0
    else:
        foreground = foreground_mask(data, known)
        source = data[foreground] if foreground.any() else data[known]
        if source.size == 0:
            value = 0.0
        elif params.strategy == "mean":
            value = float(np.mean(source, dtype=np.float64))
        else:
            value = float(np.median(source.astype(np.float64)))
    return np.full(int(np.count_nonzero(targets)), value), value


def constant_level(data: np.ndarray, usable: np.ndarray) -> float | None:
    """The one value every usable voxel holds, or None when they differ (or none is).

    A coarse grid of voxels settles almost every real scan at once; only when those
    agree are all usable voxels compared.

    Parameters
    ----------
    data : ndarray
        Intensities; values outside ``usable`` are ignored (they may be NaN).
    usable : ndarray of bool
        Finite voxels to look at.
    """
    coarse = (slice(None, None, 7),) * data.ndim
    sample = data[coarse][usable[coarse]]
    if sample.size and sample.min() != sample.max():
        return None
    values = data[usable]
    if values.size == 0:
        return None
    lowest, highest = values.min(), values.max()
    return float(lowest) if lowest == highest else None


# What the QC report shows of this stage: the voxels it replaced, coloured "filled".
_QC = StageQC(
    metrics=(QCMetric("filled_voxels", "filled",
                      "NaN, Inf and extreme voxels the sanitize stage replaced",
                      key="replaced", unit="voxels", better="lower", judge="high",
                      column=True, min_effect=100, bounds=(0, None)),),
    causes=(InvalidCause("filled", "NaN, Inf or extreme value, filled by sanitize",
                         "#ff00ff", "magenta", not_finite_input=True),),
    readings={FILLED_COUNTS: lambda m: {k: m.get(k) for k in ("nan", "posinf", "neginf",
                                                               "extreme")}},
)


@stage("sanitize", SanitizeParams, inherits=("output_dtype",), qc=_QC)
def sanitize(volume: Volume, params: SanitizeParams) -> StageOutput:
    """Count and fill NaN, +/-Inf and extreme voxels; mark them invalid.

    Parameters
    ----------
    volume : Volume
        float32 data as read (NaN preserved, values beyond float32 already +/-Inf).
    params : SanitizeParams

    Returns
    -------
    StageOutput
        A volume whose data is finite and within the limits; replaced voxels are
        ``valid=False`` and all other voxels are bit-identical to the input. Metrics:
        counts per kind (``nan``, ``posinf``, ``neginf``, ``extreme``), ``replaced``,
        ``invalid_fraction``, the ``limits`` used and the fill.

    Raises
    ------
    StageError
        When the invalid fraction exceeds ``params.max_invalid_fraction``, or when every
        usable voxel holds the same value (a dead or empty scan: nothing downstream can
        normalise or register it).
    """
    findings = find_unusable(volume.data, params)
    replaced = findings.replaced
    counts = findings.counts()
    n_replaced = int(np.count_nonzero(replaced))
    valid = volume.valid & ~replaced
    invalid_fraction = 1.0 - np.count_nonzero(valid) / valid.size
    if invalid_fraction > params.max_invalid_fraction:
        detail = ", ".join(f"{kind}={n}" for kind, n in counts.items())
        raise StageError(
            "sanitize",
            f"{invalid_fraction:.1%} of voxels are invalid ({detail}; limits "
            f"[{findings.limits[0]:.4g}, {findings.limits[1]:.4g}]), above "
            f"max_invalid_fraction={params.max_invalid_fraction:g}; a scan this corrupt "
            "would skew training statistics: exclude or re-acquire it, or raise the "
            "limit in the pipeline if this is expected",
            volume.name,
        )
    level = constant_level(volume.data, valid)
    if level is not None:
        which = "voxel" if n_replaced == 0 and volume.valid.all() else "usable voxel"
        raise StageError(
            "sanitize",
            f"the image is constant (every {which} = {level!r}): a dead or empty scan "
            "holds no anatomy to normalise or register; check the acquisition or the "
            "export (dead coil, blank series, wrong file) and exclude the subject",
            volume.name,
        )

    data = volume.data
    fill_value = None
    warnings: list[str] = []
    if n_replaced:
        known = volume.valid & ~replaced  # finite by construction: replaced holds the rest
        values, fill_value = fill_values(volume, known, replaced, params)
        data = data.copy()
        data[replaced] = values.astype(np.float32)
        detail = ", ".join(f"{kind}={n}" for kind, n in counts.items() if n)
        warnings.append(
            f"replaced {n_replaced} voxel(s) ({detail}) by the {params.strategy!r} "
            "strategy; they are marked invalid"
        )
    metrics = {
        **counts,
        "replaced": n_replaced,
        "replaced_fraction": n_replaced / data.size,
        "invalid_fraction": invalid_fraction,
        "limits": list(findings.limits),
        "fill_value": fill_value,
    }
    return StageOutput(volume.replace(data=data, valid=valid), metrics, warnings)
