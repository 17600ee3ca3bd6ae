"""A label map cut into connected pieces, for the label checks that measure pieces.

The islands check needs every structure's pieces, the off-anatomy check the pieces of the
labelled mass and of the background. cc3d cuts every value of a map into its own pieces
in one pass, where scipy's labelling cuts one mask at a time; the islands check once
labelled each structure's own box, and those boxes add up to most of the grid
(docs/benchmarks.md, rows 42 and 48).

cc3d numbers pieces in an order of its own. Where a check picks "the largest" piece, a
tie goes to the piece reached first in C order (:func:`first_reached`), the piece scipy's
numbering would have put first, so the readings do not depend on the library.
"""

from __future__ import annotations

from dataclasses import dataclass

import cc3d
import numpy as np


@dataclass(frozen=True)
class Pieces:
    """A map cut into connected pieces of one value each: ``numbers`` (0: background)
    and, per piece number, its label ``value`` and ``size`` in voxels (index 0: the
    background, size 0)."""

    numbers: np.ndarray
    value: np.ndarray
    size: np.ndarray

    def largest(self) -> int:
        """The largest piece's number (ties: :func:`first_reached`); 0 when none."""
        if len(self.size) < 2:
            return 0
        tied = np.flatnonzero(self.size == self.size.max())
        return int(tied[0]) if len(tied) == 1 else first_reached(self.numbers, tied)


def cut(values: np.ndarray, connectivity: int = 26) -> Pieces:
    """``values`` (a label map, or a mask; values <= 0 are background) cut into pieces
    connected through faces (6), edges (18) or corners too (26)."""
    values = np.asarray(values)
    if not values.dtype.isnative:  # a map read from a big-endian file (.mgz): cc3d refuses
        values = values.astype(values.dtype.newbyteorder("="))
    if values.dtype.kind in "if" and values.min(initial=0) < 0:
        values = np.where(values > 0, values, 0)
    numbers, count = cc3d.connected_components(values, connectivity=connectivity,
                                               return_N=True)
    flat = numbers.reshape(-1)
    size = np.bincount(flat, minlength=count + 1)
    size[0] = 0
    if values.dtype == bool:
        value = np.ones(count + 1, dtype=np.int64)
        value[0] = 0
    else:
        value = np.zeros(count + 1, dtype=np.int64)
        value[flat] = values.reshape(-1)
    return Pieces(numbers, value, size)


def first_reached(numbers: np.ndarray, candidates) -> int:
    """Of the piece numbers ``candidates``, the one whose first voxel comes first in C
    order in ``numbers`` (a view of the cut, or all of it)."""
    flat = numbers.reshape(-1)
    return int(flat[np.flatnonzero(np.isin(flat, candidates))[0]])


def face_surface(mask: np.ndarray) -> np.ndarray:
    """The voxels of ``mask`` (indices, one row each) with a face neighbour outside it,
    the array's edge counting as outside: ``mask & ~binary_erosion(mask)``, from six
    shifted views instead of scipy's erosion, which costs several times more.

    The nearest voxel of a mask to a point outside it lies on this surface (a step from
    an inner voxel towards the point is still in the mask and nearer), so a k-d tree of
    the surface measures distances to the mask."""
    inner = np.zeros_like(mask)
    core = mask[1:-1, 1:-1, 1:-1].copy()
    for axis in range(3):
        for step in (0, 2):
            view = [slice(1, -1)] * 3
            view[axis] = slice(step, mask.shape[axis] - 2 + step)
            core &= mask[tuple(view)]
    inner[1:-1, 1:-1, 1:-1] = core
    return np.argwhere(mask & ~inner)
