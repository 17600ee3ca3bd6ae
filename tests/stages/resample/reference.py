"""Ground truths the resample tests compare against.

:func:`world_of` gives the world position of every voxel centre, :func:`analytic` a
smooth field whose linear interpolation error is bounded by ``ANALYTIC_BOUND``, and
:func:`trilinear_reference` the resample rule evaluated voxel by voxel.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from mriprep.core.volume import Volume


def world_of(shape, affine) -> np.ndarray:
    """World coordinates (mm) of every voxel centre, shape (*shape, 3)."""
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    return ijk @ affine[:3, :3].T + affine[:3, 3]


# Smooth analytic field (world mm). Its second derivatives bound the error of linear
# interpolation along an axis of spacing h by h^2/8 * max|f''|: here 1^2/8 * (2pi/40)^2 +
# 1^2/8 * (2pi/50)^2 in-plane and 5^2/8 * 0.5 * (2pi/60)^2 along the 5 mm axis, 0.022 in all.
ANALYTIC_BOUND = (1 / 8) * (2 * np.pi / 40) ** 2 + (1 / 8) * (2 * np.pi / 50) ** 2 + (
    25 / 8
) * 0.5 * (2 * np.pi / 60) ** 2


def analytic(points: np.ndarray) -> np.ndarray:
    x, y, z = points[..., 0], points[..., 1], points[..., 2]
    return np.sin(2 * np.pi * x / 40) * np.cos(2 * np.pi * y / 50) + 0.5 * np.sin(
        2 * np.pi * z / 60 + 0.3
    )


def trilinear_reference(volume: Volume, out_shape, out_affine, template_to_subject=None):
    """The resample rule computed the plain way, point by point with scipy: trilinear at
    each output voxel's input position (0 outside), invalid where outside or where the
    invalid voxels' interpolation weight exceeds 1e-6, labels from the nearest voxel."""
    world = np.eye(4) if template_to_subject is None else template_to_subject
    vox_map = np.linalg.inv(volume.affine) @ world @ out_affine
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in out_shape], indexing="ij"))
    coords = np.tensordot(vox_map[:3, :3], ijk, axes=1) + vox_map[:3, 3, None, None, None]
    upper = (np.asarray(volume.shape) - 1)[:, None, None, None]
    inside = np.all((coords >= -1e-6) & (coords <= upper + 1e-6), axis=0)
    clipped = np.clip(coords, 0, upper)
    data = ndimage.map_coordinates(volume.data, clipped, order=1, mode="nearest")
    touched = ndimage.map_coordinates((~volume.valid).astype(np.float32), clipped, order=1,
                                      mode="nearest")
    label = volume.label[tuple(np.rint(clipped).astype(int))]
    return (np.where(inside, data, 0), inside & (touched <= 1e-6),
            np.where(inside, label, 0))
