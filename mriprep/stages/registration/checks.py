"""Can this registration be trusted? Plausibility checks, each with its own cause.

One threshold on one similarity cannot separate good registrations of other people from
failures: a real head correlates with an average template less than the template's own
copies do, and a scan rotated by 90 degrees in its header can still correlate a little.
So the register stage measures several things, each named, each with a limit set from
its measured distribution on the calibration set, written where the limit is defined
(``make bench`` prints them; docs/benchmarks.md, "failure detection"):

``head_length_mm``
    The length of the head (or brain) in the image, its largest principal extent,
    measured before any registration. A slab cut from a head keeps the head's length in
    its plane; a small brain is short in every direction.
``head_scale``, ``head_axis_scales``
    The size of the registered brain relative to the template's: the fit's isotropic
    scale (the cube root of its determinant) and its sizes along the fit's principal
    axes. Adults differ in size and proportions within a known range; a head shrunk to
    half, or a header whose voxel sizes are off, lies far outside.
``search_best_ncc``
    How well the template brain correlates with the scan at the best orientation and
    position of the global search (:mod:`mriprep.stages.registration.search`): nothing that
    is not a head scores high.
``overlap``
    The share of the template brain that lands in the scan's field of view (its valid
    voxels and the masked slices between them: :func:`field_of_view`), the brain placed
    rigidly where the fit puts it (as the default output places it). Whole heads, the
    vertex or chin cut off included, keep nearly all of it; slabs and a top third lose
    much of it.
``similarity``
    The correlation of template and registered scan over the template brain, at the
    fit's size and shape, on 2 mm grids, bias fields divided out. Other people's T1
    scans score well above noise, phantoms, slabs and wrong poses; inverted (T2-like)
    contrast scores near or below 0.
``rotation_deg``
    How far the registration turned the scan from its header's orientation. Heads lie
    in scanners within about 30 degrees of upright; a header that is wrong by a quarter
    or half turn gives 90-180.

:func:`diagnose` applies the limits in an order that names the likely cause: a scan that
is no T1 head at all is never blamed on its header.
"""

from __future__ import annotations

from dataclasses import dataclass

import nibabel as nib
import numpy as np
from nibabel.affines import apply_affine, voxel_sizes
from scipy import ndimage

from mriprep.stages.registration.pyramid import HEAD_FRACTION, MAX_BRIDGED_GAP_MM, Level
from mriprep.stages.registration.search import nearest_orientation, rotation_angle_deg

# The length of a human head or brain in an image (its largest principal extent, mm).
# Measured on the calibration set: good scans 182-291 mm (a brain alone 182-187, heads
# with neck up to 291); failures 82 (macaque) and 135 (a head shrunk to 0.45). Above 450
# is no head of any species but a header whose voxel sizes are off by a factor.
# The lower limit sits between the head shrunk to 0.45 (135 mm: it keeps its neck) and an
# adult brain alone at 0.82x MNI size (Colin27's: 149-153 mm); a margin of 7 mm each way.
HUMAN_HEAD_LENGTH_MM = (142.0, 450.0)
# The register stage applies the same range. It used 115 mm while a similarity fit
# judged the brain's size (the 0.45x head at 0.56-0.69x); the affine part of the fit
# runs off on a head that small (sizes 1.84, 0.83 and 0.56 along its axes, similarity
# -0.19), and the cause it then names is the field of view, not the size. Measured
# (make bench, registration, 2026-12-02 and 0.4.0 on -03): good scans 186-372 mm (94;
# MP2RAGE noise in the air counts as head), failures 84 (macaque) to 139 (the 0.45x
# head).
REGISTER_HEAD_LENGTH_MM = HUMAN_HEAD_LENGTH_MM
# The registered brain's size relative to MNI152's, overall (the cube root of the fit's
# determinant) and along each principal axis of the fit. Adults span about 0.82-1.18
# overall and differ in proportions by about 15%; the limits leave a margin beyond that.
# Measured (make bench, registration, 2026-12-02 and 0.4.0 on -03, the affine fit): good
# scans 0.81-1.23 overall, 0.79-1.27 along an axis (94: sizes 0.82-1.18 and per-axis
# 0.85-1.15 of people themselves 0.9-1.08); failures 0.29-1.72 along an axis, but those
# the head's length, the field of view or the similarity refuse first.
HEAD_SCALE_RANGE = (0.7, 1.4)

# Principal extent of a uniform solid along an axis of variance v: 2 * sqrt(5 v) for an
# ellipsoid (its semi-axis a has variance a^2 / 5).
_ELLIPSOID = 5.0


@dataclass(frozen=True)
class HeadShape:
    """The head (or brain) in an image, as the foreground's largest component.

    ``length_mm`` is the largest of the three principal extents: a slab cut from a head
    keeps the head's length in its plane, a small brain is short in every direction.
    """

    length_mm: float
    extents_mm: tuple[float, float, float]
    volume_ml: float


def head_shape(level: Level) -> HeadShape | None:
    """The head in a coarse, not bias-flattened level; None if nothing is bright.

    Foreground: valid voxels brighter than ``HEAD_FRACTION`` of the bright end (99th
    percentile), the same rule registration uses for head voxels; holes filled. The
    extents are those of the ellipsoid with the foreground's second moments.
    """
    usable = level.mask
    if not usable.any():
        return None
    bright = float(np.percentile(level.data[usable], 99))
    if bright <= 0:
        return None
    foreground = usable & (level.data > HEAD_FRACTION * bright)
    labels, count = ndimage.label(foreground)
    if count == 0:
        return None
    sizes = np.bincount(labels.ravel())[1:]
    head = ndimage.binary_fill_holes(labels == 1 + int(np.argmax(sizes)))
    points = apply_affine(level.affine, np.argwhere(head))
    variances = np.linalg.eigvalsh(np.cov(points.T)) if len(points) > 3 else np.zeros(3)
    extents = tuple(float(2.0 * np.sqrt(_ELLIPSOID * max(v, 0.0))) for v in variances[::-1])
    voxel_ml = abs(np.linalg.det(level.affine[:3, :3])) / 1000.0
    return HeadShape(length_mm=extents[0], extents_mm=extents,
                     volume_ml=float(head.sum() * voxel_ml))


def template_similarity(
    fixed: Level, brain: np.ndarray, moving: Level, template_to_subject: np.ndarray
) -> float:
    """Correlation of template and registered subject over the template brain, on the
    subject's valid voxels.

    Parameters
    ----------
    fixed, moving : Level
        The template's and the subject's level (same spacing).
    brain : ndarray of bool
        The template brain on ``fixed``'s grid.
    template_to_subject : ndarray, shape (4, 4)
        The registration (RAS+).

    Returns
    -------
    float
        NaN when fewer than 10 brain voxels land on valid subject voxels, 0 when either
        image is constant there.
    """
    coords, pulled, landed = _brain_on_scan(fixed, brain, moving, template_to_subject)
    valid_at = np.zeros(len(coords), dtype=bool)
    valid_at[landed] = moving.mask[tuple(np.rint(pulled[landed]).astype(int).T)]
    if valid_at.sum() < 10:
        return float("nan")
    values = ndimage.map_coordinates(moving.data, pulled[valid_at].T, order=1)
    reference = fixed.data[tuple(coords[valid_at].T)]
    values = values.astype(np.float64) - values.mean(dtype=np.float64)
    reference = reference.astype(np.float64) - reference.mean(dtype=np.float64)
    norm = float(np.sqrt((values**2).sum() * (reference**2).sum()))
    if norm == 0.0:  # a constant image correlates with nothing
        return 0.0
    return float((values * reference).sum() / norm)


def brain_overlap(fixed: Level, brain: np.ndarray, moving: Level,
                  template_to_subject: np.ndarray) -> float:
    """The share of the template brain that lands, through ``template_to_subject``, in
    the scan's field of view (:func:`field_of_view` of ``moving``'s valid voxels)."""
    coords, pulled, landed = _brain_on_scan(fixed, brain, moving, template_to_subject)
    if not len(coords):
        return 0.0
    seen = field_of_view(moving.mask, voxel_sizes(moving.affine))
    return float(seen[tuple(np.rint(pulled[landed]).astype(int).T)].sum() / len(coords))


def field_of_view(valid: np.ndarray, spacing_mm) -> np.ndarray:
    """The voxels a scan covers: its valid voxels, and the invalid ones that valid voxels
    enclose along some axis across a gap no wider than
    :data:`~mriprep.stages.registration.pyramid.MAX_BRIDGED_GAP_MM` (masked slices, a
    filled NaN blob).

    A few masked slices lie inside the field of view, between valid slices; a slab or a
    cut field of view has nothing valid beyond its edge, and a scan of a few valid
    slices far apart covers those slices only. So masked slices do not count as a
    partial field of view (a 1x1x3 mm scan with 7 of its slices masked had 83% of the
    template brain on valid voxels, under the 85% that refuses a slab), while a scan
    whose lower half was written as zeros still does. ``spacing_mm``: the voxel size
    along each axis (a number for all three).
    """
    spacing = np.broadcast_to(np.asarray(spacing_mm, dtype=float), (valid.ndim,))
    covered = valid.copy()
    for axis in range(valid.ndim):
        index = np.arange(valid.shape[axis]).reshape(
            [-1 if i == axis else 1 for i in range(valid.ndim)])
        before = np.maximum.accumulate(np.where(valid, index, -1), axis=axis)
        after = np.flip(np.minimum.accumulate(
            np.flip(np.where(valid, index, valid.shape[axis]), axis), axis=axis), axis)
        enclosed = (before >= 0) & (after < valid.shape[axis])
        covered |= enclosed & ((after - before - 1) * spacing[axis] <= MAX_BRIDGED_GAP_MM)
    return covered


def _brain_on_scan(fixed: Level, brain: np.ndarray, moving: Level,
                   template_to_subject: np.ndarray):
    """The template brain's voxels, where they land on ``moving``'s grid (continuous
    voxel coordinates), and which of them land inside the grid."""
    vox_map = np.linalg.inv(moving.affine) @ template_to_subject @ fixed.affine
    coords = np.argwhere(brain)
    pulled = coords @ vox_map[:3, :3].T + vox_map[:3, 3]
    landed = np.all((pulled >= 0) & (pulled <= np.asarray(moving.data.shape) - 1), axis=1)
    return coords, pulled, landed


# A scan is skull-stripped when a head's scalp above the brain, carried onto it by the
# fit, is this dark relative to its brain (see :func:`scalp_share`). Measured (make
# bench, registration, 2026-12-02): stripped scans 0.000-0.028 (12), whole heads
# 0.97-1.75 (80); two misregistered scans 0.033 and 0.49 (the first since mended).
STRIPPED_SCALP_SHARE = 0.2


def scalp_share(level: Level, scalp_points: np.ndarray, brain_points: np.ndarray,
                template_to_subject: np.ndarray) -> float | None:
    """How bright the scan is where the fit puts a head's scalp, relative to its brain:
    the 90th percentile of the scalp band (fat under the skin is as bright as white
    matter in T1, while skull and CSF in the same band are dark) over the brain's
    median. None where either falls outside the scan's valid voxels (too few points to
    judge)."""
    brightness = []
    to_voxel = np.linalg.inv(level.affine) @ template_to_subject
    for points in (scalp_points, brain_points):
        ijk = np.rint(apply_affine(to_voxel, points)).astype(int)
        inside = np.all((ijk >= 0) & (ijk < np.asarray(level.data.shape)), axis=1)
        ijk = ijk[inside]
        ijk = ijk[level.mask[tuple(ijk.T)]]
        if len(ijk) < 20:
            return None
        brightness.append(float(np.percentile(level.data[tuple(ijk.T)],
                                              90 if not brightness else 50)))
    scalp, brain = brightness
    return scalp / brain if brain > 0 else None


@dataclass(frozen=True)
class Limits:
    """The limits :func:`diagnose` applies (the register stage's parameters)."""

    min_head_length_mm: float
    max_head_length_mm: float
    min_search_ncc: float
    min_overlap: float
    min_similarity: float
    max_rotation_deg: float
    min_head_scale: float = HEAD_SCALE_RANGE[0]
    max_head_scale: float = HEAD_SCALE_RANGE[1]


# Every cause :func:`diagnose` can name, in the order it checks them.
CAUSES = ("head_size", "no_brain", "field_of_view", "not_t1", "orientation")


@dataclass(frozen=True)
class Failure:
    """Why a registration is refused: a cause code and a message naming the values."""

    cause: str  # head_size, no_brain, field_of_view, not_t1, orientation (CAUSES)
    reason: str


def diagnose(measures: dict, limits: Limits, template: str) -> Failure | None:
    """The first limit ``measures`` break, in the order that names the likely cause.

    ``measures`` holds ``head_length_mm`` and ``head_extents_mm`` (None when nothing is
    bright), ``search_orientations`` (orientations in which the template brain fits the
    field of view; None without a search) and ``search_best_ncc``, ``head_scale``
    (the fit's size relative to the template's), ``head_axis_scales`` (its sizes along
    the fit's principal axes), ``overlap``, ``similarity``, and ``rotation`` (3x3). NaN
    similarity or overlap fails: the check could not be made. The order: the head's
    length, a brain anywhere, the field of view, the similarity, the fit's sizes, the
    rotation.
    """
    length = measures.get("head_length_mm")
    if length is not None and not (
            limits.min_head_length_mm <= length <= limits.max_head_length_mm):
        return Failure("head_size", head_length_reason(
            length, measures["head_extents_mm"],
            (limits.min_head_length_mm, limits.max_head_length_mm)))
    best = measures.get("search_best_ncc")
    if best is not None and best < limits.min_search_ncc:
        return Failure("no_brain", (
            f"nothing in the image resembles a T1-weighted human brain: the T1 template "
            f"brain correlates at most {best:.3f} with it in any orientation and position "
            f"(below min_search_ncc={limits.min_search_ncc:g}; T1 head scans score "
            "0.55-0.85): it may be a scan of another contrast (T2, FLAIR, PD; this "
            "pipeline needs T1-weighted scans), a phantom, noise, another body part or "
            "another species' brain"))
    if measures.get("search_orientations") == 0:
        return Failure("field_of_view", (
            "the template brain fits the scan's valid field of view in no orientation "
            "and position (in every pose tried, less than 60% of it lies inside): the "
            "scan covers only part of the brain (a slab or a cut field of view)"))
    overlap = measures.get("overlap", float("nan"))
    if not overlap >= limits.min_overlap:
        return Failure("field_of_view", (
            f"only {overlap:.0%} of the template brain lies in the field of view of the "
            f"registered scan (at least {limits.min_overlap:.0%} needed): the scan covers "
            "only part of the brain (a slab, a cut field of view, slices written as "
            "zeros at its edge, or valid slices far apart)"))
    similarity = measures.get("similarity", float("nan"))
    if not similarity >= limits.min_similarity:
        if similarity <= -limits.min_similarity:
            return Failure("not_t1", (
                f"the registered scan anti-correlates with the T1 template {template!r} "
                f"(similarity {similarity:.3f}): its tissue contrast is inverted, as in "
                "a T2- or PD-weighted scan; this pipeline needs T1-weighted scans"))
        return Failure("not_t1", (
            f"the scan does not look like a T1-weighted brain: at the best pose its "
            f"similarity to template {template!r} is {similarity:.3f}, below "
            f"min_similarity={limits.min_similarity:g} (other people's T1 scans score "
            "0.62-0.83); it may be of another contrast (T2, FLAIR, PD), a phantom, or too "
            "corrupted to register"))
    # The fit's sizes mean something once it resembles a brain: the affine part
    # stretches the fit of a slab along the axis it lacks (0.42-0.54x), and that of a
    # scan that is no T1 anywhere (a T2 scan: up to 1.71x).
    scale = measures.get("head_scale")
    axes = tuple(measures.get("head_axis_scales") or ())
    sizes = [s for s in (scale, *axes) if s is not None]
    if sizes and not (limits.min_head_scale <= min(sizes)
                      and max(sizes) <= limits.max_head_scale):
        return Failure("head_size", head_scale_reason(scale, axes, limits, template))
    rotation = np.asarray(measures["rotation"])
    angle = rotation_angle_deg(rotation)
    if angle > limits.max_rotation_deg:
        return Failure("orientation", (
            f"the scan matches template {template!r} well (similarity {similarity:.3f}) "
            f"only when turned by {angle:.0f} degrees: its header orientation is wrong. "
            f"{describe_orientation_error(rotation)} Fix the header (or the converter "
            "that wrote it) and run it again"))
    return None


def head_scale_reason(scale: float | None, axes, limits: Limits, template: str) -> str:
    """Why a brain registered at ``scale`` (``axes``: along its principal axes, or
    empty) is refused."""
    along = ("" if not axes else " (along its principal axes "
             + ", ".join(f"{a:.2f}" for a in axes) + "x)")
    size = "" if scale is None else f" at {scale:.2f}x its size"
    return (
        f"the brain in the image registers to template {template!r}{size}{along}, "
        f"outside {limits.min_head_scale:g}-{limits.max_head_scale:g}x (adult human brains "
        "are 0.82-1.18x MNI size, and their proportions differ by about 15%): this is not "
        "an adult human head, or the voxel sizes in its header are wrong")


def head_length_reason(length: float, extents, human_range) -> str:
    """Why a head of ``length`` mm (principal ``extents``) is refused."""
    size = " x ".join(f"{e:.0f}" for e in extents)
    return (
        f"the head or brain in the image is {length:.0f} mm long (principal extents "
        f"{size} mm), outside the human range {human_range[0]:g}-{human_range[1]:g} mm "
        "(an adult human brain is 150-190 mm long, a macaque brain about 80): this is not "
        "a human head, or the voxel sizes in its header are wrong")


def describe_orientation_error(rotation: np.ndarray) -> str:
    """What a registration's rotation says about the header, in anatomical terms.

    ``rotation`` (3x3, RAS+) maps template directions to the scan's world directions;
    the scan's world is what its header claims. The axis the header calls R is, in the
    anatomy, ``nearest.T @ e_x``, and likewise for A and S. Left and right cannot be told
    apart against a symmetric template, so a mirrored reading is as likely.
    """
    nearest = nearest_orientation(rotation)
    anatomical = nib.orientations.aff2axcodes(np.vstack(
        [np.hstack([nearest.T, np.zeros((3, 1))]), [0, 0, 0, 1]]))
    return (
        f"The directions the header calls R, A, S point, in the anatomy, to "
        f"{', '.join(anatomical)} (or their left-right mirror: the template cannot tell "
        "left from right)."
    )
