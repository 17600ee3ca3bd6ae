"""Read an array at a voxel map's positions, once: nearest, linear or per-label linear.

The one computation of :mod:`~mriprep.outputs.native`, kept free of files: every voxel
``v`` of the output grid reads ``array`` at the continuous voxel position ``vox_map @ v``.
SimpleITK's resampler evaluates it (the resample stage's rotating path,
:mod:`mriprep.stages.resample.itk_path`, which needs no per-voxel coordinate arrays), and
the stage's field-of-view rule decides what is outside: beyond the outermost voxel
centres of ``array`` (1e-6 voxel of tolerance), where the output is 0.

Methods
    ``nearest``: the nearest voxel's value (label maps; every output value is an input
    value or 0). ``linear``: trilinear (images). ``per-label``: each label's indicator is
    interpolated linearly and the label of largest weight wins, ties to the smaller label
    (the resample stage's ``label_linear``: smoother boundaries than nearest, still only
    input labels).
"""

from __future__ import annotations

import numpy as np

from mriprep.stages.resample.itk_path import inside_rows, itk_resample

METHODS = ("nearest", "linear", "per-label")


def sample_at(array: np.ndarray, vox_map: np.ndarray, out_shape: tuple[int, int, int],
              method: str) -> np.ndarray:
    """``array`` read at ``vox_map @ v`` for every voxel ``v`` of ``out_shape``.

    Parameters
    ----------
    array : ndarray, 3D
        Integer labels (``nearest``, ``per-label``) or intensities (``linear``).
    vox_map : ndarray, 4x4
        Output voxel index to ``array`` voxel index.
    out_shape : 3 ints
    method : {"nearest", "linear", "per-label"}

    Returns
    -------
    ndarray
        ``out_shape``; float32 for ``linear``, ``array``'s dtype otherwise; 0 where
        ``vox_map @ v`` falls outside ``array``'s grid.
    """
    import SimpleITK as sitk

    if method not in METHODS:
        raise ValueError(f"sample_at: unknown method {method!r}; choose one of {METHODS}")
    out_shape = tuple(int(n) for n in out_shape)
    inside = inside_rows(vox_map, out_shape, array.shape)
    if method == "linear":
        values, keep = itk_resample(np.asarray(array, dtype=np.float32), vox_map, out_shape,
                                    sitk.sitkLinear)
        return np.where(inside, values, np.float32(0.0))
    if method == "nearest":
        values, keep = itk_resample(np.asarray(array), vox_map, out_shape,
                                    sitk.sitkNearestNeighbor)
        return np.where(inside, values, 0).astype(array.dtype, copy=False)
    return _per_label(np.asarray(array), vox_map, out_shape, inside)


def _per_label(label: np.ndarray, vox_map: np.ndarray, out_shape, inside) -> np.ndarray:
    """Per-label linear interpolation of the indicators, then argmax (ties: the smaller
    label, which comes first). One label at a time: memory does not grow with labels."""
    import SimpleITK as sitk

    best = np.full(out_shape, -1.0, dtype=np.float32)
    out = np.zeros(out_shape, dtype=label.dtype)
    for value in np.unique(label):
        score, keep = itk_resample((label == value).astype(np.float32), vox_map, out_shape,
                                   sitk.sitkLinear)
        better = score > best
        out[better] = value
        best[better] = score[better]
        del score, keep
    return np.where(inside, out, 0).astype(label.dtype, copy=False)
