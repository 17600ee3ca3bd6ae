"""The template side of registration: its brain mask, brain points, pyramid, the
orientation search's windows, and where its brain lies once placed on a subject.

All are read-only and cached per process (MNI152's pyramid is built once: its time is in
docs/benchmarks.md, "Registration").
"""

from __future__ import annotations

import functools

import numpy as np
from nibabel.affines import apply_affine, voxel_sizes
from scipy import ndimage

from mriprep.core.errors import PipelineConfigError
from mriprep.inputs.templates import load_template
from mriprep.stages.registration.pyramid import (
    HEAD_FRACTION,
    Level,
    build_levels,
    level_grid,
    subject_pyramid,
)
from mriprep.stages.registration.search import (
    ORIENTATIONS,
    SEARCH_TILTS_DEG,
    Window,
    template_windows,
    tilts,
)


# nilearn.datasets.load_mni152_brain_mask's rule: the template (scaled to a maximum of 1)
# above 0.2. Applied here to the template already in memory, so that a worker never
# imports nilearn.datasets (a second per process) for it.
MNI152_BRAIN_THRESHOLD = 0.2


@functools.lru_cache(maxsize=8)
def template_brain_mask(template: str, brain_mask: str | None = None) -> np.ndarray:
    """The template's brain on its grid.

    Parameters
    ----------
    template : str
        The built-in template name or a template image path.
    brain_mask : str, optional
        An image of the template's brain on the template's grid (non-zero inside), given
        with a user template. Without one: nilearn's mask for MNI152, the head (bright,
        holes filled) for a user template; the register stage's failure checks were
        measured with MNI152's brain mask, and a head is a coarser stand-in.

    Raises
    ------
    PipelineConfigError
        The mask's grid is not the template's, or the mask is empty.
    """
    grid = load_template(template)
    if brain_mask:
        mask_volume = load_template(brain_mask)
        if mask_volume.shape != grid.shape or not np.allclose(
                mask_volume.affine, grid.affine, atol=1e-3):
            raise PipelineConfigError(
                f"register: brain_mask {brain_mask!r} is not on the grid of template "
                f"{template!r} (shape {mask_volume.shape} against {grid.shape}, or another "
                "affine); give the mask that comes with the template, on its grid")
        brain = mask_volume.data > 0.5 * float(mask_volume.data.max())
        if not brain.any():
            raise PipelineConfigError(
                f"register: brain_mask {brain_mask!r} is empty; give the template's brain "
                "mask (non-zero inside the brain)")
        return brain
    if template == "mni152":
        return grid.data > MNI152_BRAIN_THRESHOLD
    head = grid.data > HEAD_FRACTION * np.percentile(grid.data, 99)
    return ndimage.binary_fill_holes(head)


@functools.lru_cache(maxsize=8)
def template_brain_points(template: str = "mni152", step: int = 1,
                          brain_mask: str | None = None) -> np.ndarray:
    """RAS+ coordinates (mm) of the template's brain voxels, shape (n, 3).

    Parameters
    ----------
    template : str
        The built-in template name or a template image path.
    step : int
        Keep every ``step``-th voxel along each axis (fewer points, faster error
        measures).
    brain_mask : str, optional
        As for :func:`template_brain_mask`.
    """
    ijk = np.argwhere(template_brain_mask(template, brain_mask)[::step, ::step, ::step]) * step
    points = apply_affine(load_template(template).affine, ijk)
    points.setflags(write=False)  # cached: every registration reads the same points
    return points


@functools.lru_cache(maxsize=4)
def template_pyramid(
    template: str, levels: tuple[float, ...], bias_sigma_mm: float, margin_mm: float,
    brain_mask: str | None = None,
) -> tuple[tuple[Level, ...], tuple[np.ndarray, ...], np.ndarray]:
    """The template's levels (built once per process), the brain mask of each level and
    the brain's centre of mass (RAS mm).

    The levels are built like a subject's (:func:`subject_pyramid`: the finest from the
    template, each coarser one from the finer), so that both sides of the metric are
    smoothed alike. Each level's metric mask is the brain dilated by ``margin_mm``: scalp
    and neck differ most between people.

    Raises
    ------
    PipelineConfigError
        The template holds NaN or infinite voxels, or no head.
    """
    vol = load_template(template)
    if not np.isfinite(vol.data).all():
        raise PipelineConfigError(
            f"register: template {template!r} has "
            f"{int((~np.isfinite(vol.data)).sum())} NaN or infinite voxel(s); give a "
            "template with finite values"
        )
    brain = template_brain_mask(template, brain_mask)
    brains = _brain_levels(brain, vol.affine, levels)
    empty = [spacing for spacing, level in zip(levels, brains) if not level.any()]
    if empty:
        raise PipelineConfigError(
            f"register: template {template!r} has no brain or head to register to (its "
            f"mask is empty at {empty[0]} mm); give a head image as the template"
        )
    out = []
    for level, brain_level in zip(subject_pyramid(vol, levels, bias_sigma_mm), brains):
        distance = ndimage.distance_transform_edt(
            ~brain_level, sampling=voxel_sizes(level.affine)
        )
        out.append(Level(level.data, level.affine, distance <= margin_mm, level.spacing_mm))
    centre = apply_affine(vol.affine, mask_centroid(brain))
    return tuple(out), brains, centre


# The fewest template voxels the affine part of the fit samples from on the finest level
# (at 2 mm, a 2 cm cube; coarser levels in proportion); MNI152's brain shrunk by 10 mm
# keeps about 140 times as many.
_MIN_SHAPE_VOXELS = 1000
# Coarser levels shrink the brain by this many more of their own voxels: their smoothing
# carries the brain's edge, where a whole head and its skull-stripped copy differ,
# further in. Measured (2026-12-03) on the real Colin27 with and without its scalp (ch2,
# ch2bet), 5 acquisitions, mean mm apart, in one process: 0 voxels 0.060-0.174 (0.100-
# 0.209 in the bench run, two pairs above the 0.15), 1 voxel 0.100-0.155, 2
# voxels 0.104-0.145, 3 voxels 0.097-0.139; CPU time about 7% lower (a smaller mask).
_COARSE_SHRINK_VOXELS = 2.0


@functools.lru_cache(maxsize=4)
def template_shape_levels(template: str, levels: tuple[float, ...], bias_sigma_mm: float,
                          pyramid_margin_mm: float, margin_mm: float,
                          brain_mask: str | None = None) -> tuple[Level, ...]:
    """The template's levels, coarse to fine, with the metric mask of the fit's affine
    part: the brain grown by ``margin_mm`` (shrunk where negative; on the coarser levels
    by :data:`_COARSE_SHRINK_VOXELS` more of their voxels).

    The brain's edge is what a whole head and its skull-stripped copy do not share
    (skull, scalp and CSF against the zeros and the cut cortex of a brain extraction),
    so the head's size and shape are fitted on the brain's interior (the register stage
    sets the margin, with its measured effect). A brain too small to shrink that far (a
    user template's mask) keeps the whole brain: an empty metric mask would stop ITK.
    The other arguments name the (cached) pyramid it comes from.
    """
    fixed, brains, _ = template_pyramid(template, levels, bias_sigma_mm, pyramid_margin_mm,
                                        brain_mask)
    out = []
    for level, brain in zip(fixed, brains):
        sampling = voxel_sizes(level.affine)
        if margin_mm >= 0:
            mask = ndimage.distance_transform_edt(~brain, sampling=sampling) <= margin_mm
        else:
            # A coarser level's smoothing carries the brain's edge further in: its mask
            # is shrunk by more (_COARSE_SHRINK_VOXELS of its own voxels).
            coarser = level.spacing_mm > levels[-1]
            shrink = -margin_mm + (_COARSE_SHRINK_VOXELS * level.spacing_mm if coarser else 0)
            mask = ndimage.distance_transform_edt(brain, sampling=sampling) > shrink
            if mask.sum() < _MIN_SHAPE_VOXELS * (levels[-1] / level.spacing_mm) ** 3:
                mask = brain
        out.append(Level(level.data, level.affine, mask, level.spacing_mm))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def template_scalp(template: str, spacing_mm: float, brain_mask: str | None = None,
                   band_mm: tuple[float, float] = (8.0, 18.0)) -> np.ndarray:
    """RAS+ points (mm) where a head's scalp lies above the template's brain: ``band_mm``
    outside the brain, above the brain's centre, every ``spacing_mm`` or so.

    The band is measured from the brain, not taken from the template's own head (the
    MNI152 template that nilearn ships is brain-extracted). Defacing removes the face,
    below the brain's centre, so this part of a head survives it; skull stripping
    removes all of it.
    """
    vol = load_template(template)
    brain = template_brain_mask(template, brain_mask)
    distance = ndimage.distance_transform_edt(~brain, sampling=voxel_sizes(vol.affine))
    step = max(1, int(round(spacing_mm / float(voxel_sizes(vol.affine).min()))))
    sampled = distance[::step, ::step, ::step]
    band = (sampled >= band_mm[0]) & (sampled <= band_mm[1])
    points = apply_affine(vol.affine, np.argwhere(band) * step)
    centre = apply_affine(vol.affine, mask_centroid(brain))
    return points[points[:, 2] > centre[2]]


@functools.lru_cache(maxsize=4)
def template_brain_distance(template: str, spacing_mm: float,
                            brain_mask: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The signed distance (mm; negative inside) from the edge of the template's brain, on
    the template's ``spacing_mm`` level grid, and that grid's voxel-to-RAS affine."""
    vol = load_template(template)
    # As _brain_levels makes a level's brain: its share of each voxel, above one half.
    share, _, affine = level_grid(template_brain_mask(template, brain_mask).astype(np.float32),
                                  None, vol.affine, spacing_mm)
    brain = share > 0.5
    sampling = voxel_sizes(affine)
    distance = (ndimage.distance_transform_edt(~brain, sampling=sampling)
                - ndimage.distance_transform_edt(brain, sampling=sampling)).astype(np.float32)
    distance.setflags(write=False)  # cached: every registration reads the same grid
    return distance, affine


def template_brain_region(level: Level, template_to_subject: np.ndarray, template: str,
                          spacing_mm: float, margin_mm: float,
                          brain_mask: str | None = None) -> np.ndarray:
    """The voxels of a subject's ``level`` that lie within the template's brain grown by
    ``margin_mm`` (shrunk where negative), once the template is placed by
    ``template_to_subject`` (RAS+ 4x4); the brain's edge is read from its distance map
    at ``spacing_mm``, interpolated linearly."""
    distance, affine = template_brain_distance(template, spacing_mm, brain_mask)
    voxel_map = np.linalg.inv(affine) @ np.linalg.inv(template_to_subject) @ level.affine
    inside = ndimage.affine_transform(distance, voxel_map[:3, :3], voxel_map[:3, 3],
                                      output_shape=level.data.shape, order=1,
                                      cval=float(distance.max()))
    return inside <= margin_mm


def _brain_levels(brain: np.ndarray, affine: np.ndarray, levels: tuple[float, ...]):
    """The brain mask on each level's grid, coarse to fine: the share of brain in each
    level voxel, above one half. Each coarser share comes from the finer one."""
    fine_to_coarse = []
    share = brain.astype(np.float32)
    for spacing_mm in reversed(levels):
        share, _, affine = level_grid(share, None, affine, spacing_mm)
        fine_to_coarse.append(share > 0.5)
    return tuple(reversed(fine_to_coarse))


def mask_centroid(mask: np.ndarray) -> np.ndarray:
    """The mean voxel index of a non-empty boolean mask, as ``ndimage.center_of_mass``
    gives it, from per-axis counts (faster: docs/benchmarks.md, "Registration")."""
    total = np.count_nonzero(mask)
    centre = []
    for axis in range(mask.ndim):
        others = tuple(a for a in range(mask.ndim) if a != axis)
        counts = np.count_nonzero(mask, axis=others)
        centre.append(float(np.dot(np.arange(mask.shape[axis]), counts)) / total)
    return np.asarray(centre)


@functools.lru_cache(maxsize=4)
def template_search_level(template: str, spacing_mm: float, brain_mask: str | None = None):
    """The template at the search spacing, not bias-flattened (neither is the subject's
    search level): (level, brain mask on its grid, brain centre in RAS mm)."""
    vol = load_template(template)
    brain = template_brain_mask(template, brain_mask)
    (level,) = build_levels(vol, (spacing_mm,))
    (brain_level,) = _brain_levels(brain, vol.affine, (spacing_mm,))
    return level, brain_level, apply_affine(vol.affine, mask_centroid(brain))


@functools.lru_cache(maxsize=4)
def template_search_windows(template: str, spacing_mm: float,
                            brain_mask: str | None = None) -> tuple[Window, ...]:
    """The template brain in each of the 24 orientations of the search
    (:func:`mriprep.stages.registration.search.template_windows`), turned about its centre."""
    return template_windows(*template_search_level(template, spacing_mm, brain_mask))


@functools.lru_cache(maxsize=128)
def template_tilted_windows(template: str, spacing_mm: float, orientation: int,
                            brain_mask: str | None = None,
                            degrees: tuple[float, ...] = SEARCH_TILTS_DEG
                            ) -> tuple[Window, ...]:
    """The template brain in orientation number ``orientation`` of the search, turned
    further by each of :func:`mriprep.stages.registration.search.tilts` of ``degrees``."""
    base = ORIENTATIONS[orientation]
    return template_windows(*template_search_level(template, spacing_mm, brain_mask),
                            rotations=tuple(base @ tilt for tilt in tilts(degrees)))


def search_reach(template: str, spacing_mm: float, brain_mask: str | None = None) -> int:
    """The largest extent (voxels) of the template brain in any rotation: its bounding
    box's diagonal."""
    level, brain, _ = template_search_level(template, spacing_mm, brain_mask)
    ijk = np.argwhere(brain)
    return int(np.ceil(np.linalg.norm(ijk.max(axis=0) - ijk.min(axis=0)))) + 2
