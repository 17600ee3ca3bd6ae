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
    background, size 0). ``run_start`` and ``run_piece``: where each run of one piece
    number begins in ``numbers`` read in C order (flat indices), and its number."""

    numbers: np.ndarray
    value: np.ndarray
    size: np.ndarray
    run_start: np.ndarray
    run_piece: np.ndarray

    def largest(self) -> int:
        """The largest piece's number (ties: :func:`first_reached`); 0 when none."""
        if len(self.size) < 2:
            return 0
        tied = np.flatnonzero(self.size == self.size.max())
        return int(tied[0]) if len(tied) == 1 else first_reached(self.numbers, tied)

    def voxels_of(self, marked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The voxels of the pieces that ``marked`` (one flag per piece number) marks:
        their flat indices in C order, and their piece numbers; from the runs, without
        a pass over the map."""
        chosen = np.flatnonzero(marked[self.run_piece])
        if not len(chosen):
            return np.empty(0, dtype=np.intp), np.empty(0, dtype=self.run_piece.dtype)
        stops = np.append(self.run_start[1:], self.numbers.size)
        starts, lengths = self.run_start[chosen], (stops - self.run_start)[chosen]
        # Each run's voxels follow its start: the flat index is the start plus the
        # voxel's place within its run.
        first_of_run = np.cumsum(lengths) - lengths
        flat = np.arange(int(lengths.sum()), dtype=np.intp) + np.repeat(
            starts - first_of_run, lengths)
        return flat, np.repeat(self.run_piece[chosen], lengths)


def cut(values: np.ndarray, connectivity: int = 26) -> Pieces:
    """``values`` (a label map, or a mask; values <= 0 are background) cut into pieces
    connected through faces (6), edges (18) or corners too (26).

    The pieces' sizes and values are read from the runs of one piece number along the
    map's rows, not voxel by voxel: a map's rows cross a few dozen pieces each, and a
    count over every voxel repeats the same counter along a run, one increment waiting
    on the last (docs/benchmarks.md, row 56)."""
    values = np.asarray(values)
    if not values.dtype.isnative:  # a map read from a big-endian file (.mgz): cc3d refuses
        values = values.astype(values.dtype.newbyteorder("="))
    if values.dtype.kind in "if" and values.min(initial=0) < 0:
        values = np.where(values > 0, values, 0)
    numbers, count = cc3d.connected_components(values, connectivity=connectivity,
                                               return_N=True)
    flat = numbers.reshape(-1)
    run_start = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    run_start = np.concatenate([np.zeros(min(flat.size, 1), dtype=np.intp), run_start])
    run_piece = flat[run_start]
    lengths = np.diff(np.append(run_start, flat.size))
    size = np.bincount(run_piece, weights=lengths, minlength=count + 1).astype(np.int64)
    size[0] = 0
    value = np.zeros(count + 1, dtype=np.int64)
    if values.dtype == bool:
        value[1:] = 1
    else:
        value[run_piece] = values.reshape(-1)[run_start]
        value[0] = 0
    return Pieces(numbers, value, size, run_start, run_piece)


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
    inner = mask[1:-1, 1:-1, 1:-1].copy()
    for axis in range(3):
        for step in (0, 2):
            view = [slice(1, -1)] * 3
            view[axis] = slice(step, mask.shape[axis] - 2 + step)
            inner &= mask[tuple(view)]
    surface = mask.copy()
    surface[1:-1, 1:-1, 1:-1] ^= inner  # inner voxels are mask voxels: XOR clears them
    return voxel_indices(surface)


def voxel_indices(mask: np.ndarray) -> np.ndarray:
    """``np.argwhere(mask)`` (indices, one row each, in C order), from a flat search:
    argwhere's own search over a 3-D array is several times slower
    (docs/benchmarks.md, row 54)."""
    flat = np.flatnonzero(mask)
    return np.stack(np.unravel_index(flat, mask.shape), axis=1)
