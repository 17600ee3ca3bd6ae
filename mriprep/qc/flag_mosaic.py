"""The label mosaic through the regions the check flagged: where a label map is wrong.

``mriprep check --lut`` keeps the voxels of each map's spatial findings
(:mod:`mriprep.check.label_regions`, :mod:`mriprep.cache.check_regions`). This draws
them over the cached image and its label map: three planes of tiles, as every picture
of the report (:mod:`mriprep.qc.views`), each plane with a tile moved onto every flagged
region, the labels in their colours, and each code's voxels in a colour of its own
(:data:`FLAG_COLOURS`), filled and ringed in black. A finding about the whole map (a
misfit, a mirrored map) outlines the whole labelled mass in its colour instead. Flagged
voxels are drawn with a margin of one voxel (a speck of 4 voxels would otherwise fall
between display pixels of 1.5 mm), and one more pixel on the tile. Pure: arrays in,
JPEG bytes and a legend out; the report (:mod:`mriprep.qc.check_flags`) reads the cache
and writes the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from scipy import ndimage

from mriprep.qc import mosaic
from mriprep.qc.views import PLANES, Points, index_map, view_of

# One colour per code, apart from FreeSurfer's label colours (which are mostly muted)
# and from each other; the legend names them.
FLAG_COLOURS = {
    "label-off-anatomy": "#ff00ff",  # magenta
    "label-islands": "#ffff00",      # yellow
    "label-side-swap": "#00ffff",    # cyan
    "label-misfit": "#ff8000",       # orange
}
FALLBACK_COLOUR = "#ffffff"
_LABEL_ALPHA = 0.3   # the labels under the flags: faint, so that the flags stand out
_FLAG_ALPHA = 0.85
_RING = "#000000"


@dataclass(frozen=True, eq=False)  # holds an array: == would compare it voxel by voxel
class FlaggedRegion:
    """One code's region as the picture draws it: ``points`` (k, 3) voxel indices of
    the map (None: the whole map), ``voxels`` how many the check flagged."""

    code: str
    voxels: int
    points: np.ndarray | None

    @property
    def whole_map(self) -> bool:
        return self.points is None


def flag_picture(image: np.ndarray, labels: np.ndarray, affine: np.ndarray,
                 regions: Mapping[str, FlaggedRegion],
                 label_colours: Mapping[int, str] | None = None) -> tuple[bytes, list[dict]]:
    """The flagged-region mosaic of one entry, and its legend.

    Parameters
    ----------
    image, labels : ndarray
        The cached image and label map (one grid).
    affine : ndarray
        Their voxel-to-world affine.
    regions : mapping
        Code -> :class:`FlaggedRegion`; at least one.
    label_colours : mapping, optional
        Label value -> colour (the label mosaic's legend, so both pictures agree).

    Returns
    -------
    jpeg, legend
        The picture, and one ``{"code", "colour", "voxels", "drawn", "whole_map"}``
        per region, in the order of :data:`FLAG_COLOURS`.
    """
    if not regions:
        raise ValueError("no flagged region to draw: the picture is drawn for an entry "
                         "with a spatial label finding only")
    labels = np.asarray(labels)
    if np.shape(image) != labels.shape:
        raise ValueError(f"the image's shape {np.shape(image)} is not the label map's "
                         f"{labels.shape}: they are drawn on one grid")
    ordered = sorted(regions.values(), key=lambda r: code_order(r.code))
    masks = {r.code: marked(r.points, labels.shape) for r in ordered if not r.whole_map}
    labelled = labels > 0
    focus = [_centre(r.points, affine) for r in ordered
             if not r.whole_map and len(r.points)]
    # The box holds the labels and every flag (labels in the air lie outside the brain).
    box = labelled.copy()
    for mask in masks.values():
        box |= mask
    view = view_of(box, affine, focus=focus)
    points = {p: [Points(pts) for pts in tiles] for p, tiles in view.all_points().items()}
    to_index = index_map(affine)
    values = np.asarray(image, dtype=np.float32)
    grey = mosaic.grey({p: [pts.read(values, to_index, np.nan) for pts in points[p]]
                        for p in PLANES})
    for plane in PLANES:
        for tile, pts in zip(grey[plane], points[plane]):
            shown = pts.read(labels, to_index, 0)
            mosaic.paint_labels(tile, shown, dict(label_colours or {}), _LABEL_ALPHA)
            for region in ordered:
                colour = FLAG_COLOURS.get(region.code, FALLBACK_COLOUR)
                if region.whole_map:
                    mosaic.paint_outline(tile, shown > 0, colour)
                    continue
                flagged = pts.read(masks[region.code], to_index, False)
                _paint_marks(tile, flagged, colour)
    legend = [legend_entry(r.code, r.voxels, 0 if r.whole_map else len(r.points),
                           r.whole_map) for r in ordered]
    return mosaic.encode_jpeg(mosaic.compose(grey)), legend


def legend_entry(code: str, voxels: int, drawn: int, whole_map: bool) -> dict:
    """One code's line of the picture's legend."""
    return {"code": code, "colour": FLAG_COLOURS.get(code, FALLBACK_COLOUR),
            "voxels": int(voxels), "drawn": int(drawn), "whole_map": bool(whole_map)}


def code_order(code: str) -> tuple[int, str]:
    """Where a code's region comes in a picture and its legend: as in
    :data:`FLAG_COLOURS`, other codes after."""
    codes = list(FLAG_COLOURS)
    return (codes.index(code) if code in codes else len(codes), code)


def _paint_marks(tile: np.ndarray, flagged: np.ndarray, colour: str) -> None:
    """The flagged pixels grown by one pixel, filled in ``colour`` and ringed in black:
    a speck of a few voxels stays visible on any label colour."""
    if not flagged.any():
        return
    grown = ndimage.binary_dilation(flagged, np.ones((3, 3), dtype=bool))
    ring = ndimage.binary_dilation(grown, np.ones((3, 3), dtype=bool)) & ~grown
    mosaic.paint(tile, ring, _RING, 1.0)
    mosaic.paint(tile, grown, colour, _FLAG_ALPHA)


def marked(points: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A mask of ``shape`` with ``points`` (k, 3) and their 26 neighbours set.

    ValueError for a point outside the grid: the region is not this map's (it would be
    drawn short without a word)."""
    mask = np.zeros(shape, dtype=bool)
    found = np.asarray(points, dtype=np.intp).reshape(-1, 3)
    if not len(found):
        return mask
    outside = ~np.all((found >= 0) & (found < np.array(shape)), axis=1)
    if outside.any():
        raise ValueError(f"{int(outside.sum())} of the region's {len(found)} voxels lie "
                         f"outside the label map's grid {tuple(shape)}: the region is not "
                         "this map's; check the cache again")
    mask[tuple(found.T)] = True
    box = tuple(slice(max(0, int(lo) - 1), int(hi) + 2)
                for lo, hi in zip(found.min(axis=0), found.max(axis=0)))
    mask[box] = ndimage.binary_dilation(mask[box], np.ones((3, 3, 3), dtype=bool))
    return mask


def _centre(points: np.ndarray, affine: np.ndarray) -> tuple[float, float, float]:
    """The world position of the flagged voxel nearest the region's centroid: a tile
    moved there cuts flagged voxels, even for a region in several pieces."""
    points = np.asarray(points, dtype=np.float64)
    nearest = points[np.argmin(((points - points.mean(axis=0)) ** 2).sum(axis=1))]
    return tuple((affine[:3, :3] @ nearest + affine[:3, 3]).tolist())
