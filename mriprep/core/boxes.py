"""The box around an array's non-zero voxels: the crop the checks, the QC metrics and the
label rules work in, so that a 256^3 grid's empty margin is not passed over again."""

from __future__ import annotations

import numpy as np

__all__ = ["nonzero_box"]


def nonzero_box(array: np.ndarray, margin: int = 0) -> tuple[slice, ...] | None:
    """Slices of the smallest box around ``array``'s non-zero voxels, grown by ``margin``
    voxels and clipped at the edges; None when every voxel is zero.

    A 3-D array is reduced along its first axis once, and the depth is then found in the
    rows and columns that hold anything, instead of three reductions of the whole grid.
    """
    values = np.asarray(array)
    if values.ndim == 3:
        plane = values.any(axis=0)
        rows, cols = np.flatnonzero(plane.any(axis=1)), np.flatnonzero(plane.any(axis=0))
        if rows.size == 0:
            return None
        depth = np.flatnonzero(values[:, rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
                               .any(axis=(1, 2)))
        hits = [depth, rows, cols]
    else:
        hits = []
        for axis in range(values.ndim):
            others = tuple(a for a in range(values.ndim) if a != axis)
            hit = np.flatnonzero(values.any(axis=others))
            if hit.size == 0:
                return None
            hits.append(hit)
    return tuple(slice(max(int(hit[0]) - margin, 0), min(int(hit[-1]) + 1 + margin, size))
                 for hit, size in zip(hits, values.shape))
