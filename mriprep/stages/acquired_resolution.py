"""The resolution an image actually carries, per voxel axis, against the one it claims.

A scanner or a converter can write a scan on a finer grid than it was acquired on:
Philips and GE export reconstructions zero-filled to 0.47 mm from a much coarser
acquisition, and thick slices (1 x 1 x 3 mm) are reconstructed or resampled onto a
1 mm isotropic grid. The header then claims a resolution the data do not hold, and a
pipeline that conforms to the smallest voxel (FastSurfer's ``--vox_size min``) spends
memory and a network's capacity on interpolated voxels. This module measures, per axis,
the voxel size the data hold, from the spectrum of the image along that axis.

Why the spectrum, and what in it. An interpolated image is the coarse samples passed
through an interpolator, whose transfer function leaves its mark at frequencies set by
the coarse spacing ``R``, whatever the anatomy:

* a band-limited reconstruction (zero-filled k-space, sinc or FFT interpolation) holds
  nothing above the coarse grid's Nyquist frequency ``1/(2R)``: the spectrum ends there,
  a *cliff*;
* a local interpolator (nearest, linear, cubic, any kernel that reproduces a constant)
  has a transfer function that vanishes at ``1/R``: the spectrum has a *notch* there,
  inside the band whenever ``R`` is at least twice the new spacing.

A genuine acquisition has neither: its spectrum falls smoothly with the anatomy and the
acquisition's blur into the noise, which is white up to the grid's Nyquist frequency. So
the measure looks for the marks, not for how much the spectrum falls: a blurry but
genuine scan (an average of 27 registrations, a high-SNR scan of a smooth template) is
not mistaken for an interpolated one, which a cut-off frequency or a bandwidth quantile
would do: Colin27's own 1 mm scan falls further across its band than a sharp-edged scan
resampled linearly to twice its resolution. The autocorrelation against the voxel grid
holds the same information (it is the spectrum's Fourier transform) but spreads a cliff or a
notch over every lag, where its reading depends on the anatomy's own spectral slope.

Integers stored in few levels (uint8, a small int16 range) add rounding noise, white
with variance ``step**2 / 12``, which fills a notch and the floor after a cliff; the
storage step is read from the values and that floor taken out of the spectrum before
the marks are looked for. A linear or cubic interpolation stored in 8 bits can still
leave its notch under the rounding; then a third mark stands in: the top of the band
holding nothing above the rounding floor (an *empty band*), with the roll-off below it
placed where the spectrum has fallen :data:`ROLLOFF_DB` below its low band.

What it cannot see: a local interpolator's factor below 2 puts its zero beyond the
Nyquist frequency, so a linear or cubic resampling by 1.5-2x (1 mm written at 0.6 mm)
leaves only a gradual roll-off, which a blurry genuine scan has too: it is not flagged,
or is reported at 2x. The issue's cases (and scanners' zero-filled exports, found by
their cliff at any factor) are 2x and more.

The spectrum is cheap: 1-D segments of :data:`WINDOW` voxels along each axis, drawn at
fixed random places inside the head (every voxel above a tenth of the head's bright end,
and valid), Hann-windowed and averaged. Zero-filled slices, a defaced or skull-stripped
background and invalid (filled) voxels are never inside a segment; a large background
costs nothing. The thresholds, :data:`NOTCH_DB`, :data:`CLIFF_DB` and
:data:`ROLLOFF_DB`, are set on a tuning set and judged on a frozen held-out set
(:mod:`mriprep.demo.resolution_sets`, ``benchmarks/bench_resolution.py``); their ranges
and the timing are in docs/benchmarks.md, "Acquired resolution".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The warning threshold: an axis whose header claims at least this many times
# finer a voxel than its data hold is "falsely fine".
CLAIMED_FINER_RATIO = 1.5

# Segment length (voxels) along the measured axis: 16 frequency bins between zero and
# Nyquist locate a cliff or a notch to about half a bin (6% of a 2x factor). An axis too
# short, or a head too thin along it (a few thick slices), falls back to half of it.
WINDOW = 32
_WINDOWS = (WINDOW, WINDOW // 2)
# Candidate segments drawn per axis, and the fewest usable (inside the head and valid)
# that make a spectrum worth reading: below that the axis is reported as not measured.
_CANDIDATES = 6000
MIN_SEGMENTS = 200
# Voxels sampled for the head's threshold and the storage step.
_SAMPLE = 1 << 16
_HEAD_FRACTION = 0.1  # inside the head: above this share of its 99th percentile
_SEED = 0  # segments are drawn at fixed places: the measure is deterministic

# A notch must lie this far (dB) below the spectrum on both sides of it (on its lower
# side only at the Nyquist frequency), and a cliff drop this far below what precedes
# it, to count as an interpolator's mark (tuning set: see the module doc).
NOTCH_DB = 8.0
CLIFF_DB = 10.0
# Without a notch or a cliff, a top of the band empty above the rounding floor places the
# roll-off where the spectrum has fallen this far below its low band.
ROLLOFF_DB = 10.0
# Where a cliff is taken to be: the frequency at which the spectrum has fallen to half
# its level before the cliff. A Hann window spreads a step in the spectrum over a bin
# or two either side, and leaves half the power at the step itself.
_CLIFF_EDGE_DB = 3.0
# After the rounding floor is taken out, nothing is read below this share of it, nor
# below twice the scatter of a bin's mean over n segments (a segment's power at one
# frequency scatters as much as it is large: the mean's relative scatter is 1/sqrt(n)):
# a deeper "notch" there would be that scatter.
_FLOOR_SHARE = 0.05
_DB_FLOOR = -120.0  # relative level of an empty bin (float data: exact zeros)


@dataclass(frozen=True)
class AcquiredResolution:
    """The voxel size each axis of an image holds (see the module doc).

    Attributes
    ----------
    sizes_mm : tuple of 3 floats
        Per voxel axis, the resolution the data carry, in mm: the claimed spacing times
        the factor of the interpolation found along that axis; never finer than
        ``claimed_mm``, and equal to it where no interpolation was found or the axis
        could not be measured.
    claimed_mm : tuple of 3 floats
        The voxel spacing the header claims.
    segments : tuple of 3 ints
        Segments each axis's spectrum was averaged over; 0 where the head held too few
        (the axis is reported at its claimed size).
    marks : tuple of 3 str
        What gave each axis its size: ``"notch"`` (a local interpolator's zero),
        ``"cliff"`` (a band-limited reconstruction's edge), ``"empty band"`` (no notch,
        and the top of the band empty above the storage's rounding), ``""`` (none: the
        claimed size stands) or ``"not measured"``.
    notch_db, cliff_db : tuple of 3 floats
        Per axis, the depth of the deepest notch and the largest drop of the spectrum
        found (dB; 0.0 where not measured), whether or not they reach :data:`NOTCH_DB`
        and :data:`CLIFF_DB`: how far each axis is from a verdict (``make bench``).
    """

    sizes_mm: tuple[float, float, float]
    claimed_mm: tuple[float, float, float]
    segments: tuple[int, int, int]
    marks: tuple[str, str, str]
    notch_db: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cliff_db: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def ratios(self) -> tuple[float, float, float]:
        """Per axis, the acquired size over the claimed one (1.0: the header is true)."""
        return tuple(round(float(s / c), 3) for s, c in zip(self.sizes_mm, self.claimed_mm))

    def falsely_fine_axes(self, ratio: float = CLAIMED_FINER_RATIO) -> tuple[int, ...]:
        """The voxel axes whose header claims at least ``ratio`` times finer than the
        data hold."""
        return tuple(axis for axis, r in enumerate(self.ratios) if r >= ratio)


def acquired_resolution(data: np.ndarray, spacing: tuple[float, float, float],
                        valid: np.ndarray | None = None) -> AcquiredResolution:
    """Measure, per voxel axis, the resolution ``data`` actually carries.

    Parameters
    ----------
    data : ndarray, 3-D
        The image as stored (finite: sanitize first), any real dtype.
    spacing : 3 floats
        The voxel spacing the header claims, mm, per voxel axis.
    valid : ndarray of bool, optional
        False where a voxel was not measured (filled by sanitize, a masked slice); such
        voxels never enter a segment.

    Returns
    -------
    AcquiredResolution

    Raises
    ------
    ValueError
        ``data`` is not 3-D, ``valid`` has another shape, or ``spacing`` is not three
        positive numbers.

    Notes
    -----
    Along each axis the image is read in segments of :data:`WINDOW` voxels lying wholly
    inside the head and inside ``valid``; their mean Hann-windowed power spectrum, less
    the white floor of the storage's rounding, is searched for the marks of an
    interpolation from a coarser spacing ``R`` (module doc): a notch, whose frequency
    ``1/R`` gives ``R`` as twice the spacing times Nyquist over the notch's frequency;
    a cliff, whose start ``1/(2R)`` gives ``R`` as the spacing times Nyquist over it;
    without a notch, an empty band above a roll-off. The largest factor found is the
    axis's; none found, the claimed spacing stands.
    """
    data = np.asarray(data)
    if data.ndim != 3:
        raise ValueError(f"acquired_resolution needs a 3-D image, got shape {data.shape}")
    claimed = tuple(float(s) for s in np.ravel(spacing))
    if len(claimed) != 3 or not all(np.isfinite(s) and s > 0 for s in claimed):
        raise ValueError(f"spacing must be three positive voxel sizes in mm, got {spacing!r}")
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        if valid.shape != data.shape:
            raise ValueError(f"valid has shape {valid.shape}, the image {data.shape}")
    rng = np.random.default_rng(_SEED)
    inside, threshold, step = _head_sample(data, valid, rng)
    axes = [_axis_factor(data, valid, axis, inside, threshold, step, rng)
            for axis in range(3)]
    return AcquiredResolution(
        sizes_mm=tuple(round(float(c * a.factor), 3) for c, a in zip(claimed, axes)),
        claimed_mm=claimed,
        segments=tuple(a.segments for a in axes),
        marks=tuple(a.mark for a in axes),
        notch_db=tuple(round(float(a.notch_db), 2) for a in axes),
        cliff_db=tuple(round(float(a.cliff_db), 2) for a in axes),
    )


def _head_sample(data, valid, rng):
    """Random in-head voxel coordinates (rows of ``inside``), the head's threshold and
    the storage step of the values (0.0 for continuous values)."""
    coords = np.stack([rng.integers(0, n, _SAMPLE) for n in data.shape], axis=1)
    # Indexing by coordinates reads 65k voxels; np.ravel of a strided view (a reoriented
    # scan) would copy the whole volume first.
    values = data[tuple(coords.T)].astype(np.float64)
    keep = values > 0
    if valid is not None:
        keep &= valid[tuple(coords.T)]
    if not keep.any():
        return coords[:0], np.inf, 0.0
    threshold = _HEAD_FRACTION * float(np.percentile(values[keep], 99))
    keep &= values > threshold
    return coords[keep], threshold, storage_step(values[keep])


def storage_step(values: np.ndarray) -> float:
    """The step between the levels ``values`` are stored in (1.0 for integers, the
    scale factor of scaled int16), or 0.0 when they are not on a grid of levels
    (floating-point data).

    The smallest gap between distinct values, accepted when nearly all distinct values
    lie a whole number of it from the lowest (a value sanitize filled in may not): an
    offset and a scale applied after storage (an intensity normalisation before the
    resample stage measures) keep the levels a grid.
    """
    levels = np.unique(np.asarray(values, dtype=np.float64))
    if levels.size < 2:
        return 0.0
    gaps = np.diff(levels)
    step = float(gaps.min())
    if step <= 0 or (levels[-1] - levels[0]) / step > 1e6:
        return 0.0
    # Single-precision values (levels times a scale factor, stored as float32) put each
    # gap a few units in the last place off a whole multiple: average the step over the
    # gaps that are small multiples of it.
    counts = np.round(gaps / step)
    near = (counts <= 16) & (np.abs(gaps / step - counts) < 0.01)
    step = float(np.sum(gaps[near]) / np.sum(counts[near]))
    multiples = (levels - levels[0]) / step
    on_grid = np.abs(multiples - np.round(multiples)) < 0.01
    return step if np.mean(on_grid) > 0.99 else 0.0


@dataclass(frozen=True)
class _Axis:
    """One axis's reading: the interpolation factor found (1.0 for none), the segments
    that measured it, which mark gave it, and both marks' strengths (dB)."""

    factor: float
    segments: int
    mark: str
    notch_db: float = 0.0
    cliff_db: float = 0.0


def _axis_factor(data, valid, axis, inside, threshold, step, rng) -> _Axis:
    n = data.shape[axis]
    for window in _WINDOWS:
        if n < window or len(inside) == 0:
            continue
        segments = _segments(data, valid, axis, window, inside, threshold, rng)
        if len(segments) < MIN_SEGMENTS:
            continue
        levels, empty = _levels(segments, window, step)
        notch, notch_db = _notch(levels)
        cliff, cliff_db = _cliff(levels)
        # A notch places the coarse grid exactly; without one, the top of the band
        # holding nothing above the storage's rounding is a mark of its own.
        rolloff = _rolloff(levels, empty) if notch <= 1.0 else 1.0
        found = {"notch": notch, "cliff": cliff, "empty band": rolloff}
        mark = max(found, key=found.get)
        factor = found[mark]
        return _Axis(factor, len(segments), mark if factor > 1.0 else "", notch_db, cliff_db)
    return _Axis(1.0, 0, "not measured")


def _segments(data, valid, axis, window, inside, threshold, rng) -> np.ndarray:
    """Segments of ``window`` voxels along ``axis`` that start near random in-head
    voxels and lie wholly inside the head (and ``valid``), as float64 rows."""
    n = data.shape[axis]
    pick = inside[rng.integers(0, len(inside), _CANDIDATES)]
    start = np.clip(pick[:, axis] - rng.integers(0, window, len(pick)), 0, n - window)
    index = [pick[:, a][:, None] for a in range(3)]
    index[axis] = start[:, None] + np.arange(window)[None, :]
    index = tuple(np.broadcast_arrays(*index))
    segments = data[index].astype(np.float64)
    usable = np.all(segments > threshold, axis=1)
    if valid is not None:
        usable &= np.all(valid[index], axis=1)
    return segments[usable]


def _levels(segments: np.ndarray, window: int, step: float) -> tuple[np.ndarray, int]:
    """The mean power spectrum of ``segments`` times frequency squared (flat for an
    image of sharp edges, so that every part of the band is read alike), in dB relative
    to its maximum, at the frequency bins 1..Nyquist, the storage's rounding floor taken
    out first; and the index from which every bin up to Nyquist held nothing above that
    floor (the number of bins when none did)."""
    taper = np.hanning(window + 2)[1:-1]
    centred = segments - segments.mean(axis=1, keepdims=True)
    power = np.mean(np.abs(np.fft.rfft(centred * taper, axis=1)) ** 2, axis=0)[1:]
    empty = len(power)
    if step > 0:
        floor = step * step / 12.0 * float(np.sum(taper * taper))
        least = max(_FLOOR_SHARE, 2.0 / np.sqrt(len(segments))) * floor
        clamped = power - floor <= least
        while empty > 0 and clamped[empty - 1]:
            empty -= 1
        power = np.maximum(power - floor, least)
    weighted = power * np.arange(1, len(power) + 1) ** 2
    top = float(weighted.max())
    if top <= 0:
        return np.zeros(len(weighted)), empty
    relative = np.maximum(weighted / top, 10.0 ** (_DB_FLOOR / 10.0))
    return 10.0 * np.log10(relative), empty


def _rolloff(levels: np.ndarray, empty: int) -> float:
    """Nyquist over the frequency where the spectrum falls :data:`ROLLOFF_DB` below its
    level in the band's lowest quarter, when at least an eighth of the band at its top
    holds nothing above the rounding floor; else 1.0.

    Linear or cubic interpolation stored in few levels (uint8) leaves its notch under
    the rounding, and its roll-off around the coarse Nyquist frequency is gradual, no
    cliff: where the band above is empty, the roll-off is placed where the spectrum has
    fallen a fixed depth below its low band. An anatomy whose own spectrum falls puts
    that place lower, and the size larger: the safe side for a voxel size to conform
    to."""
    nyquist = len(levels)
    if nyquist - empty < max(2, nyquist // 8):
        return 1.0
    edge = float(np.median(levels[1:max(2, nyquist // 4)])) - ROLLOFF_DB
    for i in range(1, nyquist):
        if levels[i] < edge <= levels[i - 1]:
            frequency = i + (levels[i - 1] - edge) / (levels[i - 1] - levels[i])
            return max(1.0, nyquist / frequency)
    return 1.0


def _notch(levels: np.ndarray) -> tuple[float, float]:
    """(factor, depth): 2 x Nyquist over the frequency of the deepest notch if it is at
    least :data:`NOTCH_DB` deep, else 1.0; and its depth (dB). Bins from a quarter of the
    band (factors up to 8)."""
    nyquist = len(levels)
    reach = max(2, round(3 * nyquist / 16))
    best_depth, best = 0.0, None
    for i in range(max(1, nyquist // 4 - 1), nyquist):
        below = float(levels[max(0, i - reach):i].max())
        if i < nyquist - 1:
            depth = min(below, float(levels[i + 1:i + 1 + reach].max())) - levels[i]
        else:
            depth = below - levels[i]
        if depth > best_depth:
            best_depth, best = depth, i
    if best is None or best_depth < NOTCH_DB:
        return 1.0, best_depth
    offset = 0.0
    if 0 < best < nyquist - 1:
        # Where the notch's parabola (in dB) bottoms out, between bins.
        left, mid, right = levels[best - 1], levels[best], levels[best + 1]
        curvature = left - 2 * mid + right
        if curvature > 0:
            offset = float(np.clip(0.5 * (left - right) / curvature, -0.5, 0.5))
    return max(1.0, 2.0 * nyquist / (best + 1 + offset)), best_depth


def _cliff(levels: np.ndarray) -> tuple[float, float]:
    """(factor, drop): Nyquist over the frequency where a cliff starts, if the spectrum
    anywhere drops :data:`CLIFF_DB` below the bins just before and stays there to
    Nyquist, else 1.0; and the largest such drop (dB)."""
    nyquist = len(levels)
    # A cliff falls within an eighth of the band (two bins of 16): the steady slope of
    # a blurred or linearly interpolated spectrum, 2-5 dB a bin, is not one.
    reach = max(1, nyquist // 8)
    # Highest level at or above each bin.
    above = np.maximum.accumulate(levels[::-1])[::-1]
    drops = [float(levels[max(0, i - reach):i].max() - above[i]) for i in range(1, nyquist)]
    largest = max(drops, default=0.0)
    for i in range(1, nyquist):
        before = float(levels[max(0, i - reach):i].max())
        if before - above[i] < CLIFF_DB:
            continue
        edge = before - _CLIFF_EDGE_DB
        # The cliff starts where the spectrum first falls below ``edge`` after the peak
        # of the bins before it; between bins, linearly in dB.
        j = max(0, i - reach) + int(np.argmax(levels[max(0, i - reach):i]))
        while j < i and levels[j + 1] >= edge:
            j += 1
        if j + 1 < nyquist and levels[j] > levels[j + 1]:
            frequency = j + 1 + (levels[j] - edge) / (levels[j] - levels[j + 1])
        else:
            frequency = j + 1
        return max(1.0, nyquist / frequency), largest
    return 1.0, largest
