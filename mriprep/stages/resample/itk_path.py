"""The rotating path: SimpleITK's resampler for trilinear images and nearest labels.

Rotating maps, trilinear, nearest labels (every registered subject)
    SimpleITK's resampler evaluates image, invalid-voxel weight and nearest label, in
    about a third of ``map_coordinates``' time (docs/benchmarks.md, "Stage timings"); the
    field of view is found row by row (along a row each input coordinate is linear in
    the last index), so no per-voxel coordinates are built. On the demo cohort the
    output equals the general path's: validity and labels identical, image within 1e-8
    of its range. B-spline kernels and ``label_linear`` keep the general path.
"""

from __future__ import annotations

import numpy as np

from mriprep.core.volume import Volume
from mriprep.stages.resample.kernel import INSIDE_TOLERANCE, TOUCH_WEIGHT


def inside_rows(vox_map: np.ndarray, out_shape: tuple[int, int, int], in_shape) -> np.ndarray:
    """:meth:`~mriprep.stages.resample.general._Sampler.inside` for every output voxel,
    without a coordinate array.

    Along an output row (fixed first two indices) each input coordinate moves linearly
    with the last index, so the inside voxels of a row form one run whose ends follow
    from the row's start and slope: a few operations per row instead of three float64
    coordinates per voxel.
    """
    i, j = np.meshgrid(np.arange(out_shape[0]), np.arange(out_shape[1]), indexing="ij")
    lo = np.zeros(i.shape)
    hi = np.full(i.shape, float(out_shape[2] - 1))
    for axis in range(3):
        start = vox_map[axis, 0] * i + vox_map[axis, 1] * j + vox_map[axis, 3]
        slope = vox_map[axis, 2]
        low, high = -INSIDE_TOLERANCE, in_shape[axis] - 1 + INSIDE_TOLERANCE
        if abs(slope) * max(out_shape[2] - 1, 1) <= 1e-12:
            # The row does not move along this input axis: all of it or none is inside.
            hi = np.where((start >= low) & (start <= high), hi, -1.0)
            continue
        a, b = (low - start) / slope, (high - start) / slope
        lo = np.maximum(lo, np.minimum(a, b))
        hi = np.minimum(hi, np.maximum(a, b))
    k = np.arange(out_shape[2])
    return (k >= np.ceil(lo)[..., None]) & (k <= np.floor(hi)[..., None])


def itk_resample(array: np.ndarray, vox_map: np.ndarray, out_shape, interpolator):
    """``array`` sampled at ``vox_map @ v`` for every output voxel ``v`` by SimpleITK's
    resampler (0 beyond half a voxel outside), as a read-only NumPy view of its output.

    Both grids are given ITK's unit geometry, so physical points are voxel indices; ITK
    orders them (x, y, z) = (k, j, i), the reverse of ours.
    """
    import SimpleITK as sitk

    reverse = np.eye(3)[::-1]
    transform = sitk.AffineTransform(3)
    transform.SetMatrix((reverse @ vox_map[:3, :3] @ reverse).ravel().tolist())
    transform.SetTranslation((reverse @ vox_map[:3, 3]).tolist())
    image = sitk.GetImageFromArray(np.ascontiguousarray(array))
    resampler = sitk.ResampleImageFilter()
    resampler.SetSize([int(n) for n in out_shape[::-1]])
    resampler.SetTransform(transform)
    resampler.SetInterpolator(interpolator)
    resampler.SetDefaultPixelValue(0)
    resampler.SetOutputPixelType(image.GetPixelID())
    out = resampler.Execute(image)
    return sitk.GetArrayViewFromImage(out), out  # the image keeps the view's memory


def resample_linear_itk(
    volume: Volume,
    data: np.ndarray,
    vox_map: np.ndarray,
    out_shape: tuple[int, int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """:func:`~mriprep.stages.resample.general.resample_arrays` for a rotating map,
    trilinear images and nearest labels, with SimpleITK's resampler: no per-voxel
    coordinate arrays, about a third of ``map_coordinates``' time on one thread
    (docs/benchmarks.md, "Stage timings").

    The same rule as the general path: trilinear inside the field of view (1e-6 voxel
    tolerance), 0 and invalid outside it, invalid where invalid input voxels weigh more
    than 1e-6, labels from the nearest voxel. ITK rounds a position exactly half-way
    between two voxels up where ``np.rint`` rounds to even: after a rotation such ties
    have measure zero.
    """
    import SimpleITK as sitk

    inside = inside_rows(vox_map, out_shape, volume.shape)
    outside = int(inside.size - np.count_nonzero(inside))
    values, keep = itk_resample(data.astype(np.float32, copy=False), vox_map, out_shape,
                                 sitk.sitkLinear)
    image = np.where(inside, values, np.float32(0.0))
    del values, keep
    invalid = ~volume.valid
    if invalid.any():
        touched, keep = itk_resample(invalid.astype(np.float32), vox_map, out_shape,
                                      sitk.sitkLinear)
        valid = inside & (touched <= TOUCH_WEIGHT)
        del touched, keep
    else:
        valid = inside
    label = None
    if volume.label is not None:
        nearest, keep = itk_resample(volume.label, vox_map, out_shape,
                                      sitk.sitkNearestNeighbor)
        label = np.where(inside, nearest, 0).astype(volume.label.dtype, copy=False)
        del nearest, keep
    return image, valid, label, outside
