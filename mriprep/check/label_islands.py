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
judged. ``check --lut`` leaves out the values its table's rules rewrite before training
(FreeSurfer's unknown cortex 1000/2000 lies in fragments on the medial wall by nature);
``lut-rewrites`` names their voxels.

Measured on clean maps against 5% of a structure scattered as small islands in
``make bench`` (labels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
from scipy.spatial import cKDTree

from mriprep.check.label_boxes import labelled_box, structure_boxes
from mriprep.check.label_pieces import (
    Pieces,
    cut,
    face_surface,
    first_reached,
    voxel_indices,
)

FAR_MM = 10.0
SPECK_MM3 = 8.0
MAX_SCATTERED = 0.03
MIN_STRUCTURE_MM3 = 200.0
SHOWN = 5
# A structure's specks are measured each in a box of its own while those boxes hold at
# most this share of the structure's box in voxels; beyond, the structure's box is read
# once, through a k-d tree of its body's surface (:func:`_far_voxels`).
_ONE_BY_ONE_SHARE = 1.0
# Speck voxels times body voxels measured at once in a speck's box, at most.
_PAIRS = 1_000_000


@dataclass(frozen=True)
class IslandReading:
    """Per structure (its label value) judged: the share of its voxels scattered, and
    where the scattered voxels of each flagged structure lie (voxel indices of the map,
    one row each); ``skipped``: the values present but left out by the caller's ``skip``,
    with their voxels."""

    scattered: dict[int, float] = field(default_factory=dict)
    names: Mapping[int, str] = field(default_factory=dict)
    where: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    skipped: dict[int, int] = field(default_factory=dict)

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
                 boxes: Sequence[tuple[slice, ...] | None] | None = None,
                 skip: Iterable[int] = ()) -> IslandReading:
    """The share of each structure's voxels scattered far from its body (module
    docstring). ``spacing`` is the grid's voxel size in mm; ``names`` name the values
    in the verdict; ``boxes`` are the map's :func:`structure_boxes` when the caller has
    them already; ``skip`` are values not judged (those a class table rewrites before
    training: FreeSurfer's unknown cortex 1000/2000 lies in fragments on the medial
    wall by nature, and no network learns it).

    The labelled box is cut into pieces once, every structure at a time
    (:func:`mriprep.check.label_pieces.cut`); only a structure with a piece small enough
    to be a speck besides its body is measured further, around its specks only."""
    labels = np.asarray(labels)
    spacing = tuple(float(s) for s in spacing)
    voxel_mm3 = float(np.prod(spacing))
    speck_voxels = int(SPECK_MM3 // voxel_mm3)
    scattered: dict[int, float] = {}
    where: dict[int, np.ndarray] = {}
    if speck_voxels < 1 or labels.max(initial=0) <= 0:
        return IslandReading(scattered, dict(names or {}))
    values = labels if labels.dtype.kind in "iu" else labels.astype(np.int64)
    boxes = structure_boxes(values) if boxes is None else boxes
    labelled = labelled_box(boxes)
    pieces = cut(values[labelled])
    inside = [None if box is None else _inside(box, labelled) for box in boxes]
    structure_voxels = np.bincount(pieces.value, weights=pieces.size,
                                   minlength=len(boxes) + 1)
    judged = structure_voxels * voxel_mm3 >= MIN_STRUCTURE_MM3
    judged[0] = False
    skipped = {int(v): int(structure_voxels[v]) for v in sorted(set(skip))
               if 0 < v < len(judged) and structure_voxels[v] > 0}
    judged[list(skipped)] = False
    bodies = _bodies(pieces, inside)
    is_speck = (pieces.size <= speck_voxels) & judged[pieces.value]
    is_speck[bodies] = False  # a structure's body is never its own speck
    specks: dict[int, list[np.ndarray]] = {}
    for piece, voxels in _speck_voxels(pieces, is_speck).items():
        specks.setdefault(int(pieces.value[piece]), []).append(voxels)
    for value in np.flatnonzero(judged):
        value = int(value)
        own = specks.get(value)
        far = (_far_voxels(pieces.numbers, int(bodies[value]), own, spacing,
                           inside[value - 1]) if own else ())
        scattered[value] = len(far) / int(structure_voxels[value])
        if scattered[value] > MAX_SCATTERED:
            where[value] = far + np.array([s.start for s in labelled])
    return IslandReading(scattered, dict(names or {}), where, skipped)


def _inside(box: tuple[slice, ...], outer: tuple[slice, ...]) -> tuple[slice, ...]:
    """``box``, a box of the map, in the indices of its part ``outer``."""
    return tuple(slice(b.start - o.start, b.stop - o.start) for b, o in zip(box, outer))


def _bodies(pieces: Pieces, boxes: Sequence[tuple[slice, ...] | None]) -> np.ndarray:
    """Each label value's body, its largest piece (``bodies[value]``, 0 where absent;
    ties: :func:`first_reached` in the value's box, ``boxes`` being in the cut's
    indices)."""
    bodies = np.zeros(len(boxes) + 1, dtype=np.int64)
    order = np.lexsort((-pieces.size, pieces.value))  # by value, the largest piece first
    value = pieces.value[order]
    starts = np.flatnonzero(np.r_[True, value[1:] != value[:-1]])
    for start, stop in zip(starts, np.r_[starts[1:], len(order)]):
        if value[start] <= 0:
            continue
        group = order[start:stop]
        largest = group[pieces.size[group] == pieces.size[group[0]]]
        bodies[value[start]] = (largest[0] if len(largest) == 1 else first_reached(
            pieces.numbers[boxes[value[start] - 1]], largest))
    return bodies


def _speck_voxels(pieces: Pieces, is_speck: np.ndarray) -> dict[int, np.ndarray]:
    """The voxels (indices in ``pieces.numbers``, one row each) of each piece that
    ``is_speck`` marks, by piece number: found from the cut's runs, not in a box per
    speck."""
    flat, numbers = pieces.voxels_of(is_speck)
    if not len(flat):
        return {}
    voxels = np.stack(np.unravel_index(flat, pieces.numbers.shape), axis=1)
    order = np.argsort(numbers, kind="stable")
    numbers, voxels = numbers[order], voxels[order]
    starts = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]])
    return {int(numbers[a]): voxels[a:b]
            for a, b in zip(starts, np.r_[starts[1:], len(numbers)])}


def _far_voxels(pieces: np.ndarray, body_piece: int, specks: list[np.ndarray],
                spacing: tuple[float, ...], structure: tuple[slice, ...]) -> np.ndarray:
    """The voxels (indices in ``pieces``, one row each) of ``specks`` (each one's
    voxels) with no voxel of the body nearer than :data:`FAR_MM`; ``structure`` is the
    box of the structure they belong to.

    A few specks are each measured against the body inside a box reaching
    :data:`FAR_MM` around the speck: any body voxel nearer lies in it. Where those
    boxes would read more voxels than the structure's own box (the cerebrospinal fluid
    has thousands of specks, a small structure's dozens cover its box several times),
    they are measured at once, against the body's surface through a k-d tree: the
    nearest body voxel to a point outside the body is on its surface, and a distance
    transform of the structure's box costs as much for a hemisphere's white matter as a
    whole pass over the map."""
    reach = np.ceil(FAR_MM / np.asarray(spacing)).astype(int)
    speck_box = int(np.prod(2 * reach + 1))
    structure_box = int(np.prod([s.stop - s.start for s in structure]))
    if len(specks) * speck_box > _ONE_BY_ONE_SHARE * structure_box:
        return _far_by_tree(pieces, body_piece, np.concatenate(specks), spacing,
                            structure)
    scale = np.asarray(spacing)
    near = _near_half_width(scale)
    far = []
    for own in specks:
        first, last = own.min(axis=0), own.max(axis=0)
        # Any body voxel within ``near`` of every voxel of the speck, along each axis,
        # lies nearer than FAR_MM to each of them: most specks are settled by that
        # small box alone.
        inner = tuple(map(slice, np.maximum(last - near, 0), first + near + 1))
        if (pieces[inner] == body_piece).any():
            continue
        low = np.maximum(first - reach, 0)
        high = np.minimum(last + 1 + reach, pieces.shape)
        body = voxel_indices(pieces[tuple(map(slice, low, high))] == body_piece) + low
        if body.size and own.shape[0] * body.shape[0] <= _PAIRS:
            # Squared distances of the points in mm against the squared limit, summed
            # axis by axis: the k-d tree's arithmetic, so that a speck at FAR_MM on a
            # grid whose spacing binary fractions do not hold is judged alike by both.
            squared = ((((own * scale)[:, None, :] - (body * scale)[None]) ** 2)
                       .sum(axis=-1).min(axis=1))
            own = own[squared >= FAR_MM ** 2]
        elif body.size:  # a fine grid: too many pairs to hold at once
            distance, _ = cKDTree(body * scale).query(own * scale,
                                                      distance_upper_bound=FAR_MM)
            own = own[np.isinf(distance)]
        far.append(own)
    return np.concatenate(far) if far else np.empty((0, 3), dtype=np.intp)


def _near_half_width(spacing: np.ndarray) -> np.ndarray:
    """Voxels along each axis such that a box of that half-width holds only points
    nearer than :data:`FAR_MM` to its centre, with a margin far above the rounding of
    the distances the exact tests compute."""
    near = np.floor(FAR_MM / np.sqrt(len(spacing)) / spacing).astype(int)
    while near.any() and np.sum((near * spacing) ** 2) >= FAR_MM ** 2 * (1 - 1e-9):
        near = np.maximum(near - 1, 0)
    return near


def _far_by_tree(pieces: np.ndarray, body_piece: int, own: np.ndarray,
                 spacing: tuple[float, ...], structure: tuple[slice, ...]) -> np.ndarray:
    """:func:`_far_voxels` for many specks (``own``: their voxels): one k-d tree of the
    body's surface."""
    surface = (face_surface(pieces[structure] == body_piece)
               + [s.start for s in structure])
    # An unbalanced tree builds several times faster on a surface of 10^5 points, and a
    # query's answer does not depend on the tree's shape.
    tree = cKDTree(surface * spacing, balanced_tree=False, compact_nodes=False)
    distance, _ = tree.query(own * spacing, distance_upper_bound=FAR_MM)
    return own[np.isinf(distance)]
