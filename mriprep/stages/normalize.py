"""Normalise intensities: z-score inside a mask, or FastSurfer's 0-255 conform scaling.

``zscore`` first clips the image to robust percentiles, so that the few voxels a scan
always has far out in the tails cannot dominate the statistics. ``conform`` follows
FastSurfer's ``conform.getscale``/``scalecrop`` (itself mri_convert's rule): the range
runs from the darkest voxel to the edge of a 1000-bin histogram two bins below the one
where all but 0.1% of the non-zero voxels are counted, and maps linearly onto 0-255,
clipped, with zero kept at zero. Both refuse a constant image with an error instead of
dividing by (nearly) zero, and take their statistics from valid voxels only. Invalid
voxels end at a fixed value (``invalid_value``, 0 by default), or, with
``invalid_value: null``, keep the values sanitize and mask_slices filled in, normalised
like the rest; never at NaN.

Where conform differs from FastSurfer, and why
    * FastSurfer computes the range over every voxel of the input; this stage over the
      valid ones (NaN, extreme and masked voxels have been filled and are not tissue).
    * One voxel at 1e308 stretches FastSurfer's histogram so that the whole head falls
      into its first bin and the output is black. The sanitize stage fills such voxels
      before this stage sees them; should one still reach it, values above
      ``_CONFORM_CEILING`` times the 99.9th percentile of the non-zero voxels (no tissue
      is that bright) are counted in the top bin instead of widening the histogram.
    * A uint8 input keeps its grey levels, as in FastSurfer (which takes no range of a
      uint8 image and scales none): only clipped to 0-255, which it already is.
    * FastSurfer scales after its interpolation; the conform pipelines scale before the
      resample stage. Linear interpolation commutes with the linear map, but not with
      the clipping: in ``conform_1mm`` voxels next to the clipped top 0.1% can differ
      (``make bench`` measures it). ``clip: false`` leaves the clipping to a resample
      step's ``clip_to``, after its interpolation, and the two orders agree
      (``conform_min``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.limits import UINT8_MAX
from mriprep.core.volume import Volume
from mriprep.stages import HASHED_ONLY_WHEN_SET, StageOutput, stage
from mriprep.stages.intensity import all_finite, foreground_mask, percentiles
from mriprep.stages.resample.conformed import CONFORMED_DTYPE, stored_dtype

CONFORM_MAX = float(UINT8_MAX)
# FastSurfer's histogram: 1000 bins, all but 0.1% of the non-zero voxels below the cut.
_CONFORM_BINS = 1000
_CONFORM_TOP_SHARE = 0.001
# Values this many times the 99.9th percentile of the non-zero voxels are not tissue.
_CONFORM_CEILING = 10.0


@dataclass(frozen=True)
class NormalizeParams:
    """Parameters of the normalize stage.

    Attributes
    ----------
    mode : {"zscore", "conform"}
        ``"zscore"``: subtract the mean and divide by the standard deviation of the
        ``mask`` region. ``"conform"``: FastSurfer's robust range mapped onto 0-255
        (module doc; kept as float32, cached as uint8 with ``output_dtype: uint8``).
    mask : {"foreground", "valid"}
        Region whose statistics define the z-score: the foreground (valid voxels above
        the BET-style robust threshold: the head, not the background) or every valid
        voxel.
    clip_low_percentile, clip_high_percentile : float
        ``zscore``: the image is clipped to these percentiles of its valid voxels before
        anything else. They are taken over all valid voxels, not the foreground:
        foreground percentiles would lift the whole background to the darkest tissue.
        ``conform`` uses FastSurfer's range instead.
    eps : float
        Relative guard: a standard deviation (or clipping range) not above
        ``eps * max(|mean|, 1)`` means a constant image, which is an error.
    invalid_value : float or None
        The value given to invalid voxels after normalisation; None normalises their
        (filled) values like the others, and gives any non-finite one 0.
    clip : bool
        ``conform`` only: False scales without clipping to 0-255, for a later
        ``resample`` step with ``clip_to: [0, 255]`` that clips after interpolating, as
        FastSurfer does; the two orders then agree exactly (module doc).
    """

    mode: Literal["zscore", "conform"] = "zscore"
    mask: Literal["foreground", "valid"] = "foreground"
    clip_low_percentile: float = 0.5
    clip_high_percentile: float = 99.5
    eps: float = 1e-6
    invalid_value: float | None = 0.0
    clip: bool = field(default=True, metadata={HASHED_ONLY_WHEN_SET: True})

    def __post_init__(self):
        if not self.clip and self.mode != "conform":
            raise PipelineConfigError(
                "normalize: clip: false applies to mode: conform (whose 0-255 clipping a "
                "later resample step can do after interpolating); a z-score is always "
                f"taken of the clipped image, got mode {self.mode!r}"
            )
        if not 0.0 <= self.clip_low_percentile < self.clip_high_percentile <= 100.0:
            raise PipelineConfigError(
                "need 0 <= clip_low_percentile < clip_high_percentile <= 100, "
                f"got {self.clip_low_percentile} and {self.clip_high_percentile}"
            )
        if not self.eps > 0:
            raise PipelineConfigError(f"eps must be positive, got {self.eps}")
        if self.invalid_value is not None and not np.isfinite(self.invalid_value):
            raise PipelineConfigError(
                f"invalid_value must be finite, got {self.invalid_value}"
            )


def _constant_error(volume: Volume, what: str) -> StageError:
    return StageError(
        "normalize",
        f"the image is constant ({what}): it holds no anatomy to normalise; check the "
        "scan (dead coil, blank series, wrong file)",
        volume.name,
    )


def _float32_above(bound: float) -> np.float32:
    """The smallest float32 not below ``bound``."""
    value = np.float32(bound)
    return value if value >= bound else np.nextafter(value, np.float32(np.inf))


def _float32_below(bound: float) -> np.float32:
    """The largest float32 not above ``bound``."""
    value = np.float32(bound)
    return value if value <= bound else np.nextafter(value, np.float32(-np.inf))


def conform_range(values: np.ndarray) -> tuple[float, float]:
    """FastSurfer's robust intensity range of ``values`` (module doc).

    Parameters
    ----------
    values : ndarray
        The finite voxels the range is taken over.

    Returns
    -------
    (low, high) : the darkest value, and the histogram edge two bins below the bin where
    all but 0.1% of the non-zero values are counted.

    Examples
    --------
    >>> values = np.concatenate([np.zeros(500), np.arange(1.0, 1001.0)])
    >>> conform_range(values)
    (0.0, 998.0)
    """
    values = values.reshape(-1)
    low = float(values.min())
    magnitude = np.abs(values)
    nonzero = magnitude >= 1e-15
    n_nonzero = int(np.count_nonzero(nonzero))
    high = float(values.max())
    if n_nonzero:
        bright = float(percentiles(magnitude[nonzero], [99.9])[0])
        ceiling = _CONFORM_CEILING * bright
        if high > ceiling > low:
            # Counted in the top bin, not allowed to stretch the histogram.
            high = float(values[values <= ceiling].max())
            values = np.minimum(values, values.dtype.type(high))
    if not high > low:
        return low, high
    counts, edges = np.histogram(values, bins=_CONFORM_BINS, range=(low, high))
    counted = np.concatenate(([0], np.cumsum(counts)))
    kept = values.size - int(_CONFORM_TOP_SHARE * n_nonzero)
    first = int(np.argmax(counted >= kept))
    return low, float(edges[max(first - 2, 0)])


def _uint8_on_disk(volume: Volume) -> bool:
    """Whether the file read stored uint8 voxels, unscaled (the load record says)."""
    load = volume.record_of("load")
    return stored_dtype(load.metrics if load is not None else None) == CONFORMED_DTYPE


def _scaled(values: np.ndarray, low: float, high: float, offset: float,
            scale: float, clip: bool = True) -> np.ndarray:
    """``(clip(values, low, high) - offset) * scale`` in float32, as a new array (not
    clipped with ``clip`` False)."""
    if clip:
        out = np.clip(values, np.float32(low), np.float32(high))
    else:
        out = values.astype(np.float32, copy=True)
    out -= np.float32(offset)
    out *= np.float32(scale)
    return out


@stage("normalize", NormalizeParams)
def normalize(volume: Volume, params: NormalizeParams) -> StageOutput:
    """Clip to robust percentiles, then z-score in a mask or scale to 0-255.

    Parameters
    ----------
    volume : Volume
        Sanitised data. Non-finite voxels, should any remain, are treated as invalid.
    params : NormalizeParams

    Returns
    -------
    StageOutput
        The normalised volume (float32, finite everywhere; invalid voxels at
        ``params.invalid_value``; non-finite voxels become invalid). Metrics: the
        clipping range and how many voxels it clipped, the mask size, and the mean and
        standard deviation (z-score) or the scale (conform).

    Raises
    ------
    StageError
        When no voxel is valid, or the image is constant (within ``eps``).
    """
    data = volume.data
    finite_everywhere = all_finite(data)
    finite = None if finite_everywhere else np.isfinite(data)  # only needed when some are not
    usable = volume.valid if finite_everywhere else volume.valid & finite
    warnings: list[str] = []
    n_nonfinite_valid = 0 if finite_everywhere else int(np.count_nonzero(volume.valid & ~finite))
    if n_nonfinite_valid:
        warnings.append(
            f"{n_nonfinite_valid} valid voxel(s) were not finite and are now invalid; run "
            "the sanitize stage before normalize"
        )
    # float32 as stored: statistics that need float64 convert one value at a time. A
    # clean scan is valid everywhere, and then needs no compressed copy of its voxels.
    all_usable = bool(usable.all())
    values = data.reshape(-1) if all_usable else data[usable]
    if values.size == 0:
        levels = np.unique(data if finite_everywhere else data[finite])
        if levels.size == 1:
            # A dead volume: mask_slices marked every (constant) slice invalid.
            raise _constant_error(volume, f"every finite voxel is {levels[0]:.6g}")
        raise StageError(
            "normalize",
            "no valid voxel is left to normalise: earlier stages marked every voxel "
            "invalid; see their warnings",
            volume.name,
        )
    kept_uint8 = params.mode == "conform" and _uint8_on_disk(volume)
    if kept_uint8:
        # FastSurfer's conform neither takes a range nor scales a uint8 input
        # (conform.py: getscale and scalecrop only for other dtypes): its grey levels
        # already are 0-255, and an orig.mgz conformed again must keep them.
        low, high = 0.0, CONFORM_MAX
    elif params.mode == "conform":
        low, high = conform_range(values)
    else:
        low, high = (float(q) for q in percentiles(
            values, [params.clip_low_percentile, params.clip_high_percentile]
        ))
    if not high - low > params.eps * max(abs(high), abs(low), 1.0):
        what = ("the valid voxels' conform range" if params.mode == "conform" else
                f"the valid voxels' {params.clip_low_percentile}-"
                f"{params.clip_high_percentile} percentiles")
        raise _constant_error(volume, f"{what} collapses to {low:.6g}")

    metrics = {
        "mode": params.mode,
        "clip_range": [low, high],
        # float32 v < low exactly when v < (the float32 just at or above low): counted
        # in float32, as the values are, with the float64 bound's exact meaning.
        # With clip: false, the voxels beyond the range that a later clip_to clips.
        "clipped_low": int(np.count_nonzero(values < _float32_above(low))),
        "clipped_high": int(np.count_nonzero(values > _float32_below(high))),
    }
    if params.mode == "zscore":
        if params.mask == "foreground":
            foreground = foreground_mask(data, usable)
            region = foreground.reshape(-1) if all_usable else foreground[usable]
        else:
            region = np.ones(values.shape, dtype=bool)
        if not region.any():
            raise StageError(
                "normalize",
                "the foreground mask is empty, so the z-score has no statistics; use "
                "mask: valid in the pipeline, or check the scan",
                volume.name,
            )
        clipped = np.clip(values[region].astype(np.float64), low, high)
        mean = float(clipped.mean())
        std = float(clipped.std())
        if not std > params.eps * max(abs(mean), 1.0):
            raise _constant_error(volume, f"{params.mask} standard deviation {std:.3g} "
                                          f"around mean {mean:.6g}")
        offset, scale = mean, 1.0 / std
        metrics.update(mask=params.mask, mask_voxels=int(np.count_nonzero(region)),
                       mean=mean, std=std)
    else:
        offset, scale = low, CONFORM_MAX / (high - low)
        metrics.update(scale=scale, rescaled=not kept_uint8)
        if kept_uint8:
            metrics["why_not_rescaled"] = ("uint8 input: its grey levels are kept, as "
                                           "FastSurfer keeps them")

    # float32, in place: no float64 copy of a 256^3 grid. Clipping first keeps every
    # intermediate within the clipping range, so nothing overflows.
    if params.invalid_value is not None and not all_usable:
        # Only the usable voxels change: on a conformed grid, half of it is padding.
        out = np.full(data.shape, np.float32(params.invalid_value), dtype=np.float32)
        out[usable] = _scaled(values, low, high, offset, scale, params.clip)
    else:
        source = data if finite_everywhere else np.where(finite, data, np.float32(0.0))
        out = _scaled(source, low, high, offset, scale, params.clip)
        if params.invalid_value is None and not finite_everywhere:
            out[~finite] = 0.0
    if params.mode == "conform":
        if params.clip:
            # float32 rounding of the scale may overshoot 255 by an ulp.
            np.clip(out, 0.0, CONFORM_MAX, out=out)
        # FastSurfer maps zero to zero (usually background) whatever the range's start.
        out[(data == 0) & usable] = 0.0
    metrics.update(output_min=float(out.min()), output_max=float(out.max()))
    return StageOutput(volume.replace(data=out, valid=usable), metrics, warnings)
