"""Resample: apply a pending registration and the change of grid in one interpolation.

Every output voxel centre is mapped to a continuous position in the input's voxel grid by
one affine map, ``inv(input affine) @ template_to_subject @ output affine`` (the middle
factor is the identity without a registration), and the input is interpolated there
once. Two successive resamplings (register, then regrid) would blur the anatomy twice.

Target grid
    With a pending registration: the template's grid it carries. Otherwise a grid with
    the input's axes and ``spacing``, centred on the input's field of view, covering it
    (``round(n * input_spacing / spacing)`` voxels per axis) or with an explicit
    ``shape`` (e.g. 256^3 at 1 mm, FastSurfer's conformed grid). With ``orientation``
    (e.g. ``"LIA"``, FastSurfer's voxel order) the input's axes are first reordered to it,
    as the reorient stage would but without copying a voxel: the reordering is paid for
    in the one pass that writes the output grid. With ``axis_aligned`` the output axes
    are the world's axes themselves (an oblique scan is rotated onto them, as
    FreeSurfer's and FastSurfer's conform do), and with ``centre: freesurfer`` the grid
    is centred as theirs is: output voxel ``N/2`` lies at the input's voxel ``n/2``
    (FreeSurfer's ``c_ras``), rather than the two fields of view sharing their centre.
    The two conventions differ by half an input voxel less half an output voxel.

Images
    ``linear`` (trilinear) or ``bspline`` (cubic B-spline, finite data only: its
    prefilter spreads a NaN along whole lines). Anisotropic inputs, whose largest voxel
    side exceeds ``anisotropy_threshold`` times the smallest, follow nnU-Net's idea: cubic
    in-plane and linear along the thick axis, so that cubic ringing across 5 mm slices
    cannot overshoot. The two steps are one separable kernel evaluated once per output
    point: the in-plane cubic value is taken on the two slices that bracket the point and
    blended linearly between them. Trilinear interpolation is already exactly that
    (bilinear in-plane, then linear along the thick axis), so ``linear`` needs no special
    case.

Labels
    ``nearest``, or ``label_linear``: each label's indicator is interpolated linearly and
    the most probable label wins (smoother boundaries than nearest, as FreeSurfer does).
    Either way every output value is an input label (or 0 outside the field of view).

Validity
    Conservative: an output voxel is invalid if any input voxel with a non-zero weight in
    its interpolation kernel is invalid (support: 2 voxels per axis for linear, 4 for
    cubic), or if it lies outside the input's field of view (beyond the outermost voxel
    centres, with a 1e-6 voxel tolerance for round-off). The cubic B-spline prefilter is
    recursive and reaches further, decaying by a factor 0.27 per voxel; filled voxels hold
    plausible finite values (the sanitize stage's local fill), so that tail is harmless.

Snapping onto the input's lattice (a design decision)
    Without a pending registration, when the target grid has the input's axes (3x3
    parts of the affines equal within 1e-6 relative, as after the reorient stage) and
    the target spacing equals the input's (within 1e-6 relative), the target origin is
    moved to the input lattice position nearest to the centred one, and the output is
    an integer crop/pad of the input: data, label and validity copied exactly, padded
    voxels invalid with data 0 and label 0. Centring a 256^3 grid on a field of view of
    the other shape parity puts every output voxel half a voxel between two input
    voxels, and linear interpolation there averages neighbours: it would blur an
    already-conformed 1 mm scan for no gain, cost ~0.3 s per subject, and lose
    exactness. The snap moves the grid by at most half a voxel per axis (recorded as
    ``grid_shift_mm``, along each output voxel axis), a shift FastSurfer's own conform
    would have interpolated; MONAI's Spacingd no-op plus ResizeWithPadOrCrop crops and
    pads the same way. The output affine is the input's, translated by whole voxels, so
    each copied voxel keeps its world position exactly. Any other case (a registration,
    a change of spacing, oblique target axes) takes the paths below unchanged.

When the map sends every output voxel exactly onto an input voxel (same grid, axis
flips, whole-voxel shifts; within 1e-9 voxel), values are copied, not interpolated: the
same grid returns the input bit for bit (NaN on invalid voxels, which ``linear`` accepts,
becomes 0 there as everywhere).

Axis-aligned maps
    Without a rotation (a change of spacing or of field of view, FastSurfer's 256^3
    conform grid, a registration that found none) each output axis reads along one input
    axis only. Trilinear interpolation is then the product of three 1D linear
    interpolations, and it is computed as three 1D passes over the part of the output
    grid inside the field of view (a box), never materialising per-voxel coordinates:
    the same values up to float32 rounding, at a fraction of the cost. Validity becomes
    three 1D dilations of the invalid mask, each keeping the input voxels whose 1D weight
    exceeds ``_TOUCH_WEIGHT / 8``. That is conservative with respect to the rule above:
    an output voxel whose kernel gives invalid voxels more than ``_TOUCH_WEIGHT`` of
    weight in total gives one of its (at most 8) support voxels more than an eighth of
    that, and each 1D weight of that voxel is at least its 3D weight. It marks more
    voxels only where an invalid voxel's weight lies below ``_TOUCH_WEIGHT``, within about
    1e-6 voxel of a grid plane.

Rotating maps, trilinear, nearest labels (every registered subject)
    SimpleITK's resampler evaluates image, invalid-voxel weight and nearest label (one
    thread: 0.28 s against 0.9 s for ``map_coordinates`` on a registered 1 mm head); the
    field of view is found row by row (along a row each input coordinate is linear in
    the last index), so no per-voxel coordinates are built. On the demo cohort the
    output equals the general path's: validity and labels identical, image within 1e-8
    of its range. B-spline kernels and ``label_linear`` keep the general path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import nibabel as nib
import numpy as np
from scipy import ndimage

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.stages import StageOutput, stage
from mriprep.stages.intensity import label_values
from mriprep.stages.reorient import axis_codes, orientation_codes, reoriented
from mriprep.core.volume import Volume

# Positions within this distance (voxels) of the outermost voxel centres are inside the
# field of view: matrix products leave ~1e-13 of round-off on exact grid positions.
_INSIDE_TOLERANCE = 1e-6
# An input voxel whose interpolation weight is below this does not "touch" the output.
_TOUCH_WEIGHT = 1e-6
# A map whose entries are this close to integers is an exact voxel-to-voxel map.
_INDEX_MAP_TOLERANCE = 1e-9
# Relative tolerance within which the target grid's axes and spacing equal the input's,
# so that the grid is snapped onto the input's lattice (see module doc).
_SAME_LATTICE_TOLERANCE = 1e-6
# Output voxels processed at a time: bounds the memory of coordinates and label scores.
_CHUNK_VOXELS = 1 << 20


@dataclass(frozen=True)
class ResampleParams:
    """Parameters of the resample stage.

    Attributes
    ----------
    interpolation : {"linear", "bspline"}
        Image interpolation; ``bspline`` is cubic and needs finite data.
    label_interpolation : {"nearest", "label_linear"}
        Label maps: nearest neighbour, or per-label linear interpolation and argmax.
    spacing : tuple of 3 floats
        Output voxel size (mm) when there is no pending registration.
    shape : tuple of 3 ints or None
        Output shape when there is no pending registration, centred on the input's field
        of view; None covers the field of view.
    anisotropy_threshold : float
        Largest/smallest input spacing above which a ``bspline`` image is interpolated
        cubic in-plane and linear along the thick axis.
    orientation : str or None
        Voxel order of the output grid when there is no pending registration (nibabel
        axis codes, e.g. ``"LIA"``); None keeps the input's. With a registration the
        template's grid decides, and setting it is an error.
    axis_aligned : bool
        Output axes exactly along the world axes of ``orientation`` (obliquity removed);
        False keeps the input's (reordered) axes. Needs ``orientation``.
    centre : {"field_of_view", "freesurfer"}
        Where the grid is centred: on the input's field of view, or at FreeSurfer's
        ``c_ras`` (input voxel ``n/2`` at output voxel ``N/2``).
    """

    interpolation: Literal["linear", "bspline"] = "linear"
    label_interpolation: Literal["nearest", "label_linear"] = "nearest"
    spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)
    shape: tuple[int, int, int] | None = None
    anisotropy_threshold: float = 3.0
    orientation: str | None = None
    axis_aligned: bool = False
    centre: Literal["field_of_view", "freesurfer"] = "field_of_view"

    def __post_init__(self):
        if self.orientation is not None:
            object.__setattr__(self, "orientation", axis_codes(self.orientation, "resample"))
        elif self.axis_aligned:
            raise PipelineConfigError(
                "resample: axis_aligned needs an orientation to align to (e.g. LIA)"
            )
        spacing = tuple(float(s) for s in self.spacing)
        if len(spacing) != 3 or not all(np.isfinite(spacing)) or min(spacing) <= 0:
            raise PipelineConfigError(
                f"resample: spacing must be three positive sizes in mm, got {self.spacing}"
            )
        object.__setattr__(self, "spacing", spacing)
        if self.shape is not None:
            shape = tuple(int(s) for s in self.shape)
            if len(shape) != 3 or min(shape) < 1:
                raise PipelineConfigError(
                    f"resample: shape must be three positive voxel counts, got {self.shape}"
                )
            object.__setattr__(self, "shape", shape)
        if not self.anisotropy_threshold >= 1:
            raise PipelineConfigError(
                "resample: anisotropy_threshold is a ratio of spacings and must be at "
                f"least 1, got {self.anisotropy_threshold}"
            )


def grid_centre(affine: np.ndarray, shape, convention: str) -> tuple[np.ndarray, float]:
    """The world point a target grid is centred on, by ``convention``.

    ``"field_of_view"``: the input's voxel ``(n - 1) / 2``, which lands on output voxel
    ``(N - 1) / 2``. ``"freesurfer"``: FreeSurfer's ``c_ras``, the input's voxel
    ``n / 2``, which lands on output voxel ``N / 2``.

    Returns
    -------
    (point, offset) : the world point (mm), and ``offset`` such that it lands on output
    voxel ``N / 2 - offset``.
    """
    offset = 0.5 if convention == "field_of_view" else 0.0
    index = np.asarray(shape, dtype=np.float64) / 2 - offset
    affine = np.asarray(affine, dtype=np.float64)
    return affine[:3, :3] @ index + affine[:3, 3], offset


def world_axes(orientation: str) -> np.ndarray:
    """Unit columns along the world axes named by nibabel axis codes.

    Examples
    --------
    >>> world_axes("LIA").astype(int).tolist()
    [[-1, 0, 0], [0, 0, 1], [0, -1, 0]]
    """
    ornt = nib.orientations.axcodes2ornt(tuple(orientation))
    columns = np.zeros((3, 3))
    for voxel_axis, (world_axis, sign) in enumerate(ornt):
        columns[int(world_axis), voxel_axis] = sign
    return columns


def target_grid(
    affine: np.ndarray, shape: tuple[int, int, int], spacing, out_shape=None,
    directions: np.ndarray | None = None, centre: tuple[np.ndarray, float] | None = None,
) -> tuple[tuple[int, int, int], np.ndarray]:
    """A grid with ``spacing``, by default with the input's axes and centred on its field
    of view.

    Parameters
    ----------
    affine : ndarray, shape (4, 4)
        Input voxel-to-world affine.
    shape : tuple of 3 ints
        Input shape.
    spacing : sequence of 3 floats
        Output voxel size (mm).
    out_shape : tuple of 3 ints, optional
        Output shape; by default ``round(shape * input_spacing / spacing)``.
    directions : ndarray, shape (3, 3), optional
        Unit columns of the output axes (default: the input's).
    centre : (world point, offset), optional
        From :func:`grid_centre` (default: the input's field of view).

    Returns
    -------
    shape : tuple of 3 ints
    affine : ndarray, shape (4, 4)

    Examples
    --------
    >>> shape, affine = target_grid(np.diag([1.0, 1.0, 3.0, 1.0]), (10, 10, 4), (1, 1, 1))
    >>> shape, float(affine[2, 2]), float(affine[2, 3])
    ((10, 10, 12), 1.0, -1.0)
    """
    affine = np.asarray(affine, dtype=np.float64)
    in_shape = np.asarray(shape, dtype=np.float64)
    in_spacing = np.linalg.norm(affine[:3, :3], axis=0)
    spacing = np.asarray(spacing, dtype=np.float64)
    if out_shape is None:
        new_shape = np.maximum(np.round(in_shape * in_spacing / spacing), 1).astype(int)
    else:
        new_shape = np.asarray(out_shape, dtype=int)
    if directions is None:
        directions = affine[:3, :3] / in_spacing
    point, offset = centre if centre is not None else grid_centre(affine, shape,
                                                                  "field_of_view")
    new_affine = np.eye(4)
    new_affine[:3, :3] = np.asarray(directions, dtype=np.float64) * spacing
    new_affine[:3, 3] = point - new_affine[:3, :3] @ (new_shape / 2 - offset)
    return tuple(int(s) for s in new_shape), new_affine


def snap_to_input_lattice(
    in_affine: np.ndarray, in_spacing, out_affine: np.ndarray, spacing
) -> tuple[np.ndarray, np.ndarray] | None:
    """Move a target grid with the input's axes and spacing onto the input's lattice.

    Parameters
    ----------
    in_affine : ndarray, shape (4, 4)
        Input voxel-to-world affine.
    in_spacing : sequence of 3 floats
        Input voxel size (mm).
    out_affine : ndarray, shape (4, 4)
        Target grid's affine (e.g. from :func:`target_grid`).
    spacing : sequence of 3 floats
        Target voxel size (mm).

    Returns
    -------
    (affine, shift_mm) or None
        The input's affine translated by the whole number of voxels nearest to the
        target's origin, and how far that moved the grid along each output voxel axis
        (mm, at most half a voxel each); None when the axes or spacings differ (within
        1e-6 relative), so that the grids cannot share a lattice.

    Examples
    --------
    >>> centred = np.eye(4)
    >>> centred[:3, 3] = (-0.5, 3.25, 7.0)
    >>> affine, shift = snap_to_input_lattice(np.eye(4), (1, 1, 1), centred, (1, 1, 1))
    >>> affine[:3, 3].tolist(), shift.tolist()
    ([0.0, 3.0, 7.0], [0.5, -0.25, 0.0])
    """
    in_affine = np.asarray(in_affine, dtype=np.float64)
    out_affine = np.asarray(out_affine, dtype=np.float64)
    in_spacing = np.asarray(in_spacing, dtype=np.float64)
    spacing = np.asarray(spacing, dtype=np.float64)
    tolerance = _SAME_LATTICE_TOLERANCE
    if np.any(np.abs(spacing - in_spacing) > tolerance * in_spacing):
        return None
    in_linear = in_affine[:3, :3]
    if np.abs(out_affine[:3, :3] - in_linear).max() > tolerance * np.abs(in_linear).max():
        return None
    origin = np.linalg.solve(in_linear, out_affine[:3, 3] - in_affine[:3, 3])
    whole = np.rint(origin)
    snapped = in_affine.copy()
    snapped[:3, 3] = in_linear @ whole + in_affine[:3, 3]
    return snapped, (whole - origin) * in_spacing


def _crop_or_pad(
    volume: Volume, data: np.ndarray, offset: np.ndarray, out_shape: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """Output voxel ``v`` is input voxel ``v + offset`` (whole voxels): an exact copy,
    padded with invalid voxels (data 0, label 0). Same returns as :func:`_resample_arrays`.
    """
    in_box, out_box = [], []
    for start, n_in, n_out in zip(offset.astype(int), volume.shape, out_shape):
        lo, hi = max(0, -start), min(n_out, n_in - start)
        hi = max(hi, lo)
        out_box.append(slice(lo, hi))
        in_box.append(slice(lo + start, hi + start))
    in_box, out_box = tuple(in_box), tuple(out_box)
    image = np.zeros(out_shape, dtype=np.float32)
    valid = np.zeros(out_shape, dtype=bool)
    image[out_box] = data[in_box]
    valid[out_box] = volume.valid[in_box]
    label = None
    if volume.label is not None:
        label = np.zeros(out_shape, dtype=volume.label.dtype)
        label[out_box] = volume.label[in_box]
    outside = int(np.prod(out_shape)) - int(np.prod([s.stop - s.start for s in out_box]))
    return image, valid, label, outside


def anisotropic_axis(spacing, threshold: float) -> int | None:
    """The thick axis of an anisotropic grid (largest/smallest spacing > threshold)."""
    spacing = np.asarray(spacing, dtype=np.float64)
    if spacing.max() / spacing.min() > threshold:
        return int(np.argmax(spacing))
    return None


def _index_map(vox_map: np.ndarray) -> bool:
    """Whether the voxel map sends voxel centres exactly onto voxel centres."""
    rounded = np.rint(vox_map)
    if not np.allclose(vox_map, rounded, rtol=0, atol=_INDEX_MAP_TOLERANCE):
        return False
    linear = rounded[:3, :3]
    return bool(
        np.all(np.abs(linear).sum(axis=0) == 1) and np.all(np.abs(linear).sum(axis=1) == 1)
    )


@dataclass(frozen=True)
class _Kernel:
    """How the image is interpolated: exact copy, trilinear, cubic, or cubic in-plane
    with linear along ``thick_axis``."""

    kind: Literal["crop_pad", "copy", "linear", "cubic", "cubic_inplane"]
    thick_axis: int | None = None

    def describe(self) -> str:
        return {
            "crop_pad": "exact copy, integer crop/pad (grid snapped to the input lattice)",
            "copy": "exact copy (voxel centres coincide)",
            "linear": "trilinear",
            "cubic": "cubic B-spline",
            "cubic_inplane": f"cubic B-spline in-plane, linear along axis {self.thick_axis}",
        }[self.kind]


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

    def __init__(self, volume: Volume, data: np.ndarray, kernel: _Kernel):
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
            (coords >= -_INSIDE_TOLERANCE) & (coords <= self.upper + _INSIDE_TOLERANCE),
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
        valid = inside if touched is None else inside & (touched <= _TOUCH_WEIGHT)
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


def _resample_arrays(
    volume: Volume,
    data: np.ndarray,
    vox_map: np.ndarray,
    out_shape: tuple[int, int, int],
    kernel: _Kernel,
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


def _inside_rows(vox_map: np.ndarray, out_shape: tuple[int, int, int], in_shape) -> np.ndarray:
    """:meth:`_Sampler.inside` for every output voxel, without a coordinate array.

    Along an output row (fixed first two indices) each input coordinate moves linearly
    with the last index, so the inside voxels of a row form one run whose ends follow
    from the row's start and slope: a few operations per row instead of three float64
    coordinates per voxel.
    """
    i, j = np.meshgrid(np.arange(out_shape[0]), np.arange(out_shape[1]), indexing="ij")
    lo = np.zeros(i.shape)
    hi = np.full(i.shape, float(out_shape[2] - 1))
    for axis in range(3):
        start = vox_map[axis, 0] * i + vox_map[axis, 1] * j + vox_map[axis, 3]
        slope = vox_map[axis, 2]
        low, high = -_INSIDE_TOLERANCE, in_shape[axis] - 1 + _INSIDE_TOLERANCE
        if abs(slope) * max(out_shape[2] - 1, 1) <= 1e-12:
            # The row does not move along this input axis: all of it or none is inside.
            hi = np.where((start >= low) & (start <= high), hi, -1.0)
            continue
        a, b = (low - start) / slope, (high - start) / slope
        lo = np.maximum(lo, np.minimum(a, b))
        hi = np.minimum(hi, np.maximum(a, b))
    k = np.arange(out_shape[2])
    return (k >= np.ceil(lo)[..., None]) & (k <= np.floor(hi)[..., None])


def _itk_resample(array: np.ndarray, vox_map: np.ndarray, out_shape, interpolator):
    """``array`` sampled at ``vox_map @ v`` for every output voxel ``v`` by SimpleITK's
    resampler (0 beyond half a voxel outside), as a read-only NumPy view of its output.

    Both grids are given ITK's unit geometry, so physical points are voxel indices; ITK
    orders them (x, y, z) = (k, j, i), the reverse of ours.
    """
    import SimpleITK as sitk

    reverse = np.eye(3)[::-1]
    transform = sitk.AffineTransform(3)
    transform.SetMatrix((reverse @ vox_map[:3, :3] @ reverse).ravel().tolist())
    transform.SetTranslation((reverse @ vox_map[:3, 3]).tolist())
    image = sitk.GetImageFromArray(np.ascontiguousarray(array))
    resampler = sitk.ResampleImageFilter()
    resampler.SetSize([int(n) for n in out_shape[::-1]])
    resampler.SetTransform(transform)
    resampler.SetInterpolator(interpolator)
    resampler.SetDefaultPixelValue(0)
    resampler.SetOutputPixelType(image.GetPixelID())
    out = resampler.Execute(image)
    return sitk.GetArrayViewFromImage(out), out  # the image keeps the view's memory


def _resample_linear_itk(
    volume: Volume,
    data: np.ndarray,
    vox_map: np.ndarray,
    out_shape: tuple[int, int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """:func:`_resample_arrays` for a rotating map, trilinear images and nearest labels,
    with SimpleITK's resampler: no per-voxel coordinate arrays, about a third of
    ``map_coordinates``' time on one thread (0.9 s -> 0.3 s for a registered 1 mm head).

    The same rule as the general path: trilinear inside the field of view (1e-6 voxel
    tolerance), 0 and invalid outside it, invalid where invalid input voxels weigh more
    than 1e-6, labels from the nearest voxel. ITK rounds a position exactly half-way
    between two voxels up where ``np.rint`` rounds to even: after a rotation such ties
    have measure zero.
    """
    import SimpleITK as sitk

    inside = _inside_rows(vox_map, out_shape, volume.shape)
    outside = int(inside.size - np.count_nonzero(inside))
    values, keep = _itk_resample(data.astype(np.float32, copy=False), vox_map, out_shape,
                                 sitk.sitkLinear)
    image = np.where(inside, values, np.float32(0.0))
    del values, keep
    invalid = ~volume.valid
    if invalid.any():
        touched, keep = _itk_resample(invalid.astype(np.float32), vox_map, out_shape,
                                      sitk.sitkLinear)
        valid = inside & (touched <= _TOUCH_WEIGHT)
        del touched, keep
    else:
        valid = inside
    label = None
    if volume.label is not None:
        nearest, keep = _itk_resample(volume.label, vox_map, out_shape,
                                      sitk.sitkNearestNeighbor)
        label = np.where(inside, nearest, 0).astype(volume.label.dtype, copy=False)
        del nearest, keep
    return image, valid, label, outside


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


def _axis_aligned(vox_map: np.ndarray, out_shape: tuple[int, int, int]) -> tuple[int, ...] | None:
    """For each output axis, the one input axis it reads along; None if the map rotates.

    A coefficient coupling an output axis to a second input axis is negligible when it
    moves no output voxel by more than ``_INDEX_MAP_TOLERANCE`` of an input voxel.
    """
    linear = vox_map[:3, :3]
    sources = tuple(int(i) for i in np.argmax(np.abs(linear), axis=0))
    if sorted(sources) != [0, 1, 2]:
        return None
    reach = np.abs(linear) * np.maximum(np.asarray(out_shape, dtype=np.float64) - 1, 1)
    reach[list(sources), [0, 1, 2]] = 0.0
    return sources if bool(np.all(reach <= _INDEX_MAP_TOLERANCE)) else None


@dataclass(frozen=True)
class _AxisSampling:
    """Where the output positions along one axis read the input, along one input axis.

    ``inside`` is the run of output positions within the input's field of view; the index
    arrays cover that run. ``weight`` (float32) is the share of ``upper`` in the linear
    interpolation, None when every position is a voxel centre. ``first``/``second`` are
    the input voxels whose 1D weight exceeds ``_TOUCH_WEIGHT / 8`` (``second`` None when
    that is one voxel everywhere).
    """

    inside: slice
    lower: np.ndarray
    upper: np.ndarray
    weight: np.ndarray | None
    nearest: np.ndarray
    first: np.ndarray
    second: np.ndarray | None

    @property
    def size(self) -> int:
        return self.inside.stop - self.inside.start


def _axis_sampling(scale: float, offset: float, n_out: int, n_in: int) -> _AxisSampling:
    position = scale * np.arange(n_out, dtype=np.float64) + offset
    within = (position >= -_INSIDE_TOLERANCE) & (position <= n_in - 1 + _INSIDE_TOLERANCE)
    # Positions move monotonically along the axis, so the inside positions form one run.
    run = np.flatnonzero(within)
    inside = slice(int(run[0]), int(run[-1]) + 1) if run.size else slice(0, 0)
    position = np.clip(position[inside], 0.0, n_in - 1)
    lower = np.floor(position).astype(np.intp)
    upper = np.minimum(lower + 1, n_in - 1)
    fraction = position - lower
    touch = _TOUCH_WEIGHT / 8
    first = np.where(1.0 - fraction > touch, lower, upper)
    second = np.where(fraction > touch, upper, first)
    return _AxisSampling(
        inside=inside,
        lower=lower,
        upper=upper,
        weight=fraction.astype(np.float32) if np.any(fraction) else None,
        nearest=np.rint(position).astype(np.intp),
        first=first,
        second=None if np.array_equal(first, second) else second,
    )


def _along(axis: int, vector: np.ndarray) -> np.ndarray:
    """``vector`` shaped to broadcast along ``axis`` of a 3D array."""
    shape = [1, 1, 1]
    shape[axis] = -1
    return vector.reshape(shape)


def _interpolate_axis(values: np.ndarray, axis: int, s: _AxisSampling, out=None) -> np.ndarray:
    """1D linear interpolation along ``axis`` (float32, in place on fresh gathers),
    into ``out`` if given."""
    lower = np.take(values, s.lower, axis=axis)
    if s.weight is None:
        if out is None:
            return lower
        out[...] = lower
        return out
    upper = np.take(values, s.upper, axis=axis)
    # The convex form is exact at the voxel centres and cannot overflow near float32's
    # maximum, as the difference of two extreme values would.
    lower *= _along(axis, np.float32(1.0) - s.weight)
    upper *= _along(axis, s.weight)
    return np.add(upper, lower, out=upper if out is None else out)


def _touched_axis(invalid: np.ndarray, axis: int, s: _AxisSampling) -> np.ndarray:
    """1D dilation along ``axis``: an output position is touched if a voxel it reads is."""
    touched = np.take(invalid, s.first, axis=axis)
    if s.second is not None:
        touched |= np.take(invalid, s.second, axis=axis)
    return touched


def _nearest_axis(values: np.ndarray, axis: int, s: _AxisSampling) -> np.ndarray:
    return np.take(values, s.nearest, axis=axis)


def _separable(values: np.ndarray, samplings, order, one_axis, **last) -> np.ndarray:
    """Apply ``one_axis`` along each axis in ``order``: a separable 3D operation. The
    keywords ``last`` (e.g. ``out``) go to the last pass only."""
    for i, axis in enumerate(order):
        extra = last if i == len(order) - 1 else {}
        values = one_axis(values, axis, samplings[axis], **extra)
    return values


def _resample_axis_aligned(
    volume: Volume,
    data: np.ndarray,
    vox_map: np.ndarray,
    out_shape: tuple[int, int, int],
    sources: tuple[int, ...],
    label_mode: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """:func:`_resample_arrays` for an axis-aligned map and a linear or copy kernel.

    ``data`` is the volume's image with non-finite (invalid) voxels zeroed.
    """
    columns = [0, 1, 2]
    scales, offsets = vox_map[list(sources), columns], vox_map[list(sources), 3]
    in_shape = [volume.shape[i] for i in sources]
    samplings = [
        _axis_sampling(float(scales[j]), float(offsets[j]), out_shape[j], in_shape[j])
        for j in columns
    ]
    box = tuple(s.inside for s in samplings)
    box_voxels = int(np.prod([s.size for s in samplings]))
    outside = int(np.prod(out_shape)) - box_voxels
    # Axes that shrink first: every later pass then runs over fewer voxels.
    order = sorted(columns, key=lambda j: samplings[j].size / in_shape[j])

    image = np.zeros(out_shape, dtype=np.float32)
    valid = np.zeros(out_shape, dtype=bool)
    label = None if volume.label is None else np.zeros(out_shape, dtype=volume.label.dtype)
    if box_voxels == 0:
        return image, valid, label, outside
    # The last pass writes straight into the output grid: no 256^3 temporary.
    _separable(data.transpose(sources), samplings, order, _interpolate_axis, out=image[box])
    invalid = ~volume.valid
    if invalid.any():
        valid[box] = ~_separable(invalid.transpose(sources), samplings, order, _touched_axis)
    else:
        valid[box] = True
    if label is not None:
        source_label = volume.label.transpose(sources)
        copy = all(s.weight is None for s in samplings)
        if label_mode == "label_linear" and not copy:
            label[box] = _label_linear_separable(source_label, samplings, order)
        else:
            label[box] = _separable(source_label, samplings, order, _nearest_axis)
    return image, valid, label, outside


def _label_linear_separable(label: np.ndarray, samplings, order) -> np.ndarray:
    """:func:`_label_linear` on the inside box of an axis-aligned map."""
    best = None
    out = None
    for value in np.unique(label):
        indicator = (label == value).astype(np.float32)
        score = _separable(indicator, samplings, order, _interpolate_axis)
        if best is None:
            best = np.full(score.shape, -1.0, dtype=np.float32)
            out = np.zeros(score.shape, dtype=label.dtype)
        better = score > best
        out[better] = value
        best[better] = score[better]
    return out


def _finite_data(volume: Volume, params: ResampleParams) -> np.ndarray:
    """The image to interpolate: non-finite voxels, allowed only where invalid, zeroed
    so that they cannot turn a neighbour's weighted sum into NaN."""
    finite = np.isfinite(volume.data)
    if finite.all():
        return volume.data
    if params.interpolation == "bspline":
        raise StageError(
            "resample",
            f"{int((~finite).sum())} voxel(s) are NaN or infinite and B-spline "
            "interpolation would spread them along whole lines of the volume; run the "
            "'sanitize' stage first or use interpolation: linear",
            volume.name,
        )
    bad_valid = ~finite & volume.valid
    if bad_valid.any():
        raise StageError(
            "resample",
            f"{int(bad_valid.sum())} voxel(s) marked valid are NaN or infinite; run the "
            "'sanitize' stage before 'resample'",
            volume.name,
        )
    return np.where(finite, volume.data, np.float32(0.0))


def _orientation_conflict(orientation: str) -> str:
    return (
        f"orientation {orientation!r} is set, but a registration hands over the "
        "template's grid, whose orientation is the template's; remove 'orientation' from "
        "the resample step"
    )


def _order_check(params: ResampleParams, transform_pending: bool) -> list[str]:
    """Refused when the pipeline loads: an orientation after a registration."""
    if transform_pending and params.orientation:
        return [f"stage 'resample': {_orientation_conflict(params.orientation)}"]
    return []


@stage("resample", ResampleParams, applies_transform=True, order_check=_order_check)
def resample(volume: Volume, params: ResampleParams) -> StageOutput:
    """Apply the pending registration (if any) and the target grid in one interpolation.

    Parameters
    ----------
    volume : Volume
    params : ResampleParams

    Returns
    -------
    StageOutput
        The volume on the target grid, ``pending`` cleared. Metrics: output ``shape``,
        ``spacing`` and ``affine``, the ``grid`` source (``"template"`` or
        ``"spacing"``), the ``kernel`` used, ``anisotropic_axis``, the
        ``invalid_fraction`` of the output and the share ``outside_fraction`` that lies
        outside the input's field of view, ``label_values``, and ``grid_shift_mm``: how
        far the grid was snapped onto the input's lattice along each output axis (None
        when it was not, see module doc), and the output ``orientation`` codes.

    Raises
    ------
    StageError
        Non-finite image values where they would reach the output (see module doc), or
        an ``orientation`` set while a registration hands over the template's grid.
    """
    # FreeSurfer's c_ras is a voxel of the stored grid: taken before any reordering.
    centre = grid_centre(volume.affine, volume.shape, params.centre)
    if params.orientation is not None:
        if volume.pending is not None:
            raise StageError("resample", _orientation_conflict(params.orientation), volume.name)
        # Views: the output grid is written below in one pass, reordering included.
        volume = reoriented(volume, params.orientation, contiguous=False)
    data = _finite_data(volume, params)
    pending = volume.pending
    snap = None
    if pending is not None:
        out_shape, out_affine = pending.target_shape, pending.target_affine
        world_map = pending.template_to_subject
        grid_source = "template"
    else:
        directions = world_axes(params.orientation) if params.axis_aligned else None
        out_shape, out_affine = target_grid(
            volume.affine, volume.shape, params.spacing, params.shape, directions, centre
        )
        snap = snap_to_input_lattice(volume.affine, volume.spacing, out_affine, params.spacing)
        if snap is not None:
            out_affine = snap[0]
        world_map = np.eye(4)
        grid_source = "spacing"
    vox_map = np.linalg.inv(volume.affine) @ world_map @ out_affine
    thick = anisotropic_axis(volume.spacing, params.anisotropy_threshold)
    if snap is not None:
        kernel = _Kernel("crop_pad")
    elif _index_map(vox_map):
        vox_map = np.rint(vox_map)
        kernel = _Kernel("copy")
    elif params.interpolation == "linear":
        kernel = _Kernel("linear")
    elif thick is not None:
        kernel = _Kernel("cubic_inplane", thick)
    else:
        kernel = _Kernel("cubic")
    sources = _axis_aligned(vox_map, out_shape) if kernel.kind in ("copy", "linear") else None
    if snap is not None:
        # The snapped affine is the input's translated by whole voxels: the map is the
        # identity plus that translation, up to round-off.
        offset = np.rint(vox_map[:3, 3])
        data, valid, label, outside = _crop_or_pad(volume, data, offset, out_shape)
    elif sources is not None:
        data, valid, label, outside = _resample_axis_aligned(
            volume, data, vox_map, out_shape, sources, params.label_interpolation
        )
    elif kernel.kind == "linear" and params.label_interpolation == "nearest":
        data, valid, label, outside = _resample_linear_itk(volume, data, vox_map, out_shape)
    else:
        data, valid, label, outside = _resample_arrays(
            volume, data, vox_map, out_shape, kernel, params.label_interpolation
        )
    invalid_fraction = 1.0 - float(np.count_nonzero(valid)) / valid.size
    out = volume.replace(data=data, valid=valid, label=label, affine=out_affine, pending=None,
                         applied=pending if pending is not None else volume.applied)
    metrics = {
        "grid": grid_source,
        "shape": list(out.shape),
        "spacing": [round(s, 9) for s in out.spacing],
        "affine": out_affine.tolist(),
        "kernel": kernel.describe(),
        "anisotropic_axis": thick,
        "invalid_fraction": invalid_fraction,
        "outside_fraction": outside / valid.size,
        "label_values": None if label is None else label_values(label),
        "grid_shift_mm": None if snap is None else [float(x) for x in snap[1]],
        "orientation": orientation_codes(out_affine),
    }
    return StageOutput(out, metrics)
