"""Normalise intensities: z-score inside a mask, or FastSurfer-style 0-255 scaling.

Both modes first clip the image to robust percentiles, so that the few voxels a scan
always has far out in the tails cannot dominate the statistics, and both refuse a constant
image with an error instead of dividing by (nearly) zero. The statistics come from valid
voxels only. Invalid voxels end at a fixed value (``invalid_value``, 0 by default: the
mean after a z-score), or, with ``invalid_value: null``, keep the values sanitize and
mask_slices filled in, normalised like the rest; never at NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mriprep.errors import PipelineConfigError, StageError
from mriprep.stages import StageOutput, stage
from mriprep.stages.intensity import foreground_mask, percentiles
from mriprep.volume import Volume

CONFORM_MAX = 255.0


@dataclass(frozen=True)
class NormalizeParams:
    """Parameters of the normalize stage.

    Attributes
    ----------
    mode : {"zscore", "conform"}
        ``"zscore"``: subtract the mean and divide by the standard deviation of the
        ``mask`` region. ``"conform"``: map the clipping range linearly onto 0-255, as
        FastSurfer's conform step does (kept as float32).
    mask : {"foreground", "valid"}
        Region whose statistics define the z-score: the foreground (valid voxels above
        the BET-style robust threshold: the head, not the background) or every valid
        voxel.
    clip_low_percentile, clip_high_percentile : float
        The image is clipped to these percentiles of its valid voxels before anything
        else. They are taken over all valid voxels, not the foreground: foreground
        percentiles would lift the whole background to the darkest tissue.
    eps : float
        Relative guard: a standard deviation (or clipping range) not above
        ``eps * max(|mean|, 1)`` means a constant image, which is an error.
    invalid_value : float or None
        The value given to invalid voxels after normalisation; None normalises their
        (filled) values like the others, and gives any non-finite one 0.
    """

    mode: Literal["zscore", "conform"] = "zscore"
    mask: Literal["foreground", "valid"] = "foreground"
    clip_low_percentile: float = 0.5
    clip_high_percentile: float = 99.5
    eps: float = 1e-6
    invalid_value: float | None = 0.0

    def __post_init__(self):
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


def _scaled(values: np.ndarray, low: float, high: float, offset: float,
            scale: float) -> np.ndarray:
    """``(clip(values, low, high) - offset) * scale`` in float32, as a new array."""
    out = np.clip(values, np.float32(low), np.float32(high))
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
    # NaN and +/-Inf reach the extremes: two reductions settle the usual finite volume.
    with np.errstate(invalid="ignore"):
        all_finite = data.size == 0 or bool(np.isfinite(data.min()) and np.isfinite(data.max()))
    finite = None if all_finite else np.isfinite(data)  # only needed when some are not
    usable = volume.valid if all_finite else volume.valid & finite
    warnings: list[str] = []
    n_nonfinite_valid = 0 if all_finite else int(np.count_nonzero(volume.valid & ~finite))
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
        levels = np.unique(data if all_finite else data[finite])
        if levels.size == 1:
            # A dead volume: mask_slices marked every (constant) slice invalid.
            raise _constant_error(volume, f"every finite voxel is {levels[0]:.6g}")
        raise StageError(
            "normalize",
            "no valid voxel is left to normalise: earlier stages marked every voxel "
            "invalid; see their warnings",
            volume.name,
        )
    low, high = (float(q) for q in percentiles(
        values, [params.clip_low_percentile, params.clip_high_percentile]
    ))
    if not high - low > params.eps * max(abs(high), abs(low), 1.0):
        raise _constant_error(volume, f"the valid voxels' {params.clip_low_percentile}-"
                                      f"{params.clip_high_percentile} percentiles are "
                                      f"both {low:.6g}")

    metrics = {
        "mode": params.mode,
        "clip_range": [low, high],
        # float32 v < low exactly when v < (the float32 just at or above low): counted
        # in float32, as the values are, with the float64 bound's exact meaning.
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
        metrics.update(scale=scale)

    # float32, in place: no float64 copy of a 256^3 grid. Clipping first keeps every
    # intermediate within the clipping range, so nothing overflows.
    if params.invalid_value is not None and not all_usable:
        # Only the usable voxels change: on a conformed grid, half of it is padding.
        out = np.full(data.shape, np.float32(params.invalid_value), dtype=np.float32)
        out[usable] = _scaled(values, low, high, offset, scale)
    else:
        source = data if all_finite else np.where(finite, data, np.float32(0.0))
        out = _scaled(source, low, high, offset, scale)
        if params.invalid_value is None and not all_finite:
            out[~finite] = 0.0
    metrics.update(output_min=float(out.min()), output_max=float(out.max()))
    return StageOutput(volume.replace(data=out, valid=usable), metrics, warnings)
