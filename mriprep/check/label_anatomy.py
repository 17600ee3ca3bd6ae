"""Labels where the image holds no head, or away from the brain (``label-off-anatomy``).

A label map that marks background as brain (a stray blob, a map cut for another field of
view, a bad resampling) teaches a network to find brain in air; one that marks scalp or
skull as a brain structure, to find brain in the head's wrappings. Two measures:

* **Outside the head.** The head here is what the image shows: voxels above the
  background (the median of the volume's faces) by more than :data:`HEAD_LEVEL` of the
  way to the image's robust maximum, their holes filled (ventricles, sinuses), grown by
  :data:`TOLERANCE_VOXELS` so that a label at the edge of a skull-stripped brain stays
  inside. Labelled voxels outside it are counted in millimetres cubed.
* **Outside the brain's envelope.** The brain is the map's largest connected labelled
  mass (every label of an ``aparc+aseg`` map lies in or on it); labelled voxels more than
  :data:`ENVELOPE_MM` from it are off the brain (a blob in the scalp, the skull or the
  eyes), whatever the image shows there.

:data:`MAX_OUTSIDE_MM3` of either, measured on clean maps against planted blobs in
``make bench`` (labels), is the most a map may hold. Both run on every second voxel
along each axis.

Where the image's voxels are not valid (a masked slice or slab, a filled NaN blob, the
grid beyond the scan's field of view) the image says nothing of the head: labelled voxels
there are not counted outside it, and the background and the robust maximum are read
from valid voxels (:func:`_background_level`).
"""

from __future__ import annotations

from dataclasses import dataclass

import cc3d
import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree

from mriprep.check.label_pieces import cut, face_surface
from mriprep.core.boxes import nonzero_box
from mriprep.stages.intensity import percentiles

# Share of the way from the background to the 99.5th percentile from which a voxel is
# head: above a T1's background noise (a few percent), below any tissue.
HEAD_LEVEL = 0.1
TOLERANCE_VOXELS = 2
MAX_OUTSIDE_MM3 = 200.0
# Beyond the brain's labelled mass: past a gap of two voxels of the measure's grid, so
# that a parcel cut off by a sulcus or a vessel stays with the brain.
ENVELOPE_MM = 5.0
# The measures' grid: every STEP-th voxel along each axis, each standing for STEP^3.
STEP = 2


@dataclass(frozen=True)
class AnatomyReading:
    """Labelled volume outside the head and off the brain, and where the largest part
    of each lies."""

    outside_mm3: float
    labelled_mm3: float
    where_voxel: tuple[int, int, int] | None
    off_brain_mm3: float = 0.0
    off_brain_voxel: tuple[int, int, int] | None = None

    def verdict(self) -> str | None:
        said = []
        if self.outside_mm3 > MAX_OUTSIDE_MM3:
            at = f" (around voxel {self.where_voxel})" if self.where_voxel else ""
            said.append(f"{self.outside_mm3:.0f} mm^3 of its labels lie where the image "
                        f"shows no head{at}, more than {MAX_OUTSIDE_MM3:.0f}: labels in "
                        "the background")
        if self.off_brain_mm3 > MAX_OUTSIDE_MM3:
            at = f" (around voxel {self.off_brain_voxel})" if self.off_brain_voxel else ""
            said.append(f"{self.off_brain_mm3:.0f} mm^3 of its labels lie more than "
                        f"{ENVELOPE_MM:g} mm from the brain's labelled mass{at}, more than "
                        f"{MAX_OUTSIDE_MM3:.0f}: labels in the scalp, skull or eyes")
        return "; ".join(said) or None


def read_anatomy(image: np.ndarray, labels: np.ndarray, voxel_mm3: float = 1.0,
                 valid: np.ndarray | None = None) -> AnatomyReading:
    """The labelled volume outside the head (module docstring); ``voxel_mm3`` is the
    volume of one voxel of the full grid; ``valid``, the entry's mask of voxels that hold
    the scan's own values (None: all)."""
    reading, _ = anatomy_and_where(image, labels, voxel_mm3, valid)
    return reading


def anatomy_and_where(image: np.ndarray, labels: np.ndarray, voxel_mm3: float = 1.0,
                      valid: np.ndarray | None = None
                      ) -> tuple[AnatomyReading, dict[str, np.ndarray]]:
    """:func:`read_anatomy`, and the voxels it counted outside the head (``"outside"``)
    and off the brain (``"off_brain"``): indices of the full grid, one row each, on the
    measure's grid (each stands for the :data:`STEP`^3 voxels from it, as the volumes
    count it)."""
    sub = (slice(None, None, STEP),) * 3
    values = np.asarray(image)[sub]
    # A cache's own dtype (uint8) is compared and ranked as it is; float16 is widened.
    values = (values.astype(np.float32) if values.dtype.kind == "f"
              and values.dtype.itemsize < 4 else np.ascontiguousarray(values))
    labelled = np.asarray(labels)[sub] > 0
    scale = voxel_mm3 * STEP ** 3
    if not labelled.any():
        return AnatomyReading(0.0, 0.0, None), {}
    seen = None if valid is None else np.asarray(valid)[sub].astype(bool)
    background = _background_level(values, seen)
    top = float(percentiles(values if seen is None or not seen.any() else values[seen],
                            [99.5])[0])
    # The level as a float64 scalar: every image type is compared with it in float64.
    level = np.float64(background + HEAD_LEVEL * (top - background))
    head = _fill_holes(values > level)
    candidates = labelled & ~head if seen is None else labelled & ~head & seen
    outside = _beyond(candidates, head, TOLERANCE_VOXELS)
    off_brain = _off_brain(labelled, STEP * voxel_mm3 ** (1 / 3))
    reading = AnatomyReading(int(outside.sum()) * scale, float(labelled.sum()) * scale,
                             _largest_at(outside), int(off_brain.sum()) * scale,
                             _largest_at(off_brain))
    return reading, {"outside": _voxels(outside, reading.outside_mm3),
                     "off_brain": _voxels(off_brain, reading.off_brain_mm3)}


def _background_level(values: np.ndarray, seen: np.ndarray | None) -> float:
    """The image's background level: the median of the volume's faces, not 0 (a z-scored
    cache's air is negative, and its cortex near 0). Where the scan's field of view does
    not fill the grid (``seen``, the valid voxels, misses part of a face), the faces hold
    the pipeline's fill for voxels it never saw (0, a z-scored cache's mean tissue): the
    scan's own edge, the boundary of its valid voxels, is where its background lies."""
    faces = _faces(values)
    if seen is None or _faces(seen).all():
        return float(np.median(faces))
    # On every second sample: the median needs no more, and the erosion costs an eighth.
    # A masked slab's faces inside the head join the edge too; the outer edge outnumbers
    # them.
    seen, values = seen[::2, ::2, ::2], values[::2, ::2, ::2]
    edge = seen & ~ndimage.binary_erosion(seen, border_value=0)
    return float(np.median(values[edge])) if edge.any() else float(np.median(faces))


def _faces(volume: np.ndarray) -> np.ndarray:
    """The values on the six faces of ``volume``, flat."""
    return np.concatenate([np.moveaxis(volume, a, 0)[[0, -1]].ravel() for a in range(3)])


def _voxels(found: np.ndarray, volume: float) -> np.ndarray:
    """The full grid's indices of ``found`` (one row each); a clean map's are none, and
    its volume says so without a pass over the grid."""
    return np.argwhere(found) * STEP if volume else np.empty((0, 3), dtype=np.intp)


def _fill_holes(mask: np.ndarray) -> np.ndarray:
    """``mask`` with its holes filled, as :func:`scipy.ndimage.binary_fill_holes` fills
    them (a hole: a part of the complement, face-connected, that touches no face of the
    array), from one cut of the complement instead of a propagation."""
    # The parts' sizes are not needed: cc3d's numbering alone, not a cut's.
    parts = cc3d.connected_components(~mask, connectivity=6)
    reaches_face = np.zeros(int(parts.max()) + 1, dtype=bool)
    for axis in range(mask.ndim):
        ends = np.moveaxis(parts, axis, 0)
        reaches_face[ends[0]] = True
        reaches_face[ends[-1]] = True
    reaches_face[0] = True  # the mask itself
    return mask | ~reaches_face[parts]


def _beyond(candidates: np.ndarray, region: np.ndarray, voxels: int) -> np.ndarray:
    """The ``candidates`` farther than ``voxels`` steps through faces from ``region``:
    those outside ``region`` grown by as many face-connected dilations. Only the box
    around the candidates is grown (on a clean map there are none)."""
    if not candidates.any():
        return candidates
    found = np.argwhere(candidates)
    box = tuple(slice(max(0, int(lo) - voxels), int(hi) + voxels + 1)
                for lo, hi in zip(found.min(axis=0), found.max(axis=0)))
    grown = ndimage.binary_dilation(region[box], iterations=voxels)
    out = np.zeros_like(candidates)
    out[box] = candidates[box] & ~grown
    return out


def _off_brain(labelled: np.ndarray, voxel_mm: float) -> np.ndarray:
    """Labelled voxels more than :data:`ENVELOPE_MM` from the largest labelled mass,
    measured inside the labelled voxels' box (the mass is in it, so is everything
    nearest to it), against the mass's surface (:func:`face_surface`)."""
    box = nonzero_box(labelled)
    inside = labelled[box]
    pieces = cut(inside, connectivity=26)
    out = np.zeros_like(labelled)
    if len(pieces.size) < 3:  # one piece or none
        return out
    brain = pieces.numbers == pieces.largest()
    others = np.argwhere(inside & ~brain)
    distance, _ = cKDTree(face_surface(brain)).query(others)
    far = others[distance * voxel_mm > ENVELOPE_MM]
    out[box][tuple(far.T)] = True
    return out


def _largest_at(where: np.ndarray) -> tuple[int, int, int] | None:
    """The full grid's voxel at the centre of the largest piece of ``where``."""
    if not where.any():
        return None
    parts, _ = ndimage.label(where)
    sizes = np.bincount(parts.ravel())[1:]
    centre = ndimage.center_of_mass(where, parts, int(np.argmax(sizes)) + 1)
    return tuple(int(round(c * STEP)) for c in centre)
