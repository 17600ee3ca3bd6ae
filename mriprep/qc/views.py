"""Where a mosaic looks: three planes through a box of world space, sampled from any grid.

Every picture of the report is drawn on an axis-aligned RAS+ display grid, whatever the
voxel order, obliquity or slice thickness of the volume shown: a tile is a set of world
points, and each array (image, mask, label map, template brain) is read at those points
through its own voxel-to-world affine. So the native scan, the cached output and the
template's outline line up by construction, and a header with a wrong orientation shows
as the wrong anatomy, not as a silently turned picture.

Display conventions (neurological, as nilearn's default): the subject's left on the
left; superior up in coronal and sagittal tiles; anterior up in axial and to the right in
sagittal tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

PLANES = ("axial", "coronal", "sagittal")
# Per plane: the world axis held fixed, then the world axes along rows and columns and
# whether they run downwards (rows) or rightwards (columns) with increasing mm.
_LAYOUT = {
    "axial": (2, (1, False), (0, True)),
    "coronal": (1, (2, False), (0, True)),
    "sagittal": (0, (2, False), (1, True)),
}
# Tiles cut the box between these fractions of its extent: the outermost slices of a
# head hold little anatomy.
_SLICE_RANGE = (0.18, 0.82)
# Display points sit off the grid by this much (mm): a point midway between two voxels
# then reads the same voxel whichever way the file stores its axes.
_TIE_BREAK = 1e-4


@dataclass(frozen=True)
class View:
    """A world-space box (RAS+ mm), its display pixel size and the slices per plane."""

    lower: tuple[float, float, float]
    upper: tuple[float, float, float]
    pixel_mm: float = 1.5
    slices: int = 6
    # World points every plane must cut (the centres of what the pipeline invalidated):
    # a 500-voxel NaN blob or a 6 mm slab would otherwise fall between evenly spaced tiles.
    focus: tuple[tuple[float, float, float], ...] = ()
    # The head's own box (the margin not added), when known: a focus point beyond it on a
    # plane's axis would give that plane a tile of air (a masked slice above the vertex
    # drawn as a striped tile), so that plane keeps its evenly spaced slice instead.
    head: tuple[tuple[float, float, float], tuple[float, float, float]] | None = None

    def positions(self, plane: str) -> np.ndarray:
        """World coordinates (mm) of the plane's slices along its fixed axis: evenly
        spaced, the nearest one moved onto each focus point that has head in its plane."""
        axis = _LAYOUT[plane][0]
        lo, hi = self.lower[axis], self.upper[axis]
        positions = lo + (hi - lo) * np.linspace(*_SLICE_RANGE, self.slices)
        free = list(range(self.slices))
        focus = [p for p in self.focus if self.head is None
                 or self.head[0][axis] <= p[axis] <= self.head[1][axis]]
        for point in focus[: self.slices]:
            nearest = min(free, key=lambda i: abs(positions[i] - point[axis]))
            positions[nearest] = point[axis]
            free.remove(nearest)
        return np.sort(positions)

    def tile_points(self, plane: str, position: float) -> np.ndarray:
        """The world points of one tile, shape (rows, columns, 3)."""
        fixed, (row_axis, _), (col_axis, _) = _LAYOUT[plane]
        rows = np.arange(self.upper[row_axis], self.lower[row_axis], -self.pixel_mm)
        cols = np.arange(self.lower[col_axis], self.upper[col_axis], self.pixel_mm)
        points = np.empty((rows.size, cols.size, 3))
        points[..., fixed] = position
        points[..., row_axis] = rows[:, None]
        points[..., col_axis] = cols[None, :]
        return points + _TIE_BREAK

    def all_points(self) -> dict[str, list[np.ndarray]]:
        """Every tile's points, by plane, in display order."""
        return {plane: [self.tile_points(plane, p) for p in self.positions(plane)]
                for plane in PLANES}


def view_of(mask: np.ndarray, affine: np.ndarray, focus=(), pixel_mm: float = 1.5,
            slices: int = 6, margin_mm: float = 6.0) -> View:
    """The world box around the True voxels of ``mask`` (the whole grid when empty)."""
    step = max(1, min(mask.shape) // 64)  # the box needs no full-resolution scan
    ijk = np.argwhere(mask[::step, ::step, ::step]) * step
    if ijk.size == 0:
        ijk = np.array([[0, 0, 0], [s - 1 for s in mask.shape]])
    corners = np.array([ijk.min(0) - step, ijk.max(0) + step], dtype=np.float64)
    # Every corner of the voxel box, so that an oblique grid's box holds all of it.
    box = np.array([[corners[a][0], corners[b][1], corners[c][2]]
                    for a in (0, 1) for b in (0, 1) for c in (0, 1)])
    world = box @ affine[:3, :3].T + affine[:3, 3]
    lower = world.min(0) - margin_mm
    upper = world.max(0) + margin_mm
    head = None
    if np.any(mask):  # the box of the head itself, for the focus points (see View.head)
        head = (tuple(world.min(0).tolist()), tuple(world.max(0).tolist()))
    return View(tuple(lower.tolist()), tuple(upper.tolist()), pixel_mm, slices,
                tuple(tuple(float(v) for v in p) for p in focus), head)


def sample(array: np.ndarray, world_to_index: np.ndarray, points: np.ndarray,
           order: int = 0, fill: float = 0.0) -> np.ndarray:
    """``array`` read at world ``points`` (..., 3) through a 4x4 world-to-index map.

    ``order`` 0 reads the nearest voxel (masks, labels, and the native scan as acquired:
    a 5 mm slice shows as 5 mm), 1 interpolates linearly. Points outside the grid read
    ``fill``. Booleans come back as booleans.
    """
    if order == 0:
        return Points(points).read(array, world_to_index, fill)
    flat = points.reshape(-1, 3)
    index = (flat @ world_to_index[:3, :3].T + world_to_index[:3, 3]).T
    out = ndimage.map_coordinates(array, index, order=order, mode="constant", cval=fill,
                                  prefilter=False)
    return out.reshape(points.shape[:-1])


class Points:
    """World points read on several grids: each grid's voxel indices are computed once
    (an output, its valid mask and its label map share one grid)."""

    def __init__(self, points: np.ndarray):
        self.points = points
        self._index: dict[bytes, np.ndarray] = {}
        self._nearest: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def _continuous(self, world_to_index: np.ndarray) -> np.ndarray:
        tag = world_to_index.tobytes()
        if tag not in self._index:
            flat = self.points.reshape(-1, 3)
            self._index[tag] = flat @ world_to_index[:3, :3].T + world_to_index[:3, 3]
        return self._index[tag]

    def read(self, array: np.ndarray, world_to_index: np.ndarray, fill=0) -> np.ndarray:
        """``array`` at the points, nearest voxel (rounding, no spline machinery: exact
        and cheap); ``fill`` outside the grid; booleans stay booleans."""
        self.inside(world_to_index, array.shape)  # computes the nearest voxels once
        tag = world_to_index.tobytes() + bytes(str(tuple(array.shape)), "ascii")
        return self._gather(array, *self._nearest[tag], fill)

    def inside(self, world_to_index: np.ndarray, shape) -> np.ndarray:
        """Which points fall inside a grid of ``shape`` (nearest voxel)."""
        tag = world_to_index.tobytes() + bytes(str(tuple(shape)), "ascii")
        if tag not in self._nearest:
            self._nearest[tag] = _inside(np.rint(self._continuous(world_to_index)), shape)
        return self._nearest[tag][1].reshape(self.points.shape[:-1])

    def read_support(self, array: np.ndarray, world_to_index: np.ndarray) -> np.ndarray:
        """The largest value of ``array`` among the 8 voxels around each point (0
        outside the grid): the support of a linear kernel, which is what makes a
        resampled voxel invalid (:mod:`mriprep.stages.resample`)."""
        base = np.floor(self._continuous(world_to_index))
        out = None
        for offset in np.ndindex(2, 2, 2):
            found = self._gather(array, *_inside(base + offset, array.shape), 0)
            out = found if out is None else np.maximum(out, found)
        return out

    def _gather(self, array, ijk, inside, fill) -> np.ndarray:
        source = array.view(np.uint8) if array.dtype == bool else array
        out = np.full(inside.shape, fill, dtype=source.dtype)
        out[inside] = source[ijk[0], ijk[1], ijk[2]]
        out = out.reshape(self.points.shape[:-1])
        return out.astype(bool) if array.dtype == bool else out


def _inside(index: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """The whole voxel indices (n, 3) inside ``shape``, as three rows, and which of the
    n points they are."""
    ijk = index.astype(np.intp)
    inside = np.all((ijk >= 0) & (ijk < np.array(shape)), axis=1)
    return ijk[inside].T, inside


def on_grid(array: np.ndarray, array_affine: np.ndarray, shape, affine: np.ndarray,
            fill=0) -> np.ndarray:
    """``array`` (voxel-to-world ``array_affine``) read, nearest voxel, at every voxel of
    the grid ``shape``/``affine``.

    When the two grids differ by a flip, a permutation of axes and a whole-voxel shift
    or stride (a reoriented scan and a subsampled copy of it), this is plain indexing;
    otherwise every voxel's world point is mapped (:func:`sample`).
    """
    mapping = np.linalg.inv(array_affine) @ affine
    linear = mapping[:3, :3]
    whole = np.allclose(linear, np.rint(linear), atol=1e-6) and np.allclose(
        mapping[:3, 3], np.rint(mapping[:3, 3]), atol=1e-6)
    rounded = np.rint(linear)
    if whole and all(np.count_nonzero(rounded[:, a]) == 1 for a in range(3)) \
            and all(np.count_nonzero(rounded[r]) == 1 for r in range(3)):
        axes, ranges = [], []
        for a in range(3):  # output axis a reads source axis src with step and offset
            src = int(np.flatnonzero(rounded[:, a])[0])
            step = int(rounded[src, a])
            offset = int(np.rint(mapping[src, 3]))
            axes.append(src)
            ranges.append(offset + step * np.arange(shape[a]))
        inside = [(r >= 0) & (r < array.shape[src]) for r, src in zip(ranges, axes)]
        out = np.full(tuple(shape), fill, dtype=array.dtype)
        if all(i.any() for i in inside):
            picked = np.transpose(array, axes)  # source axes in output order
            block = picked[np.ix_(*(r[i] for r, i in zip(ranges, inside)))]
            out[np.ix_(*(np.flatnonzero(i) for i in inside))] = block
        return out
    ijk = np.indices(tuple(shape)).reshape(3, -1).T
    world = ijk @ affine[:3, :3].T + affine[:3, 3]
    return sample(array, np.linalg.inv(array_affine), world, 0, fill).reshape(tuple(shape))


def index_map(affine: np.ndarray, world_change: np.ndarray | None = None) -> np.ndarray:
    """The world-to-index map of a grid with voxel-to-world ``affine``, after an optional
    ``world_change`` from display world to the grid's world (e.g. template to subject)."""
    to_index = np.linalg.inv(np.asarray(affine, dtype=np.float64))
    return to_index if world_change is None else to_index @ world_change
