"""Image-quality metrics (IQMs) of a T1-weighted volume, after MRIQC's anatomical IQMs.

Where each follows MRIQC and where it differs:

- All: computed on the scan as read (native grid, every other voxel per axis); voxels
  the pipeline invalidated (filled NaN/Inf/extreme values, masked slices) never enter a
  statistic, where MRIQC has none to leave out. Tissue summaries are MRIQC's: the median
  as the tissue mean, the standard deviation for SNR and CNR, the normalised MAD for CJV.
- Masks: the head is thresholded and hole-filled, its large components kept (a tenth of
  the largest or more: masked slices can cut a head in two); air is the valid
  background over 8 mm from it, without MRIQC's artefact ("hat") mask, so ghosting
  farther out counts as noise. CSF/GM/WM are a 1-D k-means of a brain region (a label
  map's, the registration template's brain mask mapped back through the registration,
  or the eroded head), inside the head and without exact zeros, not FSL FAST or ANTs
  Atropos. The eroded head takes in scalp and neck: on the real Colin27 it gives WM an
  SNR below GM's, where the template's brain gives WM > GM > CSF.
- ``snr_csf``/``snr_gm``/``snr_wm``: MRIQC's ``median / (std * sqrt(n / (n - 1)))``;
  ``snr_total`` is their mean. ``snr_dietrich`` (on WM): MRIQC's Rayleigh-corrected air
  SNR, but from the air's standard deviation (MRIQC prefers its MAD), and NaN (MRIQC:
  -1) when the air has no spread.
- ``cnr``, ``cjv``: MRIQC's formulas; NaN when the denominator is zero.
- ``efc``: MRIQC's normalised entropy focus criterion over the valid voxels, of their
  magnitudes (small negatives left by interpolation count by size, not as NaN).
- Air: its exact zeros are left out of every air statistic, as MRIQC leaves out its
  "rotation mask" (the empty voxels a rotated or padded field of view inserts): a
  magnitude image's noise is never exactly 0, so a zero there was written, not measured
  (padding, a zero-filled or skull-stripped background). With fewer than
  ``MIN_AIR_VOXELS`` measured air voxels the air metrics (``snr_dietrich``, ``fber``)
  are NaN, shown as n/a, and never flagged; :func:`image_quality` says why in ``notes``
  (no air in the field of view, or an air of exact zeros); ``cnr`` then takes the
  tissue spread alone.
- ``fber``: MRIQC's ratio of median energies, head over (measured) air, so finite on
  padded images; NaN (MRIQC: -1) when the air is all zeros (a skull-stripped scan).
- ``wm2max``: MRIQC's WM median over the 99.95th percentile of the valid voxels.

A metric that cannot be computed (no air, an empty class, a zero denominator not named
above) is NaN; nothing here raises or warns on a degenerate image.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import pi, sqrt

import numpy as np
from scipy import ndimage as ndi
from scipy.cluster.vq import ClusterError, kmeans2

from mriprep.core.boxes import nonzero_box
from mriprep.stages.intensity import percentiles, robust_threshold

NAN = float("nan")
# Noise sigma over the standard deviation of its magnitude in air, which is Rayleigh
# distributed there (Dietrich et al. 2007, eq. A.12).
_RAYLEIGH = sqrt(2.0 / (4.0 - pi))
_MAD_TO_SIGMA = 1.482602218505602  # MAD of a normal sample to its sigma (statsmodels' mad)
# Morphology runs on 2x2x2 blocks: an eighth of the voxels, and a block is head when
# most of it is above threshold, which also drops isolated bright air voxels.
_BLOCK = 2
_BRAIN_EROSION_MM = 8.0
# A foreground component this share of the largest one, or more, is part of the head.
_HEAD_PART_FRACTION = 0.1
_AIR_MARGIN_MM = 8.0
_THRESHOLD_SAMPLE = 1 << 18  # strided sample for the head threshold
_KMEANS_SAMPLE = 20_000  # ample for three 1-D centroids
# Fewer measured air voxels than this and the noise estimate is not worth a number.
MIN_AIR_VOXELS = 100
# How a note names the metrics that need measured air.
AIR_METRICS = {"snr_dietrich": "SNR (air)", "fber": "FBER"}


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value
class TissueMasks:
    """Boolean masks of one volume; ``csf``, ``gm``, ``wm`` are disjoint, inside ``brain``.
    ``source``: "label map", "template" or "head (no brain mask)"."""

    head: np.ndarray
    air: np.ndarray
    brain: np.ndarray
    csf: np.ndarray
    gm: np.ndarray
    wm: np.ndarray
    source: str


def _blocks(mask: np.ndarray) -> np.ndarray:
    """Coarse mask: blocks with at least half their voxels in ``mask`` (edges padded out)."""
    padded = np.zeros([-(-s // _BLOCK) * _BLOCK for s in mask.shape], dtype=np.uint8)
    padded[tuple(slice(0, s) for s in mask.shape)] = mask
    counts = np.zeros([s // _BLOCK for s in padded.shape], dtype=np.uint8)
    for offset in np.ndindex(*(_BLOCK,) * 3):
        counts += padded[tuple(slice(o, None, _BLOCK) for o in offset)]
    return counts >= _BLOCK ** 3 / 2


def _unblock(coarse: np.ndarray, box, shape) -> np.ndarray:
    """Fine mask of ``shape`` holding ``coarse`` (the blocks at ``box``), False elsewhere."""
    fine = np.zeros(shape, dtype=bool)
    inside = fine[tuple(slice(b.start * _BLOCK, b.stop * _BLOCK) for b in box)]
    for offset in np.ndindex(*(_BLOCK,) * 3):
        part = inside[tuple(slice(o, None, _BLOCK) for o in offset)]
        part[...] = coarse[tuple(slice(0, n) for n in part.shape)]
    return fine


def _fill_slice_holes(mask: np.ndarray) -> np.ndarray:
    """Fill what each slice, along every axis, encloses: a 3D hole is one in every slice
    through it, and slices also close cavities opened where the field of view cuts."""
    filled = mask.copy()
    for axis in range(3):
        planar = np.zeros((3, 3, 3), dtype=bool)
        planar[(slice(None),) * axis + (1,)] = ndi.generate_binary_structure(2, 1)
        labels, count = ndi.label(~filled, structure=planar)
        enclosed = np.ones(count + 1, dtype=bool)
        enclosed[0] = False
        for side in {0, 1, 2} - {axis}:
            enclosed[np.take(labels, [0, -1], axis=side)] = False
        filled |= enclosed[labels]
    return filled


def _head_blocks(data, usable, margin=1):
    """The head, its filled blocks cropped to a box ``margin`` (>= 1) blocks beyond them,
    and that box; (empty, None, None) without a head."""
    foreground = np.zeros(data.shape, dtype=bool)
    step = max(1, data.size // _THRESHOLD_SAMPLE)
    sample = np.ravel(data)[::step][np.ravel(usable)[::step]]
    if sample.size:
        np.greater(data, robust_threshold(sample), out=foreground, where=usable)
    labels, count = ndi.label(_blocks(foreground))
    if count == 0:
        return np.zeros(data.shape, dtype=bool), None, None
    sizes = np.bincount(labels.ravel())[1:]
    # Every large part, not the largest only: masked slices (left out as invalid) can
    # cut a head in two, and the part beyond the cut is head, not air.
    parts = np.flatnonzero(sizes >= _HEAD_PART_FRACTION * sizes.max()) + 1
    largest = np.isin(labels, parts)
    box = nonzero_box(largest, margin)
    coarse = _fill_slice_holes(largest[box])
    # Deep blocks are head whole (dark voxels there are holes); edge blocks keep only
    # their bright voxels, so that the outline keeps voxel resolution.
    head = _unblock(ndi.binary_erosion(coarse), box, data.shape) & usable
    head |= _unblock(coarse, box, data.shape) & foreground
    return head, coarse, box


def head_mask(data: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The head: valid voxels above :func:`~mriprep.stages.intensity.robust_threshold` of
    (a strided sample of) the valid intensities, as their large face-connected
    components (at least a tenth of the largest), hole-filled slice by slice along every axis (on 2x2x2 blocks, for speed)."""
    data = np.ascontiguousarray(data)
    return _head_blocks(data, np.asarray(valid, dtype=bool) & np.isfinite(data))[0]


def _ball(radius_mm: float, voxel_mm) -> np.ndarray:
    grid = np.ogrid[tuple(slice(-int(radius_mm // v), int(radius_mm // v) + 1) for v in voxel_mm)]
    return sum((g * v) ** 2 for g, v in zip(grid, voxel_mm)) <= radius_mm ** 2


def tissue_masks(data, valid, brain=None, source="label map", seed=0, *,
                 spacing=1.0) -> TissueMasks:
    """Head, air and CSF/GM/WM masks from valid voxels (anything may sit at the others).

    ``brain`` is the region the classes are fitted in, found as ``source`` says; without
    it, the head eroded by about 8 mm (``source`` "head (no brain mask)"). ``seed`` draws
    the k-means subsample (at most 20,000 voxels); ``spacing`` (mm, one or per axis)
    sizes the erosion and the 8 mm margin between the head and the air, which keeps the
    edge and nearby ghosting out of the noise. Classes are ordered by centroid: darkest
    CSF, middle GM, brightest WM, true of T1w contrast only.
    """
    data = np.ascontiguousarray(data)  # a strided view (a subsampled scan) slows every pass
    usable = np.asarray(valid, dtype=bool) & np.isfinite(data)
    block_mm = np.broadcast_to(np.asarray(spacing, dtype=float), (3,)) * _BLOCK
    near = _ball(_AIR_MARGIN_MM, block_mm)
    head, coarse, box = _head_blocks(data, usable, margin=max(near.shape) // 2 + 1)
    air = usable.copy()
    if box is not None:
        air &= ~_unblock(ndi.binary_dilation(coarse, near), box, data.shape)
    if brain is not None:
        # Inside the head only: a skull-stripped scan has background in the template's
        # brain (real Colin27 without skull made its CSF class all background).
        brain = np.asarray(brain, dtype=bool) & usable & (head if head.any() else usable)
    elif box is None:
        source, brain = "head (no brain mask)", np.zeros(data.shape, dtype=bool)
    else:
        inner = ndi.binary_erosion(coarse, _ball(_BRAIN_EROSION_MM, block_mm))
        source, brain = "head (no brain mask)", head & _unblock(inner, box, data.shape)
    # Exact zeros are no tissue signal: the masked-out parts of a skull-stripped or
    # defaced scan (the real 0.5 mm Colin27 holds them inside its head mask).
    brain = brain & (data != 0)
    return TissueMasks(head, air, brain, *_classes(data, brain, seed), source)


def _classes(data, brain, seed):
    """CSF, GM and WM: the brain's voxels nearest each of three k-means centroids."""
    classes = [np.zeros(brain.shape, dtype=bool) for _ in range(3)]
    box = nonzero_box(brain)
    if box is None:
        return classes
    region, inside = data[box], brain[box]
    values = region[inside].astype(np.float64)
    if values.size > _KMEANS_SAMPLE:
        values = values[np.random.default_rng(seed).integers(0, values.size, _KMEANS_SAMPLE)]
    start = np.percentile(values, [10.0, 50.0, 90.0])
    try:
        centroids = np.sort(kmeans2(values[:, None], start[:, None], minit="matrix",
                                    missing="raise", check_finite=False)[0].ravel())
    except ClusterError:  # fewer than three distinct levels: keep the percentiles
        centroids = start
    low, high = (centroids[:-1] + centroids[1:]) / 2
    classes[0][box], classes[2][box] = inside & (region < low), inside & (region >= high)
    classes[1][box] = inside & ~(classes[0][box] | classes[2][box])
    return classes


def snr(mu_fg: float, sigma_fg: float, n: int) -> float:
    """Tissue SNR, ``mu / (sigma * sqrt(n / (n - 1)))``; NaN for n < 2 or no spread."""
    ok = n >= 2 and sigma_fg > 0
    return float(mu_fg) / (float(sigma_fg) * sqrt(n / (n - 1))) if ok else NAN


def snr_dietrich(mu_fg: float, sigma_air: float) -> float:
    """SNR against air: there the magnitude is Rayleigh, whose noise sigma is
    ``sqrt(2 / (4 - pi))`` times its standard deviation. NaN if the air has no spread."""
    return float(mu_fg) / (_RAYLEIGH * float(sigma_air)) if sigma_air > 0 else NAN


def cnr(mu_wm, mu_gm, sigma_air, sigma_wm, sigma_gm) -> float:
    """Contrast-to-noise, ``|mu_wm - mu_gm| / sqrt(sigma_air^2 + sigma_wm^2 + sigma_gm^2)``."""
    spread = sqrt(float(sigma_air) ** 2 + float(sigma_wm) ** 2 + float(sigma_gm) ** 2)
    return abs(float(mu_wm) - float(mu_gm)) / spread if spread > 0 else NAN


def cjv(mu_wm, mu_gm, sigma_wm, sigma_gm) -> float:
    """Coefficient of joint variation, ``(sigma_wm + sigma_gm) / |mu_wm - mu_gm|``."""
    contrast = abs(float(mu_wm) - float(mu_gm))
    return (float(sigma_wm) + float(sigma_gm)) / contrast if contrast > 0 else NAN


def _efc(values: np.ndarray) -> float:
    n, magnitude = values.size, np.abs(values)
    peak = magnitude.max() if n else 0.0
    if n < 2 or not peak > 0:
        return NAN
    # Scaled to the peak (EFC is scale-free) for accurate float32 logs, whose pairwise
    # sums are good to ~1e-8 here; zeros add nothing to any sum (x ln x -> 0).
    p = magnitude[magnitude > 0] / peak
    energy = sqrt(float(np.sum(p * p)))
    # sum(q ln q) for q = p / energy; a constant image has q = 1 / sqrt(n) throughout.
    entropy = (float(np.sum(p * np.log(p))) - np.log(energy) * float(np.sum(p))) / energy
    return float(entropy / (sqrt(n) * np.log(1.0 / sqrt(n))))


def efc(data: np.ndarray, frame: np.ndarray | None = None) -> float:
    """Entropy focus criterion normalised to [0, 1]: 1 for a constant image, 0 for one
    bright voxel, lower is sharper. ``frame`` marks voxels to leave out; NaN ones are."""
    keep = np.isfinite(data) if frame is None else np.isfinite(data) & ~np.asarray(frame, bool)
    return _efc(np.asarray(data)[keep])


def _median(values: np.ndarray) -> float:
    return float(percentiles(values, [50.0])[0]) if values.size else NAN


def _fber(head_values, air_values) -> float:
    """``air_values`` are the measured (non-zero) air voxels."""
    if air_values.size < MIN_AIR_VOXELS:
        return NAN
    head, air = _median(np.abs(head_values)) ** 2, _median(np.abs(air_values)) ** 2
    return head / air if air > 0 else NAN  # NaN when the head is empty too


def fber(data: np.ndarray, head: np.ndarray, air: np.ndarray) -> float:
    """Median energy ``|x|^2`` in the head over that in the air's finite, non-zero voxels
    (zeros are padding, not noise: MRIQC's rotation mask); NaN when fewer than
    ``MIN_AIR_VOXELS`` such voxels remain (no air, or a skull-stripped background of
    zeros) or the head is empty."""
    data = np.asarray(data)
    finite = np.isfinite(data)
    return _fber(data[finite & head], _measured(data[finite & air]))


def _measured(air_values: np.ndarray) -> np.ndarray:
    return air_values[air_values != 0]


def _air_note(region: int, measured: int) -> str | None:
    """Why the air metrics are n/a, or None when the air was measured."""
    if measured >= MIN_AIR_VOXELS:
        return None
    names = " and ".join(AIR_METRICS.values())
    if region == 0:
        why = (f"no air in the field of view (none of it lies {_AIR_MARGIN_MM:g} mm or more "
               "from the head: a tight crop, common at 0.5 mm)")
    elif region - measured >= measured:
        why = (f"the air is exact zeros in {region - measured} of its {region} voxel(s) "
               "(skull-stripped, defaced or zero-padded: no noise to measure)")
    else:
        why = (f"only {measured} air voxel(s) measured, fewer than the {MIN_AIR_VOXELS} a "
               "noise estimate needs (the field of view ends close to the head)")
    return f"{names}: n/a, {why}; not judged against the cohort"


def _wm2max(wm_median: float, values: np.ndarray) -> float:
    top = float(percentiles(values, [99.95])[0]) if values.size else NAN
    return wm_median / top if top > 0 else NAN


def wm2max(data: np.ndarray, wm: np.ndarray) -> float:
    """WM median over the image's 99.95th percentile (finite voxels); NaN if either is
    missing or the percentile is not positive."""
    data = np.asarray(data)
    finite = np.isfinite(data)
    return _wm2max(_median(data[finite & wm]), data[finite])


def _stats(values: np.ndarray) -> tuple[float, float, float, int]:
    """Median, standard deviation, normalised MAD and count; NaN when empty."""
    if values.size == 0:
        return NAN, NAN, NAN, 0
    median = _median(values)
    mad = _MAD_TO_SIGMA * _median(np.abs(values - np.float32(median)))
    return median, float(np.std(values)), mad, values.size


def image_quality(data: np.ndarray, valid: np.ndarray, masks: TissueMasks,
                  notes: list[str] | None = None) -> dict[str, float]:
    """Every metric of this module for one volume, keyed by name (see the module notes).
    ``notes``, when given, receives why a metric is NaN where the volume is the cause
    (the air metrics without measured air)."""
    data = np.ascontiguousarray(data)  # a strided view (a subsampled scan) slows every pass
    usable = np.asarray(valid, dtype=bool) & np.isfinite(data)
    values = np.ravel(data) if usable.all() else data[usable]
    head, region = data[masks.head & usable], data[masks.air & usable]
    air = _measured(region)
    tissue = {name: _stats(data[getattr(masks, name) & usable]) for name in ("csf", "gm", "wm")}
    note = _air_note(region.size, air.size)
    if note is not None and notes is not None:
        notes.append(note)
    sigma_air = float(np.std(air)) if note is None else NAN
    (mu_gm, sd_gm, mad_gm, _), (mu_wm, sd_wm, mad_wm, _) = tissue["gm"], tissue["wm"]
    result = {f"snr_{name}": snr(mu, sd, n) for name, (mu, sd, _, n) in tissue.items()}
    result["snr_total"] = float(np.mean(list(result.values())))
    result.update(
        snr_dietrich=snr_dietrich(mu_wm, sigma_air),
        # Air of zeros adds no noise term: the tissue spread alone (it dominates); no
        # air at all, no CNR, as before.
        cnr=cnr(mu_wm, mu_gm, NAN if not region.size else 0.0 if note else sigma_air,
                sd_wm, sd_gm),
        cjv=cjv(mu_wm, mu_gm, mad_wm, mad_gm),
        efc=_efc(values),
        fber=_fber(head, air),
        wm2max=_wm2max(mu_wm, values),
        head_fraction=head.size / data.size if data.size else NAN,
        air_voxels=float(air.size),
    )
    return result
