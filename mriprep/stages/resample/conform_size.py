"""FastSurfer's rules for a conformed grid's voxel size and image size.

FastSurfer's ``conform`` (``FastSurferCNN/data_loader/conform.py``: ``find_min_size``,
``find_img_size_by_fov``, ``get_conformed_vox_img_size``) serves high-resolution scans
on isotropic cubes whose voxel size follows the scan:

* **Voxel size.** A number in (0, 1] mm, or ``min``: the scan's smallest voxel side,
  rounded to 1e-4 mm and capped at 1 mm. With FastSurfer's ``conform_to_1mm_threshold``
  a smallest side above the threshold gives 1 mm (its pipeline, ``run_fastsurfer.sh``,
  uses 0.98 mm: a 0.99 mm scan is served at 1 mm). Its documentation supports 0.7-1 mm;
  below 0.7 mm is experimental, and above 1 mm it refuses.
* **Image size.** 256 at 1 mm, as FreeSurfer's conform. Otherwise the cube that covers
  the scan's largest field of view, ``max(shape * voxel sizes) / voxel size`` rounded up
  (after truncating at 1e-4 voxel, so that round-off cannot add a slice), and never
  fewer than 256 voxels.

FastSurfer reads the voxel sizes from the header's zooms; here they are the affine's,
which the readers keep equal to them (FastSurfer warns where they differ). Where the
header claims a finer grid than the image carries (an interpolated reconstruction, thick
slices written on a fine grid), ``min`` can take the resolution the image actually holds
instead (:func:`conformed_voxel_size`'s ``acquired``), so that a 1 mm acquisition
exported at 0.5 mm is not served on a 0.5 mm grid eight times its size.
"""

from __future__ import annotations

import math

import numpy as np

# FastSurfer's find_min_size rounds the voxel size to 1e-4 mm and caps it at 1 mm.
_PER_MM = 10000
MAX_CONFORM_VOXEL_MM = 1.0
# FastSurfer's documentation: networks trained at 0.7-1 mm; finer is experimental.
SUPPORTED_MIN_VOXEL_MM = 0.7
# FreeSurfer's conformed cube, and FastSurfer's smallest image size.
MIN_IMAGE_SIZE = 256


def conformed_voxel_size(claimed, to_1mm_threshold: float | None = None,
                         acquired=None) -> float:
    """FastSurfer's ``--vox_size min``: the isotropic voxel size a scan is conformed to.

    Parameters
    ----------
    claimed : sequence of 3 floats
        The voxel sizes the header states (mm).
    to_1mm_threshold : float, optional
        A smallest side above it is served at 1 mm (FastSurfer's
        ``conform_to_1mm_threshold``); None: no threshold.
    acquired : sequence of 3 floats, optional
        The resolution each axis actually carries, where it is coarser than claimed;
        used in place of the claim (module doc).

    Returns
    -------
    float
        In (0, 1] mm.

    Examples
    --------
    >>> conformed_voxel_size((0.8, 0.8, 0.9))
    0.8
    >>> conformed_voxel_size((1.2, 1.2, 3.0))
    1.0
    >>> conformed_voxel_size((0.99, 0.99, 0.99), to_1mm_threshold=0.98)
    1.0
    >>> conformed_voxel_size((0.5, 0.5, 0.5), acquired=(1.0, 1.0, 1.0))
    1.0
    """
    sizes = np.asarray(claimed if acquired is None else acquired, dtype=np.float64)
    smallest = min(float(np.round(sizes.min() * _PER_MM) / _PER_MM),
                   MAX_CONFORM_VOXEL_MM)
    if to_1mm_threshold is not None and smallest > to_1mm_threshold:
        return MAX_CONFORM_VOXEL_MM
    return smallest


def conformed_image_size(shape, spacing, voxel_size: float) -> int:
    """FastSurfer's ``find_img_size_by_fov``: the cube's side in voxels (module doc).

    Examples
    --------
    >>> conformed_image_size((256, 256, 256), (1.0, 1.0, 1.0), 1.0)
    256
    >>> conformed_image_size((288, 320, 320), (0.8, 0.8, 0.8), 0.8)
    320
    >>> conformed_image_size((181, 217, 181), (1.0, 1.0, 1.0), 0.7)
    310
    """
    if voxel_size == 1.0:
        return MIN_IMAGE_SIZE
    fov = float(np.max(np.asarray(shape[:3], dtype=np.float64)
                       * np.asarray(spacing, dtype=np.float64)))
    side = math.ceil(int(fov / voxel_size * _PER_MM) / _PER_MM)
    return max(MIN_IMAGE_SIZE, side)


def voxel_size_problem(voxel_size: float) -> str | None:
    """Why FastSurfer's conform refuses an isotropic voxel size, or None."""
    if not 0.0 < voxel_size <= MAX_CONFORM_VOXEL_MM:
        return (f"a conformed voxel size must lie in (0, {MAX_CONFORM_VOXEL_MM}] mm, as "
                f"FastSurfer's conform requires (its networks are trained at "
                f"{SUPPORTED_MIN_VOXEL_MM}-1 mm); got {voxel_size} mm")
    return None


def experimental_note(voxel_size: float) -> str | None:
    """The warning for a voxel size FastSurfer calls experimental, or None."""
    if voxel_size < SUPPORTED_MIN_VOXEL_MM:
        return (f"conformed to {voxel_size} mm: FastSurfer supports {SUPPORTED_MIN_VOXEL_MM}"
                f"-1 mm and calls finer voxels experimental; a network trained at "
                f"{SUPPORTED_MIN_VOXEL_MM}-1 mm will see structures larger than it learned "
                "them (in a copy of the pipeline, set the resample step's spacing to 0.7 "
                "and remove its to_1mm_threshold to serve the scan at 0.7 mm)")
    return None
