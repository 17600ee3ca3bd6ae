"""Write a Volume's image or label map as NIfTI, atomically (temporary file, fsync, rename).

:func:`save_volume` writes the float32 data, :func:`save_label` the label map (int16 when
its values fit, else int32); both return the path written. The affine is stored as sform
and, when a qform can represent it exactly, as qform too (:func:`nifti_image` makes such an
image without writing it). Refused with
:class:`~mriprep.core.errors.InputError`: a path not ending in ``.nii`` or ``.nii.gz``, and
(``save_label``) a Volume without a label map. Nothing is left half-written.
"""

from __future__ import annotations

import os
from pathlib import Path

import nibabel as nib
import numpy as np

from mriprep.core.atomic import atomic_path
from mriprep.core.errors import InputError
from mriprep.core.limits import smallest_label_dtype
from mriprep.core.volume import Volume
from mriprep.inputs.formats import image_suffix
from mriprep.inputs.headers import FORM_ATOL_MM

WRITE_SUFFIXES = (".nii", ".nii.gz")


def save_volume(volume: Volume, path: str | os.PathLike) -> Path:
    """Write a Volume's float32 data as NIfTI, atomically.

    The affine is written as both sform and qform (code 1, scanner) so every reader agrees;
    an affine with shear, which a qform cannot represent, is written as sform only. The
    ``valid`` mask, label and provenance are not stored (see :func:`save_label`).

    Parameters
    ----------
    volume : Volume
    path : path-like
        Ends in ``.nii`` or ``.nii.gz``.

    Returns
    -------
    Path
        ``path``.
    """
    return _save_nifti(np.asarray(volume.data, dtype=np.float32), volume.affine, Path(path))


def save_label(volume: Volume, path: str | os.PathLike) -> Path:
    """Write a Volume's label map as an integer NIfTI (int16 when the values fit), atomically."""
    if volume.label is None:
        raise InputError(
            f"volume {volume.name} has no label map to write to {path}; "
            "load it with load_volume(..., label_path=...) first"
        )
    label = volume.label
    out = label.astype(smallest_label_dtype(label), copy=False)
    return _save_nifti(out, volume.affine, Path(path))


def nifti_image(array: np.ndarray, affine: np.ndarray, code: int = 1) -> nib.Nifti1Image:
    """A NIfTI image of ``array`` whose sform and qform (``code``, 1: scanner) both hold
    ``affine``, so every reader agrees; a sheared affine, which a qform cannot represent,
    gets the sform alone."""
    affine = np.asarray(affine, dtype=np.float64)
    img = nib.Nifti1Image(array, affine)
    img.header.set_xyzt_units("mm")
    img.set_sform(affine, code=code)
    img.set_qform(affine, code=code)
    if not np.allclose(img.get_qform(), affine, rtol=0, atol=FORM_ATOL_MM / 10):
        # A sheared affine has no exact qform; readers that prefer the qform (FastSurfer,
        # and mriprep.inputs.headers) would then use an approximation. Store the sform alone.
        img.set_qform(None, code=0)
    return img


def _save_nifti(array: np.ndarray, affine: np.ndarray, path: Path) -> Path:
    suffix = image_suffix(path)
    if suffix not in WRITE_SUFFIXES:
        raise InputError(
            f"cannot write {path}: mriprep writes NIfTI only; name the file *.nii.gz or *.nii"
        )
    img = nifti_image(array, affine)
    with atomic_path(path, suffix=suffix) as tmp:
        nib.save(img, str(tmp))
    return path
