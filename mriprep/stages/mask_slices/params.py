"""The mask_slices stage's parameters (their own module, so that the detectors, which the
stage's module imports, can take them without importing it back)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mriprep.core.errors import PipelineConfigError


@dataclass(frozen=True)
class MaskSlicesParams:
    """Parameters of the mask_slices stage.

    Attributes
    ----------
    axes : {"auto", "acquisition", "all"}
        Axes searched for artifact slices: ``"acquisition"`` is the thickest axis only,
        ``"all"`` every axis, ``"auto"`` the thickest axis of an anisotropic volume and
        every axis of an isotropic one. Incomplete slices are searched along every axis.
    isotropy_tolerance : float
        A volume whose largest spacing is at most this times its smallest is isotropic.
    max_invalid_slice_fraction : float
        A slice with at least this fraction of invalid or non-finite voxels is incomplete.
    zero_excess_fraction : float
        A slice is zero-filled when at least this share of the tissue both its
        neighbours hold is exactly zero in it (or when it is all zero).
    intensity_ratio : float
        A slice brighter than this times, or darker than 1/this times, the average of its
        neighbours (median over the comparable voxels) is an artifact.
    correlation_deficit : float
        A slice whose correlation with its neighbours falls this far below theirs with
        each other is an artifact.
    z_threshold : float
        An artifact score must also lie this many robust standard deviations (1.4826 MAD
        over the slices of the axis) from the median score, so that a scan whose slices
        all vary a lot is judged against its own variation. 4 finds a 16 mm in-plane
        shift of a sagittal or coronal slice (z 4.4 at 5 it was missed) and leaves every
        clean slice of the calibration set unflagged.
    score_spacing_mm : float
        Artifact scores use every k-th voxel along each in-plane axis, k the largest whole
        number with k * spacing <= this (at least 1): a lattice of about this spacing.
        0 scores every voxel.
    fill : {"none", "neighbours"}
        ``"neighbours"`` replaces flagged slices by linear interpolation between the
        nearest unflagged slices (they stay invalid); ``"none"`` keeps their values.
    """

    axes: Literal["auto", "acquisition", "all"] = "auto"
    isotropy_tolerance: float = 1.2
    max_invalid_slice_fraction: float = 0.5
    zero_excess_fraction: float = 0.3
    intensity_ratio: float = 1.25
    correlation_deficit: float = 0.2
    z_threshold: float = 4.0
    score_spacing_mm: float = 2.0
    fill: Literal["none", "neighbours"] = "none"

    def __post_init__(self):
        checks = [
            (self.isotropy_tolerance >= 1.0, "isotropy_tolerance", "at least 1"),
            (0.0 < self.max_invalid_slice_fraction <= 1.0, "max_invalid_slice_fraction",
             "in (0, 1]"),
            (0.0 < self.zero_excess_fraction <= 1.0, "zero_excess_fraction", "in (0, 1]"),
            (self.intensity_ratio > 1.0, "intensity_ratio", "above 1"),
            (0.0 < self.correlation_deficit <= 2.0, "correlation_deficit", "in (0, 2]"),
            (self.z_threshold > 0.0, "z_threshold", "positive"),
            (0.0 <= self.score_spacing_mm < np.inf, "score_spacing_mm", "finite and >= 0"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise PipelineConfigError(
                    f"{name} must be {expected}, got {getattr(self, name)}"
                )
