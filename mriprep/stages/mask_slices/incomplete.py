"""Incomplete slices: slices that carry no measurement (kinds: :func:`find_incomplete`).

They are unambiguous, so the stage searches every axis for them, and every voxel is
judged, never a lattice: an exact zero must be exact. A partly zero-filled slice is
measured against its neighbours: the share of the tissue both of them hold that is
exactly zero in it, which no background (noise or the zeros of a skull-stripped image)
can imitate. Empty slices beyond the end of the head are air, not a defect, and are left
alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mriprep.stages.intensity import foreground_mask
from mriprep.stages.mask_slices.statistics import SliceProfile, neighbours, slice_profile

if TYPE_CHECKING:
    from mriprep.stages.mask_slices.params import MaskSlicesParams

# An empty (zero or constant) slice at the border of the volume lies outside the head,
# and is no defect, when the nearest slice with content holds less head than this share
# of the largest slice's head: the head ended before the field of view did. A larger
# share there means the head was cut off by the empty slices.
_HEAD_END_FRACTION = 0.15
# Fewer voxels of the neighbours' common foreground than this and a slice's missing
# tissue is not measured (a slice grazing the top of the head).
_MIN_TISSUE_VOXELS = 500


def find_incomplete(
    data: np.ndarray,
    usable: np.ndarray,
    axis: int,
    params: MaskSlicesParams,
    profile: SliceProfile | None = None,
    foreground: np.ndarray | None = None,
) -> dict[int, str]:
    """Incomplete slices along ``axis``: index -> kind.

    Kinds: ``"invalid"`` (mostly invalid or non-finite), ``"zero"`` (zero-filled: wholly,
    or over at least ``zero_excess_fraction`` of the tissue both neighbours hold),
    ``"constant"`` (one non-zero value), and ``"outside_fov"`` for empty slices at the
    border of the volume that cut the head off. Empty slices beyond the end of the head
    (air, or the zero background of a skull-stripped image) are no defect and are not
    returned.

    Parameters
    ----------
    data : ndarray
        Intensities; non-usable voxels are ignored (they may be NaN).
    usable : ndarray of bool
        Valid and finite voxels.
    axis : int
    params : MaskSlicesParams
    profile : optional
        The slices' statistics when the caller computed them for every axis at once.
    foreground : ndarray of bool, optional
        The head (usable voxels above the volume's foreground threshold); computed here
        when not given.
    """
    if profile is None:
        profile = slice_profile(data, usable, axis)
    if foreground is None:
        foreground = foreground_mask(data, usable)
    n = data.shape[axis]
    invalid_fraction = profile.invalid_fraction
    lowest, highest, has_values = profile.lowest, profile.highest, profile.has_values
    if has_values.any():
        # Slices count as constant up to float32 rounding of the volume's range.
        tolerance = 1e-6 * (highest[has_values].max() - lowest[has_values].min())
    else:
        tolerance = 0.0

    kinds: dict[int, str] = {}
    for s in range(n):
        if invalid_fraction[s] >= params.max_invalid_slice_fraction:
            kinds[s] = "invalid"
        elif has_values[s] and highest[s] - lowest[s] <= tolerance:
            kinds[s] = "zero" if abs(lowest[s]) <= tolerance else "constant"
    if len(kinds) == n:
        return kinds  # nothing but empty slices: a dead volume, not padding
    x = np.moveaxis(data, axis, 0)
    ok = np.moveaxis(usable, axis, 0)
    head = np.moveaxis(foreground, axis, 0)
    for s, fraction in enumerate(_missing_tissue(x, ok, head, set(kinds))):
        if fraction >= params.zero_excess_fraction:
            kinds[s] = "zero"

    # Empty slices at the border: outside the head, unless the head runs into them.
    head_area = np.count_nonzero(head, axis=(1, 2))
    largest = max(int(head_area.max()), 1)
    for border_run in (range(n), range(n - 1, -1, -1)):
        run = []
        for s in border_run:
            if kinds.get(s) not in ("zero", "constant"):
                break
            run.append(s)
        if not run or len(run) == n:
            continue
        inner = border_run[len(run)]
        cut_off = head_area[inner] >= _HEAD_END_FRACTION * largest
        for s in run:
            if cut_off:
                kinds[s] = "outside_fov"
            else:
                del kinds[s]
    return kinds


def _missing_tissue(x: np.ndarray, ok: np.ndarray, head: np.ndarray, empty: set[int]):
    """Per slice of a stack: the share of the tissue both nearest non-empty neighbours
    hold that is exactly zero in the slice (NaN where there is too little of it).

    A slice half zero-filled loses half the head; a clean slice loses nothing, whatever
    its background. Counting zeros within the neighbours' head, not within the whole
    plane, makes a skull-stripped image's zero background irrelevant.
    """
    n = x.shape[0]
    out = np.full(n, np.nan)
    for s in range(n):
        if s in empty:
            continue
        below, above = neighbours(s, n, empty)
        if below is None or above is None:
            continue
        common = head[below] & head[above] & ok[s]
        count = int(np.count_nonzero(common))
        if count >= _MIN_TISSUE_VOXELS:
            out[s] = np.count_nonzero(common & (x[s] == 0)) / count
    return out
