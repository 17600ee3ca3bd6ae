"""The post-registration check: does the registered subject look like the template?

The subject is pulled onto the template's finest-level grid and the Pearson correlation
of the two flattened images over the template brain is computed (see the register
stage's notes for the measured ranges of good and failed registrations).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from mriprep.registration.pyramid import Level

# Template brain voxels that must map inside the subject's valid field of view for the
# similarity check to mean anything.
MIN_OVERLAP = 0.5


def similarity_and_overlap(
    fixed: Level, brain: np.ndarray, moving: Level, template_to_subject: np.ndarray
) -> tuple[float, float]:
    """Correlation of template and registered subject over the template brain, and the
    share of the brain that lands on valid subject voxels.

    Parameters
    ----------
    fixed, moving : Level
        The template's and the subject's level (same spacing).
    brain : ndarray of bool
        The template brain on ``fixed``'s grid.
    template_to_subject : ndarray, shape (4, 4)
        The registration (RAS+).

    Returns
    -------
    (similarity, overlap) : tuple of float
        The correlation is NaN when fewer than 10 brain voxels land on valid subject
        voxels, and 0 when either image is constant there.
    """
    vox_map = np.linalg.inv(moving.affine) @ template_to_subject @ fixed.affine
    coords = np.argwhere(brain)
    pulled = coords @ vox_map[:3, :3].T + vox_map[:3, 3]
    inside = np.all((pulled >= 0) & (pulled <= np.asarray(moving.data.shape) - 1), axis=1)
    valid_at = np.zeros(len(coords), dtype=bool)
    rounded = np.rint(pulled[inside]).astype(int)
    valid_at[inside] = moving.mask[tuple(rounded.T)]
    overlap = float(valid_at.mean()) if len(coords) else 0.0
    if valid_at.sum() < 10:
        return float("nan"), overlap
    values = ndimage.map_coordinates(moving.data, pulled[valid_at].T, order=1)
    reference = fixed.data[tuple(coords[valid_at].T)]
    values = values.astype(np.float64) - values.mean(dtype=np.float64)
    reference = reference.astype(np.float64) - reference.mean(dtype=np.float64)
    norm = float(np.sqrt((values**2).sum() * (reference**2).sum()))
    if norm == 0.0:  # a constant image correlates with nothing
        return 0.0, overlap
    return float((values * reference).sum() / norm), overlap


def registration_failure(
    similarity: float, overlap: float, min_similarity: float, template: str
) -> str | None:
    """Why a registration must be rejected, or None when it passes its check.

    NaN similarity or overlap fails: the check could not be made.
    """
    if not overlap >= MIN_OVERLAP:
        return (
            f"only {overlap:.0%} of the template brain lands on valid voxels of "
            f"the registered subject (at least {MIN_OVERLAP:.0%} needed); the scan may "
            "not contain a whole head, or its header orientation is wrong"
        )
    if not similarity >= min_similarity:
        return (
            f"registration failed its check: similarity {similarity:.3f} to "
            f"template {template!r} is below min_similarity="
            f"{min_similarity:g}; check the image orientation (a 90 degree "
            "rotation or a flipped axis in the header) or that this is a T1 head scan"
        )
    return None
