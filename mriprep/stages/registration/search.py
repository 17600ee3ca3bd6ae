"""A global search over orientations and positions before the local optimiser runs.

A gradient optimiser only finds the pose nearest its start. Two things put real scans
outside that basin: a header whose orientation is wrong by 90 or 180 degrees, and a
field of view whose centre of mass is far from the brain's (a neck and shoulders below
it). So, before the local registration, the template's brain is tried in each of the 24
axis-aligned orientations of a cube (every rotation that maps axes onto axes) and, for
each, at every position on a coarse grid: the masked normalised cross-correlation of
template and subject over all positions is computed at once with FFTs (Padfield, "Masked
object registration in the Fourier domain", IEEE TIP 2012), only over the voxels that lie
inside both the template brain and the subject's valid field of view.

The search runs on smoothed intensities without bias flattening: at 8 mm, flattening
removes the large-scale pattern (white-matter core, darker cortex and ventricles) that
tells orientations apart. The right orientation and the best wrong one score close
(docs/benchmarks.md, "Registration"), so the local registration then ranks the best few
by mutual information, where the margin is wide.

Adult heads differ in size by about 15% either way, which the 24 orientations alone
cannot absorb: the best orientation and its tilts are then tried at several sizes of
the template brain (:data:`SEARCH_SCALES`); the best size joins the template's own as a
start of the local registration, which estimates the scale further.

Everything here is pure numpy/scipy and deterministic.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np
import scipy.fft as sfft
from nibabel.affines import apply_affine
from scipy import ndimage

from mriprep.stages.registration.pyramid import Level

# The share of the template brain that must fall on valid subject voxels for a position
# to be scored: below it the correlation rests on too little of the brain. A field of
# view cut at the vertex keeps about 0.9 of it, a 40 mm slab about 0.4.
MIN_SEARCH_OVERLAP = 0.6
# Sizes of the template brain tried after the orientation search (template units: 0.84 is
# a brain 16% smaller than MNI152's). Steps of about 9% move a brain's edge by about one
# 8 mm search voxel; the range spans adults (0.82-1.18x MNI) with a step to spare.
SEARCH_SCALES = (0.76, 0.84, 0.92, 1.09, 1.18, 1.28)


def _cube_rotations() -> tuple[np.ndarray, ...]:
    """The 24 proper rotations that map coordinate axes onto coordinate axes, the
    identity first."""
    rotations = []
    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1.0, -1.0), repeat=3):
            matrix = np.zeros((3, 3))
            matrix[range(3), perm] = signs
            if np.linalg.det(matrix) > 0:
                rotations.append(matrix)
    rotations.sort(key=lambda m: -np.trace(m))  # identity (trace 3) first
    return tuple(rotations)


ORIENTATIONS = _cube_rotations()


@dataclass(frozen=True)
class Window:
    """The template brain in one orientation, on an axis-aligned grid.

    ``data`` is zero outside ``mask``; ``origin`` is the RAS mm position of voxel 0;
    ``scale`` the size of the brain relative to the template's.
    """

    rotation: np.ndarray
    data: np.ndarray
    mask: np.ndarray
    origin: np.ndarray
    scale: float = 1.0

    @property
    def linear(self) -> np.ndarray:
        """The 3x3 map from template to window directions: rotation times scale."""
        return self.scale * self.rotation


@dataclass(frozen=True)
class Candidate:
    """The best position of the template in one orientation.

    ``template_to_subject`` (RAS+ 4x4) rotates the template about its brain centre by
    ``rotation``, scales it by ``scale`` and moves it to the best position; ``ncc`` is
    the masked correlation there, ``overlap`` the share of the template brain on valid
    subject voxels.
    """

    rotation: np.ndarray
    template_to_subject: np.ndarray
    ncc: float
    overlap: float
    scale: float = 1.0


def template_windows(level: Level, brain: np.ndarray, centre: np.ndarray,
                     rotations=ORIENTATIONS, scale: float = 1.0) -> tuple[Window, ...]:
    """The template's brain turned by each of ``rotations`` about ``centre`` (RAS mm)
    and scaled by ``scale``, each on an axis-aligned grid cropped to its brain.

    ``level`` must be axis-aligned (the template's grid is): quarter turns then move
    voxels onto voxels, up to the centre's sub-voxel position.
    """
    spacing = float(level.spacing_mm)
    data = np.where(brain, level.data, 0.0).astype(np.float32)
    mask = brain.astype(np.float32)
    corners = np.array(list(itertools.product(*[(0, n - 1) for n in brain.shape])))
    windows = []
    for rotation in rotations:
        # Moved world points x = s R (t - c) + c; the window grid covers the moved box.
        linear = scale * rotation
        world = (apply_affine(level.affine, corners) - centre) @ linear.T + centre
        origin = world.min(axis=0)
        shape = tuple(int(n) for n in np.round((world.max(axis=0) - origin) / spacing) + 1)
        window_to_template = (np.linalg.inv(level.affine)
                              @ _rotation_about(np.linalg.inv(linear), centre))
        grid = window_to_template @ _grid_affine(origin, spacing)
        pulled = [
            ndimage.affine_transform(a, grid[:3, :3], grid[:3, 3], output_shape=shape,
                                     order=1, mode="constant", cval=0.0)
            for a in (data, mask)
        ]
        inside = pulled[1] > 0.5
        box = _bounding_box(inside)
        windows.append(Window(
            rotation=rotation,
            data=np.where(inside, pulled[0], 0.0)[box].astype(np.float32),
            mask=inside[box],
            origin=origin + spacing * np.array([s.start for s in box]),
            scale=float(scale),
        ))
    return tuple(windows)


# The tilts that refine an orientation of the search (see tilts).
SEARCH_TILTS_DEG = (20.0,)


def tilts(degrees: tuple[float, ...] = SEARCH_TILTS_DEG) -> tuple[np.ndarray, ...]:
    """Rotations by each of ``degrees`` (both signs) about each axis: the refinement of
    an orientation, whose neighbours lie a quarter turn away."""
    out = []
    for axis in range(3):
        for angle in degrees:
            for sign in (1.0, -1.0):
                angles = [0.0, 0.0, 0.0]
                angles[axis] = sign * angle
                out.append(_axis_rotations(angles))
    return tuple(out)


def _axis_rotations(angles_deg) -> np.ndarray:
    from mriprep.stages.registration.geometry import rigid_matrix

    return rigid_matrix(angles_deg, (0.0, 0.0, 0.0))[:3, :3]


def axis_aligned(level: Level) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A subject level resampled onto an axis-aligned RAS grid of the same spacing that
    covers it: (data, valid, origin). Oblique and permuted grids become comparable with
    the template windows."""
    spacing = float(level.spacing_mm)
    corners = np.array(list(itertools.product(*[(0, n - 1) for n in level.data.shape])))
    world = apply_affine(level.affine, corners)
    origin = world.min(axis=0)
    shape = tuple(int(n) for n in np.floor((world.max(axis=0) - origin) / spacing) + 1)
    grid = np.linalg.inv(level.affine) @ _grid_affine(origin, spacing)
    pull = functools.partial(ndimage.affine_transform, matrix=grid[:3, :3],
                             offset=grid[:3, 3], output_shape=shape, order=1,
                             mode="constant", cval=0.0)
    valid = pull(level.mask.astype(np.float32)) > 0.5
    data = np.where(valid, pull(level.data.astype(np.float32)), 0.0).astype(np.float32)
    return data, valid, origin


class SubjectSearch:
    """A subject prepared for the search: its level on an axis-aligned grid and the
    spectra every window is correlated with, computed once.

    ``reach`` (voxels) is the largest window extent to be tried: the zero padding is the
    subject's extent plus it, so that every relative position is scored without
    wrap-around. ``workers``: threads of the FFTs (the result does not depend on it).
    """

    def __init__(self, subject: Level, reach: int, workers: int = 1):
        self.spacing = float(subject.spacing_mm)
        data, valid, self.origin = axis_aligned(subject)
        self.extent = data.shape
        self.workers = workers
        self.shape = [sfft.next_fast_len(int(n + reach), real=True) for n in data.shape]
        self.spectra = [sfft.rfftn(a, self.shape, workers=workers)
                        for a in (data, data * data, valid.astype(np.float32))]
        self.variance = float(data[valid].var()) if valid.any() else 0.0

    def best_pose(self, window: Window, centre: np.ndarray) -> Candidate | None:
        """The window's best position, or None where it fits the valid field of view
        nowhere (see :data:`MIN_SEARCH_OVERLAP`)."""
        scored = _masked_ncc(window, self.spectra, self.shape, self.variance, self.workers)
        if scored is None:
            return None
        ncc, overlap, index = scored
        shift = np.array([i if i < n else i - p
                          for i, n, p in zip(index, self.extent, self.shape)], dtype=float)
        pose = _rotation_about(window.linear, centre)
        pose[:3, 3] += self.origin + self.spacing * shift - window.origin
        return Candidate(window.rotation, pose, ncc, overlap, window.scale)


def search_poses(windows, search: SubjectSearch, centre: np.ndarray) -> list[Candidate]:
    """The best position of every window, best correlation first; windows that fit the
    field of view nowhere are left out.

    Parameters
    ----------
    windows : the template's :func:`template_windows` at the search's spacing.
    search : SubjectSearch
        The subject at the search spacing, not bias-flattened.
    centre : ndarray, shape (3,)
        The template brain centre the windows were rotated about (RAS mm).
    """
    found = (search.best_pose(window, centre) for window in windows)
    return sorted((c for c in found if c is not None), key=lambda c: -c.ncc)


def _masked_ncc(window: Window, subject_ffts, shape, subject_variance, workers: int = 1):
    """(ncc, overlap, index) at the window position of highest correlation, or None.

    ``index`` is the circular shift of the best position. Correlations are computed
    over the voxels in both the window's mask and the subject's valid mask only.
    """
    f_data, f_square, f_valid = subject_ffts
    m = window.mask.astype(np.float32)
    t = window.data
    n_mask = float(m.sum())
    # Each of the window's three parts is transformed once. The five correlations after
    # the overlap go back one at a time: a batched inverse transform of all five took a
    # fifth longer (pocketfft, one thread).
    f_m, f_t, f_t2 = (np.conj(sfft.rfftn(part, shape, workers=workers))
                      for part in (m, t, t * t))
    n = sfft.irfftn(f_m * f_valid, shape, workers=workers, overwrite_x=True)
    usable = n >= MIN_SEARCH_OVERLAP * n_mask
    if not usable.any():
        return None
    sum_t, sum_t2, sum_s, sum_s2, sum_ts = (
        sfft.irfftn(a * b, shape, workers=workers, overwrite_x=True)
        for a, b in ((f_t, f_valid), (f_t2, f_valid), (f_m, f_data), (f_m, f_square),
                     (f_t, f_data)))
    n = np.maximum(n, 1.0)
    var_t = sum_t2 - sum_t * sum_t / n
    var_s = sum_s2 - sum_s * sum_s / n
    # FFT round-off leaves tiny variances where the subject is flat (air, a constant
    # slab): such positions carry no evidence and are not scored.
    window_variance = float(t[window.mask].var())
    usable &= (var_t > 1e-3 * window_variance * n) & (var_s > 1e-3 * subject_variance * n)
    if not usable.any():
        return None
    ncc = np.zeros(n.shape)
    ncc[usable] = (sum_ts[usable] - sum_t[usable] * sum_s[usable] / n[usable]) / np.sqrt(
        var_t[usable] * var_s[usable])
    ncc = np.clip(ncc, -1.0, 1.0)
    index = np.unravel_index(int(np.argmax(ncc)), ncc.shape)
    return float(ncc[index]), float(n[index] / n_mask), index


def _rotation_about(rotation: np.ndarray, centre: np.ndarray) -> np.ndarray:
    matrix = np.eye(4)
    matrix[:3, :3] = rotation
    matrix[:3, 3] = centre - rotation @ centre
    return matrix


def _grid_affine(origin: np.ndarray, spacing: float) -> np.ndarray:
    affine = np.diag([spacing, spacing, spacing, 1.0])
    affine[:3, 3] = origin
    return affine


def _bounding_box(mask: np.ndarray) -> tuple[slice, ...]:
    ijk = np.argwhere(mask)
    lo, hi = ijk.min(axis=0), ijk.max(axis=0) + 1
    return tuple(slice(int(a), int(b)) for a, b in zip(lo, hi))


def rotation_angle_deg(rotation: np.ndarray) -> float:
    """The angle (degrees) of a 3x3 rotation matrix."""
    cosine = (np.trace(rotation[:3, :3]) - 1.0) / 2.0
    return float(np.degrees(np.arccos(np.clip(cosine, -1.0, 1.0))))


def orientation_index(rotation: np.ndarray) -> int:
    """The index in :data:`ORIENTATIONS` of the orientation closest to a rotation."""
    return min(range(len(ORIENTATIONS)),
               key=lambda i: rotation_angle_deg(ORIENTATIONS[i].T @ rotation[:3, :3]))


def nearest_orientation(rotation: np.ndarray) -> np.ndarray:
    """The member of :data:`ORIENTATIONS` closest to a rotation matrix."""
    return ORIENTATIONS[orientation_index(rotation)]
