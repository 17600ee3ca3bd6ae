"""The SimpleITK backend: Euler3D transform, Mattes mutual information, regular step
gradient descent, one registration per pyramid level."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from mriprep.stages.registration.backend import BackendResult
from mriprep.stages.registration.geometry import matrix_from_sitk, ras_to_lps, sitk_image
from mriprep.stages.registration.pyramid import Level

if TYPE_CHECKING:
    from mriprep.stages.register import RegisterParams


def register_sitk(
    fixed: tuple[Level, ...], moving: list[Level], initial_lps: np.ndarray,
    centre_lps: np.ndarray, params: RegisterParams
) -> BackendResult:
    """Register level by level, each level starting from the previous one's transform.

    The start is a fixed moving-initial transform, and the optimiser moves an Euler
    transform composed with it from the identity: a start turned by a quarter turn about
    the left-right axis would otherwise put Euler angles at their singular point (gimbal
    lock), where the optimiser stalls (measured: similarity 0.33 instead of 0.62 on
    the same scan). Details: ``stop_conditions`` and ``level_seconds``, one per level.
    """
    pin_sitk_threads(params.threads)
    euler = _identity_euler(centre_lps)
    iterations, stops, seconds, value = [], [], [], float("nan")
    for fixed_level, moving_level in zip(fixed, moving):
        level_start = time.perf_counter()
        value, count, stop = register_level(fixed_level, moving_level, initial_lps, euler,
                                            params, params.max_iterations)
        iterations.append(count)
        stops.append(stop)
        seconds.append(round(time.perf_counter() - level_start, 4))
    return BackendResult(_composed(initial_lps, euler), value, stops[-1], iterations,
                         {"stop_conditions": stops, "level_seconds": seconds})


def rank_starts(
    fixed: Level, moving: Level, starts_lps: list[np.ndarray], centre_lps: np.ndarray,
    params: RegisterParams, iterations: int
) -> list[tuple[float, np.ndarray]]:
    """A short registration on one level from each start: (metric value, transform LPS)
    per start, in order. Mattes MI is negative: lower is better."""
    pin_sitk_threads(params.threads)
    out = []
    for start in starts_lps:
        euler = _identity_euler(centre_lps)
        value, _, _ = register_level(fixed, moving, start, euler, params, iterations)
        out.append((value, _composed(start, euler)))
    return out


def register_level(fixed_level: Level, moving_level: Level, start_lps: np.ndarray, euler,
                   params, iterations: int):
    """Optimise ``euler`` (in place) on one level, composed after the fixed start
    ``start_lps``: (metric value, iterations, stop condition)."""
    import SimpleITK as sitk

    method = sitk.ImageRegistrationMethod()
    method.SetNumberOfThreads(params.threads)
    method.SetMetricAsMattesMutualInformation(params.histogram_bins)
    method.SetMetricSamplingStrategy(method.RANDOM)
    method.SetMetricSamplingPercentage(params.sampling_fraction, params.seed)
    method.SetMetricFixedMask(_sitk_mask(fixed_level))
    if not moving_level.mask.all():
        method.SetMetricMovingMask(_sitk_mask(moving_level))
    method.SetInterpolator(sitk.sitkLinear)
    # Steps in mm of the largest voxel displacement (physical-shift scales): start at
    # half a voxel of this level, halve at each change of direction, stop at 1 um.
    method.SetOptimizerAsRegularStepGradientDescent(
        learningRate=0.5 * fixed_level.spacing_mm,
        minStep=1e-3,
        numberOfIterations=iterations,
        relaxationFactor=0.5,
        gradientMagnitudeTolerance=1e-8,
    )
    method.SetOptimizerScalesFromPhysicalShift()
    method.SetMovingInitialTransform(_affine(start_lps))
    method.SetInitialTransform(euler, inPlace=True)
    method.Execute(sitk_image(fixed_level.data, fixed_level.affine),
                   sitk_image(moving_level.data, moving_level.affine))
    return (float(method.GetMetricValue()), int(method.GetOptimizerIteration()),
            method.GetOptimizerStopConditionDescription())


def _identity_euler(centre_lps: np.ndarray):
    import SimpleITK as sitk

    euler = sitk.Euler3DTransform()
    euler.SetCenter([float(c) for c in centre_lps])
    return euler


def _affine(matrix_lps: np.ndarray):
    import SimpleITK as sitk

    affine = sitk.AffineTransform(3)
    affine.SetMatrix(np.asarray(matrix_lps[:3, :3], dtype=float).ravel().tolist())
    affine.SetTranslation(np.asarray(matrix_lps[:3, 3], dtype=float).tolist())
    return affine


def _composed(start_lps: np.ndarray, euler) -> np.ndarray:
    """The 4x4 (LPS) of ITK's registration result: a fixed point goes through the
    optimised Euler transform, then through the moving-initial start."""
    return start_lps @ ras_to_lps(matrix_from_sitk(euler))


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
