"""The register stage's parameters and its result record.

They live beside the backends, which read the parameters, so that the backends need not
import the stage (the stage imports them). Every limit's measured range is in
docs/benchmarks.md, section "Registration".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mriprep.core.errors import PipelineConfigError
from mriprep.stages.registration.checks import HEAD_SCALE_RANGE, REGISTER_HEAD_LENGTH_MM, Limits

__all__ = ["OUTPUT_TRANSFORMS", "RegisterParams", "RegistrationResult"]

# What the output may apply of the fit (RegisterParams.transform).
OUTPUT_TRANSFORMS = ("rigid", "similarity", "affine")


@dataclass(frozen=True)
class RegisterParams:
    """Parameters of the register stage.

    Attributes
    ----------
    backend : {"sitk", "ants"}
        ``"sitk"``: SimpleITK, a 12-parameter affine on every level (correlation, over
        the brain's interior), regular step gradient descent, from the search's start.
        ``"ants"``: ``ants.registration`` (antsRegistration: a Rigid stage by Mattes MI,
        then an Affine stage by global correlation, ``--float 1``) on the same prepared
        images and masks, but for the finest level's flattening: ANTs runs every level
        in one call, so its finest level keeps the field estimated over the whole head.
    transform : {"rigid", "similarity", "affine"}
        What the output applies of the fit. The fit always estimates the head's size and
        proportions (an affine, 12 degrees of freedom), since another person's brain
        overlaps the template only at its own size and shape. ``"rigid"`` (the default)
        keeps the subject's anatomy as it is: the rotation of the fit (its polar
        factor), placed so that the template brain's centre lands where the fit puts it.
        ``"similarity"`` also applies the fit's isotropic size (the cube root of its
        determinant), so that every brain has the template's volume; ``"affine"``
        applies the whole fit, so that every brain has the template's size and
        proportions.
    template : str
        The built-in template name (``"mni152"``) or the path of a template image.
    template_brain_mask : str or None
        The template's brain mask (an image on the template's grid, non-zero inside the
        brain), given with a user template; relative paths are relative to the pipeline
        file. None derives it: nilearn's mask for MNI152, the bright filled head for a
        user template (see :func:`mriprep.stages.registration.template.template_brain_mask`).
    threads : int
        ITK threads for the registration. With 1, results are bit-identical from run to
        run; with more they agree to ~1e-15 relative (see the module notes).
    seed : int
        Seed of the metric's random sampling. ITK reads 0 as "seed from the wall
        clock", so 0 is refused.
    level_spacings_mm : tuple of 3 floats
        Voxel size of each resolution level, coarse to fine. Repeated values are run
        once (``(4.0, 2.0, 2.0)`` is a two-level pyramid).
    sampling_fraction : float
        Share of the fixed mask's voxels the metric samples on the coarse levels and in
        the search's ranking (0, 1].
    fine_sampling_fraction : float
        The same share on the finest level, for the fit's last pass (0, 1]. A tenth
        over-determines 12 parameters, but each sample's noise and interpolation error
        moves the optimum, and a small or smooth head (ROBEX's) gives the fit fewer
        edges to hold on to: the default draws as many points as the interior has
        voxels. Accuracy over time (issue 43): it costs the registration most of its
        time again; what each value measured is in docs/benchmarks.md, "Registration".
    histogram_bins : int
        Joint-histogram bins of Mattes mutual information.
    max_iterations : int
        Optimiser iterations per level, at most.
    bias_sigma_mm : float
        Width of the smoothing that estimates the bias field divided out before
        registration; 0 disables the flattening.
    brain_margin_mm : float
        Dilation of the template brain mask used as the fixed metric mask.
    search_spacing_mm : float
        Voxel size of the global search over the 24 axis-aligned orientations and all
        positions (see :mod:`mriprep.stages.registration.search`); 0 skips it and starts from
        aligned centres of mass.
    search_candidates : int
        The best orientations of the search that a short registration on the coarsest
        level ranks by mutual information; the best goes on.
    min_similarity : float
        A registration whose post-check correlation (template vs registered subject over
        the template brain) falls below this fails the subject. Measured: good scans
        0.63-0.83, failures -0.01-0.24 (docs/benchmarks.md, "failure detection").
    min_overlap : float
        Share of the template brain that must land on valid voxels of the registered
        subject. Measured: good scans 0.998-1, failures 0.37-0.62 (same run).
    max_rotation_deg : float
        A registration that turns the scan further from its header's orientation fails
        it: the header is wrong (heads lie within about 30 degrees of upright).
        Measured: good scans 3.6-23.5 degrees, header errors 81-178 (same run).
    min_head_length_mm, max_head_length_mm : float
        Plausible lengths of a human head or brain in the image (its largest principal
        extent), checked before registration.
    min_head_scale, max_head_scale : float
        Plausible sizes of the registered brain relative to the template's, along each of
        the fit's principal axes (its singular values; their geometric mean is the
        ``head_scale`` metric).
    min_search_ncc : float
        An image in which the template brain correlates less than this with the scan at
        every orientation and position of the search holds no brain. Measured: good
        scans 0.55-0.84, failures 0.23-0.48 (same run).
    """

    backend: Literal["sitk", "ants"] = "sitk"
    transform: Literal["rigid", "similarity", "affine"] = "rigid"
    template: str = "mni152"
    template_brain_mask: str | None = None
    threads: int = 1
    seed: int = 1
    level_spacings_mm: tuple[float, float, float] = (4.0, 2.0, 2.0)
    sampling_fraction: float = 0.25
    fine_sampling_fraction: float = 1.0
    histogram_bins: int = 32
    max_iterations: int = 200
    bias_sigma_mm: float = 20.0
    brain_margin_mm: float = 5.0
    search_spacing_mm: float = 8.0
    search_candidates: int = 3
    min_similarity: float = 0.4
    min_overlap: float = 0.85
    max_rotation_deg: float = 45.0
    min_head_length_mm: float = REGISTER_HEAD_LENGTH_MM[0]
    max_head_length_mm: float = REGISTER_HEAD_LENGTH_MM[1]
    min_head_scale: float = HEAD_SCALE_RANGE[0]
    max_head_scale: float = HEAD_SCALE_RANGE[1]
    min_search_ncc: float = 0.45

    def __post_init__(self):
        problems = []
        if self.threads < 1:
            problems.append(f"threads must be at least 1, got {self.threads}")
        if self.seed < 1:
            problems.append(
                f"seed must be at least 1, got {self.seed} (ITK reads 0 as 'seed from the "
                "wall clock', which would make registration irreproducible)"
            )
        spacings = tuple(float(s) for s in self.level_spacings_mm)
        if len(spacings) != 3 or min(spacings) <= 0:
            problems.append(
                f"level_spacings_mm must be three positive voxel sizes, got {spacings}"
            )
        elif list(spacings) != sorted(spacings, reverse=True):
            problems.append(
                f"level_spacings_mm must go from coarse to fine, got {spacings}"
            )
        for name in ("sampling_fraction", "fine_sampling_fraction"):
            if not 0 < getattr(self, name) <= 1:
                problems.append(f"{name} must lie in (0, 1], got {getattr(self, name)}")
        if self.histogram_bins < 4:
            problems.append(f"histogram_bins must be at least 4, got {self.histogram_bins}")
        if self.max_iterations < 1:
            problems.append(f"max_iterations must be at least 1, got {self.max_iterations}")
        if self.bias_sigma_mm < 0 or self.brain_margin_mm < 0:
            problems.append("bias_sigma_mm and brain_margin_mm must not be negative")
        if not 0 <= self.min_similarity <= 1:
            problems.append(
                f"min_similarity is a correlation and must lie in [0, 1], got "
                f"{self.min_similarity}"
            )
        if not 0 < self.min_overlap <= 1:
            problems.append(f"min_overlap must lie in (0, 1], got {self.min_overlap}")
        if not 0 < self.max_rotation_deg <= 180:
            problems.append(
                f"max_rotation_deg must lie in (0, 180], got {self.max_rotation_deg}")
        if not 0 <= self.min_head_length_mm < self.max_head_length_mm:
            problems.append(
                f"head length limits must satisfy 0 <= min < max, got "
                f"{self.min_head_length_mm} and {self.max_head_length_mm}")
        if not 0 < self.min_head_scale < 1 < self.max_head_scale:
            problems.append(
                f"head scale limits must satisfy 0 < min < 1 < max, got "
                f"{self.min_head_scale} and {self.max_head_scale}")
        if self.transform not in OUTPUT_TRANSFORMS:
            problems.append(
                f"transform must be one of {', '.join(OUTPUT_TRANSFORMS)}, got "
                f"{self.transform!r}")
        if not -1 <= self.min_search_ncc <= 1:
            problems.append(
                f"min_search_ncc is a correlation and must lie in [-1, 1], got "
                f"{self.min_search_ncc}")
        if self.search_spacing_mm < 0:
            problems.append(
                f"search_spacing_mm must be 0 (no search) or positive, got "
                f"{self.search_spacing_mm}")
        elif self.search_spacing_mm and self.search_spacing_mm < max(self.level_spacings_mm):
            problems.append(
                f"search_spacing_mm ({self.search_spacing_mm}) must be at least the "
                f"coarsest level ({max(self.level_spacings_mm)}): the search is the "
                "coarsest step")
        if self.search_candidates < 1:
            problems.append(
                f"search_candidates must be at least 1, got {self.search_candidates}")
        if problems:
            raise PipelineConfigError("register: " + "; ".join(problems))
        object.__setattr__(self, "level_spacings_mm", spacings)

    @property
    def levels(self) -> tuple[float, ...]:
        """The distinct level spacings, coarse to fine."""
        return tuple(dict.fromkeys(self.level_spacings_mm))

    @property
    def limits(self) -> Limits:
        return Limits(self.min_head_length_mm, self.max_head_length_mm,
                      self.min_search_ncc, self.min_overlap, self.min_similarity,
                      self.max_rotation_deg, self.min_head_scale, self.max_head_scale)


@dataclass(frozen=True)
class RegistrationResult:
    """What a registration found, in both world conventions.

    ``template_to_subject`` is what the output applies (RAS+, nibabel's convention, the
    one Volume uses): the fit's rigid part, or the fit itself (see
    :attr:`RegisterParams.transform`). ``fitted`` is the whole fit, with the head's
    size and proportions; ``head_scale`` that size relative to the template's (the cube
    root of the fit's determinant) and ``head_axis_scales`` the sizes along the fit's
    principal axes, largest first. ``itk_type`` and
    ``itk_parameters``/``itk_fixed_parameters`` describe ``template_to_subject`` as an
    ITK transform in LPS (``Euler3DTransform`` when rigid, else ``AffineTransform``),
    from which a ``.tfm`` file can be rebuilt.
    """

    template_to_subject: np.ndarray
    fitted: np.ndarray
    head_scale: float
    head_axis_scales: tuple[float, float, float]
    itk_type: str
    itk_parameters: tuple[float, ...]
    itk_fixed_parameters: tuple[float, ...]
    metric_value: float
    stop_condition: str
    iterations: tuple[int, ...]
    similarity: float
    overlap: float
    seconds: float
    backend: str
    level_spacings_mm: tuple[float, ...]
    details: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, Any]:
        """The record the stage stores in provenance."""
        return {
            "backend": self.backend,
            "template_to_subject": self.template_to_subject.tolist(),
            "fitted_template_to_subject": self.fitted.tolist(),
            "head_scale": round(self.head_scale, 4),
            "head_axis_scales": [round(s, 4) for s in self.head_axis_scales],
            "itk_transform": {
                "type": self.itk_type,
                "convention": "LPS, maps template points to subject points",
                "parameters": list(self.itk_parameters),
                "fixed_parameters": list(self.itk_fixed_parameters),
            },
            "metric": "correlation",
            "metric_value": self.metric_value,
            "stop_condition": self.stop_condition,
            "iterations": list(self.iterations),
            "level_spacings_mm": list(self.level_spacings_mm),
            "similarity": self.similarity,
            "overlap": self.overlap,
            "seconds": self.seconds,
            **self.details,
        }
