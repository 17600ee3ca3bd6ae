"""FastSurfer's arithmetic: its conform's grid and interpolation, computed as its code does.

Why a path of its own (``arithmetic: fastsurfer``, which ``conform_min`` sets)
    FastSurfer's ``conform`` builds its grid in an MGH header, whose voxel size, axes and
    centre are float32 fields (nibabel hands the affine back in float32, and FastSurfer
    inverts it in float32), and samples it with ``scipy.ndimage.affine_transform``
    (order 1, mode ``constant``), which calls a position outside unless
    ``0 <= x <= n - 1`` holds exactly. Where the grid meets the scan's last slice, the
    float32 voxel size (0.9 mm stored as 0.89999998) and centre can put FastSurfer's
    positions less than 1e-6 voxel beyond that slice: scipy writes 0 there, and
    mriprep's own paths, on the float64 grid and with their 1e-6 voxel tolerance for
    round-off, write the slice's values (one whole plane on 4 of 26 scans of
    docs/benchmarks.md, row 47). Which side of ``n - 1`` a position falls on is decided
    by the last bits of that arithmetic (the precision of each step, scipy's order of
    sums, whether its compiler fused a multiply and an add), so no restatement decides
    it as FastSurfer does everywhere; the same header and the same library call with
    the same matrix do, by construction. The header is nibabel's ``MGHHeader``, as
    FastSurfer's; the call is FastSurfer's ``map_image``'s.

What stays mriprep's
    The image is the one the earlier stages made (FastSurfer interpolates the raw scan
    and scales it afterwards; the scaling is linear, so the two agree to rounding),
    non-finite voxels zeroed and refused where valid (the stage's ``_finite_data``); an
    output voxel is invalid outside the field of view (scipy's decision) or where
    invalid input voxels weigh more than ``TOUCH_WEIGHT`` (a second call, on the invalid
    mask, only where some input voxel is invalid). Labels are scipy's nearest neighbour
    (order 0: a position half-way between two voxels takes the upper one) with the same
    inside rule. The cost is scipy's, FastSurfer's own for this step, and more than
    mriprep's paths take (docs/benchmarks.md, row 47).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from mriprep.core.volume import Volume
from mriprep.stages.resample.kernel import TOUCH_WEIGHT


def fastsurfer_affine(in_affine: np.ndarray, in_shape, out_shape, spacing,
                      directions: np.ndarray) -> np.ndarray:
    """The conformed grid's affine as FastSurfer's ``conform`` computes it: an MGH
    header's float32 voxel size, direction cosines (``directions``, unit columns) and
    centre (the input's voxel ``n / 2``, FreeSurfer's ``c_ras``), read back by
    ``MGHHeader.get_affine``.

    Examples
    --------
    >>> from mriprep.stages.resample.grid import world_axes
    >>> affine = fastsurfer_affine(np.eye(4), (10, 10, 10), (12, 12, 12), (0.9,) * 3,
    ...                            world_axes("LIA"))
    >>> float(affine[0, 0]) == float(np.float32(-0.9))
    True
    """
    from nibabel.freesurfer.mghformat import MGHHeader

    header = MGHHeader()
    header.set_data_shape([int(n) for n in out_shape[:3]] + [1])
    header.set_zooms([float(s) for s in spacing])
    header["Mdc"] = np.linalg.inv(np.asarray(directions, dtype=np.float64))
    centre = np.asarray(in_shape[:3], dtype=float) / 2.0
    header["Pxyz_c"] = np.asarray(in_affine, dtype=np.float64).dot(
        np.hstack((centre, [1.0])))[:3]
    return header.get_affine()


def fastsurfer_matrix(in_affine: np.ndarray, out_affine: np.ndarray) -> np.ndarray:
    """The matrix FastSurfer's ``map_image`` hands to ``affine_transform``: the inverse
    of ``inv(out_affine) @ ras2ras @ in_affine``, ``ras2ras`` the identity, computed in
    that order and precision (the last bits decide the edge planes: module doc).
    ``out_affine`` is :func:`fastsurfer_affine`'s as nibabel returns it: float32 (nibabel
    5), so its inverse is taken in float32, as FastSurfer's is."""
    vox2vox = np.linalg.inv(out_affine) @ np.eye(4) @ in_affine
    return np.linalg.inv(vox2vox)


def resample_as_fastsurfer(
    volume: Volume,
    data: np.ndarray,
    out_affine: np.ndarray,
    out_shape: tuple[int, int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """:func:`~mriprep.stages.resample.general.resample_arrays` by FastSurfer's call.

    ``volume`` is on its stored grid (FastSurfer maps from the stored voxels; a reordered
    view would change the matrix's last bits) and ``data`` is its image with non-finite
    (invalid) voxels zeroed.
    """
    matrix = fastsurfer_matrix(volume.affine, out_affine)
    # NaN marks scipy's outside: the image is finite, so no inside value is NaN.
    image = ndimage.affine_transform(data.astype(np.float32, copy=False), matrix,
                                     output_shape=tuple(out_shape), order=1,
                                     mode="constant", cval=np.nan)
    valid = ~np.isnan(image)
    outside = int(valid.size - np.count_nonzero(valid))
    image[~valid] = 0.0
    invalid = ~volume.valid
    if invalid.any():
        touched = ndimage.affine_transform(invalid.astype(np.float32), matrix,
                                           output_shape=tuple(out_shape), order=1,
                                           mode="constant", cval=0.0)
        valid &= touched <= TOUCH_WEIGHT
        del touched
    label = None
    if volume.label is not None:
        label = ndimage.affine_transform(volume.label, matrix, output_shape=tuple(out_shape),
                                         order=0, mode="constant", cval=0)
    return image, valid, label, outside
