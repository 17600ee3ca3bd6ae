"""What both detections read of a volume: per-slice statistics, the foreground, and
which slices serve as a slice's neighbours.

:func:`slice_profiles` gives, for every axis, each slice's share of unusable voxels and
the range of its usable values (what tells an empty, constant or invalid slice);
:func:`prepare` zeroes the unusable voxels and finds the foreground and its bounding box
once for all axes; :func:`neighbours` picks the nearest usable slices on either side, at
most ``MAX_NEIGHBOUR_DISTANCE`` away. Incomplete slices are measured against their
neighbours' tissue and artifact slices against their neighbours' intensities, so both
detections use the same neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A neighbour further than this many slices away predicts too little to be compared: a
# slice may be judged across one flagged neighbour, not across a slab.
MAX_NEIGHBOUR_DISTANCE = 2


@dataclass
class SliceProfile:
    """Per-slice statistics of the usable voxels along one axis."""

    invalid_fraction: np.ndarray
    lowest: np.ndarray  # float64; +inf for a slice without usable voxels
    highest: np.ndarray
    has_values: np.ndarray


def slice_profile(data: np.ndarray, usable: np.ndarray, axis: int) -> SliceProfile:
    x = np.moveaxis(data, axis, 0)
    ok = np.moveaxis(usable, axis, 0)
    flat_axes = tuple(range(1, x.ndim))
    per_slice = ok[0].size
    return SliceProfile(
        invalid_fraction=1.0 - np.count_nonzero(ok, axis=flat_axes) / per_slice,
        lowest=np.where(ok, x, np.float32(np.inf)).min(axis=flat_axes).astype(np.float64),
        highest=np.where(ok, x, np.float32(-np.inf)).max(axis=flat_axes).astype(np.float64),
        has_values=ok.any(axis=flat_axes),
    )


def slice_profiles(data: np.ndarray, usable: np.ndarray) -> list[SliceProfile]:
    """:func:`slice_profile` along every axis of a 3D volume.

    When every voxel is usable there is nothing to mask, and the three axes share their
    passes: one reduction along the last axis gives a plane whose rows and columns
    reduce to the first two axes' slices; one more pass gives the last axis'.
    """
    if not usable.all() or data.ndim != 3 or data.size == 0:
        return [slice_profile(data, usable, axis) for axis in range(data.ndim)]
    plane_low, plane_high = data.min(axis=2), data.max(axis=2)
    lows = (plane_low.min(axis=1), plane_low.min(axis=0), data.min(axis=(0, 1)))
    highs = (plane_high.max(axis=1), plane_high.max(axis=0), data.max(axis=(0, 1)))
    profiles = []
    for axis in range(3):
        n = data.shape[axis]
        profiles.append(SliceProfile(
            invalid_fraction=np.zeros(n),
            lowest=lows[axis].astype(np.float64),
            highest=highs[axis].astype(np.float64),
            has_values=np.ones(n, dtype=bool),
        ))
    return profiles


@dataclass
class Prepared:
    """What the stacks of every axis are cut from, computed once per volume."""

    x: np.ndarray
    usable: np.ndarray
    foreground: np.ndarray
    all_usable: bool
    extent: tuple[slice, slice, slice]  # the foreground's bounding box


def prepare(data, usable, threshold) -> Prepared:
    all_usable = bool(usable.all())
    x = data if all_usable else np.where(usable, data, np.float32(0))
    # Scores are ratios of magnitudes: only positive voxels can be foreground.
    foreground = x > max(threshold, 0.0)
    if not all_usable:
        foreground &= usable
    plane = foreground.any(axis=0)
    along = (foreground.any(axis=(1, 2)), plane.any(axis=1), plane.any(axis=0))
    extent = []
    for present in along:
        where = np.flatnonzero(present)
        extent.append(slice(int(where[0]), int(where[-1]) + 1) if where.size else slice(None))
    return Prepared(x=x, usable=usable, foreground=foreground, all_usable=all_usable,
                    extent=tuple(extent))


def neighbours(s: int, n: int, excluded: set[int]) -> tuple[int | None, int | None]:
    """The nearest usable slices below and above ``s`` within reach (or None)."""
    below = next((i for i in range(s - 1, max(s - 1 - MAX_NEIGHBOUR_DISTANCE, -1), -1)
                  if i not in excluded), None)
    above = next((i for i in range(s + 1, min(s + 1 + MAX_NEIGHBOUR_DISTANCE, n))
                  if i not in excluded), None)
    return below, above
