"""The template side of registration: its brain mask, brain points and pyramid.

All three are read-only and cached per process (building MNI152's pyramid takes ~3 s).
"""

from __future__ import annotations

import functools

import numpy as np
from nibabel.affines import apply_affine, voxel_sizes
from scipy import ndimage

from mriprep.errors import PipelineConfigError
from mriprep.registration.pyramid import HEAD_FRACTION, Level, flatten_bias, level_grid
from mriprep.templates import load_template


# nilearn.datasets.load_mni152_brain_mask's rule: the template (scaled to a maximum of 1)
# above 0.2. Applied here to the template already in memory, so that a worker never
# imports nilearn.datasets (a second per process) for it.
MNI152_BRAIN_THRESHOLD = 0.2


@functools.lru_cache(maxsize=8)
def template_brain_mask(template: str) -> np.ndarray:
    """The template's brain on its grid: nilearn's mask for MNI152, the head (bright,
    holes filled) for a user template."""
    data = load_template(template).data
    if template == "mni152":
        return data > MNI152_BRAIN_THRESHOLD
    head = data > HEAD_FRACTION * np.percentile(data, 99)
    return ndimage.binary_fill_holes(head)


def template_brain_points(template: str = "mni152", step: int = 1) -> np.ndarray:
    """RAS+ coordinates (mm) of the template's brain voxels, shape (n, 3).

    Parameters
    ----------
    template : str
        The built-in template name or a template image path.
    step : int
        Keep every ``step``-th voxel along each axis (fewer points, faster error
        measures).
    """
    ijk = np.argwhere(template_brain_mask(template)[::step, ::step, ::step]) * step
    return apply_affine(load_template(template).affine, ijk)


@functools.lru_cache(maxsize=4)
def template_pyramid(
    template: str, levels: tuple[float, ...], bias_sigma_mm: float, margin_mm: float
) -> tuple[tuple[Level, ...], tuple[np.ndarray, ...], np.ndarray]:
    """The template's levels (built once per process), the brain mask of each level and
    the brain's centre of mass (RAS mm).

    Each level's metric mask is the brain dilated by ``margin_mm``: scalp and neck differ
    most between people.

    Raises
    ------
    PipelineConfigError
        The template holds NaN or infinite voxels.
    """
    vol = load_template(template)
    if not np.isfinite(vol.data).all():
        raise PipelineConfigError(
            f"register: template {template!r} has "
            f"{int((~np.isfinite(vol.data)).sum())} NaN or infinite voxel(s); give a "
            "template with finite values"
        )
    brain = template_brain_mask(template)
    out, brains = [], []
    for spacing_mm in levels:
        values, _, affine = level_grid(vol.data, None, vol.affine, spacing_mm)
        brain_level = level_grid(brain.astype(np.float32), None, vol.affine, spacing_mm)[0]
        brain_level = brain_level > 0.5
        distance = ndimage.distance_transform_edt(~brain_level, sampling=voxel_sizes(affine))
        region = distance <= margin_mm
        values = flatten_bias(values, np.ones(values.shape, dtype=bool), affine, bias_sigma_mm)
        out.append(Level(values, affine, region, spacing_mm))
        brains.append(brain_level)
    centre_vox = ndimage.center_of_mass(brain)
    centre = vol.affine[:3, :3] @ np.asarray(centre_vox) + vol.affine[:3, 3]
    return tuple(out), tuple(brains), centre
