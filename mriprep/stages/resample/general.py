"""The general path: any voxel map and any kernel, point by point in chunks.

Every output voxel's input position is computed (a slab of output planes at a time, so
that the coordinates and label scores of at most ``_CHUNK_VOXELS`` voxels are held) and
the kernel evaluated there with ``scipy.ndimage.map_coordinates``: trilinear, cubic
B-spline, or cubic in-plane and linear along the thick axis, with the conservative
validity rule and nearest or per-label linear labels. The faster paths
(:mod:`~mriprep.stages.resample.separable`, :mod:`~mriprep.stages.resample.itk_path`)
give the same output (up to rounding) where they apply; B-spline kernels and
``label_linear`` after a rotation come here.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from mriprep.core.volume import Volume
from mriprep.stages.resample.kernel import INSIDE_TOLERANCE, TOUCH_WEIGHT, Kernel

# Output voxels processed at a time: bounds the memory of coordinates and label scores.
_CHUNK_VOXELS = 1 << 20


def _chunks(vox_map: np.ndarray, out_shape: tuple[int, int, int]):
    """Yield (output slab, input voxel coordinates of its voxels, shape (3, n))."""
    plane = out_shape[1] * out_shape[2]
    step = max(1, _CHUNK_VOXELS // plane)
    j, k = np.meshgrid(np.arange(out_shape[1]), np.arange(out_shape[2]), indexing="ij")
    jk = np.stack([j.ravel(), k.ravel()]).astype(np.float64)
    linear, offset = vox_map[:3, :3], vox_map[:3, 3:4]
    for start in range(0, out_shape[0], step):
        stop = min(start + step, out_shape[0])
        i = np.repeat(np.arange(start, stop, dtype=np.float64), plane)
        grid = np.vstack([i, np.tile(jk, (1, stop - start))])
        yield slice(start, stop), linear @ grid + offset


class _Sampler:
    """Evaluates a volume's image and validity, and its labels, at voxel coordinates."""

    def __init__(self, volume: Volume, data: np.ndarray, kernel: Kernel):
        """``data``: the volume's image with its non-finite (invalid) voxels zeroed."""
        self.shape = np.asarray(volume.shape)
        self.upper = (self.shape - 1)[:, None].astype(np.float64)
        self.kernel = kernel
        if kernel.kind in ("cubic", "cubic_inplane"):
            # Interpolating coefficients along every axis: evaluated at an integer
            # thick-axis position they reproduce that slice's in-plane cubic spline.
            self.values = ndimage.spline_filter(data.astype(np.float64), order=3, mode="mirror")
        else:
            self.values = data
        self.invalid = None
        invalid = ~volume.valid
        if invalid.any():
            footprint = self._cubic_footprint()
            if footprint is not None:
                invalid = ndimage.maximum_filter(invalid, footprint=footprint, mode="nearest")
            self.invalid = invalid.astype(np.float32)
            # Only points within one voxel of this box can touch an invalid voxel.
            corners = np.argwhere(invalid)
            self.invalid_box = (corners.min(0)[:, None] - 1.0, corners.max(0)[:, None] + 1.0)
        self.label = volume.label

    def _cubic_footprint(self) -> np.ndarray | None:
        """Cubic weights reach one voxel further than linear ones on each side, along
        the cubic axes: dilating the invalid mask there and then testing the linear
        support tests exactly the cubic support."""
        if self.kernel.kind == "cubic":
            return np.ones((3, 3, 3), dtype=bool)
        if self.kernel.kind == "cubic_inplane":
            size = [3, 3, 3]
            size[self.kernel.thick_axis] = 1
            return np.ones(size, dtype=bool)
        return None

    def inside(self, coords: np.ndarray) -> np.ndarray:
        """Positions within the outermost voxel centres (with round-off tolerance)."""
        return np.all(
            (coords >= -INSIDE_TOLERANCE) & (coords <= self.upper + INSIDE_TOLERANCE),
            axis=0,
        )

    def clip(self, coords: np.ndarray) -> np.ndarray:
        return np.clip(coords, 0.0, self.upper)

    def image(self, coords: np.ndarray, inside: np.ndarray):
        """Image values (0 outside) and validity at clipped coordinates."""
        if self.kernel.kind == "copy":
            index = tuple(np.rint(coords).astype(np.intp))
            values = self.values[index]
            touched = self.invalid[index] if self.invalid is not None else None
        else:
            values = self._interpolate(coords)
            touched = None
            if self.invalid is not None:
                lo, hi = self.invalid_box
                near = np.all((coords > lo) & (coords < hi), axis=0)
                touched = np.zeros(coords.shape[1], dtype=np.float32)
                touched[near] = ndimage.map_coordinates(
                    self.invalid, coords[:, near], order=1, mode="nearest"
                )
        valid = inside if touched is None else inside & (touched <= TOUCH_WEIGHT)
        return np.where(inside, values, 0.0).astype(np.float32), valid

    def _interpolate(self, coords: np.ndarray) -> np.ndarray:
        kind = self.kernel.kind
        if kind == "linear":
            return ndimage.map_coordinates(self.values, coords, order=1, mode="nearest")
        if kind == "cubic":
            return ndimage.map_coordinates(
                self.values, coords, order=3, mode="mirror", prefilter=False
            )
        # Cubic in-plane on the two slices that bracket the point, linear between them.
        axis = self.kernel.thick_axis
        last = int(self.shape[axis]) - 1
        position = coords[axis]
        lower = np.clip(np.floor(position), 0, max(last - 1, 0))
        weight = position - lower
        on_lower, on_upper = coords.copy(), coords.copy()
        on_lower[axis] = lower
        on_upper[axis] = np.minimum(lower + 1, last)
        below = ndimage.map_coordinates(
            self.values, on_lower, order=3, mode="mirror", prefilter=False
        )
        above = ndimage.map_coordinates(
            self.values, on_upper, order=3, mode="mirror", prefilter=False
        )
        return below + weight * (above - below)

    def nearest_labels(self, coords: np.ndarray, inside: np.ndarray) -> np.ndarray:
        labels = self.label[tuple(np.rint(coords).astype(np.intp))]
        return np.where(inside, labels, 0).astype(self.label.dtype)


def resample_arrays(
    volume: Volume,
    data: np.ndarray,
    vox_map: np.ndarray,
    out_shape: tuple[int, int, int],
    kernel: Kernel,
    label_mode: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """Sample ``volume`` at ``vox_map @ v`` for every output voxel ``v`` of ``out_shape``.

    ``data`` is the volume's image with non-finite (invalid) voxels zeroed. Returns the
    float32 image, the boolean validity, the label map (or None) and the number of output
    voxels outside the input's field of view.
    """
    sampler = _Sampler(volume, data, kernel)
    data = np.empty(out_shape, dtype=np.float32)
    valid = np.empty(out_shape, dtype=bool)
    label = None if volume.label is None else np.empty(out_shape, dtype=volume.label.dtype)
    by_label = label is not None and label_mode == "label_linear" and kernel.kind != "copy"
    outside = 0
    for slab, coords in _chunks(vox_map, out_shape):
        chunk = (slab.stop - slab.start, out_shape[1], out_shape[2])
        inside = sampler.inside(coords)
        outside += int(inside.size - np.count_nonzero(inside))
        coords = sampler.clip(coords)
        values, ok = sampler.image(coords, inside)
        data[slab] = values.reshape(chunk)
        valid[slab] = ok.reshape(chunk)
        if label is not None and not by_label:
            label[slab] = sampler.nearest_labels(coords, inside).reshape(chunk)
    if by_label:
        label[...] = _label_linear(volume.label, vox_map, out_shape, sampler)
    return data, valid, label, outside


def _label_linear(label, vox_map, out_shape, sampler: _Sampler) -> np.ndarray:
    """Per-label linear interpolation of the indicator maps, then argmax (ties: the
    smaller label). One label at a time, so memory does not grow with the label count."""
    best = np.full(out_shape, -1.0, dtype=np.float32)
    out = np.zeros(out_shape, dtype=label.dtype)
    for value in np.unique(label):
        indicator = (label == value).astype(np.float32)
        for slab, coords in _chunks(vox_map, out_shape):
            chunk = (slab.stop - slab.start, out_shape[1], out_shape[2])
            inside = sampler.inside(coords).reshape(chunk)
            score = ndimage.map_coordinates(
                indicator, sampler.clip(coords), order=1, mode="nearest"
            ).reshape(chunk)
            better = inside & (score > best[slab])
            out[slab][better] = value
            best[slab][better] = score[better]
    return out
