"""Validate: the invariants every cached volume must satisfy, checked last.

A subject that breaks any of them is reported with every broken invariant and its
offending value, and never cached. The stage changes nothing.

One invariant is a plausibility check on the output (the others are the plausibility
stage's, on the input): ``head_coverage``, the share of the output grid that is valid
head (voxels above the robust foreground threshold of the valid ones): a whole brain
covers much more of any shipped grid than a macaque, a shrunk head or a crop
(``min_head_coverage``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from nibabel.affines import voxel_sizes

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.limits import FLOAT16_MAX, UINT8_MAX
from mriprep.core.volume import Volume
from mriprep.stages import StageOutput, stage
from mriprep.stages.intensity import all_finite, foreground_mask, label_values
from mriprep.stages.plausibility import shear_deg



@dataclass(frozen=True)
class ValidateParams:
    """Parameters of the validate stage.

    Attributes
    ----------
    output_dtype : {"float32", "float16", "uint8"}
        The cache's dtype (inherited from the pipeline). With float16 every value must
        fit float16's range; with uint8 it must lie in 0-255 (it is rounded when cached,
        as FastSurfer rounds its conformed images).
    expected_shape : (int, int, int) or None
        The grid the pipeline promises (e.g. 256^3 for a conform pipeline). None: the
        grid of the registration template when the volume was registered (so a pipeline
        whose ``template`` changes needs no other change), else any.
    expected_spacing : (float, float, float) or None
        Voxel size in mm; None: the registration template's likewise, else any.
    spacing_tolerance : float
        Largest accepted difference from ``expected_spacing``, in mm.
    allowed_labels : tuple of int or None
        Label values a label map may hold; None: any.
    min_valid_fraction : float
        Smallest fraction of valid voxels; the volume must hold at least one in any case.
    min_head_coverage : float
        Smallest share of the output grid that is valid head; 0 disables. Measured on
        FastSurfer's 256^3 grid: whole heads 20-30%, Colin27's brain alone 10.0% / a
        macaque brain 0.7%, a head at 0.45 scale 2.4%, a 64 mm crop 0% (docs/benchmarks.md,
        "Input plausibility").
    warn : tuple of str
        Invariants that only warn; only ``head_coverage`` may (the others would put a
        broken tensor into the cache).
    """

    output_dtype: Literal["float32", "float16", "uint8"] = "float32"
    expected_shape: tuple[int, int, int] | None = None
    expected_spacing: tuple[float, float, float] | None = None
    spacing_tolerance: float = 1e-3
    allowed_labels: tuple[int, ...] | None = None
    min_valid_fraction: float = 0.0
    min_head_coverage: float = 0.05
    warn: tuple[str, ...] = ()

    def __post_init__(self):
        if self.expected_shape is not None and any(s < 1 for s in self.expected_shape):
            raise PipelineConfigError(
                f"expected_shape must be positive, got {self.expected_shape}"
            )
        if self.expected_spacing is not None and any(
            not s > 0 for s in self.expected_spacing
        ):
            raise PipelineConfigError(
                f"expected_spacing must be positive, got {self.expected_spacing}"
            )
        if not self.spacing_tolerance >= 0:
            raise PipelineConfigError(
                f"spacing_tolerance must be >= 0, got {self.spacing_tolerance}"
            )
        if not 0.0 <= self.min_valid_fraction <= 1.0:
            raise PipelineConfigError(
                "min_valid_fraction must lie in [0, 1], got "
                f"{self.min_valid_fraction}"
            )
        if not 0.0 <= self.min_head_coverage < 1.0:
            raise PipelineConfigError(
                f"min_head_coverage must lie in [0, 1), got {self.min_head_coverage}"
            )
        if set(self.warn) - {"head_coverage"}:
            raise PipelineConfigError(
                f"warn: only 'head_coverage' may warn instead of failing, got "
                f"{list(self.warn)}"
            )


def _expected_grid(volume: Volume, params: ValidateParams):
    """(shape, spacing, who promised them): the configured grid, else the grid of the
    registration transform the volume was resampled with (the template's), else nothing
    to check."""
    if params.expected_shape is not None or params.expected_spacing is not None:
        return params.expected_shape, params.expected_spacing, ""
    applied = volume.applied
    if applied is None:
        return None, None, ""
    spacing = tuple(float(s) for s in voxel_sizes(applied.target_affine))
    return applied.target_shape, spacing, f" (the grid of {applied.target_name})"


# Output grids are orthogonal up to float32 rounding of the input's affine (~1e-5 deg).
_MAX_OUTPUT_SHEAR_DEG = 0.01
# Every 2nd voxel along each axis estimates the coverage within a fraction of a percent.
_COVERAGE_STEP = 2


def head_coverage(volume: Volume) -> float:
    """The share of the grid that is valid head (the robust foreground of valid voxels)."""
    step = (slice(None, None, _COVERAGE_STEP),) * 3
    data, valid = volume.data[step], volume.valid[step]
    if not valid.any():
        return 0.0
    return float(np.count_nonzero(foreground_mask(data, valid)) / max(data.size, 1))


def coverage_problem(coverage: float, params: ValidateParams) -> str | None:
    """The sentence for a head covering too little of the grid, or None."""
    if coverage >= params.min_head_coverage:
        return None
    return (
        f"head coverage: the head covers {coverage:.1%} of the output grid, below "
        f"min_head_coverage={params.min_head_coverage:g} (whole human heads cover 20-30% "
        "of a 256^3 1 mm grid, a brain alone 10%): the scan holds a small part of a head, "
        "or a brain much smaller than a human one"
    )


def find_violations(volume: Volume, params: ValidateParams) -> list[str]:
    """Every broken invariant of ``volume``, one sentence each (empty when all hold)."""
    problems: list[str] = []
    data = volume.data
    if data.dtype != np.float32:
        problems.append(f"dtype: data is {data.dtype}, expected float32")
    # Only a volume with a non-finite extreme is searched voxel by voxel.
    n_nonfinite = 0 if all_finite(data) else int(np.count_nonzero(~np.isfinite(data)))
    if n_nonfinite:
        first = tuple(int(i) for i in np.argwhere(~np.isfinite(data))[0])
        problems.append(
            f"finite: {n_nonfinite} voxel(s) are NaN or infinite (first at {first}: "
            f"{data[first]})"
        )
    elif params.output_dtype == "float16" and data.size:
        largest = float(np.abs(data).max())
        if largest > FLOAT16_MAX:
            problems.append(
                f"float16 range: largest magnitude {largest:.6g} exceeds {FLOAT16_MAX:g} "
                "and would become Inf in the float16 cache; normalise the intensities or "
                "use output_dtype: float32"
            )
    elif params.output_dtype == "uint8" and data.size:
        low, high = float(data.min()), float(data.max())
        if low < -0.5 or high >= UINT8_MAX + 0.5:
            problems.append(
                f"uint8 range: values {low:.6g}..{high:.6g} do not round into 0-255; "
                "normalise with mode: conform, or use output_dtype: float32"
            )
    if volume.valid.shape != data.shape or volume.valid.dtype != np.bool_:
        problems.append(
            f"valid mask: {volume.valid.dtype} {volume.valid.shape}, expected bool "
            f"{data.shape}"
        )
    else:
        valid_fraction = float(np.count_nonzero(volume.valid)) / max(data.size, 1)
        if valid_fraction == 0.0:
            problems.append("valid fraction: no voxel is valid")
        elif valid_fraction < params.min_valid_fraction:
            problems.append(
                f"valid fraction: {valid_fraction:.3%} of voxels are valid, below "
                f"min_valid_fraction={params.min_valid_fraction:g}"
            )
    expected_shape, expected_spacing, promised_by = _expected_grid(volume, params)
    if expected_shape is not None and volume.shape != tuple(expected_shape):
        problems.append(
            f"shape: {volume.shape}, expected {tuple(expected_shape)}{promised_by}"
        )
    affine = volume.affine
    if not np.all(np.isfinite(affine)) or np.linalg.matrix_rank(affine[:3, :3]) < 3:
        problems.append(f"affine: not finite or singular: {affine.tolist()}")
    else:
        sheared = shear_deg(affine)
        if sheared > _MAX_OUTPUT_SHEAR_DEG:
            problems.append(
                f"affine: the voxel axes meet {sheared:.3f} degrees from a right angle (a "
                "sheared grid, inherited from a sheared input header, whose spacing is not "
                "its voxel size); refuse such inputs with the plausibility stage, or "
                "resample with axis_aligned: true"
            )
    if expected_spacing is not None and np.all(np.isfinite(affine)):
        spacing = np.asarray(volume.spacing)
        expected = np.asarray(expected_spacing, dtype=np.float64)
        if np.any(np.abs(spacing - expected) > params.spacing_tolerance):
            problems.append(
                f"spacing: {tuple(round(float(s), 6) for s in spacing)} mm, expected "
                f"{tuple(round(float(s), 6) for s in expected)} within "
                f"{params.spacing_tolerance} mm{promised_by}"
            )
    if volume.pending is not None:
        problems.append(
            "pending transform: registration estimated a transform that was never "
            "applied; add a resample step after register"
        )
    if volume.label is not None and params.allowed_labels is not None:
        unexpected = sorted(set(label_values(volume.label)) - set(params.allowed_labels))
        if unexpected:
            problems.append(
                f"label values: {unexpected[:10]} not in the allowed set "
                f"{sorted(params.allowed_labels)}"
            )
    return problems


def _entry_meta(params: ValidateParams, volume: Volume) -> dict:
    """The allowed label values, for ``mriprep check`` to test every entry against."""
    if params.allowed_labels is None:
        return {}
    return {"label_values": [int(v) for v in params.allowed_labels]}


@stage("validate", ValidateParams, inherits=("output_dtype",),
       last="checks the final output", entry_meta=_entry_meta)
def validate(volume: Volume, params: ValidateParams) -> StageOutput:
    """Check the output invariants; pass the volume through unchanged.

    Invariants: float32 data, all finite (and within float16 range for a float16 cache),
    a boolean ``valid`` mask of the data's shape with at least ``min_valid_fraction``
    valid voxels, a finite non-singular affine with orthogonal axes, the expected shape
    and spacing when configured, no unapplied transform, label values within the allowed
    set, and a head covering at least ``min_head_coverage`` of the grid (a warning
    instead where ``warn`` names ``head_coverage``).

    Raises
    ------
    StageError
        Naming every broken invariant and its offending value.
    """
    problems = find_violations(volume, params)
    coverage = head_coverage(volume) if params.min_head_coverage > 0 else None
    low_coverage = None if coverage is None else coverage_problem(coverage, params)
    warnings = []
    if low_coverage and "head_coverage" in params.warn:
        warnings.append(low_coverage)
    elif low_coverage:
        problems.append(low_coverage)
    if problems:
        raise StageError(
            "validate",
            f"{len(problems)} invariant(s) broken: " + "; ".join(problems),
            volume.name,
            metrics={"head_coverage": coverage},
        )
    metrics = {
        "data_min": float(volume.data.min()) if volume.data.size else None,
        "data_max": float(volume.data.max()) if volume.data.size else None,
        "valid_fraction": float(np.count_nonzero(volume.valid)) / max(volume.data.size, 1),
        "shape": list(volume.shape),
        "spacing": [round(s, 6) for s in volume.spacing],
        "head_coverage": coverage,
    }
    if volume.label is not None:
        metrics["label_values"] = label_values(volume.label)
    return StageOutput(volume, metrics, warnings)
