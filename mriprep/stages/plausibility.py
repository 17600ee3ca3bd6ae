"""Plausibility: refuse an input that no pipeline can serve, before the costly stages.

A conform pipeline has no template to disagree with, so without these checks it caches a
macaque brain, a sheared header or a volume of pure noise as if they were human heads.
The stage measures four things on the input as stored (after sanitize, so that extreme
voxels cannot move a statistic), reports every measure in its metrics, and fails the
subject naming each check that is broken with its value. A check listed in ``warn`` is
reported as a warning instead. The fifth plausibility check, how much of the *output*
grid the head covers, needs the output, and lives in the validate stage
(``min_head_coverage``).

``voxel_size``
    The voxel sides (mm) from the affine. Human MRI is acquired at 0.5-6 mm; a side
    outside ``min_voxel_mm``-``max_voxel_mm`` is a header in the wrong unit or a
    non-human (microscopy, ex-vivo) image.
``shear``
    The largest departure from 90 degrees between two voxel axes of the affine. A
    scanner grid is orthogonal; a sheared sform (a converter's bug, a CT gantry tilt
    written into an MR series) would make every resampled grid follow it.
``no_head``
    Two measures of "an object against air". ``large_scale_share``: the share of the
    image's variance that survives smoothing at 8 mm (a head is one large structure,
    noise has none). ``background_share``: the share of the field of view darker than
    a tenth of the bright end (a head scan always has air around the head).
``head_size``
    The length of the head or brain (its largest principal extent, measured as the
    register stage measures it: :func:`mriprep.stages.registration.checks.head_shape` on an
    8 mm level) against the human range, and its smallest extent (a slab or a crop is
    thin in one direction).

The stage also measures, per voxel axis, the resolution the data actually carry
(:func:`mriprep.stages.acquired_resolution.acquired_resolution`): an axis whose header
claims at least :data:`~mriprep.stages.acquired_resolution.CLAIMED_FINER_RATIO` times
finer voxels than its data hold (a scan interpolated onto a finer grid than it was
acquired on) is a warning, never a refusal: the scan is usable, at its true resolution.

Each limit sits in the gap between good scans and failures of the calibration set, with
the good side's margin the larger (a new scanner's good scan is likelier than a new
failure to fall just outside), except shear's (about a voxel at the head's edge). The
limits are defined, with their measured ranges, in :class:`PlausibilityParams`; the full
table: ``make bench`` (``benchmarks/bench_plausibility.py``); docs/benchmarks.md, "Input
plausibility".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from nibabel.affines import voxel_sizes
from scipy import ndimage

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.volume import Volume
from mriprep.stages import StageOutput, stage
from mriprep.stages.acquired_resolution import CLAIMED_FINER_RATIO, acquired_resolution
from mriprep.stages.intensity import all_finite
from mriprep.stages.qc_declaration import REFUSAL_CAUSES, QCMetric, StageQC
from mriprep.stages.registration.checks import HUMAN_HEAD_LENGTH_MM, head_length_reason, head_shape
from mriprep.stages.registration.pyramid import HEAD_FRACTION, build_levels

# Every check of this stage, in the order its message names them.
CHECKS = ("voxel_size", "shear", "no_head", "head_size")
# The level the head's shape is measured on: the register stage's search level, so that
# both stages measure the same length.
_SHAPE_LEVEL_MM = 8.0
# The level the variance measures use, and the smoothing that keeps "large" structure.
_STRUCTURE_LEVEL_MM = 4.0
_STRUCTURE_SIGMA_MM = 8.0


@dataclass(frozen=True)
class PlausibilityParams:
    """Parameters of the plausibility stage.

    Each limit with its measured range on the calibration set, good scans / failures
    (docs/benchmarks.md, "Input plausibility").

    Attributes
    ----------
    min_voxel_mm, max_voxel_mm : float
        Plausible voxel sides of a human MRI scan. Good 0.9-5.0 / headers in the wrong
        unit 0.1 and 10.
    max_shear_deg : float
        Largest departure from right angles between the voxel axes. 0.5 degrees shifts
        a point 128 mm from the centre by 1.1 mm, about a voxel. Good 0 / sheared sforms
        3 and 10.
    min_large_scale_share : float
        Least share of the variance at scales above 8 mm. Good 0.67-0.76 / noise 0.017,
        blank 0.
    min_background_share : float
        Least share of the field of view that is air. Good 0.52-0.62 / noise and blank 0,
        a 64 mm crop 0.0002.
    min_head_length_mm, max_head_length_mm : float
        The human range of the head's (or brain's) length, as the register stage has it.
        Good 186-291 / macaque 82, a head at 0.45 scale 135, voxel sizes x10 2801.
    min_head_width_mm : float
        Least smallest extent of the head or brain. Good 145-199 / 40 mm slabs 49-50, top
        thirds 71-85, macaque 57, the small head 86.
    warn : tuple of str
        Checks (of ``voxel_size``, ``shear``, ``no_head``, ``head_size``) that only warn.
    """

    min_voxel_mm: float = 0.2
    max_voxel_mm: float = 8.0
    max_shear_deg: float = 0.5
    min_large_scale_share: float = 0.2
    min_background_share: float = 0.1
    min_head_length_mm: float = HUMAN_HEAD_LENGTH_MM[0]
    max_head_length_mm: float = HUMAN_HEAD_LENGTH_MM[1]
    min_head_width_mm: float = 110.0
    warn: tuple[str, ...] = ()

    def __post_init__(self):
        problems = []
        if not 0 < self.min_voxel_mm < self.max_voxel_mm:
            problems.append(f"need 0 < min_voxel_mm < max_voxel_mm, got "
                            f"{self.min_voxel_mm} and {self.max_voxel_mm}")
        if not 0 <= self.max_shear_deg < 90:
            problems.append(f"max_shear_deg must lie in [0, 90), got {self.max_shear_deg}")
        for name in ("min_large_scale_share", "min_background_share"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"{name} is a share and must lie in [0, 1), got "
                                f"{getattr(self, name)}")
        if not 0 <= self.min_head_length_mm < self.max_head_length_mm:
            problems.append(f"need 0 <= min_head_length_mm < max_head_length_mm, got "
                            f"{self.min_head_length_mm} and {self.max_head_length_mm}")
        unknown = sorted(set(self.warn) - set(CHECKS))
        if unknown:
            problems.append(f"warn names unknown check(s) {unknown}; the checks are "
                            f"{', '.join(CHECKS)}")
        if problems:
            raise PipelineConfigError("plausibility: " + "; ".join(problems))


def shear_deg(affine: np.ndarray) -> float:
    """The largest departure from 90 degrees between two voxel axes of ``affine``.

    Examples
    --------
    >>> sheared = np.eye(4)
    >>> sheared[0, 1] = np.tan(np.radians(10))
    >>> round(shear_deg(sheared), 6)
    10.0
    """
    axes = np.asarray(affine, dtype=np.float64)[:3, :3]
    axes = axes / np.linalg.norm(axes, axis=0)
    worst = 0.0
    for a, b in itertools.combinations(range(3), 2):
        cosine = float(np.clip(axes[:, a] @ axes[:, b], -1.0, 1.0))
        worst = max(worst, abs(90.0 - float(np.degrees(np.arccos(cosine)))))
    return worst


def _levels(volume: Volume):
    """The shape level (8 mm) and the structure level (4 mm), the coarser built from the
    finer: one pass over the full-resolution voxels. Neither is finer than the volume's
    largest voxel side: a header claiming 10 mm voxels would otherwise be upsampled into
    billions of voxels."""
    coarsest = float(voxel_sizes(volume.affine).max())
    shape_mm = max(_SHAPE_LEVEL_MM, coarsest)
    structure_mm = max(_STRUCTURE_LEVEL_MM, coarsest)
    if structure_mm == shape_mm:
        (level,) = build_levels(volume, (shape_mm,))
        return level, level
    shape_level, structure_level = build_levels(volume, (shape_mm, structure_mm))
    return shape_level, structure_level


def structure_measures(level) -> dict[str, float]:
    """``large_scale_share`` and ``background_share`` (module doc) of a level."""
    usable = level.mask
    values = level.data[usable].astype(np.float64)
    if values.size < 2 or float(values.var()) == 0.0:
        return {"large_scale_share": 0.0, "background_share": 0.0}
    sigma = _STRUCTURE_SIGMA_MM / level.spacing_mm
    # Normalised convolution: invalid voxels lend nothing to the smoothed image.
    weight = ndimage.gaussian_filter(usable.astype(np.float64), sigma)
    smooth = ndimage.gaussian_filter(np.where(usable, level.data, 0.0).astype(np.float64),
                                     sigma)
    inside = usable & (weight > 0.1)
    smooth = smooth[inside] / weight[inside]
    bright = float(np.percentile(values, 99))
    air = values <= HEAD_FRACTION * bright if bright > 0 else np.ones(values.shape, bool)
    return {
        "large_scale_share": float(smooth.var() / values.var()),
        "background_share": float(np.count_nonzero(air) / values.size),
    }


def measure(volume: Volume) -> dict:
    """Every measure of this stage on ``volume`` (finite data)."""
    shape_level, structure_level = _levels(volume)
    shape = head_shape(shape_level)
    sides = voxel_sizes(volume.affine)
    resolution = acquired_resolution(volume.data, tuple(sides), volume.valid)
    return {
        "voxel_size_mm": [round(float(s), 4) for s in sides],
        "acquired_resolution_mm": list(resolution.sizes_mm),
        "acquired_resolution_ratio": max(resolution.ratios),
        "falsely_fine_axes": list(resolution.falsely_fine_axes()),
        "acquired_resolution_marks": list(resolution.marks),
        "shear_deg": shear_deg(volume.affine),
        **structure_measures(structure_level),
        "head_length_mm": None if shape is None else round(shape.length_mm, 1),
        "head_extents_mm": None if shape is None else [round(e, 1) for e in shape.extents_mm],
        "head_volume_ml": None if shape is None else round(shape.volume_ml, 1),
    }


def broken_checks(measures: dict, params: PlausibilityParams) -> dict[str, str]:
    """Check name -> sentence naming the measured value, for every broken check."""
    broken: dict[str, str] = {}
    sides = measures["voxel_size_mm"]
    if min(sides) < params.min_voxel_mm or max(sides) > params.max_voxel_mm:
        broken["voxel_size"] = (
            f"voxel size {' x '.join(f'{s:g}' for s in sides)} mm lies outside the "
            f"plausible {params.min_voxel_mm:g}-{params.max_voxel_mm:g} mm of human MRI: "
            "the header's voxel sizes are in the wrong unit, or this is not an in-vivo "
            "human scan; fix the header (pixdim and the affine)")
    if measures["shear_deg"] > params.max_shear_deg:
        broken["shear"] = (
            f"the affine is sheared: two voxel axes meet {measures['shear_deg']:.2f} "
            f"degrees away from a right angle (at most {params.max_shear_deg:g} allowed); "
            "a scanner grid is orthogonal, so the header (sform) is wrong: rewrite it "
            "from the qform or the scanner's DICOM geometry")
    large, air = measures["large_scale_share"], measures["background_share"]
    if large < params.min_large_scale_share or air < params.min_background_share:
        broken["no_head"] = (
            f"the image shows no head: {large:.0%} of its variance lies at scales above "
            f"8 mm (a head scan has 60-80%, at least {params.min_large_scale_share:.0%} "
            f"needed) and {air:.0%} of its field of view is air (at least "
            f"{params.min_background_share:.0%} needed); it is noise, blank, or a crop "
            "from inside the head")
    length = measures["head_length_mm"]
    if length is None:
        broken.setdefault("no_head", "nothing in the image is brighter than its "
                                     "background: it shows no head")
    else:
        extents = measures["head_extents_mm"]
        size = " x ".join(f"{e:.0f}" for e in extents)
        if not params.min_head_length_mm <= length <= params.max_head_length_mm:
            broken["head_size"] = head_length_reason(
                length, extents, (params.min_head_length_mm, params.max_head_length_mm))
        elif extents[-1] < params.min_head_width_mm:
            broken["head_size"] = (
                f"the head or brain in the image is only {extents[-1]:.0f} mm across in "
                f"its thinnest direction (principal extents {size} mm; at least "
                f"{params.min_head_width_mm:g} needed): the scan holds a slab or a crop of "
                "the head, not the whole brain")
    return broken


def falsely_fine_warning(measures: dict) -> str | None:
    """The warning for the axes whose header claims at least
    :data:`~mriprep.stages.acquired_resolution.CLAIMED_FINER_RATIO` times finer voxels
    than the data hold, naming each with its claimed and measured size and the fix; None
    when there are none."""
    axes = measures.get("falsely_fine_axes") or []
    if not axes:
        return None
    claimed, acquired = measures["voxel_size_mm"], measures["acquired_resolution_mm"]
    marks = measures.get("acquired_resolution_marks") or [""] * 3
    how = {"notch": "the zero a linear or cubic interpolator leaves in its spectrum",
           "cliff": "its spectrum ending as a zero-filled (sinc) reconstruction's does",
           "empty band": "its spectrum rolling off into an empty band, as an interpolation "
                         "stored in few levels does"}
    parts = [f"voxel axis {a} claims {claimed[a]:g} mm but carries about "
             f"{acquired[a]:.2g} mm ({how.get(marks[a], 'its spectrum')})" for a in axes]
    true = " x ".join(f"{max(c, q):.2g}" for c, q in zip(claimed, acquired))
    return (
        f"acquired_resolution: the scan was written on a grid at least "
        f"{CLAIMED_FINER_RATIO:g}x finer than it was acquired on: {'; '.join(parts)}. "
        f"Its voxels are interpolated, not measured: use its true resolution ({true} mm), "
        "e.g. as the voxel size to conform to, or re-export the scan at its acquired "
        "resolution")


# A refusal names every check that failed (the demo's referee compares them with the
# causes it planted). The QC report shows how much finer the header claims than the data
# hold: a property of the input, not judged against the cohort (the stage warns from
# CLAIMED_FINER_RATIO on).
_QC = StageQC(
    metrics=(QCMetric(
        "acquired_resolution_ratio", "claimed finer",
        "largest ratio over the voxel axes of the resolution the data carry to the one the "
        f"header claims: 1 when the header is true, {CLAIMED_FINER_RATIO:g} or more when "
        "the scan was written on a finer grid than it was acquired on (a warning)",
        key="acquired_resolution_ratio", unit="x", judge="none", column=True, fmt=".2f",
        bounds=(1.0, None)),),
    readings={REFUSAL_CAUSES: lambda m: list(m.get("failed_checks", []))},
)


@stage("plausibility", PlausibilityParams, qc=_QC)
def plausibility(volume: Volume, params: PlausibilityParams) -> StageOutput:
    """Measure the input and refuse it if it cannot be a human head scan.

    Parameters
    ----------
    volume : Volume
        The input, sanitised (finite data; filled voxels invalid).
    params : PlausibilityParams

    Returns
    -------
    StageOutput
        The volume unchanged; metrics: every measure of :func:`measure`, and the checks
        that only warned; warnings: those checks, and the axes whose header claims at
        least 1.5x finer voxels than the data hold (:func:`falsely_fine_warning`).

    Raises
    ------
    StageError
        Naming every broken check not listed in ``warn``, each with its value; the
        metrics travel with it.
    """
    if not all_finite(volume.data):
        raise StageError(
            "plausibility",
            "the image holds NaN or infinite voxels; run the 'sanitize' stage before "
            "'plausibility'",
            volume.name,
        )
    metrics = measure(volume)
    broken = broken_checks(metrics, params)
    failed = {name: text for name, text in broken.items() if name not in params.warn}
    metrics["failed_checks"] = sorted(failed)
    metrics["warned_checks"] = sorted(set(broken) - set(failed))
    if failed:
        raise StageError(
            "plausibility",
            "; ".join(f"{name}: {failed[name]}" for name in CHECKS if name in failed),
            volume.name,
            metrics=metrics,
        )
    warnings = [f"{name}: {broken[name]}" for name in CHECKS if name in broken]
    resolution = falsely_fine_warning(metrics)
    if resolution is not None:
        warnings.append(resolution)
    return StageOutput(volume, metrics, warnings)
