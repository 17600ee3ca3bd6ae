"""Register: registration of a subject to a template, in float precision.

The stage estimates the transform that maps the template's world onto the subject's
(``template_to_subject``, RAS+ mm) and does not resample: it stores the transform in
``Volume.pending`` with the template's grid, and the resample stage applies transform and
change of grid in one interpolation.

How it works, and why
---------------------
* **A coarse pyramid** (``level_spacings_mm``, default 4 then 2 mm; the template's built
  once per process). The subject's levels are built by normalised convolution, so
  invalid voxels lend no intensity to their neighbours, and the values next to invalid
  voxels are continued from the valid ones (the metric's interpolation and gradient read
  them); thick-slice axes are upsampled to the level spacing, which keeps the metric's
  gradient consistent across thick slices, and a short run of missing slices is bridged
  the same way, between the slices either side, so that a gap does not change which
  part of the head the fit sees. 2 mm voxels already over-determine the
  parameters: there is no 1 mm level.
* **Bias-field flattening.** Both images are divided by their own heavily smoothed
  version (``bias_sigma_mm``): a smooth bias field was mutual information's largest error
  source. A receive field too strong for that (a surface coil, 7T) is divided out by N4
  on the 8 mm level before the search; the cached image is untouched. Voxels far
  brighter than any tissue once the field is gone (a spike slice that slice masking
  missed) leave the metric. On the finest level (SimpleITK backend, with a coarser level
  before it) the subject's field is estimated within the template brain that the
  coarser level's fit places, as MNI152's is (nilearn ships it brain-extracted): over
  the whole head, a face or scalp that defacing or skull stripping took away from one
  scan and not another changed the flattened brain near it. The checks still read the
  finest level flattened over the whole head, on which their limits were measured.
* **A brain-focused metric.** The fixed mask is the template's brain dilated by
  ``brain_margin_mm`` for the search's ranking, and the brain's interior for the fit
  (scalp, neck, and the brain's edge that skull stripping and defacing change differ
  most between scans of one head); the moving mask is the subject's ``valid``; the
  rotation centre is the template brain's centre of mass, which decouples rotation from
  translation.
* **Deterministic sampling.** ``sampling_fraction`` (``fine_sampling_fraction`` on the
  finest level) of the fixed mask's voxels, drawn once per level with ``seed``, so the
  step-halving optimiser converges to 1 um steps.
* **Each head at its own size and shape.** The search tries the template brain at
  several sizes; the fit is a 12-parameter affine on every level over the brain's
  interior (:mod:`~mriprep.stages.registration.sitk_backend`), and the checks judge it.
  The output applies its rotation (``transform="rigid"``), the rotation with the
  isotropic size (``"similarity"``) or the whole fit (``"affine"``).
* **A refusal is retried first.** A fit refused for its similarity, overlap or size
  (:data:`RETRIED_CAUSES`) may sit in a wrong basin: the stage registers again with a
  wider search before it refuses, and records that it did.

Precision: both backends compute the metric on float32 images and keep the transform in
double precision, as ITK does. With one thread (the default; the runner parallelises
across subjects) the same input, ``seed`` and parameters give bit-identical transforms
(tested); with more, ITK's threaded sums change order and repeated runs agree only to
rounding. ANTsPy reads its thread count once per process; the count in effect is
recorded as ``ants_threads``.

Failure detection (docs/design.md, "Registration knows when it failed"): a local
optimiser converges wherever it starts, so a global search
(:mod:`~mriprep.stages.registration.search`) gives the start, and a scan whose header is
wrong still registers, the rotation it needed naming the error; then
:func:`~mriprep.stages.registration.checks.diagnose` names the first check that fails.
A left-right flip cannot be detected against nilearn's MNI152 2009 template: it is its
own mirror image.

Measured (accuracy, time, every check's ranges, and the figures behind the choices
above): ``make bench`` (registration); docs/benchmarks.md, "Registration".
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from mriprep.core.errors import StageError
from mriprep.core.volume import PendingTransform, Volume
from mriprep.stages import StageOutput, stage
from mriprep.stages.qc_declaration import (
    REFUSAL_CAUSES,
    TEMPLATE_TO_SUBJECT,
    QCMetric,
    StageQC,
)
from mriprep.stages.registration.ants_backend import register_ants
from mriprep.stages.registration.params import RegisterParams, RegistrationResult
from mriprep.stages.registration.checks import (
    STRIPPED_SCALP_SHARE,
    brain_overlap,
    diagnose,
    head_shape,
    scalp_share,
    template_similarity,
)
from mriprep.stages.registration.geometry import (
    RAS_TO_LPS,
    decompose_linear,
    euler_from_matrix,
    itk_transform_text,
    output_transform,
    ras_to_lps,
)
from mriprep.stages.registration.pyramid import (
    Level,
    build_levels,
    centre_of_mass,
    corrected_levels,
    flattened,
    without_bright_outliers,
)
from mriprep.stages.registration.search import (
    SEARCH_SCALES,
    SEARCH_TILTS_DEG,
    SubjectSearch,
    orientation_index,
    rotation_angle_deg,
    search_poses,
    template_windows,
)
from mriprep.stages.registration.sitk_backend import rank_starts, register_sitk
from mriprep.stages.registration.template import (
    search_reach,
    template_pyramid,
    template_search_level,
    template_brain_distance,
    template_brain_points,
    template_brain_region,
    template_scalp,
    template_search_windows,
    template_shape_levels,
    template_tilted_windows,
)

__all__ = ["RegisterParams", "RegistrationResult", "prepare_template", "register",
           "register_volume"]

# The transform an entry stores next to its tensors, in ITK's format (any ITK/ANTs tool
# reads it, e.g. to apply it to another image of the subject).
TRANSFORM_FILE = "transform.tfm"

_BACKENDS = {"sitk": register_sitk, "ants": register_ants}
# Whether a backend fits level by level: then its finest level is the one flattened
# within the template brain that the coarser levels' fit places (_BrainFlattening), and the
# wide retry can fit the coarser levels from each start and the finest from the best of
# them alone (_best_start_then_finest). ANTs runs every level of each of its stages in
# one call (ants_backend's docstring): its retry fits every start fully.
_FITS_LEVEL_BY_LEVEL = {"sitk": True, "ants": False}
# The metric mask of the fit's affine part: the template brain shrunk by 10 mm (see
# template_shape_levels). The brain's edge is where a whole head and its skull-stripped
# copy differ; how far apart their transforms land, by margin (2026-12-02, mean mm,
# synthetic people's BET-like copies / the real Colin27 ch2 against ch2bet): +5 mm
# 0.56-0.64 / -, 0 0.23 / -, -3 0.12 / -, -5 0.08-0.10 / 0.20-0.24, -8 0.06-0.09 /
# 0.13-0.16, -10 0.05 / 0.10-0.11, -12 0.05 / 0.15. Consistency across poses was best
# at -10 too (0.01-0.02 mm on Colin27).
SHAPE_MARGIN_MM = -10.0
# Where the finest level's bias field is estimated: the template brain placed by the
# coarser level's fit, grown by this margin (see _BrainFlattening). 0: the brain's own edge,
# where MNI152's image ends; not tuned (the one value measured).
BRAIN_REGION_MARGIN_MM = 0.0


def prepare_template(params: RegisterParams) -> None:
    """Build the template's pyramid for ``params`` now (it is cached per process).

    The first registration in a process otherwise pays for it (timed: docs/benchmarks.md,
    "Registration"); a worker or a benchmark can call this once up front.
    """
    _template_pyramid_for(params)
    template_brain_distance(params.template, params.levels[-1], params.template_brain_mask)


def _template_pyramid_for(params: RegisterParams):
    return template_pyramid(
        params.template, params.levels, params.bias_sigma_mm, params.brain_margin_mm,
        params.template_brain_mask,
    )


def register_volume(volume: Volume, params: RegisterParams,
                    wide: bool = False) -> RegistrationResult:
    """Register ``volume`` to ``params.template`` (pose, size and shape); no
    resampling.

    The steps: the subject's levels (search level, then the registration levels); the
    head's length; the global search over orientations and positions; a short
    registration on the coarsest level from each of the best ``search_candidates``,
    ranked by mutual information; the backend's fit from the best; the post-checks'
    similarity, overlap and rotation. Nothing is judged here:
    :func:`~mriprep.stages.registration.checks.diagnose` does that on the result's measures.

    Parameters
    ----------
    volume : Volume
        Finite data (run sanitize first); ``valid`` marks the voxels the metric may use.
    params : RegisterParams
    wide : bool
        The wider search the stage retries with before it refuses a scan: more
        candidates (:data:`WIDE_CANDIDATE_FACTOR`), tilts of :data:`WIDE_TILTS_DEG`, the
        coarser levels fitted from each of the :data:`WIDE_FITS` best distinct starts,
        and the finest level from the one whose fit correlates best with the template
        there (``wide_coarse_similarities``).

    Returns
    -------
    RegistrationResult
        The transform (RAS+ 4x4 and ITK parameters), final metric, stop condition,
        iterations per level, post-check similarity and overlap, seconds, and in
        ``details`` the search's and the head's measures.

    Raises
    ------
    StageError
        Non-finite input, or no valid voxel to register.
    """
    start = time.perf_counter()
    if not np.isfinite(volume.data).all():
        bad = int(np.count_nonzero(~np.isfinite(volume.data)))
        raise StageError(
            "register",
            f"{bad} voxel(s) are NaN or infinite; ITK and ANTs cannot register them: "
            "run the 'sanitize' stage before 'register'",
            volume.name,
        )
    if not volume.valid.any():
        raise StageError(
            "register", "no voxel is valid, nothing to register", volume.name
        )
    fixed, brains, centre = _template_pyramid_for(params)
    search = params.search_spacing_mm
    raw = build_levels(volume, ((search,) if search else ()) + params.levels)
    raw, field_ratio = corrected_levels(raw, params.threads)
    raw, bright = without_bright_outliers(raw)
    moving = flattened(raw[1:] if search else raw, params.bias_sigma_mm)
    shape = head_shape(raw[0])
    details: dict[str, Any] = {
        "head_length_mm": None if shape is None else round(shape.length_mm, 1),
        "head_extents_mm": None if shape is None else [round(e, 1) for e in shape.extents_mm],
        "head_volume_ml": None if shape is None else round(shape.volume_ml, 1),
        "bias_ratio": None if field_ratio is None else round(field_ratio, 2),
        "bright_voxels_excluded": bright,
    }
    centre_lps = RAS_TO_LPS[:3, :3] @ centre
    if search:
        starts, search_details = _search_starts(raw[0], fixed[0], moving[0], centre,
                                                centre_lps, params, wide)
        details.update(search_details)
    else:
        # Aligned centres of mass (the subject's valid voxels, the whole template head).
        initial = np.eye(4)
        initial[:3, 3] = (
            centre_of_mass(moving[0].data, moving[0].affine, moving[0].mask)
            - centre_of_mass(fixed[0].data, fixed[0].affine)
        )
        starts = [initial]
        details["search_orientations"] = None
    shape_fixed = template_shape_levels(params.template, params.levels, params.bias_sigma_mm,
                                        params.brain_margin_mm, SHAPE_MARGIN_MM,
                                        params.template_brain_mask)
    backend = _BACKENDS[params.backend]
    # The similarity judges the fit, at the subject's own size and shape: a rigid fit of a
    # small head correlates with the template as poorly as a failure does. It and the
    # overlap read moving[-1], flattened over the whole head: the checks' limits were
    # measured on it. A wide retry's choice between its starts reads the same kind of
    # level: the coarse one (moving[-2]) where the backend fits level by level, else the
    # finest.
    finest_moving = _BrainFlattening(raw[-1], params)
    if wide and len(moving) > 1 and _FITS_LEVEL_BY_LEVEL[params.backend]:
        found, similarities = _best_start_then_finest(
            backend, fixed, brains, moving, shape_fixed, starts[:WIDE_FITS], centre_lps,
            params, finest_moving)
        details["wide_coarse_similarities"] = similarities
    else:
        fits = [backend(fixed, moving, shape_fixed, ras_to_lps(initial), centre_lps, params,
                        finest_moving) for initial in starts[: WIDE_FITS if wide else 1]]
        found = fits[0]
        if wide:
            similarities = [_similarity(fixed, brains, moving, f, -1) for f in fits]
            found = fits[int(np.argmax(similarities))]
            details["wide_fit_similarities"] = _rounded(similarities)
    details["finest_bias_region"] = finest_moving.region
    fitted = ras_to_lps(found.transform_lps)
    fit_similarity = template_similarity(fixed[-1], brains[-1], moving[-1], fitted)
    share = scalp_share(raw[-1], template_scalp(params.template, params.levels[-1],
                                                params.template_brain_mask),
                        template_brain_points(params.template, 2, params.template_brain_mask),
                        fitted)
    details["scalp_share"] = None if share is None else round(share, 3)
    details["skull_stripped"] = share is not None and share < STRIPPED_SCALP_SHARE
    rotation, head_scale, axis_scales = decompose_linear(fitted)
    # The overlap judges the field of view with the template brain placed rigidly (the
    # default output): the affine part of a fit that went wrong stretches the brain out
    # of a whole head (a T2 scan: 0.84 at the fit, 0.99 placed rigidly), while a slab
    # stays a slab either way (0.37-0.61).
    overlap = brain_overlap(fixed[-1], brains[-1], moving[-1],
                            output_transform(fitted, centre, "rigid"))
    details["rotation_deg"] = round(rotation_angle_deg(rotation), 3)
    template_to_subject = output_transform(fitted, centre, params.transform)
    itk_type, itk_transform = _itk_parameters(template_to_subject, centre_lps,
                                              params.transform)
    return RegistrationResult(
        template_to_subject=template_to_subject,
        fitted=fitted,
        head_scale=head_scale,
        head_axis_scales=tuple(float(a) for a in axis_scales),
        itk_type=itk_type,
        itk_parameters=tuple(float(p) for p in itk_transform.GetParameters()),
        itk_fixed_parameters=tuple(float(p) for p in itk_transform.GetFixedParameters()),
        metric_value=found.metric_value,
        stop_condition=found.stop_condition,
        iterations=tuple(found.iterations),
        similarity=fit_similarity,
        overlap=overlap,
        seconds=time.perf_counter() - start,
        backend=params.backend,
        level_spacings_mm=params.levels,
        details={**details, **found.details},
    )


def _best_start_then_finest(backend, fixed, brains, moving, shape_fixed, starts,
                            centre_lps, params, finest_moving):
    """The wide retry's fit, for a backend that fits level by level: the coarser levels
    from each start, the start whose fit correlates best with the template on the last
    of them kept, and the finest level from that fit alone, on the level flattened
    within the brain it places. Returns the backend's result (iterations, stop
    conditions and level times of both calls, in level order) and each start's
    similarity (None where too few brain voxels landed on the scan).

    Choosing on the coarse level spares a full fit of every start: on a scan that is
    then refused (another contrast, a slab), each of them ran the finest level to its
    iteration cap. For the SimpleITK backend the chosen start's result is the one a
    fit of every level from it gives, to the bit: it fits level by level, and its finest
    level starts from the coarser levels' fit either way.
    """
    coarse = [backend(fixed[:-1], moving[:-1], shape_fixed[:-1], ras_to_lps(initial),
                      centre_lps, params) for initial in starts]
    similarities = [_similarity(fixed, brains, moving, f, -2) for f in coarse]
    best = coarse[int(np.argmax(similarities))]
    found = backend(fixed[-1:], [finest_moving(best.transform_lps)], shape_fixed[-1:],
                    best.transform_lps, centre_lps, params)
    joined = {key: best.details.get(key, []) + found.details.get(key, [])
              for key in ("stop_conditions", "level_seconds")}
    return (dataclasses.replace(found, iterations=best.iterations + found.iterations,
                                details={**found.details, **joined}),
            _rounded(similarities))


def _rounded(similarities: list[float]) -> list[float | None]:
    """Similarities as the record keeps them: 4 decimals, None for one that could not be
    measured."""
    return [round(float(s), 4) if np.isfinite(s) else None for s in similarities]


def _similarity(fixed, brains, moving, found, level: int) -> float:
    """``found``'s correlation with the template on ``level``; a NaN (too few brain
    voxels landed on the scan) ranks below every number."""
    value = template_similarity(fixed[level], brains[level], moving[level],
                                ras_to_lps(found.transform_lps))
    return -np.inf if np.isnan(value) else value


class _BrainFlattening:
    """The finest level as the fit sees it, given the coarser level's fit (template to
    subject, LPS): its bias field estimated within the template's brain that fit places
    (grown by :data:`BRAIN_REGION_MARGIN_MM`), not over the whole head. Where that brain
    holds no valid voxel of the level (a coarse fit placed off the field of view, which
    the overlap check then judges), over the whole head as before. :attr:`region` says
    which of the two the fit used (``"brain"`` or ``"whole head"``; None until asked,
    and for a backend that never asks), and the record keeps it as
    ``finest_bias_region``.

    MNI152 (nilearn's) is brain-extracted, so its flattening sees brain alone; a subject's
    scalp, face and neck are what defacing, skull stripping and the field of view take
    away from one scan of a head and not another, and over the whole head they changed
    the flattened brain near them, and the fit with it (measured: docs/benchmarks.md,
    "Registration", "The finest level flattened within the brain"). The coarser levels
    keep the whole head: placed by the search's start, which is a few mm off and
    differently on each scan, the brain made every level less consistent. A whole-head
    user template is still flattened over its head: with one, the two sides no longer see
    the same tissue on the finest level (not measured; MNI152 is the measured case).
    """

    def __init__(self, raw_finest: Level, params: RegisterParams):
        self.raw_finest, self.params = raw_finest, params
        self.region: str | None = None

    def __call__(self, template_to_subject_lps: np.ndarray) -> Level:
        params = self.params
        region = template_brain_region(
            self.raw_finest, ras_to_lps(template_to_subject_lps), params.template,
            params.levels[-1], BRAIN_REGION_MARGIN_MM, params.template_brain_mask)
        if not (region & self.raw_finest.mask).any():
            region = None
        self.region = "whole head" if region is None else "brain"
        (level,) = flattened([self.raw_finest], params.bias_sigma_mm, [region])
        return level


def _itk_parameters(template_to_subject: np.ndarray, centre_lps: np.ndarray, model: str):
    """The output transform as an ITK transform (LPS): its type name and the transform."""
    import SimpleITK as sitk

    lps = ras_to_lps(template_to_subject)
    if model == "rigid":
        return "Euler3DTransform_double_3_3", euler_from_matrix(lps, centre_lps)
    affine = sitk.AffineTransform(3)
    affine.SetCenter([float(c) for c in centre_lps])
    affine.SetMatrix(lps[:3, :3].ravel().tolist())
    affine.SetTranslation((lps[:3, 3] - centre_lps + lps[:3, :3] @ centre_lps).tolist())
    return "AffineTransform_double_3_3", affine


# Iterations of each short ranking registration on the coarsest level: enough to pull a
# start that the 8 mm search placed within a voxel into its basin.
_RANKING_ITERATIONS = 30
# The wider search a refusal retries with (RegisterParams' search_candidates times this
# many orientations, tilted by each of these angles), and the distinct starts whose
# coarser levels it fits (the best of them goes on to the finest level). A false refusal
# loses a subject from its cohort; the retry costs seconds, and only on a scan that would
# otherwise be refused.
WIDE_CANDIDATE_FACTOR = 3
WIDE_TILTS_DEG = (10.0, 20.0, 30.0)
WIDE_FITS = 4
# Two starts closer than this (degrees, mm) lead the fit to one place: the wide retry
# fits only one of them.
_SAME_START_DEG, _SAME_START_MM = 5.0, 4.0


def _search_starts(search_level, fixed_level, moving_level, centre, centre_lps, params,
                   wide: bool):
    """The starting poses, best first, and the search's measures.

    The 24 orientations are searched first; each of the best ``search_candidates`` is
    then refined by tilts of 20 degrees about each axis (a head lies up to ~30
    degrees from the nearest orientation, beyond the local optimiser's reach); a short
    registration on the coarsest level ranks the refined poses by mutual information
    (which candidate wins on the calibration set: docs/benchmarks.md, "Registration").
    ``wide`` searches more candidates and tilts (:data:`WIDE_CANDIDATE_FACTOR`,
    :data:`WIDE_TILTS_DEG`) and drops starts that repeat a better one.
    """
    template, spacing = params.template, params.search_spacing_mm
    mask = params.template_brain_mask
    search = SubjectSearch(search_level, search_reach(template, spacing, mask),
                           workers=params.threads)
    coarse = search_poses(template_search_windows(template, spacing, mask), search, centre)
    details = {
        "search_orientations": len(coarse),
        "search_best_ncc": round(coarse[0].ncc, 4) if coarse else None,
        "search_second_ncc": round(coarse[1].ncc, 4) if len(coarse) > 1 else None,
    }
    if not coarse:
        # The template brain fits the field of view nowhere: start from the header's
        # orientation; the checks will refuse the result.
        initial = np.eye(4)
        initial[:3, 3] = (centre_of_mass(moving_level.data, moving_level.affine,
                                         moving_level.mask)
                          - centre_of_mass(fixed_level.data, fixed_level.affine))
        return [initial], details
    level, brain, _ = template_search_level(template, spacing, mask)
    candidates = params.search_candidates * (WIDE_CANDIDATE_FACTOR if wide else 1)
    tilt_degrees = WIDE_TILTS_DEG if wide else SEARCH_TILTS_DEG
    starts = []
    for candidate in coarse[:candidates]:
        tilted = search_poses(
            template_tilted_windows(template, spacing, orientation_index(candidate.rotation),
                                    mask, tilt_degrees),
            search, centre)
        best = max([candidate, *tilted], key=lambda c: c.ncc)
        starts.append(best)
        # Then the brain's size, at the best orientation and tilt. At 8 mm the head's
        # outline can outscore the brain's at a wrong size, so the best size joins the
        # template's own size as a start, and mutual information chooses between them.
        sized = [search.best_pose(window, centre) for scale in SEARCH_SCALES
                 for window in template_windows(level, brain, centre, (best.rotation,), scale)]
        resized = max((c for c in sized if c is not None), key=lambda c: c.ncc, default=None)
        if resized is not None and resized.ncc > best.ncc:
            starts.append(resized)
    ranked = rank_starts(fixed_level, moving_level,
                         [ras_to_lps(c.template_to_subject) for c in starts], centre_lps,
                         params, _RANKING_ITERATIONS)
    order = [int(i) for i in np.argsort([value for value, _ in ranked], kind="stable")]
    winner = order[0]
    details.update({
        "search_best_ncc": round(max(c.ncc for c in starts), 4),
        "search_start_scales": [round(c.scale, 3) for c in starts],
        "search_start_ncc": [round(c.ncc, 4) for c in starts],
        "search_ranking_mi": [round(value, 4) for value, _ in ranked],
        "search_start_rotation_deg": round(rotation_angle_deg(starts[winner].rotation), 1),
    })
    poses = [ras_to_lps(ranked[i][1]) for i in order]
    return (_distinct(poses) if wide else poses), details


def _distinct(poses: list[np.ndarray]) -> list[np.ndarray]:
    """``poses`` without those that repeat an earlier one: a rotation within
    :data:`_SAME_START_DEG` of it and a translation within :data:`_SAME_START_MM`."""
    kept: list[np.ndarray] = []
    for pose in poses:
        if not any(rotation_angle_deg(decompose_linear(k)[0].T @ decompose_linear(pose)[0])
                   < _SAME_START_DEG
                   and np.linalg.norm(k[:3, 3] - pose[:3, 3]) < _SAME_START_MM
                   for k in kept):
            kept.append(pose)
    return kept


def _entry_meta(params: RegisterParams, volume: Volume) -> dict:
    """The applied transform in the entry's sidecar (RAS+, template to subject)."""
    if volume.applied is None:
        return {}
    return {"template_to_subject": volume.applied.template_to_subject.tolist(),
            "transform_file": TRANSFORM_FILE}


def _entry_files(params: RegisterParams, volume: Volume) -> dict[str, str]:
    if volume.applied is None:
        return {}
    return {TRANSFORM_FILE: itk_transform_text(volume.applied.template_to_subject)}


# The causes a fit in the wrong basin can give (a wrong position or orientation that
# correlates poorly, a size the optimiser ran off to), which a wider search may mend:
# the stage retries before it refuses. Not retried: the head's length, the search's best
# correlation and a search in which no orientation fits the field of view, measured
# before any fit (_refused_before_the_fit), and a rotation beyond the limit of a fit
# that passed every other check, which is a good fit of a wrong header (the tuning
# set's nine header errors all refused as before after a retry: 15-20 s each, spent).
RETRIED_CAUSES = ("field_of_view", "not_t1", "head_size")


def _refused_before_the_fit(result: RegistrationResult, limits) -> bool:
    """Whether the head's length or the search's orientations (none fits the field of
    view) refuse the scan: both are measured before any fit, and a wider search finds
    them the same."""
    length = result.details.get("head_length_mm")
    return ((length is not None
             and not limits.min_head_length_mm <= length <= limits.max_head_length_mm)
            or result.details.get("search_orientations") == 0)


def _measures(result: RegistrationResult) -> dict:
    """What :func:`~mriprep.stages.registration.checks.diagnose` judges of a result."""
    return {**result.details, "similarity": result.similarity, "overlap": result.overlap,
            "rotation": decompose_linear(result.fitted)[0],
            "head_scale": result.head_scale, "head_axis_scales": result.head_axis_scales}


# What the QC report shows of this stage: how well the scan fits the template, and what
# the fit says of the head (its size and receive field, whether it was skull-stripped).
_QC = StageQC(
    metrics=(
        QCMetric("registration_similarity", "reg. similarity",
                 "correlation of the registered scan with the template inside its brain",
                 key="similarity", better="higher", column=True, min_effect=0.02,
                 bounds=(-1.0, 1.0)),
        QCMetric("registration_overlap", "reg. overlap",
                 "share of the template's brain covered by the registered scan",
                 key="overlap", better="higher", min_effect=0.02, bounds=(0.0, 1.0)),
        QCMetric("head_scale", "head size",
                 "size of the brain relative to the template's (the cube root of the "
                 "registration's affine determinant; adults 0.82-1.18x MNI)",
                 key="head_scale", unit="x template", judge="none", column=True),
        QCMetric("bias_ratio", "bias field",
                 "largest over smallest value of the receive field the registration "
                 "divided out (N4, estimated on the 8 mm level)",
                 key="bias_ratio", better="lower", judge="high", min_effect=1.0,
                 bounds=(1.0, None)),
        QCMetric("skull_stripped", "skull-stripped",
                 "1 when no scalp lies where a head's scalp would be: the input was "
                 "brain-extracted", key="skull_stripped", judge="none"),
    ),
    readings={TEMPLATE_TO_SUBJECT: lambda m: m.get("template_to_subject"),
              REFUSAL_CAUSES: lambda m: [m["failure"]] if m.get("failure") else []},
)


@stage("register", RegisterParams, template_fields=("template", "template_brain_mask"),
       hands_over_transform=True, entry_meta=_entry_meta, entry_files=_entry_files, qc=_QC)
def register(volume: Volume, params: RegisterParams) -> StageOutput:
    """Estimate the template-to-subject transform (rigid by default); hand it to
    resample.

    Returns
    -------
    StageOutput
        The input volume (unchanged voxels) with ``pending`` set to the transform and
        the template's grid. Metrics: see :meth:`RegistrationResult.metrics`.

    Raises
    ------
    StageError
        Non-finite input, or a registration that fails its checks (see
        :mod:`mriprep.stages.registration.checks`); the error carries the stage's metrics, with
        the cause in ``failure``.
    """
    from mriprep.inputs.templates import load_template

    result = register_volume(volume, params)
    failure = diagnose(_measures(result), params.limits, params.template)
    warnings = []
    if (failure is not None and failure.cause in RETRIED_CAUSES and params.search_spacing_mm
            and not _refused_before_the_fit(result, params.limits)):
        first = failure
        retry = register_volume(volume, params, wide=True)
        retry_failure = diagnose(_measures(retry), params.limits, params.template)
        if retry_failure is None or (np.nan_to_num(retry.similarity, nan=-np.inf)
                                     > np.nan_to_num(result.similarity, nan=-np.inf)):
            result, failure = retry, retry_failure
        result = dataclasses.replace(result, details={
            **result.details, "search_retried": True, "first_failure": first.cause})
        if failure is None:
            warnings.append(
                f"the first fit was refused ({first.cause}: {first.reason}); a wider "
                f"search over more orientations and starts found a fit that passes "
                f"(similarity {result.similarity:.3f}): look at this subject's QC page")
    if failure is not None:
        raise StageError("register", failure.reason, volume.name,
                         metrics={**result.metrics(), "failure": failure.cause})
    if params.backend == "ants" and result.details.get("ants_threads") != params.threads:
        warnings.append(
            f"ANTs runs with {result.details.get('ants_threads') or 'all'} ITK thread(s), "
            f"not threads={params.threads}: ANTsPy reads ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS "
            "once per process, so set it before the worker starts for reproducible results"
        )
    template = load_template(params.template)
    pending = PendingTransform(
        template_to_subject=result.template_to_subject,
        target_shape=template.shape,
        target_affine=template.affine,
        target_name=f"registration template {params.template!r}",
    )
    return StageOutput(volume.replace(pending=pending), result.metrics(), warnings)
