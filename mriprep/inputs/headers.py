"""Decide from an image header alone whether its volume is usable.

:class:`ImageHeader` is what a header says once checked. The checks take header values,
never voxels, so a corrupt header is refused before a byte of data is allocated:

- :func:`check_shape` takes an :class:`ImageHeader` and a voxel limit; it refuses with
  :class:`~mriprep.core.errors.HeaderError` fewer than 3 dimensions, a zero-length or
  negative axis, more than one volume, or more voxels than the limit.
- :func:`check_dtype` refuses with ``HeaderError`` voxels that are not integer or float.
- :func:`check_affine` refuses with ``HeaderError`` a non-finite or singular affine.
- :func:`choose_nifti_affine` returns the NIfTI affine and where it came from, choosing
  between qform and sform the way FastSurfer does (warning when they disagree); it
  refuses with ``HeaderError`` a set qform that is no affine at all.
- :func:`compare_zooms` warns when the header's voxel sizes differ from the affine's.
- :func:`nifti_scaling` returns the ``scl_slope``/``scl_inter`` to apply (None, None: none),
  and refuses with ``HeaderError`` a slope whose intercept is not finite.

Warnings are appended, as sentences naming the file and the fix, to the list passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from nibabel.affines import voxel_sizes
from nibabel.spatialimages import HeaderDataError

from mriprep.core.errors import HeaderError

# 512^3 voxels: a 0.5 mm whole-head scan fits; as float32 plus the valid mask it is ~0.6 GiB.
DEFAULT_MAX_VOXELS = 512**3

# FastSurfer's tolerance (conform.py, check_affine_in_nifti) for qform vs sform and for
# header zooms vs affine column norms: below a micrometre, float32 storage noise.
FORM_ATOL_MM = 1e-3
# Smallest singular value of the affine's 3x3 part (mm per voxel) below which the affine is
# treated as singular: no real voxel is a hundredth of a micrometre wide.
MIN_SINGULAR_VALUE_MM = 1e-5


@dataclass(frozen=True)
class ImageHeader:
    """What the header of an image file says, after sanity checks.

    ``disk_shape`` is the shape stored in the file (possibly 4D with one volume); ``shape``
    is the 3D shape mriprep uses. ``affine`` is the chosen voxel-to-RAS+ matrix (mm) and
    ``affine_source`` says where it came from (``"sform"``, ``"qform"``,
    ``"pixdim"`` for a NIfTI without either, ``"mgh"``, ``"itk"``). ``scl_slope`` and
    ``scl_inter`` are the scaling that will be applied (None: the values are used as
    stored); ``stored_scaling`` is what a NIfTI header holds, even when it is ignored.
    """

    path: Path
    format: str
    disk_shape: tuple[int, ...]
    disk_dtype: str
    affine: np.ndarray
    affine_source: str
    header_zooms: tuple[float, float, float]
    scl_slope: float | None = None
    scl_inter: float | None = None
    stored_scaling: tuple[float, float] | None = None
    warnings: tuple[str, ...] = ()

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.disk_shape[:3])

    @property
    def n_voxels(self) -> int:
        # Python ints: a corrupt NIfTI-2 header can claim more voxels than int64 holds.
        return math.prod(self.disk_shape)

    @property
    def spacing(self) -> tuple[float, float, float]:
        return tuple(float(s) for s in voxel_sizes(self.affine))


def choose_nifti_affine(path: Path, hdr, warnings: list[str]) -> tuple[np.ndarray, str]:
    """Pick qform or sform as FastSurfer does: when both are set and differ, trust qform.

    FastSurfer (``conform.check_affine_in_nifti``) overrides the sform with the qform when
    ``qform_code`` is set and the two differ by more than 1e-3. We also fall back to the
    other form when the preferred one is unusable (non-finite or singular), with a warning.
    """
    qcode, scode = int(hdr["qform_code"]), int(hdr["sform_code"])
    qform = _safe_form(hdr.get_qform) if qcode else None
    sform = _safe_form(hdr.get_sform) if scode else None
    if qform is None and sform is None:
        if qcode or scode:  # a form was set but nibabel could not even build it
            raise HeaderError(
                f"{path}: the header's qform (code {qcode}) cannot be turned into an "
                "affine (invalid quaternion); rewrite the header with a valid orientation"
            )
        warnings.append(
            f"{path}: neither qform_code nor sform_code is set, so the orientation is "
            "unknown; using the voxel sizes only (NIfTI method 1, as nibabel does). Set a "
            "proper orientation in the header if this scan came from a scanner"
        )
        return np.asarray(hdr.get_best_affine(), dtype=np.float64), "pixdim"
    if qform is None:
        return sform, "sform"
    if sform is None:
        return qform, "qform"
    if np.allclose(qform, sform, rtol=0, atol=FORM_ATOL_MM):
        return sform, "sform"
    q_ok, s_ok = _usable_affine(qform), _usable_affine(sform)
    if q_ok or not s_ok:
        chosen, name, other = qform, "qform", "sform"
    else:
        chosen, name, other = sform, "sform", "qform"
    diff = np.abs(qform - sform)
    diff_text = f"{np.nanmax(diff):.4g}" if np.any(np.isfinite(diff)) else "nan"
    reason = (
        "as FastSurfer does"
        if name == "qform"
        else "because the qform is not usable (non-finite or singular)"
    )
    warnings.append(
        f"{path}: qform and sform disagree (largest difference {diff_text} mm, codes "
        f"qform={qcode} sform={scode}); using the {name} {reason}. If the {other} is the "
        f"right one, copy it over (e.g. `fslorient -copy{other}2{name}`) and rerun"
    )
    return chosen, name


def _safe_form(getter) -> np.ndarray | None:
    try:
        return np.asarray(getter(), dtype=np.float64)
    except (ValueError, HeaderDataError, np.linalg.LinAlgError):
        return None


def _usable_affine(affine: np.ndarray) -> bool:
    if not np.all(np.isfinite(affine)):
        return False
    return float(np.linalg.svd(affine[:3, :3], compute_uv=False).min()) >= MIN_SINGULAR_VALUE_MM


def check_affine(path: Path, affine: np.ndarray, source: str) -> None:
    if not np.all(np.isfinite(affine)):
        raise HeaderError(
            f"{path}: the {source} affine contains non-finite values "
            f"({matrix_text(affine)}); the header's orientation is corrupt: rewrite it "
            "(e.g. nibabel: img.set_sform(good_affine, code=1); img.set_qform(good_affine, "
            "code=1)) or re-export the scan"
        )
    smallest = float(np.linalg.svd(affine[:3, :3], compute_uv=False).min())
    if smallest < MIN_SINGULAR_VALUE_MM:
        raise HeaderError(
            f"{path}: the {source} affine is singular (smallest singular value "
            f"{smallest:.3g} mm; {matrix_text(affine)}), so voxels have no position in "
            "space; check the voxel sizes (pixdim) and orientation in the header and "
            "rewrite it"
        )


def matrix_text(affine: np.ndarray) -> str:
    rows = ("[" + ", ".join(f"{v:.4g}" for v in row) + "]" for row in affine[:3])
    return "rows " + " ".join(rows)


def compare_zooms(path, zooms, affine, source, warnings: list[str]) -> None:
    norms = voxel_sizes(affine)
    if not np.allclose(norms, zooms, rtol=1e-4, atol=FORM_ATOL_MM):
        warnings.append(
            f"{path}: header voxel sizes {tuple(round(z, 4) for z in zooms)} differ from the "
            f"{source} affine's {tuple(round(float(n), 4) for n in norms)}; mriprep uses the "
            "affine's. If the voxel sizes are right and the affine is wrong, fix the header"
        )


def nifti_scaling(path: Path, hdr, warnings: list[str]) -> tuple[float | None, float | None]:
    """``scl_slope``/``scl_inter`` as nibabel applies them, with a warning where it matters.

    nibabel (and the NIfTI standard) read a zero or non-finite slope as "no scaling". NaN
    and 0 are also what nibabel and many tools write when they do not scale, so a warning
    is given only when scaling was evidently intended: an intercept is set but the slope
    is unusable, or the slope is infinite.
    """
    slope, inter = float(hdr["scl_slope"]), float(hdr["scl_inter"])
    if slope == 0 or not np.isfinite(slope):
        intended = np.isinf(slope) or (np.isfinite(inter) and inter != 0)
        if intended:
            warnings.append(
                f"{path}: scl_slope is {slope} with scl_inter {inter}; like nibabel, mriprep "
                "ignores both and reads the stored values unscaled. If the intensities "
                "look wrong, set scl_slope to the intended factor in the header"
            )
        return None, None
    if not np.isfinite(inter):
        raise HeaderError(
            f"{path}: scl_slope is {slope} but scl_inter is {inter}, so no intensity can be "
            "computed; set scl_inter to 0 (or the intended offset) in the header"
        )
    return slope, inter


def check_shape(header: ImageHeader, max_voxels: int) -> None:
    path, shape = header.path, header.disk_shape
    if len(shape) < 3:
        raise HeaderError(
            f"{path} has shape {shape} ({len(shape)}D); mriprep needs a 3D volume: check "
            "that this is the anatomical scan and not a single slice"
        )
    if any(s == 0 for s in shape):
        raise HeaderError(
            f"{path} has a zero-length dimension (shape {shape}): the header describes an "
            "empty volume; the conversion from DICOM probably failed: convert it again"
        )
    if any(s < 0 for s in shape):
        raise HeaderError(
            f"{path} has a negative dimension (shape {shape}): the header is corrupt; "
            "re-export the scan"
        )
    n_volumes = math.prod(shape[3:])
    if n_volumes != 1:
        raise HeaderError(
            f"{path} holds {n_volumes} volumes (shape {shape}); mriprep needs a single 3D "
            "volume: extract one (e.g. `fslroi IN OUT 0 1`, or nibabel "
            "img.slicer[..., 0]) or average the repeats first"
        )
    n_voxels = header.n_voxels
    if n_voxels > max_voxels:
        raise HeaderError(
            f"{path}: the header claims shape {shape} = {n_voxels:.3g} voxels, above the "
            f"limit of {max_voxels:,} (max_voxels); if the header is right, crop or "
            "downsample the scan or raise max_voxels, otherwise the header is corrupt"
        )


def check_dtype(path: Path, dtype: np.dtype) -> None:
    if dtype.kind not in "uif":
        raise HeaderError(
            f"{path} stores voxels as {dtype} (kind {dtype.kind!r}), not as real numbers; "
            "mriprep needs one integer or float intensity per voxel: convert it (e.g. take "
            "the magnitude of complex data) and save it as NIfTI"
        )
