"""FastSurfer's conform as a referee: what its ``conform.py`` gives for an image.

The conform pipeline is built to give what FastSurfer's conform gives
(``FastSurferCNN/data_loader/conform.py``, v2.3, read in its repository; FastSurfer is
not on PyPI and cannot be installed here). This module restates that behaviour in a few
lines of nibabel and scipy, deliberately sharing no code with mriprep's stages, so that
``make bench`` and the tests can measure the pipeline's agreement with it voxel by voxel:

* **Grid.** 256^3 voxels of 1 mm, LIA, along the world axes (FastSurfer's strict LIA:
  an oblique scan is resampled), with output voxel ``(128, 128, 128)`` at the input's
  voxel ``shape / 2`` (FreeSurfer's ``c_ras``). When the map from the input's voxels is
  a pure reordering (a 1 mm scan whose axes already run along the world's) and some
  axis changes parity, FastSurfer moves that centre to input voxel ``shape - 128`` on
  every axis, so that the copy needs no interpolation: a shift of ``(shape - 256) / 2``
  voxels, not the half voxel that would do. The pipeline moves by the half voxel
  (``grid_shift_mm``); :func:`agreement` compares the two at equal world positions.
  FastSurfer's own code at the commit in ``../shared/fastsurfer`` never takes that
  branch: its ``is_resampling_vox2vox`` takes ``np.maximum`` where ``np.minimum`` is
  meant and calls every map a resampling, so it keeps the ``c_ras`` grid and
  interpolates linearly, half a voxel off the scan's lattice. ``conform_min``
  follows that code (tests/demo/test_conform_min_fidelity.py runs it); this
  restatement, and ``conform_1mm``'s snap, keep the branch as its comment means it.
* **Intensities.** The range from the input's minimum to the edge two bins below the
  bin of a 1000-bin histogram (minimum to maximum) where all but 0.1% of the non-zero
  voxels are counted; trilinear interpolation (``scipy.ndimage.affine_transform``,
  order 1, zero outside); then ``clip(scale * (value - low), 0, 255)``, zero where the
  interpolated input is zero, rounded to uint8. A uint8 input is not scaled at all
  (FastSurfer takes no range of it and skips ``scalecrop``): interpolated and rounded.
* **Already conformed.** An image that passes FastSurfer's ``is_conform`` (256^3, every
  voxel size within 1e-6 of 1 mm, strict LIA within 1e-6, uint8) is returned as it is,
  voxels and affine, as FastSurfer's callers of ``conform`` return it.
* **Geometry of a file.** FastSurfer's ``check_affine_in_nifti`` takes the qform where a
  NIfTI header sets one that differs from the sform (any element by more than 1e-3),
  else the file's affine (:func:`header_affine`; mriprep's loader chooses the same,
  docs/inputs.md).
* **No upper bound.** Where the cumulative histogram reaches no cut-off, FastSurfer
  takes the maximum for an image of under 10 non-zero voxels and raises otherwise; so
  does :func:`conform_scale`. numpy's histogram counts every voxel of a finite image, so
  the branch is restated for completeness; a NaN or an infinity stops both earlier, in
  the histogram (ValueError).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

SIZE = 256
# Columns: the world directions of voxel axes i, j, k (Left, Inferior, Anterior).
LIA = np.array([[-1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])


def conform_affine(affine: np.ndarray, shape) -> np.ndarray:
    """The affine of FastSurfer's conformed grid for an image (module doc)."""
    affine = np.asarray(affine, dtype=np.float64)
    shape = np.asarray(shape[:3], dtype=np.float64)
    centre = shape / 2.0
    reorder_only = _is_reordering(np.linalg.inv(_lia_affine(affine @ [*centre, 1.0]))
                                  @ affine)
    if reorder_only:
        order = [int(np.argmax(np.abs(affine[:3, j]))) for j in (0, 2, 1)]
        delta = shape[order] - SIZE
        if np.any(delta % 2):
            moved = np.empty(3)
            moved[order] = delta
            centre = centre + moved / 2.0
    return _lia_affine(affine @ [*centre, 1.0])


def _lia_affine(c_ras: np.ndarray) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = LIA
    out[:3, 3] = np.asarray(c_ras)[:3] - LIA @ np.full(3, SIZE / 2.0)
    return out


def _is_reordering(vox2vox: np.ndarray, eps: float = 1e-6) -> bool:
    part = np.abs(vox2vox[:3, :3])
    return abs(part.sum() - 3) <= eps and bool(np.all(np.minimum(part, abs(part - 1)) <= eps))


def conform_scale(data: np.ndarray) -> tuple[float, float]:
    """(low, scale) of FastSurfer's robust 0-255 mapping (module doc)."""
    nonzero = int(np.count_nonzero(np.abs(data) >= 1e-15))
    counts, edges = np.histogram(data, bins=1000, range=(float(data.min()),
                                                         float(data.max())))
    # The first edge, not the minimum: numpy widens a constant image's range by 0.5.
    low = float(edges[0])
    cumulative = np.concatenate(([0], np.cumsum(counts)))
    above = np.flatnonzero(cumulative >= data.size - int(0.001 * nonzero))
    if len(above):
        top = float(edges[above[0] - 2])
    elif np.isclose(cumulative[-1], 1.0, atol=1e-6) or nonzero < 10:
        top = float(edges[-1])
    else:
        raise RuntimeError("rescale upper bound not found: f_high=0.999 (FastSurfer's "
                           "getscale raises here too)")
    return low, (255.0 / (top - low) if top != low else 1.0)


def header_affine(image) -> np.ndarray:
    """The affine FastSurfer's ``check_affine_in_nifti`` leaves a NIfTI image with
    (module doc): its qform where the header sets one that differs from the sform."""
    header = image.header
    if (header["qform_code"] != 0
            and not np.allclose(image.get_sform(), image.get_qform(), atol=0.001)):
        return np.asarray(image.get_qform(), dtype=np.float64)
    return np.asarray(image.affine, dtype=np.float64)


def is_conform(data: np.ndarray, affine: np.ndarray, eps: float = 1e-6) -> bool:
    """FastSurfer's ``is_conform`` with its defaults (module doc); the strict LIA test
    takes the off-axis entries' magnitude, as its docstring means."""
    affine = np.asarray(affine, dtype=np.float64)
    directions = affine[:3, :3]
    sizes = np.sqrt((directions ** 2).sum(axis=0))
    return (data.shape == (SIZE,) * 3 and bool(np.max(np.abs(sizes - 1.0)) < eps)
            and bool(np.all(np.sign(directions[LIA != 0]) == LIA[LIA != 0]))
            and bool(np.all(np.abs(directions[LIA == 0]) <= eps))
            and data.dtype == np.uint8)


def fastsurfer_conform(data: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FastSurfer's conformed uint8 image and its affine, for a finite image (in the
    dtype its file stores: a uint8 image is not rescaled, a conformed one not touched)."""
    if is_conform(np.asarray(data), affine):
        return np.asarray(data), np.asarray(affine, dtype=np.float64)
    uint8 = np.asarray(data).dtype == np.uint8
    data = np.asarray(data, dtype=np.float64)
    out_affine = conform_affine(affine, data.shape)
    low, scale = (0.0, 1.0) if uint8 else conform_scale(data)
    out_to_in = np.linalg.inv(affine) @ out_affine
    if _is_reordering(np.linalg.inv(out_to_in)):
        order = 0  # FastSurfer's shortcut: a pure reordering is copied, not interpolated
    else:
        order = 1
    mapped = ndimage.affine_transform(data, out_to_in[:3, :3], out_to_in[:3, 3],
                                      output_shape=(SIZE,) * 3, order=order)
    scaled = np.clip(scale * (mapped - low), 0.0, 255.0)
    scaled[mapped == 0] = 0.0
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8), out_affine


@dataclass(frozen=True)
class Agreement:
    """How two conformed uint8 images agree at equal world positions."""

    same_axes: bool  # both grids have the same voxel axes and size
    offset_voxels: tuple[float, float, float]  # where ours' voxel 0 lies in theirs
    compared: int  # voxels that are non-zero in either, on the common part of the grids
    equal: float  # share of them with the same value
    within_one: float  # share within one grey level
    mean_abs: float
    max_abs: int


def agreement(ours: np.ndarray, our_affine: np.ndarray, theirs: np.ndarray,
              their_affine: np.ndarray) -> Agreement:
    """Compare two 256^3 grids whose voxel axes agree, at equal world positions."""
    same_axes = bool(np.allclose(our_affine[:3, :3], their_affine[:3, :3], atol=1e-6))
    offset = np.linalg.solve(their_affine[:3, :3], our_affine[:3, 3] - their_affine[:3, 3])
    whole = np.rint(offset).astype(int)
    if not same_axes or np.abs(offset - whole).max() > 1e-3:
        return Agreement(same_axes, tuple(float(o) for o in offset), 0, 0.0, 0.0,
                         float("nan"), -1)
    ours_box, theirs_box = [], []
    for shift, n in zip(whole, ours.shape):
        lo, hi = max(0, -shift), min(n, n - shift)
        ours_box.append(slice(lo, hi))
        theirs_box.append(slice(lo + shift, hi + shift))
    a = ours[tuple(ours_box)].astype(np.int16)
    b = theirs[tuple(theirs_box)].astype(np.int16)
    either = (a > 0) | (b > 0)
    diff = np.abs(a - b)[either]
    n = int(diff.size)
    return Agreement(
        same_axes=True,
        offset_voxels=tuple(float(o) for o in whole),
        compared=n,
        equal=float(np.count_nonzero(diff == 0) / max(n, 1)),
        within_one=float(np.count_nonzero(diff <= 1) / max(n, 1)),
        mean_abs=float(diff.mean()) if n else 0.0,
        max_abs=int(diff.max()) if n else 0,
    )
