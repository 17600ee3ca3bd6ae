"""The images that leave the cache, and how they are written: NIfTI or MGZ, atomically.

:func:`native_like` gives an array the native scan's geometry: the same qform and sform
(with their codes) as the scan's NIfTI header, so it overlays the scan in any viewer
whichever of the two forms the viewer trusts. :func:`save_image` writes an image to a
path whose suffix picks the format (``.nii``, ``.nii.gz``; ``.mgz``, ``.mgh`` through
nibabel's ``MGHImage``), through a temporary name renamed into place.
"""

from __future__ import annotations

import os
from pathlib import Path

import nibabel as nib
import numpy as np

from mriprep.core.atomic import atomic_path
from mriprep.core.errors import InputError
from mriprep.inputs.formats import image_suffix
from mriprep.inputs.writing import nifti_image

NIFTI_SUFFIXES = (".nii", ".nii.gz")
MGH_SUFFIXES = (".mgz", ".mgh")
# FreeSurfer's MGH stores these voxel types only.
_MGH_DTYPES = (np.uint8, np.int16, np.int32, np.float32)


def native_like(data: np.ndarray, affine: np.ndarray, header=None) -> nib.Nifti1Image:
    """``data`` as a NIfTI image on the native grid.

    ``affine`` is the voxel-to-world matrix mriprep read the scan with (qform or sform,
    :func:`~mriprep.inputs.headers.choose_nifti_affine`). With the scan's NIfTI
    ``header``, the image gets that header's qform and sform and their codes, its units
    and slice information; otherwise (an MGH, NRRD or MetaImage scan) both forms hold
    ``affine``, code 1 (scanner).
    """
    if not isinstance(header, nib.nifti1.Nifti1Header):  # Nifti2Header subclasses it
        return nifti_image(data, affine)
    img = nib.Nifti1Image(data, affine)
    qcode, scode = int(header["qform_code"]), int(header["sform_code"])
    img.set_qform(header.get_qform() if qcode else None, code=qcode)
    img.set_sform(header.get_sform() if scode else None, code=scode)
    img.header.set_xyzt_units(*header.get_xyzt_units())
    img.header.set_dim_info(*header.get_dim_info())
    return img


def save_image(img: nib.spatialimages.SpatialImage, path: str | os.PathLike) -> Path:
    """Write ``img`` to ``path`` atomically, NIfTI or MGH by the suffix; return the path.

    An MGH file gets the image's affine; its voxel types are uint8, int16, int32 and
    float32 (others are refused: convert first).

    Raises
    ------
    InputError
        A suffix that is neither NIfTI nor MGH, or a voxel type MGH cannot store.
    """
    path = Path(path)
    suffix = image_suffix(path)
    if suffix in MGH_SUFFIXES:
        data = np.asanyarray(img.dataobj)
        if data.dtype.type not in _MGH_DTYPES:
            raise InputError(
                f"cannot write {path}: MGH stores uint8, int16, int32 or float32 voxels, "
                f"not {data.dtype}; write a .nii.gz instead"
            )
        img = nib.MGHImage(data, img.affine)
    elif suffix not in NIFTI_SUFFIXES:
        raise InputError(
            f"cannot write {path}: name the file *.nii.gz, *.nii or *.mgz (the suffix "
            "chooses the format)"
        )
    with atomic_path(path, suffix=suffix) as tmp:
        nib.save(img, str(tmp))
    return path
