"""Resolution levels for registration: isotropic grids, bias flattening, centres of mass.

A level is an image in the registration's intensity space on an isotropic grid, with
the mask of voxels the metric may use. Levels are built by normalised convolution, so
that invalid voxels lend no intensity to their neighbours (short runs of missing slices
are first bridged between their neighbours, as thick slices are), and flattened by
dividing out a smooth multiplicative bias field. Pure numpy/scipy: no registration toolkit here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nibabel.affines import voxel_sizes
from scipy import ndimage

from mriprep.core.volume import Volume
from mriprep.stages.sanitize import fill_local

# A level voxel is used by the metric when at least this share of the Gaussian
# weight that made it came from valid input voxels.
MIN_LEVEL_WEIGHT = 0.5
# Head voxels: brighter than this share of the bright end (99th percentile) of the
# image. Background noise of a T1 scan sits far below it.
HEAD_FRACTION = 0.1
# Where the head mask gives too little support for the local mean, the bias estimate
# falls back to the head's median (weight of the fallback, relative to a full kernel).
_BIAS_FALLBACK_WEIGHT = 0.05
# Flattening passes: the second finds the head again once the field is divided out.
_FLATTEN_PASSES = 2
# The flattening's Gaussian runs on a grid of block means coarse enough that it spans
# this many of its voxels (see _divided_by_local_mean).
_COARSE_SIGMA_VOXELS = 2.5


@dataclass(frozen=True)
class Level:
    """One pyramid level: a float32 image in the registration's intensity space, its
    voxel-to-RAS affine, and the boolean mask of voxels the metric may use."""

    data: np.ndarray
    affine: np.ndarray
    mask: np.ndarray
    spacing_mm: float


def level_grid(
    data: np.ndarray, weight: np.ndarray | None, affine: np.ndarray, spacing_mm: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Resample a volume onto an isotropic ``spacing_mm`` grid for registration, masked
    voxels contributing nothing (normalised convolution).

    Axes finer than ``spacing_mm`` are Gaussian-smoothed (anti-aliasing) and
    downsampled; coarser ones (thick slices) are upsampled linearly. The grid keeps the
    input's axes and the centre of its field of view.

    Parameters
    ----------
    data : ndarray
        The volume, finite.
    weight : ndarray of bool or None
        Voxels that may contribute (None: all).
    affine : ndarray, shape (4, 4)
    spacing_mm : float

    Returns
    -------
    values : ndarray (float32)
        Weighted Gaussian average of the contributing voxels (0 where none contributes).
    support : ndarray (float32)
        Share of each output voxel's Gaussian weight that came from contributing voxels.
    affine : ndarray, shape (4, 4)
        The output grid.
    """
    factor = spacing_mm / voxel_sizes(affine)
    # Anti-aliasing where an axis is downsampled: a Gaussian of half the new voxel size
    # beyond the old one. Axes coarser than the level (thick slices) are upsampled.
    sigma = 0.5 * np.sqrt(np.maximum(factor**2 - 1.0, 0.0))
    data = np.asarray(data, dtype=np.float32)
    if weight is None or weight.all():
        smooth = ndimage.gaussian_filter(data, sigma, mode="nearest")
        support = None
    else:
        w = weight.astype(np.float32)
        smooth = ndimage.gaussian_filter(data * w, sigma, mode="nearest")
        support = ndimage.gaussian_filter(w, sigma, mode="nearest")
    shape = np.asarray(data.shape)
    new_shape = np.maximum(np.round(shape / factor).astype(int), 1)
    offset = (shape - 1) / 2.0 - factor * (new_shape - 1) / 2.0
    voxel_map = np.eye(4)
    voxel_map[:3, :3] = np.diag(factor)
    voxel_map[:3, 3] = offset
    new_affine = affine @ voxel_map

    def pull(array):
        return resample_axes(array, factor, offset, tuple(new_shape))

    values = pull(smooth)
    if support is None:
        return values, np.ones(values.shape, np.float32), new_affine
    support = pull(support)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(support > 1e-3, values / np.maximum(support, 1e-3), 0.0)
    return values.astype(np.float32), support.astype(np.float32), new_affine


def flatten_bias(values: np.ndarray, usable: np.ndarray, affine, sigma_mm: float,
                 region: np.ndarray | None = None) -> np.ndarray:
    """Divide out a smooth multiplicative field: ``values / local mean of the head``.

    The local mean is a normalised convolution over head voxels (bright, usable), so the
    background and masked voxels do not darken it; where the head gives too little
    support it falls back to the head's median. Applied to the template and the subject
    alike, it leaves the anatomy's edges and removes the scanner's smooth bias field.

    Under a strong field (an uncorrected surface coil: 10x across the head) the head's
    dark side falls below the brightness rule that finds the head, and its local mean
    then comes from the fallback. So the head is found again on the flattened image,
    where the field is mostly gone, and the original divided by the local mean of that
    head. ``sigma_mm`` 0 returns ``values`` unchanged.

    ``region``, where given, restricts the head voxels the local mean is taken over (on
    the register stage's finest level, the brain: see :mod:`mriprep.stages.register`);
    the whole image is divided.
    """
    if sigma_mm <= 0:
        return values
    if region is not None:
        usable = usable & region
    head = _head_voxels(values, usable)
    flat = values
    for _ in range(_FLATTEN_PASSES):
        if not head.any():
            return flat
        flat = _divided_by_local_mean(values, head, affine, sigma_mm)
        head = _head_voxels(flat, usable)
    return flat


def _head_voxels(values: np.ndarray, usable: np.ndarray) -> np.ndarray:
    bright = np.percentile(values[usable], 99) if usable.any() else 0.0
    return usable & (values > HEAD_FRACTION * bright)


def _divided_by_local_mean(values, head, affine, sigma_mm: float) -> np.ndarray:
    median = float(np.median(values[head]))
    sigma = sigma_mm / voxel_sizes(affine)
    # Wide Gaussians run on block means of the grid, then the local mean is interpolated
    # back: the field is smooth at this scale, and on a 2 mm head the full-grid filters
    # took 0.2-0.4 s a scan.
    block = np.maximum(np.floor(sigma / _COARSE_SIGMA_VOXELS), 1).astype(int)
    coarse_sigma = np.sqrt(np.maximum(sigma**2 - (block**2 - 1) / 12.0, 0.0)) / block
    h = head.astype(np.float32)
    local_sum = ndimage.gaussian_filter(_block_means(values * h, block), coarse_sigma,
                                        mode="constant")
    local_weight = ndimage.gaussian_filter(_block_means(h, block), coarse_sigma,
                                           mode="constant")
    local_mean = (local_sum + _BIAS_FALLBACK_WEIGHT * median) / (
        local_weight + _BIAS_FALLBACK_WEIGHT
    )
    if (block > 1).any():
        # Block k's mean sits at fine index k * b + (b - 1) / 2.
        local_mean = resample_axes(local_mean, 1.0 / block, -(block - 1) / (2.0 * block),
                                   values.shape)
    return (values / local_mean).astype(np.float32)


def _block_means(array: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Means of ``block``-sized blocks, the grid padded with zeros to whole blocks (as a
    Gaussian's ``mode="constant"`` sees beyond the edge)."""
    if (block == 1).all():
        return array
    padded_shape = -(-np.asarray(array.shape) // block) * block
    padded = np.zeros(padded_shape, np.float32)
    padded[tuple(slice(0, n) for n in array.shape)] = array
    split = [d for n, b in zip(padded_shape, block) for d in (n // b, b)]
    return padded.reshape(split).mean(axis=(1, 3, 5))


def resample_axes(array: np.ndarray, scale, offset, shape) -> np.ndarray:
    """Linear interpolation of ``array`` (float32) at input index ``scale * i + offset``
    along each axis, edges extended (scipy's ``mode="nearest"``).

    Every map between levels is diagonal (the levels keep the input's axes), so the
    interpolation runs one axis at a time: faster than ``ndimage.affine_transform``
    (docs/benchmarks.md, "Registration"), equal to it within float32 rounding.
    """
    out = np.asarray(array, dtype=np.float32)
    for axis, (n_out, a, b) in enumerate(zip(shape, np.broadcast_to(scale, 3),
                                             np.broadcast_to(offset, 3))):
        n_in = out.shape[axis]
        where = np.clip(a * np.arange(n_out) + b, 0.0, n_in - 1)
        below = np.floor(where).astype(np.intp)
        above = np.minimum(below + 1, n_in - 1)
        weight = (where - below).astype(np.float32).reshape(
            [-1 if i == axis else 1 for i in range(out.ndim)])
        out = out.take(below, axis) * (1.0 - weight) + out.take(above, axis) * weight
    return out


def build_levels(volume: Volume, levels: tuple[float, ...]) -> list[Level]:
    """The subject's levels, coarse to fine, not bias-flattened.

    The finest level is downsampled from the input, each coarser one from the next finer
    (cheap); each level's mask holds the voxels mostly made of valid input.

    Parameters
    ----------
    volume : Volume
        Finite data; ``valid`` marks the voxels that may contribute.
    levels : tuple of float
        Distinct voxel sizes (mm), coarse to fine.
    """
    fine_to_coarse: list[Level] = []
    data, weight, affine = volume.data, volume.valid, volume.affine
    data, weight = bridged_slice_gaps(data, weight, affine)
    for spacing_mm in reversed(levels):
        values, support, affine = level_grid(data, weight, affine, spacing_mm)
        mask = support >= MIN_LEVEL_WEIGHT
        fine_to_coarse.append(Level(continued_past(values, mask), affine, mask, spacing_mm))
        data, weight = values, mask
    return fine_to_coarse[::-1]


# The widest run of missing slices (mm, across the gap) that the levels bridge by
# interpolating between the slices either side. A 3 mm scan's levels already interpolate
# linearly across 3 mm between slices; a few missing slices make the gap a few times
# wider, and the head's outline and ventricles change little across it. A wider hole
# (a lost slab of the brain) stays without weight. The tuning set's gaps: 3-10 mm.
MAX_BRIDGED_GAP_MM = 15.0


def bridged_slice_gaps(
    data: np.ndarray, valid: np.ndarray, affine: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``data`` and ``valid`` with each interior run of wholly invalid slices (masked,
    NaN or zero-filled slices) no wider than :data:`MAX_BRIDGED_GAP_MM` filled by linear
    interpolation between the valid slices either side, and counted valid where both
    of those are.

    Left without weight, a gap changes which part of the head the fit sees, and another
    person's head differs from the template's unevenly, so the fit moved with the gaps
    (measured: docs/benchmarks.md, "Registration", "Missing slices bridged"). Slices at
    the edge of the field of view, partly invalid slices and wider gaps are left as they
    are. The cached image is not touched: this is the registration's view only.
    """
    if valid.all():
        return data, valid
    spacing = voxel_sizes(affine)
    for axis in range(3):
        others = tuple(i for i in range(3) if i != axis)
        missing = ~valid.any(axis=others)
        runs = _interior_runs(missing)
        runs = [(a, b) for a, b in runs if (b - a) * spacing[axis] <= MAX_BRIDGED_GAP_MM]
        if not runs:
            continue
        data = np.array(data, dtype=np.float32, copy=True)
        valid = valid.copy()
        for first, stop in runs:  # slices first..stop-1 are missing
            below = np.take(data, first - 1, axis=axis)
            above = np.take(data, stop, axis=axis)
            both = np.take(valid, first - 1, axis=axis) & np.take(valid, stop, axis=axis)
            for index in range(first, stop):
                weight = (index - first + 1) / (stop - first + 1)
                where = [slice(None)] * 3
                where[axis] = index
                data[tuple(where)] = (1.0 - weight) * below + weight * above
                valid[tuple(where)] = both
    return data, valid


def _interior_runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """(first, stop) of each run of True in ``flags`` with a False on both sides."""
    padded = np.concatenate(([False], flags, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])
            if a > 0 and b < flags.size]


# How far past the mask the level's values are continued: the metric's linear
# interpolation reads the 8 voxels around a point, its central-difference gradient those
# around the points a voxel either side; two voxels cover both.
_CONTINUED_VOXELS = 2


def continued_past(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``values`` with the unmasked voxels next to the mask filled from the masked ones
    (normalised convolution, :func:`~mriprep.stages.sanitize.fill_local`).

    Invalid voxels carry no weight in the metric, but a point sampled next to them is
    interpolated, and its gradient taken, from them: left at 0 (what a level holds where
    no valid voxel contributed), every masked slab's edge became a step that pulled the
    fit. Measured on 1x1x3 mm scans of real heads with three NaN slices: 2.0 mm against
    the same head's 1 mm scan with zeros there, 0.16 mm continued (docs/benchmarks.md,
    "Registration"); masking the same slices of an intact scan gives the same transform
    to the bit, so what remains is what not seeing those slices costs.
    """
    if mask.all() or not mask.any():
        return values
    near = ndimage.binary_dilation(mask, iterations=_CONTINUED_VOXELS) & ~mask
    out = values.copy()
    out[near] = fill_local(values, mask, near, np.ones(3)).astype(np.float32)
    return out


def flattened(levels: list[Level], bias_sigma_mm: float,
              regions: list[np.ndarray] | None = None) -> list[Level]:
    """Each level with its bias field divided out (see :func:`flatten_bias`), estimated
    within each level's region where ``regions`` are given."""
    regions = regions or [None] * len(levels)
    return [
        Level(flatten_bias(level.data, level.mask, level.affine, bias_sigma_mm, region),
              level.affine, level.mask, level.spacing_mm)
        for level, region in zip(levels, regions)
    ]


def subject_pyramid(
    volume: Volume, levels: tuple[float, ...], bias_sigma_mm: float
) -> list[Level]:
    """The subject's levels (:func:`build_levels`), coarse to fine, each bias-flattened.

    ``bias_sigma_mm`` is the width of the bias-field estimate (see
    :func:`flatten_bias`); 0 disables it.
    """
    return flattened(build_levels(volume, levels), bias_sigma_mm)


def centre_of_mass(data: np.ndarray, affine: np.ndarray, mask: np.ndarray | None = None):
    """Intensity centre of mass (RAS mm) of the positive part of ``data`` within ``mask``
    (None: everywhere)."""
    weights = np.clip(data, 0, None)
    if mask is not None:
        weights = np.where(mask, weights, 0.0)
    centre_vox = ndimage.center_of_mass(weights)
    return affine[:3, :3] @ np.asarray(centre_vox) + affine[:3, 3]


# N4 on the coarsest level: one fitting level of 4 control points per axis (a receive
# field is smooth over a head), iterations, the width of the field's histogram
# deconvolution (wider corrects more per iteration: 30 iterations at 1.0 recover a 10x
# field that ITK's default 0.15 leaves at 1.4x), and the brightness share of the head it
# fits over. Cost: docs/benchmarks.md, section "registration".
_N4_ITERATIONS = (30,)
_N4_FIELD_FWHM = 1.0
_N4_HEAD_FRACTION = 0.02
# A field found larger than this after the first round gets a second round. Measured
# (2026-12-02, the field after one round): clean scans 1.33-1.71, fields of 2x 1.38,
# 4x 2.71, 7x 5.61, 10x 4.87-10.2. One round of 60 iterations for every scan instead
# doubled N4's time (0.7-1.2 s to 1.3-2.4 s) and read clean Colin27 scans as 2.3-2.7x.
_N4_CONTINUE_RATIO = 3.0
# N4 fits its field to every this-many-th head voxel along each axis. Its cost is linear
# in the points it fits (0.6-1.2 s a scan on every 8 mm head voxel); a field of 4 control
# points per axis is over-determined by an eighth of them. Measured (2026-12-03, five
# scans, every other voxel against every voxel): 0.13-0.22 s instead of 0.60-1.19 s;
# field ratios over the head 1.47/1.43, 1.70/1.77, 2.78/2.89, 10.3/10.4, 4.63/4.92;
# largest log-field difference 0.14-0.29 (a constant offset included, which the median
# normalisation removes).
_N4_POINT_STRIDE = 2


def _n4_log_field(level: Level, points: np.ndarray, threads: int) -> np.ndarray:
    """The log of the receive field N4 fits to ``level``'s voxels in ``points``, on the
    whole level."""
    import SimpleITK as sitk

    from mriprep.stages.registration.geometry import sitk_image

    image = sitk_image(np.maximum(level.data, 0.0), level.affine)
    n4 = sitk.N4BiasFieldCorrectionImageFilter()
    n4.SetMaximumNumberOfIterations(list(_N4_ITERATIONS))
    n4.SetBiasFieldFullWidthAtHalfMaximum(_N4_FIELD_FWHM)
    n4.SetConvergenceThreshold(1e-6)
    n4.SetNumberOfThreads(threads)
    n4.Execute(image, sitk_image(points.astype(np.uint8), level.affine))
    return sitk.GetArrayFromImage(n4.GetLogBiasFieldAsImage(image)).T.astype(np.float64)


def _field_ratio(log_field: np.ndarray, head: np.ndarray) -> float:
    return float(np.exp(log_field[head].max() - log_field[head].min()))


def corrected_levels(levels: list[Level], threads: int = 1) -> tuple[list[Level], float | None]:
    """The levels with the receive field that N4 finds on the coarsest one divided out,
    and that field's largest over smallest value over the head (None: no head found).

    N4 (SimpleITK's ``N4BiasFieldCorrectionImageFilter``) runs on the coarsest level
    only, where it is cheap; its field is smooth, so it is resampled to the finer levels
    linearly. The head it fits over is found at a low brightness, so that the dark side
    of a strong field belongs to it. ``threads``: ITK threads of N4.
    """
    coarse = levels[0]
    usable = coarse.mask & (coarse.data > 0)
    if usable.sum() < 100:
        return levels, None
    bright = float(np.percentile(coarse.data[usable], 99))
    head = ndimage.binary_fill_holes(usable & (coarse.data > _N4_HEAD_FRACTION * bright))
    if head.sum() < 100:
        return levels, None
    fitted_points = np.zeros_like(head)
    fitted_points[::_N4_POINT_STRIDE, ::_N4_POINT_STRIDE, ::_N4_POINT_STRIDE] = True
    fitted_points &= head
    if fitted_points.sum() < 100:  # a small field of view: every head voxel
        fitted_points = head
    log_field = _n4_log_field(coarse, fitted_points, threads)
    ratio = _field_ratio(log_field, head)
    if ratio > _N4_CONTINUE_RATIO:
        # A strong field is not done converging in the first round: N4 again, on the
        # image the first round corrected.
        corrected = Level((coarse.data / np.exp(log_field)).astype(np.float32),
                          coarse.affine, coarse.mask, coarse.spacing_mm)
        log_field = log_field + _n4_log_field(corrected, fitted_points, threads)
        ratio = _field_ratio(log_field, head)
    log_field = log_field - float(np.median(log_field[head]))
    out = [Level((coarse.data / np.exp(log_field)).astype(np.float32), coarse.affine,
                 coarse.mask, coarse.spacing_mm)]
    for level in levels[1:]:
        to_coarse = np.linalg.inv(coarse.affine) @ level.affine
        on_level = resample_axes(log_field, np.diag(to_coarse)[:3], to_coarse[:3, 3],
                                 level.data.shape)
        out.append(Level((level.data / np.exp(on_level)).astype(np.float32), level.affine,
                         level.mask, level.spacing_mm))
    return out, ratio


# A level voxel brighter than this many times the head's bright tissue level (its 90th
# percentile: white matter and scalp fat), once the receive field is divided out, is no
# T1 tissue: a spike slice that slice masking missed, an artifact's remnant. Measured
# (2026-12-06, the tuning set's 2 mm levels): clean whole heads, skull-stripped, defaced
# and coarse 8-bit scans of five people 0-5 voxels; a x4 spike slice at the edge of a
# 3 mm sagittal head, which mask_slices does not score, 2144 (its fit's similarity 0.57
# with them, 0.72 without, the clean scans' 0.82).
BRIGHT_OUTLIER_FACTOR = 2.0


def without_bright_outliers(levels: list[Level]) -> tuple[list[Level], int]:
    """The levels with voxels brighter than :data:`BRIGHT_OUTLIER_FACTOR` times their
    head's 90th percentile taken out of the mask (their neighbours' values continued
    over them, :func:`continued_past`), and how many the finest level lost."""
    out, excluded = [], 0
    for level in levels:
        usable = level.mask & (level.data > 0)
        if usable.sum() < 100:
            out.append(level)
            excluded = 0
            continue
        head = usable & (level.data > HEAD_FRACTION * np.percentile(level.data[usable], 99))
        limit = BRIGHT_OUTLIER_FACTOR * float(np.percentile(level.data[head], 90))
        bright = level.mask & (level.data > limit)
        excluded = int(np.count_nonzero(bright))
        if excluded:
            mask = level.mask & ~bright
            level = Level(continued_past(level.data, mask), level.affine, mask,
                          level.spacing_mm)
        out.append(level)
    return out, excluded

