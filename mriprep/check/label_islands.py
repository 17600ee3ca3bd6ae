"""Voxels of a structure scattered far from its body (``label-islands``).

Automatic segmentations leave islands: a caudate's tail cut off by partial volume, the
cerebrospinal fluid in pieces, a parcel on two banks of a sulcus. Those are pieces of
some size, or specks near the structure. A label map whose structure has been scattered
(a bad resampling, a merged map, noise written as labels) has specks far from anything
of its kind. So, per structure of at least :data:`MIN_STRUCTURE_MM3`: its largest
connected piece is its body, and its *scattered* voxels are those in pieces of at most
:data:`SPECK_MM3` lying more than :data:`FAR_MM` from the body. A structure with more
than :data:`MAX_SCATTERED` of its voxels scattered is flagged. Pieces connect through
faces, edges and corners (26-connectivity), so a thin strand is one piece. On a grid
coarser than :data:`SPECK_MM3` per voxel (3 mm) no piece is that small and nothing is
judged.

Measured on clean maps against 5% of a structure scattered as small islands in
``make bench`` (labels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree

FAR_MM = 10.0
SPECK_MM3 = 8.0
MAX_SCATTERED = 0.03
MIN_STRUCTURE_MM3 = 200.0
SHOWN = 5
_CONNECTIVITY = np.ones((3, 3, 3), dtype=bool)


@dataclass(frozen=True)
class IslandReading:
    """Per structure (its label value) judged: the share of its voxels scattered."""

    scattered: dict[int, float] = field(default_factory=dict)
    names: Mapping[int, str] = field(default_factory=dict)

    def flagged(self) -> list[tuple[int, float]]:
        return sorted(((v, s) for v, s in self.scattered.items() if s > MAX_SCATTERED),
                      key=lambda vs: -vs[1])

    def verdict(self) -> str | None:
        flagged = self.flagged()
        if not flagged:
            return None
        shown = ", ".join(f"{self.names.get(v, f'label {v}')} {share:.1%}"
                          for v, share in flagged[:SHOWN])
        more = len(flagged) - SHOWN
        return (f"{len(flagged)} structure(s) have more than {MAX_SCATTERED:.0%} of their "
                f"voxels scattered as specks (at most {SPECK_MM3:g} mm^3) over {FAR_MM:g} "
                f"mm from their body: {shown}" + (f" and {more} more" if more > 0 else ""))


def read_islands(labels: np.ndarray, spacing: Sequence[float] = (1.0, 1.0, 1.0),
                 names: Mapping[int, str] | None = None) -> IslandReading:
    """The share of each structure's voxels scattered far from its body (module
    docstring). ``spacing`` is the grid's voxel size in mm; ``names`` name the values
    in the verdict."""
    labels = np.asarray(labels)
    spacing = tuple(float(s) for s in spacing)
    voxel_mm3 = float(np.prod(spacing))
    speck_voxels = int(SPECK_MM3 // voxel_mm3)
    scattered: dict[int, float] = {}
    if speck_voxels < 1 or labels.max(initial=0) <= 0:
        return IslandReading(scattered, dict(names or {}))
    values = labels if labels.dtype.kind in "iu" else labels.astype(np.int64)
    for index, box in enumerate(ndimage.find_objects(np.clip(values, 0, None))):
        value = index + 1
        if box is None:
            continue
        structure = values[box] == value
        voxels = int(structure.sum())
        if voxels * voxel_mm3 < MIN_STRUCTURE_MM3:
            continue
        pieces, count = ndimage.label(structure, structure=_CONNECTIVITY)
        if count < 2:
            scattered[value] = 0.0
            continue
        sizes = np.bincount(pieces.ravel())
        sizes[0] = 0
        specks = np.flatnonzero((sizes > 0) & (sizes <= speck_voxels))
        if specks.size == 0:
            scattered[value] = 0.0
            continue
        scattered[value] = _far_voxels(pieces, int(np.argmax(sizes)), specks,
                                       spacing) / voxels
    return IslandReading(scattered, dict(names or {}))


def _far_voxels(pieces: np.ndarray, body_piece: int, specks: np.ndarray,
                spacing: tuple[float, ...]) -> int:
    """The voxels of the ``specks`` pieces farther than :data:`FAR_MM` from the body.

    Distances to the body's surface voxels, through a k-d tree: a distance transform of
    the structure's box costs as much for a hemisphere's white matter as a whole pass
    over the map."""
    body = pieces == body_piece
    surface = body & ~ndimage.binary_erosion(body)
    is_speck = np.zeros(int(pieces.max()) + 1, dtype=bool)
    is_speck[specks] = True
    speck_points = np.argwhere(is_speck[pieces]) * spacing
    tree = cKDTree(np.argwhere(surface) * spacing)
    distance, _ = tree.query(speck_points, distance_upper_bound=FAR_MM)
    return int(np.isinf(distance).sum())
