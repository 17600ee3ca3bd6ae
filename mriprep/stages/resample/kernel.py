"""Which kernel reads the input, and the tolerances every resampling path shares.

Every path (:mod:`~mriprep.stages.resample.grid`'s crop/pad,
:mod:`~mriprep.stages.resample.separable`, :mod:`~mriprep.stages.resample.itk_path`,
:mod:`~mriprep.stages.resample.general`) applies the same rule: a position within
``INSIDE_TOLERANCE`` of the outermost voxel centres is inside the field of view, an input
voxel weighing ``TOUCH_WEIGHT`` or less does not touch the output, and a voxel map within
``INDEX_MAP_TOLERANCE`` of integers is an exact voxel-to-voxel map (:func:`index_map`),
copied rather than interpolated. The one exception is ``arithmetic: fastsurfer``
(:mod:`~mriprep.stages.resample.fastsurfer_path`), which calls a position inside exactly
where FastSurfer's scipy call does, with no tolerance. :class:`Kernel` names the
interpolation the stage chose; :func:`anisotropic_axis` finds the thick axis that
``bspline`` interpolates linearly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

# Positions within this distance (voxels) of the outermost voxel centres are inside the
# field of view: matrix products leave ~1e-13 of round-off on exact grid positions.
INSIDE_TOLERANCE = 1e-6
# An input voxel whose interpolation weight is below this does not "touch" the output.
TOUCH_WEIGHT = 1e-6
# A map whose entries are this close to integers is an exact voxel-to-voxel map.
INDEX_MAP_TOLERANCE = 1e-9


def anisotropic_axis(spacing, threshold: float) -> int | None:
    """The thick axis of an anisotropic grid (largest/smallest spacing > threshold)."""
    spacing = np.asarray(spacing, dtype=np.float64)
    if spacing.max() / spacing.min() > threshold:
        return int(np.argmax(spacing))
    return None


def index_map(vox_map: np.ndarray) -> bool:
    """Whether the voxel map sends voxel centres exactly onto voxel centres."""
    rounded = np.rint(vox_map)
    if not np.allclose(vox_map, rounded, rtol=0, atol=INDEX_MAP_TOLERANCE):
        return False
    linear = rounded[:3, :3]
    return bool(
        np.all(np.abs(linear).sum(axis=0) == 1) and np.all(np.abs(linear).sum(axis=1) == 1)
    )


@dataclass(frozen=True)
class Kernel:
    """How the image is interpolated: exact copy, trilinear, cubic, or cubic in-plane
    with linear along ``thick_axis``."""

    kind: Literal["crop_pad", "copy", "linear", "cubic", "cubic_inplane", "fastsurfer"]
    thick_axis: int | None = None

    def describe(self) -> str:
        return {
            "crop_pad": "exact copy, integer crop/pad (grid snapped to the input lattice)",
            "copy": "exact copy (voxel centres coincide)",
            "linear": "trilinear",
            "cubic": "cubic B-spline",
            "cubic_inplane": f"cubic B-spline in-plane, linear along axis {self.thick_axis}",
            "fastsurfer": "trilinear, FastSurfer's call (scipy.ndimage.affine_transform, "
                          "constant mode) on its float32 grid",
        }[self.kind]
