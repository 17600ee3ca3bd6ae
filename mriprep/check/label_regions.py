"""Where a label map's spatial findings lie, kept so that the QC report can draw them.

A ``label-off-anatomy`` or ``label-islands`` warning names a volume and a voxel; a person
judging it wants to see the voxels. For each spatial finding of one map the check keeps a
:class:`Region`: the flagged voxels' indices on the map's grid, or ``whole_map`` where
the finding is about the map as a whole:

``label-off-anatomy``
    the labelled voxels outside the head and off the brain's mass: the measure samples
    every second voxel, and each sample stands for the 2 x 2 x 2 voxels from it, as the
    finding's volume counts them; those voxels are the region's (``anatomy_step``);
``label-islands``
    the scattered voxels of each flagged structure;
``label-side-swap``
    the voxels of the reversed pairs, both sides, when a few structures are swapped;
    the whole map when it is mirrored or its hemispheres' parcels swapped;
``label-misfit``
    the whole map (it lies off its image as a whole).

At most :data:`MAX_KEPT` voxels of a region are kept, evenly spread over them, and the
count of all of them with it. Pure: :mod:`mriprep.cache.check_regions` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

# Voxels kept per region: enough to draw a mosaic's tiles through it (a tile shows one
# slice of a few hundred voxels of it), a few hundred kB at most per entry.
MAX_KEPT = 20_000


@dataclass(frozen=True, eq=False)  # holds an array: == would compare it voxel by voxel
class Region:
    """The voxels of one finding: ``points`` (k, 3) voxel indices (uint16) of the map,
    ``voxels`` how many the check flagged (more than k when thinned), and
    ``whole_map`` for a finding about the whole map (no points)."""

    code: str
    voxels: int
    points: np.ndarray
    whole_map: bool = False

    def to_json(self) -> dict:
        """What the check record keeps of it (the points go to the regions file)."""
        return {"voxels": int(self.voxels), "kept": int(len(self.points)),
                "whole_map": self.whole_map}


def region(code: str, points: np.ndarray, step: int = 1,
           shape: tuple[int, ...] | None = None) -> Region:
    """A region of ``points`` (k, 3), thinned to :data:`MAX_KEPT` rows, evenly.

    With ``step`` > 1 each point is a sample of a measure on every ``step``-th voxel
    and stands for the ``step``^3 voxels from it (those inside ``shape``): the region
    counts and keeps those voxels, so that its count is the finding's volume."""
    points = np.asarray(points).reshape(-1, 3)
    if step > 1:
        if shape is None:
            raise ValueError("a region of samples needs the grid's shape")
        size = np.asarray(shape, dtype=np.intp)
        total = int(np.prod(np.clip(size - points, 0, step), axis=1).sum())
        block = np.argwhere(np.ones((step,) * 3, dtype=bool))
        points = (_thinned(points, max(1, MAX_KEPT // step ** 3))[:, None, :]
                  + block[None]).reshape(-1, 3)
        points = points[np.all(points < size, axis=1)]
    else:
        total = len(points)
        points = _thinned(points, MAX_KEPT)
    if points.size and points.max() > np.iinfo(np.uint16).max:
        raise ValueError(f"a region of {code} reaches voxel index {int(points.max())}; "
                         "grids over 65,535 voxels along an axis are not kept")
    return Region(code, total, points.astype(np.uint16))


def _thinned(points: np.ndarray, most: int) -> np.ndarray:
    """At most ``most`` of ``points``, evenly spread over them."""
    if len(points) <= most:
        return points
    return points[np.linspace(0, len(points) - 1, most).round().astype(np.intp)]


def whole_map(code: str, voxels: int) -> Region:
    """A finding about the whole map of ``voxels`` labelled voxels."""
    return Region(code, int(voxels), np.empty((0, 3), dtype=np.uint16), True)


def map_regions(labels: np.ndarray, *, anatomy: Mapping[str, np.ndarray] | None = None,
                anatomy_step: int = 1,
                islands: Mapping[int, np.ndarray] | None = None,
                swapped: tuple[int, ...] | None = None,
                mirrored: bool = False, misfit: bool = False) -> dict[str, Region]:
    """The regions of one map's spatial findings, by code (module docstring).

    Parameters
    ----------
    labels : ndarray
        The label map.
    anatomy : mapping, optional
        For a ``label-off-anatomy`` finding: its flagged voxels by kind
        (:func:`~mriprep.check.label_anatomy.anatomy_and_where`).
    anatomy_step : int
        The anatomy measure's grid step: each of its voxels stands for ``step``^3
        (:data:`~mriprep.check.label_anatomy.STEP`).
    islands : mapping, optional
        For a ``label-islands`` finding: each flagged structure's scattered voxels.
    swapped : tuple of int, optional
        For a ``label-side-swap`` finding about a few pairs: their label values.
    mirrored : bool
        A ``label-side-swap`` finding about the whole map or a hemisphere's parcels.
    misfit : bool
        A ``label-misfit`` finding.
    """
    out: dict[str, Region] = {}
    labelled = None

    def count() -> int:
        nonlocal labelled
        if labelled is None:
            labelled = int(np.count_nonzero(labels))
        return labelled

    if anatomy:
        found = [p for p in anatomy.values() if len(p)]
        if found:
            out["label-off-anatomy"] = region("label-off-anatomy",
                                              np.unique(np.concatenate(found), axis=0),
                                              anatomy_step, labels.shape)
    if islands:
        out["label-islands"] = region("label-islands",
                                      np.concatenate(list(islands.values())))
    if mirrored:
        out["label-side-swap"] = whole_map("label-side-swap", count())
    elif swapped:
        out["label-side-swap"] = region("label-side-swap",
                                        np.argwhere(np.isin(labels, list(swapped))))
    if misfit:
        out["label-misfit"] = whole_map("label-misfit", count())
    return out
