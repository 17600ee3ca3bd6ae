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

Two rules for maps FastSurfer's generator does not take as they come, applied to values
the class table does not list (``known``):

* **Desikan to DKT.** FreeSurfer's default ``aparc+aseg`` uses the Desikan atlas, which
  has three parcels per hemisphere the DKT atlas dropped: bankssts (1001/2001),
  frontalpole (1032/2032) and temporalpole (1033/2033). DKT's protocol gives their cortex
  to the neighbouring parcels, so here their voxels join the hemisphere's unknown parcel
  and take its fill (nearest touching parcel). ``processing="aparc"`` only.
* **Corpus callosum.** FreeSurfer's ``aparc+aseg`` and ``aseg`` carry the callosum as
  251-255; FastSurfer puts back ``aseg.auto_noCCseg.mgz``'s values there, which are the
  white matter of either hemisphere. That file does not travel with a cached label map,
  so each callosum voxel takes the nearer of left and right white matter (2, 41).

Every rewrite is counted (:attr:`Prepared.moved`, voxels per rule), so nothing is mapped
away unseen; :attr:`Prepared.cortex_lost` names a hemisphere whose whole cortex the
``aparc`` rules would send to background (a map without cortical parcels, such as
``aseg.mgz``), which the table refuses.

FastSurfer decides which right parcels stay lateralised from the values *before* the
fill, so a voxel of 2000 filled with a kept parcel (say 2005) becomes the left one
(1005): a right-hemisphere voxel with a left-hemisphere class, along the medial wall
where FreeSurfer leaves its unknown cortex. ``cortex="fuse"`` keeps that rule, so that
the classes equal FastSurfer's own training data, and counts those voxels;
``cortex="fuse_after_fill"`` lets the filled value decide, so a right-hemisphere voxel
never takes a left-hemisphere class. ``cortex="split"`` keeps every parcel of both
hemispheres (use a table that lists them).
The fill blurs only the neighbourhood of the unknown voxels (:func:`fill_unknown_parcel`),
with the same result as blurring the whole volume. Costs: docs/benchmarks.md (fastsurfer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from mriprep.core.boxes import nonzero_box

PROCESSING = ("aparc", "aseg", "none")
CORTEX = ("fuse", "fuse_after_fill", "split")

# Right-hemisphere DKT parcels that FastSurfer's fused table keeps apart from the left:
# those along the midline, where left and right touch and position cannot tell them apart.
KEPT_RIGHT = (2002, 2005, 2010, 2012, 2013, 2014, 2016, 2017, 2021, 2022, 2023, 2024,
              2025, 2028)
# Desikan parcels the DKT atlas does not have: bankssts, frontalpole, temporalpole.
DESIKAN_ONLY = (1001, 1032, 1033, 2001, 2032, 2033)
CORPUS_CALLOSUM = (251, 252, 253, 254, 255)
WHITE_MATTER = (2, 41)

# (from, to) rewrites applied before the lookup. Order matters only in that none of the
# targets is itself rewritten.
_APARC_REWRITES = ((80, 77), (85, 0), (62, 41), (30, 2), (72, 24), (29, 0), (61, 0),
                   (3, 0), (42, 0))
_ASEG_REWRITES = ((1000, 3), (2000, 42), (80, 77), (85, 0), (62, 41), (30, 2), (72, 24))
_NAMES = {3: "Left-Cerebral-Cortex", 42: "Right-Cerebral-Cortex", 29: "Left-undetermined",
          61: "Right-undetermined", 85: "Optic-Chiasm", 80: "non-WM-hypointensities",
          62: "Right-vessel", 30: "Left-vessel", 72: "5th-Ventricle",
          1000: "ctx-lh-unknown", 2000: "ctx-rh-unknown"}

# The fill's Gaussian: sigma 5 voxels, scipy's default truncation at 4 sigma.
_SIGMA = 5.0
_RADIUS = int(4.0 * _SIGMA + 0.5)
# Side of the blocks the unknown voxels are grouped by before blurring their surroundings.
_BLOCK = 16


@dataclass
class Prepared:
    """A label map after the rules, and what they moved."""

    labels: np.ndarray                                   # int32, FreeSurfer values
    moved: dict[str, int] = field(default_factory=dict)  # rule -> voxels it rewrote
    cortex_lost: tuple[str, ...] = ()                    # hemispheres ("left", "right")


def _rewrite(labels: np.ndarray, pairs, moved: dict[str, int]) -> None:
    # Masks from the input values first: a chain a->b, b->c must not turn a into c.
    masks = [(labels == a, a, b) for a, b in pairs]
    for mask, a, b in masks:
        count = int(np.count_nonzero(mask))
        if count:
            labels[mask] = b
            moved[f"{a} {_NAMES.get(a, '')} -> {b}".replace("  ", " ")] = count


def _blurred_choice(labels: np.ndarray, where: np.ndarray, parcels: np.ndarray,
                    box: tuple[slice, ...]) -> tuple[np.ndarray, int]:
    """The winning parcel at the ``where`` voxels of ``box``, from a crop reaching
    ``_RADIUS`` past the box (clipped at the volume's edge).

    A Gaussian truncated at ``_RADIUS`` is separable, and each 1-D pass sums only
    neighbours within the radius: values more than ``_RADIUS`` inside the crop's cut
    faces are bit for bit those of the whole volume, the same numbers summed in the same
    order. Parcels absent from the crop blur to exactly 0 there, so the lowest parcel,
    which wins every all-zero tie, stands in for them. Also returns how many voxels no
    parcel's blur reached (the all-zero ties)."""
    crop = tuple(slice(max(0, s.start - _RADIUS), min(n, s.stop + _RADIUS))
                 for s, n in zip(box, labels.shape))
    inner = tuple(slice(s.start - c.start, s.stop - c.start) for s, c in zip(box, crop))
    region = labels[crop]
    inside = where[box]
    best = np.zeros(np.count_nonzero(inside))
    choice = np.full(best.shape, parcels[0], dtype=labels.dtype)
    present = np.isin(parcels, np.unique(region))
    for parcel in parcels[present]:
        blurred = ndimage.gaussian_filter(1000.0 * (region == parcel), sigma=_SIGMA)
        values = blurred[inner][inside]
        # Strictly greater: on a tie the first (lowest) parcel wins, as argmax does.
        better = values > best
        best[better] = values[better]
        choice[better] = parcel
    return choice, int(np.count_nonzero(best == 0))


def fill_unknown_parcel(labels: np.ndarray, unknown: int, stop: int) -> tuple[int, int]:
    """Give each voxel of ``unknown`` (1000 or 2000) the nearest parcel in
    ``(unknown, stop)``, in place (module docstring); return the voxels filled, and how
    many of them lie beyond the blur's reach (more than 20 voxels from every touching
    parcel: they take the lowest touching parcel, as FastSurfer's argmax gives them).

    Only the unknown voxels' surroundings are blurred: they are grouped into blocks of
    ``_BLOCK`` voxels, touching blocks into boxes, and each box is blurred with a margin
    of the Gaussian's radius (see :func:`_blurred_choice`)."""
    where = labels == unknown
    coords = np.argwhere(where)
    if not len(coords):
        return 0, 0
    # The ring of voxels touching the unknown ones, grown in the box around them only.
    near = tuple(slice(max(0, int(lo) - 1), int(hi) + 2)
                 for lo, hi in zip(coords.min(axis=0), coords.max(axis=0)))
    ring = ndimage.binary_dilation(where[near], ndimage.generate_binary_structure(3, 2)) \
        & ~where[near]
    parcels = np.unique(labels[near][ring])
    parcels = parcels[(parcels > unknown) & (parcels < stop)]
    if len(parcels) == 0:
        return 0, 0  # left as it is: the lookup then names the value as unknown
    grid_shape = tuple(-(-n // _BLOCK) for n in labels.shape)
    occupied = np.zeros(grid_shape, dtype=bool)
    occupied[tuple((coords // _BLOCK).T)] = True
    groups, _ = ndimage.label(occupied, np.ones((3, 3, 3), dtype=bool))
    boxes = [tuple(slice(g.start * _BLOCK, min(g.stop * _BLOCK, n))
                   for g, n in zip(group, labels.shape))
             for group in ndimage.find_objects(groups)]
    # Every box is blurred from the map before the fill, as the whole-volume blur is:
    # the choices are written only when all are made.
    choices = [_blurred_choice(labels, where, parcels, box) for box in boxes]
    for box, (choice, _) in zip(boxes, choices):
        labels[box][where[box]] = choice
    return len(coords), sum(unreached for _, unreached in choices)


def _callosum_to_white_matter(labels: np.ndarray) -> int:
    """Each corpus callosum voxel takes the nearer of left and right white matter."""
    callosum = np.isin(labels, CORPUS_CALLOSUM)
    count = int(np.count_nonzero(callosum))
    white = np.isin(labels, WHITE_MATTER)
    if not count or not white.any():
        return 0  # nothing to take from: the lookup names the values as unknown
    # The distance transform works on a box around the callosum with room for the
    # white matter beside it, not on the whole volume.
    lo = np.maximum(np.argwhere(callosum).min(axis=0) - 16, 0)
    hi = np.argwhere(callosum).max(axis=0) + 17
    box = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi))
    if not white[box].any():
        box = (slice(None),) * labels.ndim
    _, nearest = ndimage.distance_transform_edt(~white[box], return_indices=True)
    region = labels[box]
    picked = region[tuple(nearest)]
    region[callosum[box]] = picked[callosum[box]]
    return count


def _labelled_reach(labels: np.ndarray) -> tuple[slice, ...]:
    """The box of the non-zero voxels grown by the fill's Gaussian radius and one voxel
    (clipped at the edges); the whole map when it is empty or not 3-D."""
    box = nonzero_box(labels, _RADIUS + 1) if labels.ndim == 3 else None
    return box if box is not None else (slice(None),) * labels.ndim


def rewritten_values(processing: str = "aparc",
                     known: np.ndarray | None = None) -> frozenset[int]:
    """The values :func:`prepare_labels` rewrites into others or into background under
    ``processing`` (``known`` as there): no voxel reaches the class lookup, or training,
    with one of them. The right parcels that ``cortex="fuse"`` moves to the left stay
    structures of their own and are not among them."""
    if processing not in PROCESSING:
        raise ValueError(f"processing {processing!r} is unknown; choose one of {PROCESSING}")
    if processing == "none":
        return frozenset()
    listed = set() if known is None else {int(v) for v in np.asarray(known).ravel()}
    values = set() if listed & set(CORPUS_CALLOSUM) else set(CORPUS_CALLOSUM)
    if processing == "aseg":
        return frozenset(values | {old for old, _ in _ASEG_REWRITES})
    return frozenset(values | {old for old, _ in _APARC_REWRITES} | {1000, 2000}
                     | {v for v in DESIKAN_ONLY if v not in listed})


def prepare_labels(labels: np.ndarray, processing: str = "aparc", cortex: str = "fuse",
                   known: np.ndarray | None = None) -> Prepared:
    """FreeSurfer-numbered ``labels`` rewritten by the rules above, as a copy (int32).

    ``known`` are the values the class table lists: a Desikan parcel or a callosum value
    it lists keeps its own class. None applies both rules."""
    if processing not in PROCESSING:
        raise ValueError(f"processing {processing!r} is unknown; choose one of {PROCESSING}")
    if cortex not in CORTEX:
        raise ValueError(f"cortex {cortex!r} is unknown; choose one of {CORTEX}")
    out = np.array(labels, dtype=np.int32, copy=True)
    result = Prepared(out)
    if processing == "none":
        return result
    # The rules run in a view of the labelled box and the fill's reach around it: they
    # change labelled voxels only, and every box they blur or measure lies inside it,
    # so the result is the whole map's, at a fraction of the passes over a 256^3 grid.
    out = out[_labelled_reach(out)]
    listed = set() if known is None else {int(v) for v in np.asarray(known).ravel()}
    moved = result.moved
    if not listed & set(CORPUS_CALLOSUM):
        filled = _callosum_to_white_matter(out)
        if filled:
            moved["251-255 corpus callosum -> nearer white matter (2/41)"] = filled
    if processing == "aseg":
        _rewrite(out, _ASEG_REWRITES, moved)
        return result
    lost = [side for side, cortex_value, lo in (("left", 3, 1000), ("right", 42, 2000))
            if (out == cortex_value).any() and not ((out >= lo) & (out < lo + 1000)).any()]
    result.cortex_lost = tuple(lost)
    unknown_before = {u: int(np.count_nonzero(out == u)) for u in (1000, 2000)}
    before_fill = out.copy() if cortex == "fuse" else None
    desikan = {}
    for value in (v for v in DESIKAN_ONLY if v not in listed):
        mask = out == value
        if mask.any():
            desikan[value] = mask
            out[mask] = 1000 if value < 2000 else 2000
    _rewrite(out, _APARC_REWRITES, moved)
    for unknown in (1000, 2000):
        filled, unreached = fill_unknown_parcel(out, unknown, unknown + 1000)
        ours = {v: m for v, m in desikan.items() if (v >= 2000) == (unknown == 2000)}
        if not filled:
            for value, mask in ours.items():  # nothing to fill from: named as they were
                out[mask] = value
            continue
        if unknown_before[unknown]:
            moved[f"{unknown} {_NAMES[unknown]} -> nearest parcel"] = unknown_before[unknown]
        for value, mask in ours.items():
            moved[f"{value} Desikan-only parcel -> nearest DKT parcel"] = int(mask.sum())
        if unreached:
            moved[f"{unknown} and Desikan-only voxels beyond the fill's reach -> the lowest "
                  "touching parcel (FastSurfer's argmax)"] = unreached
    if cortex in ("fuse", "fuse_after_fill"):
        decides = before_fill if cortex == "fuse" else out
        kept = np.isin(decides, KEPT_RIGHT)
        crossed = int(np.count_nonzero(np.isin(out, KEPT_RIGHT) & ~kept))
        if crossed:
            moved["2000 filled with a kept right parcel -> its left class "
                  "(FastSurfer's rule)"] = crossed
        right = (out >= 2000) & (out <= 2999) & ~kept
        out[right] -= 1000
    return result
