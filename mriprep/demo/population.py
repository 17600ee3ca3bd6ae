"""A population: the ways real adult cohorts differ from the calibration set's scans.

The calibration set (:mod:`mriprep.demo.calibration`) holds a few people in several
acquisitions. A real cohort also holds small and large heads, strong receive fields
(surface coils, 7T), skull-stripped and defaced shares of public data sets, MP2RAGE
"UNI" images with noise all over their background, motion ghosts, white-matter
lesions, scanners that store 12-bit integers, and conversions that clip the bright end.
Every one of them is a good scan that must be accepted.

Two kinds of variation:

* of an :class:`~mriprep.demo.anatomy.Anatomy`, before acquisition:
  :func:`scaled_anatomy` (another head size is another anatomy);
* of a :class:`~mriprep.demo.scanner.Scan`, after acquisition, keeping its geometry and
  truth: :func:`with_bias`, :func:`skull_stripped`, :func:`defaced`,
  :func:`mp2rage_background`, :func:`ghosted`, :func:`with_lesions`,
  :func:`with_bright_ring`, :func:`slice_defects`, :func:`int16_scaled`, :func:`clipped`.

:func:`population_cases` builds :class:`~mriprep.demo.calibration.Case` objects of them,
all of kind ``good``, deterministic in their seed, each built lazily.

"The head" is, throughout, the voxels brighter than :data:`HEAD_FRACTION` of the
image's 99th percentile: the rule the register stage uses for head voxels.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Callable, Sequence

import numpy as np
from nibabel.affines import voxel_sizes
from scipy import ndimage

from mriprep.demo.anatomy import CSF, GM, WM, Anatomy
from mriprep.demo.calibration import (
    ACQUISITIONS,
    MAX_POSE_ROTATION_DEG,
    MAX_POSE_TRANSLATION_MM,
    Case,
    person,
    real_head,
)
from mriprep.demo.real_scans import real_scan
from mriprep.demo.scanner import Acquisition, Scan, acquire, random_pose

HEAD_FRACTION = 0.1  # head voxels: brighter than this share of the 99th percentile

# The cases (see population_cases).
HEAD_SIZES = (0.82, 0.88, 0.94, 1.06, 1.12, 1.18)
AXIS_SCALES = ((0.85, 1.0, 1.1), (1.15, 0.9, 1.0), (0.9, 1.15, 0.85))
BIAS_RATIOS = (2.0, 4.0, 7.0, 10.0)
SECOND_POSE = "ax3_tilt20"  # the non-reference pose of each scaled anatomy

# Defacing (see defaced): the cut is the half-space anterior-inferior of a plane that
# contains the left-right axis and leans DEFACE_ANGLE_DEG back from vertical, as
# pydeface's face mask does from the nasion down and back to under the chin.
DEFACE_ANGLE_DEG = 45.0
# Where that plane lies without labels to place it: distance (mm) from the MNI origin
# along its normal. Colin27's brain (FSL BET's mask) reaches 5 mm short of it.
DEFACE_OFFSET_MM = 67.0
DEFACE_MARGIN_MM = 4.0  # with labels: the plane lies this far beyond the brain
DEFACE_BOTTOM_Z_MM = -100.0  # the mask ends under the chin; the neck below stays


# --- a variation of an anatomy --------------------------------------------------------

def scaled_anatomy(anatomy: Anatomy, scale: float | Sequence[float],
                   name: str | None = None) -> Anatomy:
    """The same head made ``scale`` times its size (one factor, or one per axis).

    Only the affine changes: it is scaled about the world position of the grid's
    centre, so every voxel keeps its intensity and label and a real scan scaled by 0.92
    truly becomes a smaller head, with no resampling blur (the voxels become 0.92 mm).

    ``template_to_anatomy`` becomes None: the map from the template is then
    ``S @ template_to_anatomy``, no longer rigid, and a rigid registration has no rigid
    truth to be scored against. A scaled anatomy is scored by consistency across its
    own poses only (it is another anatomy: give it its own name). ``details`` keeps the
    scaling matrix ``S`` and the rigid truth before scaling, for whoever needs them.
    """
    factors = np.broadcast_to(np.asarray(scale, dtype=float), (3,))
    if np.any(factors <= 0):
        raise ValueError(f"scale must be positive, got {scale!r}")
    centre = anatomy.affine[:3, :3] @ ((np.asarray(anatomy.image.shape) - 1) / 2.0) \
        + anatomy.affine[:3, 3]
    about = np.eye(4)
    about[:3, :3] = np.diag(factors)
    about[:3, 3] = centre - factors * centre
    details = dict(anatomy.details)
    details["scaled_by"] = [float(f) for f in factors]
    details["scaling"] = about.tolist()
    if anatomy.template_to_anatomy is not None:
        details["template_to_anatomy_unscaled"] = anatomy.template_to_anatomy.tolist()
    return Anatomy(anatomy.image, anatomy.labels, about @ anatomy.affine, None,
                   name or f"{anatomy.name}@{_scale_label(factors)}", details,
                   anatomy.mni_frame @ np.linalg.inv(about))


# --- variations of a scan ---------------------------------------------------------------

def head_mask(data: np.ndarray) -> np.ndarray:
    """The head: voxels brighter than :data:`HEAD_FRACTION` of the 99th percentile."""
    return data > HEAD_FRACTION * np.percentile(data, 99)


def with_bias(scan: Scan, ratio: float, rng: np.random.Generator) -> Scan:
    """The scan under a smooth receive field whose max/min over the head is ``ratio``.

    An uncorrected surface coil or a 7T scan varies several-fold across the head; the
    scanner's own field (a few %) is already in the scan. The field is exp of a random
    linear-plus-quadratic polynomial of world position (the coil is fixed in the
    scanner, not in the voxel grid), rescaled in log so that log(max / min) over the
    head is exactly log(ratio), centred so that the head's brightest and darkest gains
    are sqrt(ratio) and 1/sqrt(ratio).
    """
    if ratio < 1:
        raise ValueError(f"ratio is max/min and must be >= 1, got {ratio}")
    head = head_mask(scan.data)
    world = _world_axes(scan.affine, scan.data.shape)
    ijk = np.argwhere(head)
    centre = scan.affine[:3, :3] @ ijk.mean(axis=0) + scan.affine[:3, 3]
    u = [(w - c) / 100.0 for w, c in zip(world, centre)]  # about the head, in 10 cm
    linear = rng.normal(0.0, 1.0, 3)
    quadratic = rng.normal(0.0, 0.5, (3, 3))
    log_field = sum(linear[a] * u[a] for a in range(3))
    for a in range(3):
        for b in range(a, 3):
            log_field = log_field + quadratic[a, b] * u[a] * u[b]
    log_field = np.asarray(log_field, dtype=np.float64)
    inside = log_field[head]
    lo, hi = float(inside.min()), float(inside.max())
    if hi - lo <= 0:  # a head of one voxel: nothing to vary
        return scan
    log_field = (log_field - (lo + hi) / 2) * (np.log(ratio) / (hi - lo))
    field = np.exp(log_field).astype(np.float32)
    return dataclasses.replace(scan, data=(scan.data * field).astype(np.float32))


def skull_stripped(scan: Scan, rim_mm: float = 2.0) -> Scan:
    """The scan as FSL BET writes it: the brain, a thin rim, and exact zeros elsewhere.

    The brain is the labelled CSF, grey and white matter, dilated by ``rim_mm`` (BET's
    surface lies a little outside the brain and keeps a thin rim of CSF and dura), its
    holes filled. BET's background is 0, with no noise.

    Raises
    ------
    ValueError
        The scan has no labels (a real head): there is no known brain to keep.
        Colin27's own BET output is in the calibration set as ``colin27_brain``.
    """
    if scan.labels is None:
        raise ValueError("skull_stripped needs a scan with labels (a synthetic person); "
                         "a real head's stripped copy must come from the real data")
    keep = _within_mm(np.isin(scan.labels, (CSF, GM, WM)), rim_mm, scan.affine)
    keep = ndimage.binary_fill_holes(keep)
    data = np.where(keep, scan.data, np.float32(0.0)).astype(np.float32)
    return dataclasses.replace(scan, data=data)


def deface_mask(scan: Scan, margin_mm: float = DEFACE_MARGIN_MM,
                offset_mm: float | None = None) -> np.ndarray:
    """The voxels :func:`defaced` zeroes: the face and jaw, in the anatomy's frame.

    The scan's known geometry stands in for pydeface's registration of its face mask:
    each voxel is taken to the template's frame (scan voxel -> scan world ->
    ``inv(pose)`` -> the anatomy's ``mni_frame``: the identity for synthetic people and
    Colin27, an approximate fit for the other real heads), RAS+ with anterior +y and
    superior +z. There the mask is the half-space anterior-inferior of a plane along the left-right
    axis, leaning :data:`DEFACE_ANGLE_DEG` back (nasion down and back to the chin), down
    to :data:`DEFACE_BOTTOM_Z_MM` (the neck below the chin stays). The plane lies at
    ``offset_mm`` along its normal; by default, for a labelled scan, ``margin_mm``
    beyond the furthest brain voxel (pydeface's registration fits its mask to each
    head, and a scaled or warped brain reaches further forward than MNI's), else at
    :data:`DEFACE_OFFSET_MM`.
    """
    to_template = scan.mni_frame @ np.linalg.inv(scan.pose) @ scan.affine
    angle = np.radians(DEFACE_ANGLE_DEG)
    # Distance along the plane's normal (anterior and down) and height, per voxel, as
    # sums of per-axis terms: no grid of coordinates is built.
    normal = np.cos(angle) * to_template[1] - np.sin(angle) * to_template[2]
    along = _linear_in_index(normal, scan.data.shape)
    height = _linear_in_index(to_template[2], scan.data.shape)
    if offset_mm is None:
        if scan.labels is not None and np.any(scan.labels > 0):
            offset_mm = float(along[scan.labels > 0].max()) + margin_mm
        else:
            offset_mm = DEFACE_OFFSET_MM
    return (along > offset_mm) & (height > DEFACE_BOTTOM_Z_MM)


def defaced(scan: Scan, margin_mm: float = DEFACE_MARGIN_MM,
            offset_mm: float | None = None) -> Scan:
    """The scan with its face and jaw zeroed, as pydeface writes it (see
    :func:`deface_mask` for where the cut lies). The brain is untouched: by
    construction where the scan has labels; without them, as far as the brain is
    MNI-like (:data:`DEFACE_OFFSET_MM` is set on Colin27's)."""
    cut = deface_mask(scan, margin_mm, offset_mm)
    data = np.where(cut, np.float32(0.0), scan.data).astype(np.float32)
    return dataclasses.replace(scan, data=data)


def mp2rage_background(scan: Scan, rng: np.random.Generator, level: float = 1.0,
                       margin_mm: float = 1.0) -> Scan:
    """The scan with an MP2RAGE "UNI" background: noise over the whole tissue range.

    The UNI image divides two inversions; where there is no signal, in the air around
    the head, the ratio is noise spanning its whole range (salt and pepper as bright as
    white matter). Outside the head (its mask filled and dilated by ``margin_mm``, so
    that the scalp's partial-volume edge stays) each voxel becomes uniform in
    [0, ``level`` x the head's 99th percentile]; the head is unchanged.
    """
    head = ndimage.binary_fill_holes(head_mask(scan.data))
    head = _within_mm(head, margin_mm, scan.affine)
    top = level * float(np.percentile(scan.data[head], 99))
    data = scan.data.copy()
    outside = ~head
    data[outside] = rng.uniform(0.0, top, int(outside.sum())).astype(np.float32)
    return dataclasses.replace(scan, data=data)


def ghosted(scan: Scan, amplitude: float = 0.15, rng: np.random.Generator | None = None,
            axis: int | None = None) -> Scan:
    """The scan with motion ghosts along its phase-encode axis.

    Motion that repeats every second (fourth) line of k-space puts copies of the
    image shifted by N/2 (N/4) along the phase-encode axis, wrapped around the field of
    view. Here: the copy shifted by N/2 at ``amplitude``, those by +-N/4 at half of it
    each. The phase-encode axis is ``axis``, or the in-plane stored axis (0 or 1; axis 2
    is the slice axis) with the larger field of view. ``rng``, if given, draws the
    ghosts' amplitude within +-20% of ``amplitude`` (patients do not move alike).
    """
    if axis is None:
        fov = np.asarray(scan.data.shape[:2]) * voxel_sizes(scan.affine)[:2]
        axis = int(np.argmax(fov))
    if rng is not None:
        amplitude = amplitude * float(rng.uniform(0.8, 1.2))
    n = scan.data.shape[axis]
    data = scan.data.astype(np.float32)
    ghosts = amplitude * np.roll(data, n // 2, axis=axis)
    ghosts += (amplitude / 2) * np.roll(data, n // 4, axis=axis)
    ghosts += (amplitude / 2) * np.roll(data, -(n // 4), axis=axis)
    return dataclasses.replace(scan, data=(data + ghosts).astype(np.float32))


def white_matter_mask(scan: Scan, depth_mm: float = 20.0) -> np.ndarray:
    """White matter: the label where there are labels; else the brightest 20% of the
    head, eroded, and at least ``depth_mm`` inside the head (bright scalp fat is the
    other bright tissue of a T1 head, and it lies within a centimetre of the surface)."""
    if scan.labels is not None:
        return scan.labels == WM
    head = ndimage.binary_fill_holes(head_mask(scan.data))
    depth = ndimage.distance_transform_edt(head, sampling=voxel_sizes(scan.affine))
    bright = head & (scan.data >= np.percentile(scan.data[head], 80)) & (depth >= depth_mm)
    return ndimage.binary_erosion(bright)


def with_lesions(scan: Scan, rng: np.random.Generator, count: int = 8,
                 radius_mm: float | tuple[float, float] = (3.0, 6.0),
                 contrast: tuple[float, float] = (0.3, 0.5), edge_mm: float = 1.5) -> Scan:
    """The scan with T1-dark white-matter lesions (multiple sclerosis "black holes").

    ``count`` spheres, each of a radius drawn in ``radius_mm``, centred where the whole
    sphere and its soft edge lie in white matter (:func:`white_matter_mask`). Inside,
    the intensity falls to a fraction drawn in ``contrast`` of what it was (0.3-0.5 of
    white matter: the CSF to grey matter range), the voxel's noise scaled with it, over
    an edge ``edge_mm`` wide. Labels stay white matter (a segmentation network sees the
    lesion as white matter that looks darker, as FreeSurfer's hypointensities are).

    Raises
    ------
    ValueError
        No white matter is deep enough for a lesion of the largest radius.
    """
    lo, hi = (radius_mm, radius_mm) if np.isscalar(radius_mm) else radius_mm
    spacing = voxel_sizes(scan.affine)
    wm = white_matter_mask(scan)
    depth = ndimage.distance_transform_edt(wm, sampling=spacing)
    gain = np.ones(scan.data.shape, dtype=np.float32)
    for _ in range(count):
        radius = float(rng.uniform(lo, hi))
        reach = radius + edge_mm / 2
        # A voxel at depth d is d from the nearest non-WM voxel: a centre deeper than
        # the sphere's reach plus a voxel (the finest side: a thick slice's depth is
        # already measured in mm) keeps all of it in white matter.
        candidates = np.argwhere(depth >= reach + spacing.min())
        if len(candidates) == 0:
            raise ValueError(f"no white matter deep enough for a lesion of {radius:.1f} mm")
        centre = candidates[rng.integers(len(candidates))]
        half = np.ceil(reach / spacing).astype(int) + 1
        box = tuple(slice(max(c - h, 0), c + h + 1) for c, h in zip(centre, half))
        offsets = np.ogrid[box]
        distance = np.sqrt(sum(((o - c) * s) ** 2
                               for o, c, s in zip(offsets, centre, spacing)))
        weight = np.clip(0.5 + (radius - distance) / edge_mm, 0.0, 1.0)
        weight *= wm[box]  # never outside white matter, whatever rounding does
        factor = float(rng.uniform(*contrast))
        gain[box] = np.minimum(gain[box], 1.0 - weight * (1.0 - factor))
    return dataclasses.replace(scan, data=(scan.data * gain).astype(np.float32))


def with_bright_ring(scan: Scan, rng: np.random.Generator,
                     radius_mm: tuple[float, float] = (4.0, 6.0), rim_mm: float = 1.5,
                     brightness: float = 1.6, edge_mm: float = 1.0) -> Scan:
    """The scan with one ring-enhancing lesion in white matter: a dark core inside a
    bright rim, as an abscess or a tumour after contrast shows in a T1 scan.

    The lesion's outer radius is drawn in ``radius_mm``; its rim, ``rim_mm`` thick,
    reaches ``brightness`` times the white matter's median, and its core falls to 0.4
    of what it was; soft over ``edge_mm``. It lies where the whole of it is white matter
    (:func:`white_matter_mask`). Labels stay as they were.

    Raises
    ------
    ValueError
        No white matter is deep enough for the lesion.
    """
    spacing = voxel_sizes(scan.affine)
    wm = white_matter_mask(scan)
    radius = float(rng.uniform(*radius_mm))
    depth = ndimage.distance_transform_edt(wm, sampling=spacing)
    # Its reach is the radius and half the soft edge; one voxel more (the finest side)
    # keeps all of it in white matter, as for with_lesions.
    candidates = np.argwhere(depth >= radius + edge_mm / 2 + spacing.min())
    if len(candidates) == 0:
        raise ValueError(f"no white matter deep enough for a ring of {radius:.1f} mm")
    centre = candidates[rng.integers(len(candidates))]
    half = np.ceil((radius + edge_mm) / spacing).astype(int) + 1
    box = tuple(slice(max(c - h, 0), c + h + 1) for c, h in zip(centre, half))
    distance = np.sqrt(sum(((o - c) * s) ** 2
                           for o, c, s in zip(np.ogrid[box], centre, spacing)))
    inside = np.clip(0.5 + (radius - distance) / edge_mm, 0.0, 1.0)
    core = np.clip(0.5 + (radius - rim_mm - distance) / edge_mm, 0.0, 1.0)
    rim = inside - core
    level = float(np.median(scan.data[wm]))
    data = scan.data.copy()
    data[box] = (data[box] * (1.0 - inside + 0.4 * core) + rim * brightness * level)
    return dataclasses.replace(scan, data=data.astype(np.float32))


def slice_defects(scan: Scan, rng: np.random.Generator, nan: int = 0, zero: int = 0,
                  spike: int = 0, dropout: int = 0) -> Scan:
    """The scan with broken slices along its slice axis (the stored axis 2), each at a
    slice that holds brain, none next to another:

    * ``nan`` slices of NaN (a reconstruction that failed for them);
    * one slab of ``zero`` consecutive slices written as zeros (a dropped packet);
    * ``spike`` slices 4 times too bright and ``dropout`` slices at half their
      intensity (an RF spike, a signal dropout).

    The slices are drawn from the middle 80% of the slices that hold head, where the
    brain is.
    """
    data = scan.data.copy()
    rows = np.flatnonzero(head_mask(np.nan_to_num(data)).any(axis=(0, 1)))
    if len(rows) == 0:
        return scan
    lo, hi = rows[0] + len(rows) // 10, rows[-1] - len(rows) // 10
    chosen: list[int] = []

    def pick(width: int = 1) -> int:
        for _ in range(1000):
            start = int(rng.integers(lo, max(hi - width + 1, lo + 1)))
            if all(abs(start - c) > width + 1 for c in chosen):
                chosen.extend(range(start, start + width))
                return start
        raise ValueError("the scan has too few slices for these defects")

    if zero:
        start = pick(zero)
        data[:, :, start:start + zero] = 0.0
    for _ in range(nan):
        data[:, :, pick()] = np.nan
    for _ in range(spike):
        data[:, :, pick()] *= np.float32(4.0)
    for _ in range(dropout):
        data[:, :, pick()] *= np.float32(0.5)
    return dataclasses.replace(scan, data=data)


def quantisation_slope(data: np.ndarray, bits: int = 12) -> float:
    """The scale factor (NIfTI ``scl_slope``) that stores ``data``'s [0, max] in
    ``2**bits`` integer levels."""
    top = float(np.max(data))
    return top / (2**bits - 1) if top > 0 else 1.0


def int16_scaled(scan: Scan, bits: int = 12) -> Scan:
    """The scan as a scanner that stores ``bits``-bit integers with a scale factor does:
    ``round(data / slope) * slope`` over [0, max] (the values a reader sees after
    applying ``scl_slope``; :func:`quantisation_slope` gives the slope). Many 1.5T
    scanners store 12 bits in int16."""
    if not 1 <= bits <= 15:
        raise ValueError(f"bits must be 1-15 to fit int16, got {bits}")
    slope = quantisation_slope(scan.data, bits)
    levels = np.clip(np.round(scan.data / slope), 0, 2**bits - 1)
    return dataclasses.replace(scan, data=(levels * slope).astype(np.float32))


def clipped(scan: Scan, percentile: float = 95.0) -> Scan:
    """The scan saturated at the ``percentile`` of its head, as a conversion with a wrong
    window writes it: every brighter voxel becomes that value."""
    level = np.float32(np.percentile(scan.data[head_mask(scan.data)], percentile))
    return dataclasses.replace(scan, data=np.minimum(scan.data, level).astype(np.float32))


# --- the cases ----------------------------------------------------------------------------

def population_cases(seed: int = 0, people: int = 2, real: bool = True) -> list[Case]:
    """The population: good scans that differ as real adult cohorts do.

    Anatomies: ``person-0`` .. ``person-{people-1}`` (the same people as
    :func:`~mriprep.demo.calibration.calibration_cases` with the same ``seed``) and,
    with ``real`` where mricron-data is installed, ``colin27``.

    * Head sizes (:data:`HEAD_SIZES`, isotropic, and :data:`AXIS_SCALES`, per axis) of
      Colin27 and person-0: each is a new anatomy (``colin27@0.82``) with a reference
      pose (1 mm) and a second pose (:data:`SECOND_POSE`), scored by consistency only.
    * Bias fields (:data:`BIAS_RATIOS`, max/min over the head) on Colin27 and person-0.
    * A skull-stripped copy of every person; a defaced copy of Colin27 and every person.
    * An MP2RAGE background, motion ghosts (0.15), 8 lesions of 3-6 mm, 12-bit storage
      and clipping at the 95th percentile, each on Colin27 and on one person (in turn).

    All but the scaled anatomies' cases keep their source's anatomy name with
    ``reference=False``: the anatomy's reference pose is the ``1mm`` case of the
    calibration set. Each scan is in a random pose (up to 15 degrees and 15 mm) drawn
    from ``seed`` and the case's name, so a case is the same whatever else is in the set.
    """
    sources: dict[str, Callable[[], Anatomy]] = {
        f"person-{i}": functools.partial(person, seed * 100 + i) for i in range(people)}
    persons = list(sources)
    if real and real_scan("colin27") is not None:
        sources["colin27"] = functools.partial(real_head, "colin27")
    sized = [n for n in ("colin27", "person-0") if n in sources]
    cases: list[Case] = []

    def add(name, anatomy, source, acquisition="1mm", reference=False, variation=None,
            **kwargs):
        cases.append(Case(name, "good", anatomy, acquisition, functools.partial(
            _population_scan, source, ACQUISITIONS[acquisition], [seed, _tag(name)],
            variation, kwargs), reference=reference))

    for base in sized:
        for scale in (*HEAD_SIZES, *AXIS_SCALES):
            label = _scale_label(scale)
            anatomy = f"{base}@{label}"
            source = functools.partial(_scaled, sources[base], scale, anatomy)
            add(f"{base}/size{label}", anatomy, source, reference=True)
            add(f"{base}/size{label}_{SECOND_POSE}", anatomy, source, SECOND_POSE)
    for base in sized:
        for ratio in BIAS_RATIOS:
            add(f"{base}/bias{ratio:g}x", base, sources[base], variation=with_bias,
                ratio=ratio)
    for base in persons:
        add(f"{base}/stripped", base, sources[base], variation=skull_stripped)
    for base in [n for n in ("colin27",) if n in sources] + persons:
        add(f"{base}/defaced", base, sources[base], variation=defaced)
    artefacts = (("mp2rage", mp2rage_background, {}),
                 ("ghost0.15", ghosted, {"amplitude": 0.15}),
                 ("lesions8", with_lesions, {"count": 8, "radius_mm": (3.0, 6.0)}),
                 ("int16_12bit", int16_scaled, {"bits": 12}),
                 ("clipped_p95", clipped, {"percentile": 95.0}))
    for index, (label, variation, kwargs) in enumerate(artefacts):
        chosen = [n for n in ("colin27",) if n in sources]
        if persons:
            chosen.append(persons[index % len(persons)])
        for base in chosen:
            add(f"{base}/{label}", base, sources[base], variation=variation, **kwargs)
    return cases


# Variations that draw random numbers take an rng.
_RANDOM = {with_bias, mp2rage_background, with_lesions, with_bright_ring, slice_defects}


def _population_scan(anatomy: Callable[[], Anatomy], acquisition: Acquisition, rng_seed,
                     variation: Callable[..., Scan] | None, kwargs: dict) -> Scan:
    """The anatomy in a random pose (as the calibration set draws it), then varied."""
    rng = np.random.default_rng(rng_seed)
    pose = random_pose(rng, MAX_POSE_ROTATION_DEG, MAX_POSE_TRANSLATION_MM)
    scan = acquire(anatomy(), pose, acquisition, rng)
    if variation is None:
        return scan
    if variation in _RANDOM:
        kwargs = {**kwargs, "rng": np.random.default_rng([*rng_seed, 1])}
    return variation(scan, **kwargs)


def _scaled(source: Callable[[], Anatomy], scale, name: str) -> Anatomy:
    return scaled_anatomy(source(), scale, name)  # shares the source's arrays: cheap


def _tag(name: str) -> int:
    """A stable number for a case name (Python's hash() changes between processes)."""
    return zlib.crc32(name.encode())


def _scale_label(scale) -> str:
    factors = np.broadcast_to(np.asarray(scale, dtype=float), (3,))
    if np.all(factors == factors[0]):
        return f"{factors[0]:g}"
    return "x".join(f"{f:g}" for f in factors)


def _world_axes(affine: np.ndarray, shape) -> list[np.ndarray]:
    """World x, y, z (mm) of every voxel, each a float32 array of ``shape``."""
    return [_linear_in_index(affine[row], shape) for row in range(3)]


def _linear_in_index(row: np.ndarray, shape) -> np.ndarray:
    """``row[:3] @ ijk + row[3]`` for every voxel index ijk, as a float32 array."""
    i, j, k = (np.arange(n, dtype=np.float32) for n in shape)
    out = (np.float32(row[0]) * i)[:, None, None] + (np.float32(row[1]) * j)[None, :, None]
    return out + (np.float32(row[2]) * k + np.float32(row[3]))[None, None, :]


def _within_mm(mask: np.ndarray, distance_mm: float, affine: np.ndarray) -> np.ndarray:
    """``mask`` dilated by ``distance_mm`` (Euclidean, in mm on the voxel grid)."""
    if distance_mm <= 0:
        return mask.copy()
    return ndimage.distance_transform_edt(~mask, sampling=voxel_sizes(affine)) \
        <= distance_mm
