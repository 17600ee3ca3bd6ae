"""Labels where the image holds no head (``label-off-anatomy``).

A label map that marks background as brain (a stray blob, a map cut for another field of
view, a bad resampling) teaches a network to find brain in air. The head here is what
the image shows: voxels above the background (the median of the volume's faces) by more
than :data:`HEAD_LEVEL` of the way to the image's robust maximum, their holes filled (ventricles, sinuses), grown by :data:`TOLERANCE_VOXELS` so that a
label at the edge of a skull-stripped brain stays inside. Labelled voxels outside it are
counted in millimetres cubed; :data:`MAX_OUTSIDE_MM3` of them, measured on clean maps
against planted blobs in ``make bench`` (labels), is the most a map may hold. The
measure runs on every second voxel along each axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

# Share of the way from the background to the 99.5th percentile from which a voxel is
# head: above a T1's background noise (a few percent), below any tissue.
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
    # The background's level from the volume's faces, not 0: a z-scored cache's air is
    # negative, and its cortex near 0.
    faces = np.concatenate([np.moveaxis(values, a, 0)[[0, -1]].ravel() for a in range(3)])
    background = float(np.median(faces))
    top = float(np.percentile(values, 99.5))
    head = ndimage.binary_fill_holes(values > background + HEAD_LEVEL * (top - background))
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
