"""Resample: apply a pending registration and the change of grid in one interpolation.

Every output voxel centre is mapped to a continuous position in the input's voxel grid by
one affine map, ``inv(input affine) @ template_to_subject @ output affine`` (the middle
factor is the identity without a registration), and the input is interpolated there
once. Two successive resamplings (register, then regrid) would blur the anatomy twice.

Target grid
    With a pending registration: the template's grid it carries. Otherwise a grid with
    the input's axes and ``spacing``, centred on the input's field of view, covering it
    (``round(n * input_spacing / spacing)`` voxels per axis) or with an explicit
    ``shape`` (e.g. 256^3 at 1 mm, FastSurfer's conformed grid), or with FastSurfer's
    rules for sub-millimetre scans (``spacing: min``, ``shape: fov``:
    :mod:`~mriprep.stages.resample.conform_size`). With ``orientation``
    (e.g. ``"LIA"``, FastSurfer's voxel order) the input's axes are first reordered to it,
    as the reorient stage would but without copying a voxel: the reordering is paid for
    in the one pass that writes the output grid. With ``axis_aligned`` the output axes
    are the world's axes themselves (an oblique scan is rotated onto them, as
    FreeSurfer's and FastSurfer's conform do), and with ``centre: freesurfer`` the grid
    is centred as theirs is: output voxel ``N/2`` lies at the input's voxel ``n/2``
    (FreeSurfer's ``c_ras``), rather than the two fields of view sharing their centre.
    The two conventions differ by half an input voxel less half an output voxel.

Images
    ``linear`` (trilinear) or ``bspline`` (cubic B-spline, finite data only: its
    prefilter spreads a NaN along whole lines). Anisotropic inputs, whose largest voxel
    side exceeds ``anisotropy_threshold`` times the smallest, follow nnU-Net's idea: cubic
    in-plane and linear along the thick axis, so that cubic ringing across 5 mm slices
    cannot overshoot. The two steps are one separable kernel evaluated once per output
    point: the in-plane cubic value is taken on the two slices that bracket the point and
    blended linearly between them. Trilinear interpolation is already exactly that
    (bilinear in-plane, then linear along the thick axis), so ``linear`` needs no special
    case.

Labels
    ``nearest``, or ``label_linear``: each label's indicator is interpolated linearly and
    the most probable label wins (smoother boundaries than nearest, as FreeSurfer does).
    Either way every output value is an input label (or 0 outside the field of view).

Validity
    Conservative: an output voxel is invalid if any input voxel with a non-zero weight in
    its interpolation kernel is invalid (support: 2 voxels per axis for linear, 4 for
    cubic), or if it lies outside the input's field of view (beyond the outermost voxel
    centres, with a 1e-6 voxel tolerance for round-off; none with ``arithmetic:
    fastsurfer``, where scipy's rule decides as in FastSurfer). The cubic B-spline
    prefilter is recursive and reaches further, decaying by a factor 0.27 per voxel;
    filled voxels hold plausible finite values (the sanitize stage's local fill), so that
    tail is harmless.

Snapping onto the input's lattice (a design decision)
    Without a pending registration, a target grid with the input's axes and spacing is
    moved onto the input's lattice, by at most half a voxel per axis (``grid_shift_mm``),
    and the output is an exact integer crop/pad of the input; the reasons are given in
    :mod:`~mriprep.stages.resample.grid`.

When the map sends every output voxel exactly onto an input voxel (same grid, axis
flips, whole-voxel shifts; within 1e-9 voxel), values are copied, not interpolated: the
same grid returns the input bit for bit (NaN on invalid voxels, which ``linear`` accepts,
becomes 0 there as everywhere).

Already conformed
    An input that already meets FastSurfer's ``is_conform`` for a conform target (an
    explicit ``shape`` and ``orientation``; uint8 on disk) is returned as it is, voxels
    and affine, as FastSurfer returns it (:mod:`~mriprep.stages.resample.conformed`).

The paths
    The stage chooses the grid (:mod:`~mriprep.stages.resample.grid`) and the kernel
    (:mod:`~mriprep.stages.resample.kernel`), then the cheapest path that applies the
    rules above: the crop/pad of a snapped grid
    (:func:`~mriprep.stages.resample.grid.crop_or_pad`), three 1D passes for an
    axis-aligned map (:mod:`~mriprep.stages.resample.separable`), SimpleITK's resampler
    for a rotating map with trilinear images and nearest labels
    (:mod:`~mriprep.stages.resample.itk_path`), and otherwise the general path
    (:mod:`~mriprep.stages.resample.general`). With ``arithmetic: fastsurfer`` the grid's
    affine and the interpolation are FastSurfer's own computations instead
    (:mod:`~mriprep.stages.resample.fastsurfer_path`, which says why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.volume import Volume
from mriprep.stages import HASHED_ONLY_WHEN_SET, StageOutput, stage
from mriprep.stages.intensity import label_values
from mriprep.stages.reorient import axis_codes, orientation_codes, reoriented
from mriprep.stages.resample.conform_size import (
    conformed_image_size,
    conformed_voxel_size,
    experimental_note,
    voxel_size_problem,
)
from mriprep.stages.resample.conformed import conform_mismatches, stored_dtype
from mriprep.stages.resample.fastsurfer_path import fastsurfer_affine, resample_as_fastsurfer
from mriprep.stages.resample.general import resample_arrays
from mriprep.stages.resample.grid import (
    crop_or_pad,
    grid_centre,
    snap_to_input_lattice,
    target_grid,
    world_axes,
)
from mriprep.stages.resample.itk_path import resample_linear_itk
from mriprep.stages.resample.kernel import Kernel, anisotropic_axis, index_map
from mriprep.stages.resample.separable import axis_sources, resample_axis_aligned


@dataclass(frozen=True)
class ResampleParams:
    """Parameters of the resample stage.

    Attributes
    ----------
    interpolation : {"linear", "bspline"}
        Image interpolation; ``bspline`` is cubic and needs finite data.
    label_interpolation : {"nearest", "label_linear"}
        Label maps: nearest neighbour, or per-label linear interpolation and argmax.
    spacing : tuple of 3 floats, float, or "min"
        Output voxel size (mm) when there is no pending registration; one number is
        isotropic. ``"min"`` is FastSurfer's ``--vox_size min``: isotropic at the scan's
        smallest voxel side, at most 1 mm
        (:mod:`~mriprep.stages.resample.conform_size`), taken from the resolution the
        image carries where the header claims a finer one (``voxel_size_from``).
    shape : tuple of 3 ints, "fov", or None
        Output shape when there is no pending registration, centred on the input's field
        of view; None covers the field of view. ``"fov"`` is FastSurfer's conformed cube:
        256 at 1 mm, else the cube covering the scan's largest field of view, at least
        256 (isotropic spacing in (0, 1] mm only, as FastSurfer's conform).
    to_1mm_threshold : float or None
        With ``spacing: min``, a smallest voxel side above this (mm) is served at 1 mm
        (FastSurfer's ``conform_to_1mm_threshold``; its pipeline uses 0.98).
    voxel_size_from : {"acquired", "header"}
        With ``spacing: min``: ``acquired`` takes, on an axis whose header claims at
        least 1.5x finer voxels than the image carries, the measured resolution
        (:mod:`~mriprep.stages.acquired_resolution`); ``header`` takes the header's
        voxel sizes as they are, as FastSurfer does.
    snap_to_input : bool
        A target grid with the input's axes and spacing is moved onto the input's
        lattice (module doc). False keeps the grid exactly where ``centre`` puts it, and
        interpolates where the two lattices are half a voxel apart, as FastSurfer does.
    clip_to : (low, high) or None
        The image is clipped to this range after interpolating: FastSurfer clips its
        conformed image to 0-255 after interpolating, which a ``normalize`` step with
        ``clip: false`` leaves to this one.
    arithmetic : {"mriprep", "fastsurfer"}
        ``fastsurfer`` computes the grid's affine and the interpolation as FastSurfer's
        conform does (float32 MGH header fields; ``scipy.ndimage.affine_transform``
        with its matrix), so that the planes where the grid meets the scan's edge within
        round-off are inside or outside as FastSurfer has them
        (:mod:`~mriprep.stages.resample.fastsurfer_path`). Needs ``axis_aligned``,
        ``centre: freesurfer``, ``snap_to_input: false``, ``linear`` and ``nearest``.
    anisotropy_threshold : float
        Largest/smallest input spacing above which a ``bspline`` image is interpolated
        cubic in-plane and linear along the thick axis.
    orientation : str or None
        Voxel order of the output grid when there is no pending registration (nibabel
        axis codes, e.g. ``"LIA"``); None keeps the input's. With a registration the
        template's grid decides, and setting it is an error.
    axis_aligned : bool
        Output axes exactly along the world axes of ``orientation`` (obliquity removed);
        False keeps the input's (reordered) axes. Needs ``orientation``.
    centre : {"field_of_view", "freesurfer"}
        Where the grid is centred: on the input's field of view, or at FreeSurfer's
        ``c_ras`` (input voxel ``n/2`` at output voxel ``N/2``).
    """

    interpolation: Literal["linear", "bspline"] = "linear"
    label_interpolation: Literal["nearest", "label_linear"] = "nearest"
    spacing: tuple[float, float, float] | float | Literal["min"] = (1.0, 1.0, 1.0)
    shape: tuple[int, int, int] | Literal["fov"] | None = None
    anisotropy_threshold: float = 3.0
    orientation: str | None = None
    axis_aligned: bool = False
    centre: Literal["field_of_view", "freesurfer"] = "field_of_view"
    to_1mm_threshold: float | None = field(
        default=None, metadata={HASHED_ONLY_WHEN_SET: True})
    voxel_size_from: Literal["acquired", "header"] = field(
        default="acquired", metadata={HASHED_ONLY_WHEN_SET: True})
    snap_to_input: bool = field(default=True, metadata={HASHED_ONLY_WHEN_SET: True})
    clip_to: tuple[float, float] | None = field(
        default=None, metadata={HASHED_ONLY_WHEN_SET: True})
    arithmetic: Literal["mriprep", "fastsurfer"] = field(
        default="mriprep", metadata={HASHED_ONLY_WHEN_SET: True})

    def __post_init__(self):
        if self.orientation is not None:
            object.__setattr__(self, "orientation", axis_codes(self.orientation, "resample"))
        elif self.axis_aligned:
            raise PipelineConfigError(
                "resample: axis_aligned needs an orientation to align to (e.g. LIA)"
            )
        if self.spacing != "min":
            spacing = self.spacing
            if isinstance(spacing, (int, float)):
                spacing = (spacing,) * 3
            spacing = tuple(float(s) for s in spacing)
            if len(spacing) != 3 or not all(np.isfinite(spacing)) or min(spacing) <= 0:
                raise PipelineConfigError(
                    "resample: spacing must be three positive sizes in mm, one size, or "
                    f"min, got {self.spacing}"
                )
            object.__setattr__(self, "spacing", spacing)
        if self.shape == "fov":
            self._check_fastsurfer_cube()
        elif self.shape is not None:
            shape = tuple(int(s) for s in self.shape)
            if len(shape) != 3 or min(shape) < 1:
                raise PipelineConfigError(
                    f"resample: shape must be three positive voxel counts, got {self.shape}"
                )
            object.__setattr__(self, "shape", shape)
        if self.to_1mm_threshold is not None and (
                self.spacing != "min" or not 0 < self.to_1mm_threshold <= 1):
            raise PipelineConfigError(
                "resample: to_1mm_threshold is FastSurfer's conform_to_1mm_threshold, a "
                "size in (0, 1] mm that applies to spacing: min; got "
                f"{self.to_1mm_threshold} with spacing {self.spacing}"
            )
        if self.voxel_size_from != "acquired" and self.spacing != "min":
            raise PipelineConfigError(
                "resample: voxel_size_from chooses where spacing: min reads the voxel "
                f"sizes; with spacing {list(self.spacing)} it does nothing: remove it"
            )
        if self.clip_to is not None and not (
                np.all(np.isfinite(self.clip_to)) and self.clip_to[0] < self.clip_to[1]):
            raise PipelineConfigError(
                f"resample: clip_to must be [low, high] with low < high, got {self.clip_to}"
            )
        if self.arithmetic == "fastsurfer":
            self._check_fastsurfer_arithmetic()
        if not self.anisotropy_threshold >= 1:
            raise PipelineConfigError(
                "resample: anisotropy_threshold is a ratio of spacings and must be at "
                f"least 1, got {self.anisotropy_threshold}"
            )

    def _check_fastsurfer_arithmetic(self):
        """``arithmetic: fastsurfer`` reproduces FastSurfer's conform, which has one
        grid convention and one interpolation: anything else is refused."""
        needed = {"axis_aligned": True, "centre": "freesurfer", "snap_to_input": False,
                  "interpolation": "linear", "label_interpolation": "nearest"}
        wrong = [f"{name}: {getattr(self, name)}" for name, value in needed.items()
                 if getattr(self, name) != value]
        if wrong:
            raise PipelineConfigError(
                "resample: arithmetic fastsurfer computes FastSurfer's conform (strict "
                "LIA-like axes, centred at c_ras, never snapped, trilinear, nearest "
                f"labels); it needs axis_aligned: true, centre: freesurfer, snap_to_input: "
                f"false, interpolation: linear, label_interpolation: nearest; got "
                f"{', '.join(wrong)}"
            )

    def _check_fastsurfer_cube(self):
        """``shape: fov`` is FastSurfer's cube: refused where FastSurfer refuses."""
        if self.spacing == "min":
            return
        if max(self.spacing) - min(self.spacing) > 1e-9:
            raise PipelineConfigError(
                "resample: shape fov is FastSurfer's conformed cube, which has isotropic "
                f"voxels; got spacing {list(self.spacing)} (give one size, or min)"
            )
        problem = voxel_size_problem(self.spacing[0])
        if problem is not None:
            raise PipelineConfigError(f"resample: shape fov: {problem}")


def _finite_data(volume: Volume, params: ResampleParams) -> np.ndarray:
    """The image to interpolate: non-finite voxels, allowed only where invalid, zeroed
    so that they cannot turn a neighbour's weighted sum into NaN."""
    finite = np.isfinite(volume.data)
    if finite.all():
        return volume.data
    if params.interpolation == "bspline":
        raise StageError(
            "resample",
            f"{int((~finite).sum())} voxel(s) are NaN or infinite and B-spline "
            "interpolation would spread them along whole lines of the volume; run the "
            "'sanitize' stage first or use interpolation: linear",
            volume.name,
        )
    bad_valid = ~finite & volume.valid
    if bad_valid.any():
        raise StageError(
            "resample",
            f"{int(bad_valid.sum())} voxel(s) marked valid are NaN or infinite; run the "
            "'sanitize' stage before 'resample'",
            volume.name,
        )
    return np.where(finite, volume.data, np.float32(0.0))


def _orientation_conflict(orientation: str) -> str:
    return (
        f"orientation {orientation!r} is set, but a registration hands over the "
        "template's grid, whose orientation is the template's; remove 'orientation' from "
        "the resample step"
    )


def _order_check(params: ResampleParams, transform_pending: bool) -> list[str]:
    """Refused when the pipeline loads: an orientation after a registration."""
    if transform_pending and params.orientation:
        return [f"stage 'resample': {_orientation_conflict(params.orientation)}"]
    return []


@stage("resample", ResampleParams, applies_transform=True, order_check=_order_check)
def resample(volume: Volume, params: ResampleParams) -> StageOutput:
    """Apply the pending registration (if any) and the target grid in one interpolation.

    Parameters
    ----------
    volume : Volume
    params : ResampleParams

    Returns
    -------
    StageOutput
        The volume on the target grid, ``pending`` cleared. Metrics: output ``shape``,
        ``spacing`` and ``affine``, the ``grid`` source (``"template"`` or
        ``"spacing"``), the ``kernel`` used, ``anisotropic_axis``, the
        ``invalid_fraction`` of the output and the share ``outside_fraction`` that lies
        outside the input's field of view, ``label_values``, and ``grid_shift_mm``: how
        far the grid was snapped onto the input's lattice along each output axis (None
        when it was not, see module doc), the output ``orientation`` codes, and
        ``already_conformed``: the input already met FastSurfer's ``is_conform`` for a
        conform target (shape and orientation set) and is returned as it is, ``grid``
        ``"input"`` (:mod:`~mriprep.stages.resample.conformed`), and
        ``voxel_size_rule``: with ``spacing: min``, the claimed and measured voxel sizes
        and the size chosen (None otherwise). Warnings: a voxel size FastSurfer calls
        experimental, and a header that claims a finer grid than the image carries.

    Raises
    ------
    StageError
        Non-finite image values where they would reach the output (see module doc), or
        an ``orientation`` set while a registration hands over the template's grid.
    """
    spacing, shape, sizing, warnings = _target_size(volume, params)
    conformed = _already_conformed(volume, params, spacing, shape)
    if conformed is not None:
        conformed.metrics["voxel_size_rule"] = sizing
        conformed.warnings.extend(warnings)
        return conformed
    # FreeSurfer's c_ras is a voxel of the stored grid: taken before any reordering.
    centre = grid_centre(volume.affine, volume.shape, params.centre)
    # FastSurfer's arithmetic maps from the stored voxels too (fastsurfer_path).
    stored = volume
    as_fastsurfer = params.arithmetic == "fastsurfer"
    if params.orientation is not None:
        if volume.pending is not None:
            raise StageError("resample", _orientation_conflict(params.orientation), volume.name)
        # Views: the output grid is written below in one pass, reordering included.
        volume = reoriented(volume, params.orientation, contiguous=False)
    data = _finite_data(stored if as_fastsurfer else volume, params)
    pending = volume.pending
    snap = None
    if pending is not None:
        out_shape, out_affine = pending.target_shape, pending.target_affine
        world_map = pending.template_to_subject
        grid_source = "template"
    else:
        directions = world_axes(params.orientation) if params.axis_aligned else None
        out_shape, out_affine = target_grid(
            volume.affine, volume.shape, spacing, shape, directions, centre
        )
        if as_fastsurfer:
            out_affine = fastsurfer_affine(stored.affine, stored.shape, out_shape, spacing,
                                           directions)
        if params.snap_to_input:
            snap = snap_to_input_lattice(volume.affine, volume.spacing, out_affine, spacing)
        if snap is not None:
            out_affine = snap[0]
        world_map = np.eye(4)
        grid_source = "spacing"
    vox_map = np.linalg.inv(volume.affine) @ world_map @ out_affine
    thick = anisotropic_axis(volume.spacing, params.anisotropy_threshold)
    if as_fastsurfer:
        kernel = Kernel("fastsurfer")
    elif snap is not None:
        kernel = Kernel("crop_pad")
    elif index_map(vox_map):
        vox_map = np.rint(vox_map)
        kernel = Kernel("copy")
    elif params.interpolation == "linear":
        kernel = Kernel("linear")
    elif thick is not None:
        kernel = Kernel("cubic_inplane", thick)
    else:
        kernel = Kernel("cubic")
    sources = axis_sources(vox_map, out_shape) if kernel.kind in ("copy", "linear") else None
    if as_fastsurfer:
        data, valid, label, outside = resample_as_fastsurfer(stored, data, out_affine,
                                                             out_shape)
    elif snap is not None:
        # The snapped affine is the input's translated by whole voxels: the map is the
        # identity plus that translation, up to round-off.
        offset = np.rint(vox_map[:3, 3])
        data, valid, label, outside = crop_or_pad(volume, data, offset, out_shape)
    elif sources is not None:
        data, valid, label, outside = resample_axis_aligned(
            volume, data, vox_map, out_shape, sources, params.label_interpolation
        )
    elif kernel.kind == "linear" and params.label_interpolation == "nearest":
        data, valid, label, outside = resample_linear_itk(volume, data, vox_map, out_shape)
    else:
        data, valid, label, outside = resample_arrays(
            volume, data, vox_map, out_shape, kernel, params.label_interpolation
        )
    if params.clip_to is not None:
        # In place unless a path handed back a view of the input, which must not change.
        shared = np.may_share_memory(data, volume.data)
        data = np.clip(data, np.float32(params.clip_to[0]), np.float32(params.clip_to[1]),
                       out=None if shared else data)
    invalid_fraction = 1.0 - float(np.count_nonzero(valid)) / valid.size
    out = volume.replace(data=data, valid=valid, label=label, affine=out_affine, pending=None,
                         applied=pending if pending is not None else volume.applied)
    metrics = {
        "grid": grid_source,
        "shape": list(out.shape),
        "spacing": [round(s, 9) for s in out.spacing],
        "affine": out_affine.tolist(),
        "kernel": kernel.describe(),
        "anisotropic_axis": thick,
        "invalid_fraction": invalid_fraction,
        "outside_fraction": outside / valid.size,
        "label_values": None if label is None else label_values(label),
        "grid_shift_mm": None if snap is None else [float(x) for x in snap[1]],
        "orientation": orientation_codes(out_affine),
        "already_conformed": False,
        "voxel_size_rule": sizing,
    }
    return StageOutput(out, metrics, warnings)


def _target_size(volume: Volume, params: ResampleParams):
    """The target grid's spacing and shape, with FastSurfer's rules where they are asked
    for (``spacing: min``, ``shape: fov``), what decided them, and any warning.

    Returns
    -------
    spacing : tuple of 3 floats
    shape : tuple of 3 ints or None
    sizing : dict or None
        For ``spacing: min``: the voxel sizes the header claims, those measured where
        the header claims a finer grid than the image carries (None with
        ``voxel_size_from: header``), the threshold and the size chosen.
    warnings : list of str
    """
    warnings = []
    sizing = None
    if volume.pending is not None:
        return params.spacing, params.shape, None, warnings  # the template's grid decides
    if params.spacing == "min":
        claimed = tuple(float(s) for s in volume.spacing)
        measured = None
        if params.voxel_size_from == "acquired":
            measured = _carried_sizes(volume)
        size = conformed_voxel_size(claimed, params.to_1mm_threshold, measured)
        spacing = (size,) * 3
        sizing = {
            "rule": "min",
            "claimed_mm": [round(s, 6) for s in claimed],
            "acquired_mm": None if measured is None else [round(s, 6) for s in measured],
            "to_1mm_threshold": params.to_1mm_threshold,
            "voxel_size_mm": size,
        }
        as_claimed = conformed_voxel_size(claimed, params.to_1mm_threshold)
        if size != as_claimed:
            warnings.append(
                f"the header claims {min(claimed):g} mm voxels but the image carries "
                f"{min(measured):g} mm at best: conformed to {size:g} mm, not "
                f"{as_claimed:g} mm (voxel_size_from: header keeps the header's sizes)"
            )
    else:
        spacing = params.spacing
    shape = params.shape
    if shape == "fov":
        side = conformed_image_size(volume.shape, volume.spacing, spacing[0])
        shape = (side,) * 3
    if params.spacing == "min" or params.shape == "fov":
        note = experimental_note(spacing[0])
        if note is not None:
            warnings.append(note)
    return spacing, shape, sizing, warnings


# A measured size is known to about 6% (docs/benchmarks.md, row 46) and acquisitions are
# prescribed in tenths of a millimetre: a measured size is rounded to one.
_MEASURED_SIZE_STEP_MM = 0.1


def _carried_sizes(volume: Volume) -> tuple[float, float, float]:
    """Per voxel axis, the voxel size to conform from: the header's, except on an axis
    where the image carries a resolution at least ``CLAIMED_FINER_RATIO`` times coarser
    than the header claims, which takes the measured one, rounded to a tenth of a mm.

    The plausibility stage's measure is used where it ran on this grid, so that its
    warning, the check's finding and this choice rest on one measurement; otherwise
    the image is measured here.
    """
    from mriprep.stages.acquired_resolution import CLAIMED_FINER_RATIO, acquired_resolution

    record = volume.record_of("plausibility")
    metrics = record.metrics if record is not None else {}
    claimed = metrics.get("voxel_size_mm")
    if (claimed is None or "acquired_resolution_mm" not in metrics
            or not np.allclose(sorted(claimed), sorted(volume.spacing), atol=1e-3)):
        found = acquired_resolution(volume.data, volume.spacing, volume.valid)
        claimed, acquired = volume.spacing, found.sizes_mm
        falsely_fine = found.falsely_fine_axes(CLAIMED_FINER_RATIO)
    else:
        acquired, falsely_fine = metrics["acquired_resolution_mm"], metrics["falsely_fine_axes"]
    step = _MEASURED_SIZE_STEP_MM
    return tuple(
        round(float(size) / step) * step if axis in falsely_fine else float(claim)
        for axis, (claim, size) in enumerate(zip(claimed, acquired))
    )


def _already_conformed(volume: Volume, params: ResampleParams, spacing,
                       shape) -> StageOutput | None:
    """The volume as it is when it is already on the conform target by FastSurfer's
    rules (:mod:`~mriprep.stages.resample.conformed`), else None.

    FastSurfer uses a conformed image's voxels and affine as they are; interpolating it
    onto the snapped grid anyway would change voxels wherever its axes or voxel sizes
    differ from the target's by round-off within ``eps``. Only a conform target
    qualifies: an explicit shape and an orientation, and no registration to apply.
    """
    if volume.pending is not None or shape is None or params.orientation is None:
        return None
    load = volume.record_of("load")
    dtype = stored_dtype(load.metrics if load is not None else None)
    if conform_mismatches(volume.affine, volume.shape, dtype, shape, spacing,
                          params.orientation, strict=params.axis_aligned):
        return None
    data = _finite_data(volume, params)
    if params.clip_to is not None:
        data = np.clip(data, np.float32(params.clip_to[0]), np.float32(params.clip_to[1]))
    out = volume.replace(data=data) if data is not volume.data else volume
    valid = out.valid
    metrics = {
        "grid": "input",
        "shape": list(out.shape),
        "spacing": [round(s, 9) for s in out.spacing],
        "affine": out.affine.tolist(),
        "kernel": "none: already conformed (FastSurfer's is_conform), voxels and affine "
                  "kept as they are",
        "anisotropic_axis": None,
        "invalid_fraction": 1.0 - float(np.count_nonzero(valid)) / valid.size,
        "outside_fraction": 0.0,
        "label_values": None if out.label is None else label_values(out.label),
        "grid_shift_mm": None,
        "orientation": orientation_codes(out.affine),
        "already_conformed": True,
    }
    return StageOutput(out, metrics)
