"""The SimpleITK backend: regular step gradient descent, one registration per pyramid
level.

The fit is a 12-parameter affine (ITK's ``AffineTransform``) on every level over the
brain's interior (``shape_fixed``), started from the global search's ranked pose (which
already holds the search's estimate of the head's size), with the correlation of the two
images as its metric. Adults' heads differ in size and in their proportions: another
person's brain overlaps the template's only at its own size and shape, which is what the
checks judge, and the stage's rigid output is this fit's rotation. Every level, not the
finest alone: the coarse level's fit places the brain within which the finest level's
bias field is estimated, and starts the finest level's fit.

Why correlation over the interior: both images are T1-weighted and bias-flattened, so
their voxels relate linearly; correlation is what the checks' similarity measures; and
the brain's edge is where a whole head and its skull-stripped or defaced copy differ.
With Mattes MI the 12 parameters collapsed one axis of good scans.

Why no rigid pass before it (0.4.0 had one on each level): on real heads whose size
differs from the template's (S1, ROBEX: 0.91x and 0.82x), the rigid mutual-information
optimum slides along the size mismatch (ROBEX's in four poses 2-4 mm apart, its 4 mm
pass at the 200-iteration cap), and the affine that followed was as consistent from the
ranked start alone (docs/benchmarks.md, "Registration"). The short rigid ranking of the
search's starts stays: it chooses between orientations.

Measured (these choices and their alternatives): docs/benchmarks.md, "Registration".
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from mriprep.stages.registration.backend import BackendResult
from mriprep.stages.registration.geometry import matrix_from_sitk, ras_to_lps, sitk_image
from mriprep.stages.registration.pyramid import Level

if TYPE_CHECKING:
    from mriprep.stages.registration.params import RegisterParams

# The metric of the ranking registrations and of the fit (module notes).
POSE_METRIC = "mattes"
SHAPE_METRIC = "correlation"
# The optimiser stops when its step, in mm of the largest voxel displacement, falls below
# these: the ranking's (a start only needs to be in its basin) and the fit's. The fit
# keeps 1 um: a sampled correlation's gradient turns often, the step halves at each
# turn, and at 10 um the affine of a long, narrow head stopped 2-8% short of its sizes.
MIN_STEP_MM = 0.01
SHAPE_MIN_STEP_MM = 0.001


def register_sitk(
    fixed: tuple[Level, ...], moving: list[Level], shape_fixed: tuple[Level, ...],
    initial_lps: np.ndarray, centre_lps: np.ndarray, params: RegisterParams,
    finest_moving: Callable[[np.ndarray], Level] | None = None,
) -> BackendResult:
    """The affine, level by level, each level starting from the previous one's fit.

    The start is a fixed moving-initial transform, and the optimiser moves a transform
    composed with it from the identity. ``fixed`` is unused here (the ranking ran on
    it); ``shape_fixed`` carries the interior mask. The result's metric value is the
    fit's correlation on its last level (ITK's: -1 at a perfect fit). Details:
    ``stop_conditions`` and ``level_seconds``, one per level.

    ``finest_moving``, where given and the pyramid has coarser levels, replaces the
    finest moving level: it receives the coarser levels' fit (template to subject, LPS)
    and returns the level to fit on (the register stage's: the bias field estimated
    within the brain that fit places). The finest level then takes that fit as its
    fixed start and optimises a fresh affine after it, as the change was measured (its
    image is another one than the coarse level's, so the coarse fit is its start, not
    its state; the same start composed the other way was not measured apart).
    """
    del fixed  # the fit's metric mask is the interior's (shape_fixed)
    pin_sitk_threads(params.threads)
    iterations, stops, seconds = [], [], []
    shape = _identity(centre_lps, "affine")
    value = float("nan")
    for fixed_level, moving_level in zip(shape_fixed, moving):
        level_start = time.perf_counter()
        # The pyramid's finest level, not this call's last: the wide retry fits the
        # coarser levels and the finest one in two calls (register._best_start_then_finest).
        finest = moving_level.spacing_mm == params.levels[-1]
        if moving_level is moving[-1] and finest_moving is not None and len(moving) > 1:
            initial_lps = _composed(initial_lps, shape)
            shape = _identity(centre_lps, "affine")
            moving_level = finest_moving(initial_lps)
        fraction = params.fine_sampling_fraction if finest else params.sampling_fraction
        value, count, stop = register_level(fixed_level, moving_level, initial_lps, shape,
                                            params, params.max_iterations, SHAPE_METRIC,
                                            fraction, SHAPE_MIN_STEP_MM)
        iterations.append(count)
        stops.append(stop)
        seconds.append(round(time.perf_counter() - level_start, 4))
    return BackendResult(_composed(initial_lps, shape), value, stops[-1], iterations,
                         {"stop_conditions": stops, "level_seconds": seconds})


def rank_starts(
    fixed: Level, moving: Level, starts_lps: list[np.ndarray], centre_lps: np.ndarray,
    params: RegisterParams, iterations: int
) -> list[tuple[float, np.ndarray]]:
    """A short rigid registration on one level from each start (each start keeps its
    size): (metric value, transform LPS) per start, in order. Mattes MI is negative:
    lower is better."""
    pin_sitk_threads(params.threads)
    out = []
    for start in starts_lps:
        moved = _identity(centre_lps, "rigid")
        value, _, _ = register_level(fixed, moving, start, moved, params, iterations,
                                     POSE_METRIC, params.sampling_fraction, MIN_STEP_MM)
        out.append((value, _composed(start, moved)))
    return out


def register_level(fixed_level: Level, moving_level: Level, start_lps: np.ndarray,
                   transform, params, iterations: int, metric: str,
                   sampling_fraction: float, min_step_mm: float):
    """Optimise ``transform`` (in place) on one level, composed after the fixed start
    ``start_lps``, by ``metric`` (``"mattes"`` or ``"correlation"``) over
    ``sampling_fraction`` of the fixed mask: (metric value, iterations, stop
    condition)."""
    import SimpleITK as sitk

    method = sitk.ImageRegistrationMethod()
    method.SetNumberOfThreads(params.threads)
    if metric == "correlation":
        method.SetMetricAsCorrelation()
    else:
        method.SetMetricAsMattesMutualInformation(params.histogram_bins)
    # Gradients by central differences at the sampled points, not a Gaussian-derivative
    # image of the whole grid: the filter cost ~0.15 s a call on a 2 mm head, more
    # than the iterations of a converged level.
    method.SetMetricUseFixedImageGradientFilter(False)
    method.SetMetricUseMovingImageGradientFilter(False)
    method.SetMetricSamplingStrategy(method.RANDOM)
    method.SetMetricSamplingPercentage(sampling_fraction, params.seed)
    method.SetMetricFixedMask(_sitk_mask(fixed_level))
    if not moving_level.mask.all():
        method.SetMetricMovingMask(_sitk_mask(moving_level))
    method.SetInterpolator(sitk.sitkLinear)
    # Steps in mm of the largest voxel displacement (physical-shift scales): start at
    # half a voxel of this level, halve at each change of direction, stop at MIN_STEP_MM.
    method.SetOptimizerAsRegularStepGradientDescent(
        learningRate=0.5 * fixed_level.spacing_mm,
        minStep=min_step_mm,
        numberOfIterations=iterations,
        relaxationFactor=0.5,
        gradientMagnitudeTolerance=1e-8,
    )
    method.SetOptimizerScalesFromPhysicalShift()
    method.SetMovingInitialTransform(_affine(start_lps))
    method.SetInitialTransform(transform, inPlace=True)
    method.Execute(sitk_image(fixed_level.data, fixed_level.affine),
                   sitk_image(moving_level.data, moving_level.affine))
    return (float(method.GetMetricValue()), int(method.GetOptimizerIteration()),
            method.GetOptimizerStopConditionDescription())


def _identity(centre_lps: np.ndarray, model: str):
    """The identity of ``model`` about ``centre_lps``: ITK's Euler3D (``"rigid"``) or a
    12-parameter AffineTransform (``"affine"``)."""
    import SimpleITK as sitk

    transform = sitk.AffineTransform(3) if model == "affine" else sitk.Euler3DTransform()
    transform.SetCenter([float(c) for c in centre_lps])
    return transform


def _affine(matrix_lps: np.ndarray):
    import SimpleITK as sitk

    affine = sitk.AffineTransform(3)
    affine.SetMatrix(np.asarray(matrix_lps[:3, :3], dtype=float).ravel().tolist())
    affine.SetTranslation(np.asarray(matrix_lps[:3, 3], dtype=float).tolist())
    return affine


def _composed(start_lps: np.ndarray, transform) -> np.ndarray:
    """The 4x4 (LPS) of ITK's registration result: a fixed point goes through the
    optimised transform, then through the moving-initial start."""
    return start_lps @ ras_to_lps(matrix_from_sitk(transform))


def _sitk_mask(level: Level):
    return sitk_image(level.mask.astype(np.uint8), level.affine)


def pin_sitk_threads(threads: int) -> None:
    """Make ``threads`` SimpleITK's global default thread count.

    Parts of ITK's registration (the metric's threader) use the global count, not the
    registration method's: with the method at 1 thread and the global at 2, repeated
    runs differed in the last bits. Like the runner's ``configure_worker``, this pins
    the process-wide value instead of restoring it, so that concurrent tasks of a
    threaded scheduler never see another task's value mid-run.
    """
    import SimpleITK as sitk

    if sitk.ProcessObject.GetGlobalDefaultNumberOfThreads() != threads:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(threads)
