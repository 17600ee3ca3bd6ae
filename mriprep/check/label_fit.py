"""Whether a label map fits its image (``label-misfit``).

On a T1-weighted image, cerebral white matter is brighter than the cortex beside it. A
label map that lies on its image separates the two well; moved against it (a shift, a
wrong affine, another person's or another session's map) it mixes them. The measure is
the *separation* of white matter (2, 41) from cortex (3, 42 and the parcels 1000-2999):
the difference of their mean intensities over their pooled standard deviation.

An absolute floor on the separation would depend on the scanner's contrast, so the map
is compared with itself: the separation where it lies, against the map moved by one and
two voxels along each axis. A map that lies on its image separates best where it lies;
one that does not separates better somewhere else, and the *gain* of the best move says
by how much. Another person's map separates badly everywhere: its separation falls below
:data:`MIN_SEPARATION`. Both are measured on clean maps, on maps moved by 1, 2 and 4 mm
and on another person's, in ``make bench`` (labels). The measure runs on every third
voxel along each axis (a move of one or two voxels reads a neighbouring grid), a 27th of
the reads, so it stays a small part of a check.

Only the image's valid voxels are read: a slice the pipeline masked (zero-filled, NaN,
an artifact) holds a fill, not the tissue under its labels, and read as tissue it made a
true map of a scan with a zero-filled slab look like another person's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WHITE_MATTER = (2, 41)
# The relative gain from which a map is said not to lie on its image, and the separation
# below which white matter is hardly brighter than cortex under the labels (make bench
# labels: both measured on synthetic people only, hence warnings, not errors).
MAX_GAIN = 0.05
MIN_SEPARATION = 1.0
# The moves tried, in voxels along each axis.
MOVES = (-2, -1, 1, 2)
# Voxels of each tissue (on the subsampled grid) below which nothing is judged.
MIN_VOXELS = 200
# Every third voxel along each axis: the moves read the neighbouring grids.
_STEP = 3


@dataclass(frozen=True)
class FitReading:
    """The separation where the map lies, and the best move's."""

    here: float
    best: float
    best_move: tuple[int, int, int]

    @property
    def gain(self) -> float:
        """How much better the best move separates, relative to where the map lies."""
        return (self.best - self.here) / max(abs(self.here), 1e-6)

    def verdict(self) -> str | None:
        """None when the map lies on its image; else what is wrong: moved (a better
        place exists), or foreign (white matter hardly brighter anywhere near)."""
        moved = self.gain > MAX_GAIN
        if moved and (self.best >= MIN_SEPARATION or self.here >= MIN_SEPARATION):
            shown = ", ".join(f"{m:+d}" for m in self.best_move)
            return (f"white matter and cortex separate {self.gain:.0%} better with the "
                    f"labels moved by ({shown}) voxels (separation {self.best:.2f} "
                    f"against {self.here:.2f} where they lie): the map does not lie on "
                    "its image")
        if self.here < MIN_SEPARATION:
            return (f"under these labels white matter is hardly brighter than cortex "
                    f"(separation {self.here:.2f}, below {MIN_SEPARATION}): the map of "
                    "another person or session, a gross misregistration, or not a T1 "
                    "image")
        return None


def tissue_codes(labels: np.ndarray) -> np.ndarray:
    """0 elsewhere, 1 cerebral white matter, 2 cortex (uint8, the labels' shape)."""
    labels = np.asarray(labels)
    if labels.dtype.kind in "iu" and labels.dtype.itemsize <= 2:
        # Every value of the type has its entry, negative ones through the unsigned
        # view: no clip, no copy of the map before the lookup.
        unsigned = labels.view(labels.dtype.str.replace("i", "u"))
        return _CODES[: 1 << (8 * labels.dtype.itemsize)][unsigned]
    return _CODES[np.clip(labels, 0, _CODES.size - 1)]


def _code_table() -> np.ndarray:
    lookup = np.zeros(1 << 16, dtype=np.uint8)
    lookup[list(WHITE_MATTER)] = 1
    lookup[[3, 42]] = 2
    lookup[1000:3000] = 2
    return lookup


# Indexed by a label value (its unsigned view for an 8- or 16-bit map); values above
# 3000 and negative ones are no tissue of the measure.
_CODES = _code_table()


class _Tissues:
    """Each tissue's count, sum and sum of squares of one image's values, for codes that
    move over it. An image of integers of at most 16 bits (a uint8 cache) is summed
    through a histogram of its values per tissue, one count per voxel instead of three
    weighted sums, while every partial sum of squares is an integer that float64 holds
    exactly: both ways then give the same separation."""

    def __init__(self, image: np.ndarray):
        image = np.asarray(image)
        small = image.dtype.kind in "iu" and image.dtype.itemsize <= 2 and image.size
        low, high = (int(image.min()), int(image.max())) if small else (0, 0)
        if small and image.size * max(abs(low), abs(high)) ** 2 < 2 ** 53:
            self.levels = np.arange(low, high + 1, dtype=np.float64)
            self.offset = (image.astype(np.intp) - low).ravel()
        else:
            self.levels = None
            self.values = image.astype(np.float64).ravel()
            self.squares = self.values * self.values

    def separation(self, codes: np.ndarray) -> float:
        """White matter's mean intensity minus cortex's, over their pooled standard
        deviation, for :func:`tissue_codes` on the image's grid; NaN when either has
        fewer than :data:`MIN_VOXELS` voxels."""
        codes = codes.ravel()
        if self.levels is not None:
            size = len(self.levels)
            key = np.multiply(codes, size, dtype=np.intp)
            key += self.offset
            counts = np.bincount(key, minlength=3 * size).reshape(3, size)[1:3]
            n = counts.sum(axis=1)
            if n.min() < MIN_VOXELS:
                return float("nan")
            s1 = counts @ self.levels
            s2 = counts @ (self.levels * self.levels)
        else:
            n = np.bincount(codes, minlength=3)[1:3]
            if n.min() < MIN_VOXELS:
                return float("nan")
            s1 = np.bincount(codes, weights=self.values, minlength=3)[1:3]
            s2 = np.bincount(codes, weights=self.squares, minlength=3)[1:3]
        mean = s1 / n
        var = np.maximum(s2 / n - mean * mean, 0.0)
        pooled = np.sqrt(var.mean())
        return float((mean[0] - mean[1]) / max(pooled, 1e-6))


def read_fit(image: np.ndarray, labels: np.ndarray,
             labelled: tuple[slice, ...] | None = None,
             valid: np.ndarray | None = None) -> FitReading | None:
    """The separation where ``labels`` lie on ``image`` (same grid) and at each move;
    None when the map has too little white matter or cortex to judge.

    ``labelled``, the box of the map's labelled voxels when the caller knows it, bounds
    the reads: a sampled voxel that no move brings onto a label adds nothing to either
    tissue, so the sums are those of the whole grid, in the same order. ``valid``, the
    entry's mask of voxels that hold the scan's own values (None: all), leaves the
    others out of every read, where the map lies and at each move."""
    image, labels = np.asarray(image), np.asarray(labels)
    margin = max(abs(m) for m in MOVES)
    inner = []
    for axis, n in enumerate(image.shape):
        start, stop = margin, n - margin
        if labelled is not None:
            # The first sampled index that a move can bring onto the box, on the grid of
            # every third voxel from ``margin``; the last one likewise.
            low = max(start, labelled[axis].start - margin)
            start += -(-(low - start) // _STEP) * _STEP
            stop = min(stop, labelled[axis].stop + margin)
        inner.append(slice(start, max(start, stop), _STEP))
    inner = tuple(inner)
    # The region the moved reads reach; each read looks up the codes of its own voxels
    # only (13 reads of a 27th each), not every voxel of the region.
    reach = tuple(slice(s.start - margin, s.stop + margin) for s in inner)
    region = labels[reach]
    local = tuple(slice(margin, margin + s.stop - s.start, _STEP) for s in inner)
    tissues = _Tissues(image[inner])
    # An invalid image voxel is read as unlabelled, whichever label a move brings to it.
    read = None if valid is None else np.asarray(valid[inner], dtype=bool).view(np.uint8)

    def tissue_at(window: tuple[slice, ...]) -> np.ndarray:
        codes = tissue_codes(region[window])
        if read is not None:
            codes *= read
        return codes

    here = tissues.separation(tissue_at(local))
    if not np.isfinite(here):
        return None
    best, best_move = here, (0, 0, 0)
    for axis in range(3):
        for move in MOVES:
            # The label that lies ``move`` voxels away is read at each sampled voxel:
            # the map moved by -move.
            shifted = list(local)
            start, stop = local[axis].start + move, local[axis].stop + move
            shifted[axis] = slice(start, stop, _STEP)
            value = tissues.separation(tissue_at(tuple(shifted)))
            if np.isfinite(value) and value > best:
                best = value
                best_move = tuple(-move if a == axis else 0 for a in range(3))
    return FitReading(here, best, best_move)
