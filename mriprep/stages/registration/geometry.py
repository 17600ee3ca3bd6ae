"""World conventions: RAS+ (nibabel, :class:`~mriprep.core.volume.Volume`) and LPS (ITK, ANTs).

nibabel's world is RAS+, ITK's and ANTs' is LPS: flipping x and y converts points, and a
matrix ``M`` becomes ``FLIP @ M @ FLIP``. This module converts 4x4 matrices, transforms
and images between the two, and measures how far apart two transforms send points.
SimpleITK and ANTsPy are imported only by the functions that need them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
from nibabel.affines import voxel_sizes

RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


def rigid_matrix(angles_deg, translation_mm) -> np.ndarray:
    """A 4x4 rigid transform: rotations about x, then y, then z (degrees), then a
    translation (mm)."""
    ax, ay, az = np.deg2rad(np.asarray(angles_deg, dtype=float))
    rx = np.array([[1, 0, 0], [0, np.cos(ax), -np.sin(ax)], [0, np.sin(ax), np.cos(ax)]])
    ry = np.array([[np.cos(ay), 0, np.sin(ay)], [0, 1, 0], [-np.sin(ay), 0, np.cos(ay)]])
    rz = np.array([[np.cos(az), -np.sin(az), 0], [np.sin(az), np.cos(az), 0], [0, 0, 1]])
    matrix = np.eye(4)
    matrix[:3, :3] = rz @ ry @ rx
    matrix[:3, 3] = translation_mm
    return matrix


def ras_to_lps(matrix: np.ndarray) -> np.ndarray:
    """A RAS+ world 4x4 transform expressed in LPS (the same map; it is its own inverse)."""
    return RAS_TO_LPS @ np.asarray(matrix, dtype=np.float64) @ RAS_TO_LPS


def to_sitk_transform(template_to_subject: np.ndarray):
    """The RAS+ ``template_to_subject`` 4x4 as a SimpleITK transform (LPS).

    The returned ``AffineTransform`` maps template physical points to subject physical
    points, which is the transform ITK's and ANTs' resamplers expect when the template is
    the reference (fixed) image: ``sitk.WriteTransform(to_sitk_transform(m), "x.tfm")``
    writes a file ``antsApplyTransforms -r template -i subject -t x.tfm`` can use.

    Parameters
    ----------
    template_to_subject : ndarray, shape (4, 4)
        Maps a template RAS+ point (mm) to the subject's RAS+ point.

    Returns
    -------
    SimpleITK.AffineTransform
    """
    import SimpleITK as sitk

    lps = ras_to_lps(template_to_subject)
    transform = sitk.AffineTransform(3)
    transform.SetMatrix(lps[:3, :3].ravel().tolist())
    transform.SetTranslation(lps[:3, 3].tolist())
    return transform


def matrix_from_sitk(transform) -> np.ndarray:
    """The RAS+ 4x4 of a SimpleITK matrix-offset transform given in LPS."""
    return _ras_from_centred(
        np.asarray(transform.GetMatrix(), dtype=np.float64).reshape(3, 3),
        np.asarray(transform.GetTranslation(), dtype=np.float64),
        np.asarray(transform.GetCenter(), dtype=np.float64),
    )


def matrix_from_ants(transform) -> np.ndarray:
    """The RAS+ 4x4 of an ANTsPy affine/rigid transform (LPS parameters and centre)."""
    parameters = np.asarray(transform.parameters, dtype=np.float64)
    return _ras_from_centred(
        parameters[:9].reshape(3, 3),
        parameters[9:12],
        np.asarray(transform.fixed_parameters, dtype=np.float64),
    )


def _ras_from_centred(matrix: np.ndarray, translation: np.ndarray, centre: np.ndarray):
    """The RAS+ 4x4 of ITK's centred LPS parametrisation ``x -> M (x - c) + c + t``."""
    lps = np.eye(4)
    lps[:3, :3] = matrix
    lps[:3, 3] = translation + centre - matrix @ centre
    return ras_to_lps(lps)


def euler_from_matrix(template_to_subject_lps: np.ndarray, centre: np.ndarray):
    """An ITK ``Euler3DTransform`` (LPS) equal to a rigid 4x4 (LPS), with a given centre.

    Parameters
    ----------
    template_to_subject_lps : ndarray, shape (4, 4)
        A rigid map in LPS; a matrix only nearly orthogonal is replaced by the nearest
        rotation.
    centre : ndarray, shape (3,)
        The rotation centre (LPS mm).

    Returns
    -------
    SimpleITK.Euler3DTransform
    """
    import SimpleITK as sitk

    # The nearest rotation: ANTs' float-precision matrix is orthogonal to ~1e-7 only.
    u, _, vt = np.linalg.svd(template_to_subject_lps[:3, :3])
    rotation = u @ vt
    transform = sitk.Euler3DTransform()
    transform.SetCenter(centre.tolist())
    transform.SetMatrix(rotation.ravel().tolist(), 1e-6)
    offset = template_to_subject_lps[:3, 3]
    transform.SetTranslation((offset - centre + rotation @ centre).tolist())
    return transform


def _lps_grid(affine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Origin, voxel spacing and direction cosines (LPS) of a RAS+ voxel-to-world affine."""
    lps = RAS_TO_LPS @ affine
    spacing = voxel_sizes(lps)
    return lps[:3, 3], spacing, lps[:3, :3] / spacing


def sitk_image(array: np.ndarray, affine: np.ndarray):
    """A SimpleITK image of a nibabel-ordered array ([i, j, k]) with its RAS+ affine."""
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(np.ascontiguousarray(np.asarray(array).T))
    origin, spacing, direction = _lps_grid(affine)
    image.SetSpacing(spacing.tolist())
    image.SetDirection(direction.ravel().tolist())
    image.SetOrigin(origin.tolist())
    return image


def ants_image(array: np.ndarray, affine: np.ndarray):
    """An ANTsPy float32 image of a nibabel-ordered array with its RAS+ affine."""
    import ants

    origin, spacing, direction = _lps_grid(affine)
    return ants.from_numpy(
        np.ascontiguousarray(array, dtype=np.float32), origin=origin.tolist(),
        spacing=spacing.tolist(), direction=direction,
    )


def target_registration_error(
    estimated: np.ndarray, true: np.ndarray, points_ras: np.ndarray
) -> tuple[float, float]:
    """Mean and max distance (mm) between two transforms' images of the same points.

    Parameters
    ----------
    estimated, true : array_like, shape (4, 4)
        ``template_to_subject`` transforms (RAS+).
    points_ras : ndarray, shape (n, 3)
        Template points, e.g. :func:`mriprep.stages.registration.template.template_brain_points`.

    Returns
    -------
    (mean_mm, max_mm) : tuple of float

    Examples
    --------
    >>> shift = np.eye(4)
    >>> shift[:3, 3] = [0.3, 0.4, 0.0]
    >>> target_registration_error(shift, np.eye(4), np.zeros((2, 3)))
    (0.5, 0.5)
    """
    difference = np.asarray(estimated, np.float64) - np.asarray(true, np.float64)
    moved = points_ras @ difference[:3, :3].T + difference[:3, 3]
    distances = np.linalg.norm(moved, axis=1)
    return float(distances.mean()), float(distances.max())


def itk_transform_text(template_to_subject: np.ndarray) -> str:
    """The registration transform as an ITK ``.tfm`` text file (LPS, as ITK expects)."""
    import SimpleITK as sitk

    transform = to_sitk_transform(np.asarray(template_to_subject))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "transform.tfm")
        sitk.WriteTransform(transform, path)
        return Path(path).read_text()


def decompose_linear(matrix: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """A 4x4's linear part as (rotation, isotropic scale, per-axis scales).

    The rotation is the polar factor (the rotation nearest the linear part), the scale
    the cube root of its determinant, and the per-axis scales its singular values,
    largest first: for a similarity transform all three equal the scale.
    """
    linear = np.asarray(matrix, dtype=np.float64)[:3, :3]
    u, singular, vt = np.linalg.svd(linear)
    rotation = u @ vt
    if np.linalg.det(rotation) < 0:  # a mirror is no pose; keep the proper rotation
        u[:, -1] *= -1
        rotation = u @ vt
    scale = float(abs(np.linalg.det(linear)) ** (1.0 / 3.0))
    return rotation, scale, singular


def output_transform(fitted: np.ndarray, centre: np.ndarray, model: str) -> np.ndarray:
    """What an output applies of a fitted template-to-subject map (RAS+ 4x4).

    ``"rigid"``: the fit's rotation, placed so that ``centre`` (the template brain's
    centre, RAS mm) lands where the fit puts it: the subject's anatomy keeps its own
    size. ``"similarity"``: the rotation and the isotropic scale about that centre.
    ``"affine"``: the fit itself.
    """
    fitted = np.asarray(fitted, dtype=np.float64)
    if model == "affine":
        return fitted.copy()
    rotation, scale, _ = decompose_linear(fitted)
    linear = rotation if model == "rigid" else scale * rotation
    out = np.eye(4)
    out[:3, :3] = linear
    landing = fitted[:3, :3] @ centre + fitted[:3, 3]
    out[:3, 3] = landing - linear @ centre
    return out
