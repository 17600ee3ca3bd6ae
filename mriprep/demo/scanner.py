"""A scanner for anatomies: a known pose, a slice grid, a field of view, bias and noise.

:func:`acquire` moves an :class:`~mriprep.demo.anatomy.Anatomy` by a known rigid pose
and samples it the way an MR scanner does: on a grid of slices (axial, coronal or
sagittal, possibly tilted), each thick slice averaging its slab, within a field of view
that may cut the vertex or stop at the chin, under a smooth multiplicative bias field
and Rician noise, stored in the voxel order the scanner chose.

The truth of every scan is kept: the pose, the grid, and, for anatomies whose rigid
truth is known, ``template_to_subject`` (template RAS+ mm to scan RAS+ mm).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from nibabel.affines import apply_affine, voxel_sizes
from scipy import ndimage

from mriprep.demo.anatomy import Anatomy
from mriprep.stages.registration.geometry import rigid_matrix

Slicing = Literal["axial", "coronal", "sagittal"]
# Voxel axes (i, j, k) of each slicing as world axes; k is the slice axis, as scanners
# and DICOM converters store it.
_SLICING_AXES = {"axial": (0, 1, 2), "coronal": (0, 2, 1), "sagittal": (1, 2, 0)}
WM_INTENSITY = 1000.0  # stored intensities: white matter near this


@dataclass(frozen=True)
class Acquisition:
    """How one scan is taken.

    Attributes
    ----------
    spacing : 3 floats
        Voxel size (mm) along the stored axes i, j, k; k is the slice axis.
    slicing : {"axial", "coronal", "sagittal"}
    tilt_deg : float
        The slice grid is tilted by this angle about the left-right axis (an oblique,
        AC-PC-like acquisition): the stored axes are then not the world's.
    flips : 3 bools
        Stored axes that run backwards (a scanner's LPS or LIA voxel order).
    vertex_margin_mm : float
        Space above the top of the head; negative cuts that many mm off the vertex.
    coverage_mm : float or None
        Extent of the field of view downwards from its top, in mm along the grid's
        superior-inferior axis; None reaches the bottom of the anatomy (the neck).
    noise : float
        Rician noise sigma relative to white matter (0.015: SNR ~65, a 3T T1).
    bias : float
        Amplitude of the smooth multiplicative bias field (0.15: within about ±15%).
    """

    spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)
    slicing: Slicing = "axial"
    tilt_deg: float = 0.0
    flips: tuple[bool, bool, bool] = (False, False, False)
    vertex_margin_mm: float = 6.0
    coverage_mm: float | None = None
    noise: float = 0.015
    bias: float = 0.15


@dataclass(frozen=True)
class Scan:
    """An acquired scan: stored data, its affine, labels and the truth behind it."""

    data: np.ndarray  # float32, white matter near WM_INTENSITY
    labels: np.ndarray | None  # int16, on the same grid
    affine: np.ndarray
    pose: np.ndarray  # anatomy RAS+ mm -> scan RAS+ mm
    template_to_subject: np.ndarray | None
    # The anatomy's approximate frame in MNI152 space (Anatomy.mni_frame): where edits
    # defined in the template's frame go (the defacing plane); never a truth.
    mni_frame: np.ndarray = field(default_factory=lambda: np.eye(4))


def random_pose(rng: np.random.Generator, max_rotation_deg: float = 10.0,
                max_translation_mm: float = 10.0) -> np.ndarray:
    """A random rigid 4x4: rotations and translations uniform within the limits."""
    angles = rng.uniform(-max_rotation_deg, max_rotation_deg, size=3)
    translation = rng.uniform(-max_translation_mm, max_translation_mm, size=3)
    return rigid_matrix(angles, translation)


def acquire(anatomy: Anatomy, pose: np.ndarray, acquisition: Acquisition,
            rng: np.random.Generator) -> Scan:
    """Scan ``anatomy`` moved by ``pose`` (anatomy mm -> scanner mm).

    Raises
    ------
    ValueError
        The field of view holds no part of the head.
    """
    spacing = np.asarray(acquisition.spacing, dtype=float)
    directions = _grid_directions(acquisition)
    start, shape = _field_of_view(anatomy, pose, directions, spacing, acquisition)
    affine = np.eye(4)
    affine[:3, :3] = directions * spacing
    affine[:3, 3] = directions @ start

    # Each slice averages its slab: sub-slices at the anatomy's resolution, then means.
    sub = max(1, int(round(spacing[2] / voxel_sizes(anatomy.affine).min())))
    fine = affine @ np.diag([1.0, 1.0, 1.0 / sub, 1.0])
    fine[:3, 3] -= fine[:3, 2] * (sub - 1) / 2.0
    to_anatomy = np.linalg.inv(anatomy.affine) @ np.linalg.inv(pose)
    grid = to_anatomy @ fine
    samples = ndimage.affine_transform(
        anatomy.image, grid[:3, :3], grid[:3, 3], output_shape=(*shape[:2], shape[2] * sub),
        order=1, mode="constant", cval=0.0, output=np.float32,
    )
    clean = samples.reshape(*shape, sub).mean(axis=3, dtype=np.float32)
    labels = None
    if anatomy.labels is not None:
        centre = to_anatomy @ affine
        labels = ndimage.affine_transform(
            anatomy.labels, centre[:3, :3], centre[:3, 3], output_shape=shape, order=0,
            mode="constant", cval=0,
        ).astype(np.int16)

    scale = WM_INTENSITY / _white_level(anatomy)
    data = clean * (scale * _bias_field(shape, rng, acquisition.bias))
    data = _rician(data, rng, acquisition.noise * WM_INTENSITY)
    data, labels, affine = _store(data, labels, affine, acquisition.flips)
    truth = None
    if anatomy.template_to_anatomy is not None:
        truth = pose @ anatomy.template_to_anatomy
    return Scan(data, labels, affine, np.asarray(pose, dtype=float), truth, anatomy.mni_frame)


def _grid_directions(acquisition: Acquisition) -> np.ndarray:
    """World directions (columns) of the stored axes i, j, k, before any flip."""
    axes = _SLICING_AXES[acquisition.slicing]
    directions = np.eye(3)[:, list(axes)]
    tilt = rigid_matrix((acquisition.tilt_deg, 0.0, 0.0), (0.0, 0.0, 0.0))[:3, :3]
    return tilt @ directions


def _field_of_view(anatomy, pose, directions, spacing, acquisition):
    """The grid's first voxel (in grid-frame mm) and its shape: the head's bounding box
    in the grid's frame, cut at the top and bottom as the acquisition says."""
    head = apply_affine(pose, anatomy.head_points(step=3)) @ directions  # grid frame
    lo, hi = head.min(axis=0) - 6.0, head.max(axis=0) + 6.0
    vertical = int(np.argmax(np.abs(directions[2])))  # the superior-inferior axis
    up = np.sign(directions[2, vertical])
    top = head[:, vertical].max() if up > 0 else head[:, vertical].min()
    top = top + up * acquisition.vertex_margin_mm
    bottom = hi[vertical] if up < 0 else lo[vertical]
    if acquisition.coverage_mm is not None:
        reach = top - up * acquisition.coverage_mm
        bottom = max(bottom, reach) if up > 0 else min(bottom, reach)
    lo[vertical], hi[vertical] = min(top, bottom), max(top, bottom)
    if np.any(hi <= lo):
        raise ValueError("the field of view holds no part of the head")
    shape = tuple(int(n) for n in np.floor((hi - lo) / spacing) + 1)
    return lo, shape


def _white_level(anatomy: Anatomy) -> float:
    """The anatomy's white-matter intensity: WM's median when labelled, else a robust
    bright level of the head (real scans)."""
    if anatomy.labels is not None:
        return float(np.median(anatomy.image[anatomy.labels == 3]))
    head = anatomy.image[anatomy.image > 0.1 * np.percentile(anatomy.image, 99.5)]
    return float(np.percentile(head, 90))


def _bias_field(shape, rng: np.random.Generator, amplitude: float) -> np.ndarray:
    """exp of a random quadratic in normalised coordinates, within about ±amplitude."""
    axes = [np.linspace(-1, 1, n, dtype=np.float32) for n in shape]
    x, y, z = np.meshgrid(*axes, indexing="ij", sparse=True)
    c = rng.uniform(-1, 1, size=9).astype(np.float32) * (amplitude / 3)
    log_field = c[0] * x + c[1] * y + c[2] * z + c[3] * x * y + c[4] * y * z + c[5] * x * z
    log_field = log_field + c[6] * x**2 + c[7] * y**2 + c[8] * z**2
    return np.exp(log_field).astype(np.float32)


def _rician(clean: np.ndarray, rng: np.random.Generator, sigma: float) -> np.ndarray:
    if sigma <= 0:
        return clean.astype(np.float32)
    real = clean + rng.normal(0.0, sigma, clean.shape).astype(np.float32)
    imag = rng.normal(0.0, sigma, clean.shape).astype(np.float32)
    return np.sqrt(real * real + imag * imag)


def _store(data, labels, affine, flips):
    """Reverse the flipped axes of the arrays and say so in the affine."""
    affine = affine.copy()
    for axis, flip in enumerate(flips):
        if not flip:
            continue
        n = data.shape[axis]
        data = np.flip(data, axis)
        if labels is not None:
            labels = np.flip(labels, axis)
        affine[:3, 3] += affine[:3, axis] * (n - 1)
        affine[:3, axis] *= -1
    return np.ascontiguousarray(data), (None if labels is None
                                        else np.ascontiguousarray(labels)), affine
