"""Labels where the image holds no head (``label-off-anatomy``).

A label map that marks background as brain (a stray blob, a map cut for another field of
view, a bad resampling) teaches a network to find brain in air. The head here is what
the image shows: voxels brighter than :data:`HEAD_LEVEL` of the image's robust maximum,
their holes filled (ventricles, sinuses), grown by :data:`TOLERANCE_VOXELS` so that a
label at the edge of a skull-stripped brain stays inside. Labelled voxels outside it are
counted in millimetres cubed; :data:`MAX_OUTSIDE_MM3` of them, measured on clean maps
against planted blobs in ``make bench`` (labels), is the most a map may hold. The
measure runs on every second voxel along each axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

# Share of the 99.5th percentile from which a voxel is head: far above the background
# noise of a T1 (a few percent), far below any tissue.
HEAD_LEVEL = 0.1
TOLERANCE_VOXELS = 2
MAX_OUTSIDE_MM3 = 200.0
_STEP = 2


@dataclass(frozen=True)
class AnatomyReading:
    """Labelled volume outside the head, and where the largest part of it lies."""

    outside_mm3: float
    labelled_mm3: float
    where_voxel: tuple[int, int, int] | None

    def verdict(self) -> str | None:
        if self.outside_mm3 <= MAX_OUTSIDE_MM3:
            return None
        at = f" (around voxel {self.where_voxel})" if self.where_voxel else ""
        return (f"{self.outside_mm3:.0f} mm^3 of its labels lie where the image shows no "
                f"head{at}, more than {MAX_OUTSIDE_MM3:.0f}: labels in the background")


def read_anatomy(image: np.ndarray, labels: np.ndarray,
                 voxel_mm3: float = 1.0) -> AnatomyReading:
    """The labelled volume outside the head (module docstring); ``voxel_mm3`` is the
    volume of one voxel of the full grid."""
    sub = (slice(None, None, _STEP),) * 3
    values = np.asarray(image)[sub].astype(np.float32)
    labelled = np.asarray(labels)[sub] > 0
    scale = voxel_mm3 * _STEP ** 3
    if not labelled.any():
        return AnatomyReading(0.0, 0.0, None)
    top = float(np.percentile(values[values > 0], 99.5)) if (values > 0).any() else 0.0
    head = ndimage.binary_fill_holes(values > HEAD_LEVEL * top)
    head = ndimage.binary_dilation(head, iterations=TOLERANCE_VOXELS)
    outside = labelled & ~head
    count = int(outside.sum())
    where = None
    if count:
        parts, n = ndimage.label(outside)
        sizes = np.bincount(parts.ravel())[1:]
        centre = ndimage.center_of_mass(outside, parts, int(np.argmax(sizes)) + 1)
        where = tuple(int(round(c * _STEP)) for c in centre)
    return AnatomyReading(count * scale, float(labelled.sum()) * scale, where)
