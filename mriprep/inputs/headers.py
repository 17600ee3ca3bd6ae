"""Decide from an image header alone whether its volume is usable.

:class:`ImageHeader` is what a header says once checked. The checks take header values,
never voxels, so a corrupt header is refused before a byte of data is allocated:

- :func:`check_shape` takes an :class:`ImageHeader` and a voxel limit; it refuses with
  :class:`~mriprep.core.errors.HeaderError` fewer than 3 dimensions, a zero-length or
  negative axis, more than one volume, or more voxels than the limit.
- :func:`check_dtype` refuses with ``HeaderError`` voxels that are not integer or float.
- :func:`check_affine` refuses with ``HeaderError`` a non-finite or singular affine.
- :func:`choose_nifti_affine` returns the NIfTI affine, where it came from and how far
  apart qform and sform place the field of view (:func:`form_conflict_mm`), choosing
  between them the way FastSurfer does unless ``header: qform | sform`` asks for one
  (warning when they disagree); it refuses with ``HeaderError`` a set qform that is no
  affine at all, and a requested form the file does not set.
- :func:`header_conflict` says whether a load record's conflict makes the subject's
  geometry uncertain (above :data:`FORM_CONFLICT_LIMIT_MM`, chosen by the default rule).
- :func:`compare_zooms` warns when the header's voxel sizes differ from the affine's.
- :func:`nifti_scaling` returns the ``scl_slope``/``scl_inter`` to apply (None, None: none),
  and refuses with ``HeaderError`` a slope whose intercept is not finite.

Warnings are appended, as sentences naming the file and the fix, to the list passed in.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import numpy as np
from nibabel.affines import voxel_sizes
from nibabel.spatialimages import HeaderDataError

from mriprep.core.errors import HeaderError

# 512^3 voxels: a 0.5 mm whole-head scan fits; as float32 plus the valid mask it is ~0.6 GiB.
DEFAULT_MAX_VOXELS = 512**3

# FastSurfer's tolerance (conform.py, check_affine_in_nifti) for qform vs sform and for
# header zooms vs affine column norms: below a micrometre, float32 storage noise.
FORM_ATOL_MM = 1e-3
# How far apart (mm) qform and sform may place the field of view before the subject's
# geometry is uncertain: a QC flag and a `header-conflict` warning of `mriprep check`
# (form_conflict_mm, the largest distance over the corners of the voxel box). Measured
# (2026-12-02): float32 storage noise of both forms written by nibabel from one affine, 30
# random oblique, flipped, 0.5-5 mm grids: median 2.6e-5 mm, at most 0.011 mm (a 1280 mm
# axis with a qform near 180 degrees); mriprep's writers (inputs/writing.py, the demo's):
# 1.4e-5 mm; slightly non-orthogonal scanner grids (direction cosines rounded to 5-6
# decimals, as DICOM stores them) against their rotation-only qform: 0.0004-0.0018 mm.
# Failures: nibabel-saved sheared sforms (qform = their rotation-only approximation): 3
# degrees 1.15 mm on a 32^3 1 mm grid, 6.3-8.0 mm on 0.9x0.9x5 mm and 1 mm head grids;
# 10 degrees 3.7 mm (32^3), 20-26 mm; an SPM-like coregistration that moved the sform: 2 mm
# shift 2.0 mm, 1 mm + 1 degree 4.0 mm, 2 degrees 6.3 mm, 5 mm + 5 degrees 20 mm; real
# files: 5 of mricron-data's 13 atlases set both codes with qforms 77-363 mm off. 1 mm
# lies 90 times above the noise and below every failure: a voxel of a 1 mm scan.
FORM_CONFLICT_LIMIT_MM = 1.0
# What `header:` (pipeline) and the manifest's `header` column accept: "auto" is the
# FastSurfer rule of choose_nifti_affine; "qform" / "sform" ask for that form.
HEADER_CHOICES = ("auto", "qform", "sform")
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
    # How far apart (mm) the qform and sform place the field of view (form_conflict_mm);
    # None unless both are set and usable (a NIfTI with both codes).
    form_conflict_mm: float | None = None
    # The form asked for (HEADER_CHOICES): "auto" unless `header:` chose one.
    header_choice: str = "auto"

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


class ChosenAffine(NamedTuple):
    """What :func:`choose_nifti_affine` decided: the affine, its source (``"qform"``,
    ``"sform"``, ``"pixdim"``) and the qform/sform distance (None unless both are set
    and usable)."""

    affine: np.ndarray
    source: str
    conflict_mm: float | None


def form_conflict_mm(qform: np.ndarray, sform: np.ndarray, shape) -> float:
    """The largest distance (mm) between where ``qform`` and ``sform`` put a point of the
    field of view: the voxel box from -0.5 to n-0.5 on each axis (voxel centres 0..n-1,
    each voxel's extent counted).

    Both maps are affine, so ``|(Q - S) @ [i, j, k, 1]|`` is convex over the box and its
    maximum lies at one of the box's 8 corners. NaN when either form is not finite.
    """
    sizes = [max(int(n), 1) for n in tuple(shape)[:3]] + [1] * (3 - len(tuple(shape)[:3]))
    corners = np.array([[-0.5 if high == 0 else n - 0.5 for high, n in zip(bits, sizes)] + [1.0]
                        for bits in itertools.product((0, 1), repeat=3)])
    with np.errstate(invalid="ignore", over="ignore"):
        offsets = (np.asarray(qform, np.float64) - np.asarray(sform, np.float64)) @ corners.T
        distance = np.sqrt((offsets[:3] ** 2).sum(axis=0)).max()
    return float(distance) if np.isfinite(distance) else float("nan")


def choose_nifti_affine(path: Path, hdr, warnings: list[str],
                        header: str = "auto", fallback: bool = False) -> ChosenAffine:
    """Pick qform or sform as FastSurfer does: when both are set and differ, trust qform.

    FastSurfer (``conform.check_affine_in_nifti``) overrides the sform with the qform when
    ``qform_code`` is set and the two differ by more than 1e-3. We also fall back to the
    other form when the preferred one is unusable (non-finite or singular), with a warning.
    How far apart the two place the field of view is measured in mm
    (:func:`form_conflict_mm`) and said in the warning.

    ``header="qform"`` or ``"sform"`` (the pipeline's ``header:``, the manifest's
    ``header`` column) takes that form, without a warning: the choice was made. A form
    asked for that the file does not set is a ``HeaderError``, unless ``fallback`` (a
    label map, read as its image is): then the default rule decides.
    """
    if header not in HEADER_CHOICES:
        raise ValueError(f"header must be one of {', '.join(HEADER_CHOICES)}, got {header!r}")
    qcode, scode = int(hdr["qform_code"]), int(hdr["sform_code"])
    qform = _safe_form(hdr.get_qform) if qcode else None
    sform = _safe_form(hdr.get_sform) if scode else None
    conflict = None
    if qform is not None and sform is not None and _usable_affine(qform) \
            and _usable_affine(sform):
        # (A form that is not usable places nothing: the other one is the geometry.)
        conflict = form_conflict_mm(qform, sform, _header_shape(hdr))
    if header != "auto":
        asked = qform if header == "qform" else sform
        if asked is not None:
            return ChosenAffine(asked, header, conflict)
        if not fallback:
            code = qcode if header == "qform" else scode
            other = "sform" if header == "qform" else "qform"
            what = (f"its {header}_code is 0 (no {header} is set)" if not code
                    else f"its {header} (code {code}) cannot be turned into an affine")
            raise HeaderError(
                f"{path}: header: {header} is asked for this scan (the manifest's `header` "
                f"column or the pipeline's `header:`), but {what}; ask for the {other} "
                "or leave `header` empty (auto: the FastSurfer rule), or write the "
                f"intended {header} into the file"
            )
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
        return ChosenAffine(np.asarray(hdr.get_best_affine(), dtype=np.float64), "pixdim", None)
    if qform is None:
        return ChosenAffine(sform, "sform", None)
    if sform is None:
        return ChosenAffine(qform, "qform", None)
    if np.allclose(qform, sform, rtol=0, atol=FORM_ATOL_MM):
        return ChosenAffine(sform, "sform", conflict)
    q_ok, s_ok = _usable_affine(qform), _usable_affine(sform)
    if q_ok or not s_ok:
        chosen, name = qform, "qform"
    else:
        chosen, name = sform, "sform"
    distance = "an unknown distance" if conflict is None else f"{conflict:.3g} mm"
    if name == "qform":
        advice = (
            "using the qform as FastSurfer does. If the sform is the intended geometry "
            "(SPM-coregistered files), set `header: sform` in the pipeline or the "
            "manifest's `header` column; if the qform is, copy it over the sform "
            "(`fslorient -copyqform2sform`) or set `header: qform`"
        )
    else:
        advice = (
            "using the sform because the qform is not usable (non-finite or singular). "
            "Rewrite the qform from the sform (`fslorient -copysform2qform`) if the sform "
            "is right"
        )
    warnings.append(
        f"{path}: the qform and sform place the field of view up to {distance} apart (at "
        f"a corner of the grid; codes qform={qcode} sform={scode}); {advice}"
    )
    return ChosenAffine(chosen, name, conflict)


def header_conflict(load_metrics: Mapping[str, Any] | None) -> float | None:
    """The qform/sform distance (mm) of a load record's metrics when it makes the
    subject's geometry uncertain: above :data:`FORM_CONFLICT_LIMIT_MM` with the form
    chosen by the default rule (no ``header:`` asked for one). None otherwise."""
    if not isinstance(load_metrics, Mapping):
        return None
    distance = load_metrics.get("form_conflict_mm")
    if isinstance(distance, bool) or not isinstance(distance, (int, float)):
        return None
    if load_metrics.get("header", "auto") != "auto":
        return None
    distance = float(distance)
    return distance if distance > FORM_CONFLICT_LIMIT_MM else None


def _header_shape(hdr) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in hdr.get_data_shape()[:3])
    except (HeaderDataError, ValueError):
        return (1, 1, 1)


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
