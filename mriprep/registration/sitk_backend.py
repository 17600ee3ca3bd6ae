"""The SimpleITK backend: Euler3D transform, Mattes mutual information, regular step
gradient descent, one registration per pyramid level."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from mriprep.registration.backend import BackendResult
from mriprep.registration.geometry import (
    euler_from_matrix,
    matrix_from_sitk,
    ras_to_lps,
    sitk_image,
)
from mriprep.registration.pyramid import Level

if TYPE_CHECKING:
    from mriprep.stages.register import RegisterParams


def register_sitk(
    fixed: tuple[Level, ...], moving: list[Level], initial_lps: np.ndarray,
    centre_lps: np.ndarray, params: RegisterParams
) -> BackendResult:
    """Register level by level, each level starting from the previous one's transform.

    Details: ``stop_conditions`` and ``level_seconds``, one per level.
    """
    import SimpleITK as sitk

    pin_sitk_threads(params.threads)
    transform = euler_from_matrix(initial_lps, centre_lps)
    iterations, stops, seconds, value = [], [], [], float("nan")
    for fixed_level, moving_level in zip(fixed, moving):
        level_start = time.perf_counter()
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
            numberOfIterations=params.max_iterations,
            relaxationFactor=0.5,
            gradientMagnitudeTolerance=1e-8,
        )
        method.SetOptimizerScalesFromPhysicalShift()
        method.SetInitialTransform(transform, inPlace=True)
        method.Execute(sitk_image(fixed_level.data, fixed_level.affine),
                       sitk_image(moving_level.data, moving_level.affine))
        iterations.append(int(method.GetOptimizerIteration()))
        stops.append(method.GetOptimizerStopConditionDescription())
        value = float(method.GetMetricValue())
        seconds.append(round(time.perf_counter() - level_start, 4))
    lps = ras_to_lps(matrix_from_sitk(transform))
    return BackendResult(lps, value, stops[-1], iterations,
                         {"stop_conditions": stops, "level_seconds": seconds})


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
