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

from mriprep.check.label_boxes import structure_boxes

FAR_MM = 10.0
SPECK_MM3 = 8.0
MAX_SCATTERED = 0.03
MIN_STRUCTURE_MM3 = 200.0
SHOWN = 5
# Up to this many specks in a structure, each is measured in a box of its own; more, at
# once through a k-d tree (:func:`_far_voxels`).
_FEW_SPECKS = 256
# Speck voxels times body voxels measured at once in a speck's box, at most.
_PAIRS = 1_000_000
_CONNECTIVITY = np.ones((3, 3, 3), dtype=bool)


@dataclass(frozen=True)
class IslandReading:
    """Per structure (its label value) judged: the share of its voxels scattered, and
    where the scattered voxels of each flagged structure lie (voxel indices of the map,
    one row each)."""

    scattered: dict[int, float] = field(default_factory=dict)
    names: Mapping[int, str] = field(default_factory=dict)
    where: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

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
                 names: Mapping[int, str] | None = None,
                 boxes: Sequence[tuple[slice, ...] | None] | None = None) -> IslandReading:
    """The share of each structure's voxels scattered far from its body (module
    docstring). ``spacing`` is the grid's voxel size in mm; ``names`` name the values
    in the verdict; ``boxes`` are the map's :func:`structure_boxes` when the caller has
    them already.

    Each structure is cut into pieces inside its own box; only a structure with more
    than one piece, and a piece small enough to be a speck, is measured further, around
    its specks only."""
    labels = np.asarray(labels)
    spacing = tuple(float(s) for s in spacing)
    voxel_mm3 = float(np.prod(spacing))
    speck_voxels = int(SPECK_MM3 // voxel_mm3)
    scattered: dict[int, float] = {}
    where: dict[int, np.ndarray] = {}
    if speck_voxels < 1 or labels.max(initial=0) <= 0:
        return IslandReading(scattered, dict(names or {}))
    values = labels if labels.dtype.kind in "iu" else labels.astype(np.int64)
    for index, box in enumerate(structure_boxes(values) if boxes is None else boxes):
        value = index + 1
        if box is None:
            continue
        structure = values[box] == value
        voxels = int(np.count_nonzero(structure))
        if voxels * voxel_mm3 < MIN_STRUCTURE_MM3:
            continue
        pieces, count = _pieces(structure)
        if count < 2:
            scattered[value] = 0.0
            continue
        sizes = np.bincount(pieces.ravel())
        sizes[0] = 0
        specks = np.flatnonzero((sizes > 0) & (sizes <= speck_voxels))
        if specks.size == 0:
            scattered[value] = 0.0
            continue
        far = _far_voxels(pieces, int(np.argmax(sizes)), specks, spacing)
        scattered[value] = len(far) / voxels
        if scattered[value] > MAX_SCATTERED:
            where[value] = far + np.array([s.start for s in box])
    return IslandReading(scattered, dict(names or {}), where)


def _pieces(structure: np.ndarray) -> tuple[np.ndarray, int]:
    """The 26-connected pieces of ``structure`` and their number, numbered in 16 bits
    while they fit (the numbering is written for every voxel of the box: half the bytes
    of 32; measured in docs/benchmarks.md, row 42)."""
    try:
        return ndimage.label(structure, structure=_CONNECTIVITY, output=np.uint16)
    except RuntimeError:  # more than 65,535 pieces
        return ndimage.label(structure, structure=_CONNECTIVITY)


def _far_voxels(pieces: np.ndarray, body_piece: int, specks: np.ndarray,
                spacing: tuple[float, ...]) -> np.ndarray:
    """The voxels (indices in ``pieces``, one row each) of the ``specks`` pieces with no
    voxel of the body nearer than :data:`FAR_MM`.

    A few specks are each measured against the body inside a box reaching
    :data:`FAR_MM` around the speck: any body voxel nearer lies in it. Many (the
    cerebrospinal fluid has thousands of specks, a scattered structure hundreds) are
    measured at once, against the body's surface through a k-d tree: the nearest body
    voxel to a point outside the body is on its surface, and a distance transform of
    the structure's box costs as much for a hemisphere's white matter as a whole pass
    over the map."""
    if len(specks) > _FEW_SPECKS:
        return _far_by_tree(pieces, body_piece, specks, spacing)
    speck_boxes = ndimage.find_objects(pieces, max_label=int(specks.max()))
    reach = [int(np.ceil(FAR_MM / s)) for s in spacing]
    scale = np.asarray(spacing)
    far = []
    for speck in specks:
        box = speck_boxes[speck - 1]
        around = tuple(slice(max(0, s.start - r), min(n, s.stop + r))
                       for s, r, n in zip(box, reach, pieces.shape))
        start = np.array([s.start for s in around])
        body = np.argwhere(pieces[around] == body_piece)
        own = np.argwhere(pieces[box] == speck) + ([s.start for s in box] - start)
        if body.size and own.shape[0] * body.shape[0] <= _PAIRS:
            # Squared distances against the squared limit, as the k-d tree compares them.
            squared = ((((own[:, None, :] - body[None]) * scale) ** 2).sum(axis=-1)
                       .min(axis=1))
            own = own[squared >= FAR_MM ** 2]
        elif body.size:  # a fine grid: too many pairs to hold at once
            distance, _ = cKDTree(body * scale).query(own * scale,
                                                      distance_upper_bound=FAR_MM)
            own = own[np.isinf(distance)]
        far.append(own + start)
    return np.concatenate(far) if far else np.empty((0, 3), dtype=np.intp)


def _far_by_tree(pieces: np.ndarray, body_piece: int, specks: np.ndarray,
                 spacing: tuple[float, ...]) -> np.ndarray:
    """:func:`_far_voxels` for many specks: one k-d tree of the body's surface."""
    body = pieces == body_piece
    surface = body & ~ndimage.binary_erosion(body)
    is_speck = np.zeros(int(pieces.max()) + 1, dtype=bool)
    is_speck[specks] = True
    own = np.argwhere(is_speck[pieces])
    tree = cKDTree(np.argwhere(surface) * spacing)
    distance, _ = tree.query(own * spacing, distance_upper_bound=FAR_MM)
    return own[np.isinf(distance)]
