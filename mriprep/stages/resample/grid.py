"""Where the output grid lies: its shape and affine, centred and oriented as asked.

:func:`target_grid` builds a grid with a given spacing (and shape), centred by
:func:`grid_centre` on the input's field of view or at FreeSurfer's ``c_ras``, with the
input's axes or the world axes of an orientation (:func:`world_axes`).
:func:`snap_to_input_lattice` moves a grid that shares the input's axes and spacing onto
its lattice, and :func:`crop_or_pad` is what resampling onto such a grid reduces to. The
functions here take affines and shapes; only :func:`crop_or_pad` reads a volume.

Snapping onto the input's lattice (a design decision)
    Without a pending registration, when the target grid has the input's axes (3x3
    parts of the affines equal within 1e-6 relative, as after the reorient stage) and
    the target spacing equals the input's (within 1e-6 relative), the target origin is
    moved to the input lattice position nearest to the centred one, and the output is
    an integer crop/pad of the input: data, label and validity copied exactly, padded
    voxels invalid with data 0 and label 0. Centring a 256^3 grid on a field of view of
    the other shape parity puts every output voxel half a voxel between two input
    voxels, and linear interpolation there averages neighbours: it would blur an
    already-conformed 1 mm scan for no gain, cost time (docs/benchmarks.md, "Stage
    timings"), and lose exactness. The snap moves the grid by at most half a voxel per
    axis (recorded as ``grid_shift_mm``, along each output voxel axis), a shift
    FastSurfer's own conform would have interpolated; MONAI's Spacingd no-op plus
    ResizeWithPadOrCrop crops and pads the same way. The output affine is the input's,
    translated by whole voxels, so each copied voxel keeps its world position exactly.
    Any other case (a registration, a change of spacing, oblique target axes) takes the
    interpolating paths unchanged.
"""

from __future__ import annotations

import nibabel as nib
import numpy as np
from nibabel.affines import voxel_sizes

from mriprep.core.volume import Volume

# Relative tolerance within which the target grid's axes and spacing equal the input's,
# so that the grid is snapped onto the input's lattice (see module doc).
_SAME_LATTICE_TOLERANCE = 1e-6


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
    in_spacing = voxel_sizes(affine)
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


def crop_or_pad(
    volume: Volume, data: np.ndarray, offset: np.ndarray, out_shape: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """Output voxel ``v`` is input voxel ``v + offset`` (whole voxels): an exact copy,
    padded with invalid voxels (data 0, label 0). Same returns as
    :func:`~mriprep.stages.resample.general.resample_arrays`.
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
