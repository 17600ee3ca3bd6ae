"""FreeSurfer label maps made ready for a class table: FastSurfer's ``aparc``/``aseg`` rules.

FreeSurfer's ``aparc.DKTatlas+aseg`` holds labels no network should learn (vessels,
"undetermined", the optic chiasm, left-over cortex 3/42, the parcels "unknown" 1000/2000).
FastSurfer's training data generator rewrites them before the lookup; these are the same
rules, written from its documented behaviour:

``processing="aparc"`` (FastSurfer's default)
    80 -> 77 (hypointensities), 85 -> 0, 62 -> 41, 30 -> 2 (vessel into white matter),
    72 -> 24 (5th ventricle into CSF), 29, 61, 3 and 42 -> 0; then each voxel of 1000 (2000)
    takes the cortical parcel of its hemisphere that is nearest in the sense of the largest
    Gaussian-blurred (sigma 5 voxels) indicator among the parcels touching the unknown
    region; then, with ``cortex="fuse"``, right-hemisphere parcels 2xxx become 1xxx except
    the medial ones FastSurfer keeps lateralised (:data:`KEPT_RIGHT`).
``processing="aseg"``
    1000 -> 3, 2000 -> 42, and the vessel/hypointensity/chiasm/5th-ventricle rules above.
``processing="none"``
    Values pass unchanged.

One deliberate difference: FastSurfer decides which right parcels stay lateralised from
the values *before* the fill, so a voxel of 2000 filled with a kept parcel (say 2005)
still becomes the left one (1005). Here the filled value decides, so a right-hemisphere
voxel never takes a left-hemisphere class.

``cortex="split"`` keeps every parcel of both hemispheres (use a table that lists them).
The fill of unknown parcels costs one 3D Gaussian per neighbouring parcel; it only runs
when 1000/2000 occur. Limits and costs: docs/benchmarks.md (fastsurfer).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

PROCESSING = ("aparc", "aseg", "none")
CORTEX = ("fuse", "split")

# Right-hemisphere DKT parcels that FastSurfer's fused table keeps apart from the left:
# those along the midline, where left and right touch and position cannot tell them apart.
KEPT_RIGHT = (2002, 2005, 2010, 2012, 2013, 2014, 2016, 2017, 2021, 2022, 2023, 2024,
              2025, 2028)

# (from, to) rewrites applied before the lookup. Order matters only in that none of the
# targets is itself rewritten.
_APARC_REWRITES = ((80, 77), (85, 0), (62, 41), (30, 2), (72, 24), (29, 0), (61, 0),
                   (3, 0), (42, 0))
_ASEG_REWRITES = ((1000, 3), (2000, 42), (80, 77), (85, 0), (62, 41), (30, 2), (72, 24))


def _rewrite(labels: np.ndarray, pairs) -> None:
    # Masks from the input values first: a chain a->b, b->c must not turn a into c.
    masks = [(labels == a, b) for a, b in pairs]
    for mask, b in masks:
        labels[mask] = b


def fill_unknown_parcel(labels: np.ndarray, unknown: int, stop: int) -> None:
    """Give each voxel of ``unknown`` (1000 or 2000) the nearest parcel in
    ``(unknown, stop)``, in place (module docstring); nothing changes without one."""
    where = labels == unknown
    if not where.any():
        return
    ring = ndimage.binary_dilation(where, ndimage.generate_binary_structure(3, 2)) & ~where
    parcels = np.unique(labels[ring])
    parcels = parcels[(parcels > unknown) & (parcels < stop)]
    if len(parcels) == 0:
        return  # left as it is: the lookup then names the value as unknown
    best = np.full(labels.shape, -np.inf)
    choice = np.zeros(labels.shape, dtype=labels.dtype)
    for parcel in parcels:
        blurred = ndimage.gaussian_filter(1000.0 * (labels == parcel), sigma=5)
        # Strictly greater: on a tie the first (lowest) parcel wins, as argmax does.
        better = blurred > best
        best[better] = blurred[better]
        choice[better] = parcel
    labels[where] = choice[where]


def prepare_labels(labels: np.ndarray, processing: str = "aparc",
                   cortex: str = "fuse") -> np.ndarray:
    """A copy of FreeSurfer-numbered ``labels`` rewritten by the rules above (int32)."""
    if processing not in PROCESSING:
        raise ValueError(f"processing {processing!r} is unknown; choose one of {PROCESSING}")
    if cortex not in CORTEX:
        raise ValueError(f"cortex {cortex!r} is unknown; choose one of {CORTEX}")
    out = np.array(labels, dtype=np.int32, copy=True)
    if processing == "aseg":
        _rewrite(out, _ASEG_REWRITES)
    elif processing == "aparc":
        _rewrite(out, _APARC_REWRITES)
        fill_unknown_parcel(out, 1000, 2000)
        fill_unknown_parcel(out, 2000, 3000)
        if cortex == "fuse":
            right = (out >= 2000) & (out <= 2999) & ~np.isin(out, KEPT_RIGHT)
            out[right] -= 1000
    return out
