"""One pass over one tensor file: checksum its bytes and analyse its values.

The file's storage format reads it (:meth:`mriprep.cache.formats.TensorFormat.scan`) and
hands its values over in chunks of whole slices to the analysis for the tensor's kind
(image: finiteness, what the cast to the training dtype loses, the block means of its
identity fingerprint; valid mask: True count; label map: voxel count of each value). A
``.npy`` is read once, every chunk feeding the XXH3-128 checksum and, while it is still
in the CPU cache, the analysis; a compressed ``.b2nd`` is checksummed over its stored
bytes, then decoded one compressed chunk at a time.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mriprep.cache.formats import find_format, unknown_format_problem
from mriprep.cache.formats.base import UNREADABLE
from mriprep.core.hashing import CHUNK_BYTES
from mriprep.core.limits import CastLimits, cast_limits
from mriprep.splits.identity import IDENTITY_BLOCKS, identity_descriptor

# Block means per axis from which the image's identity descriptor is made (see
# mriprep.splits.identity: about 6 mm on the MNI grid; measured there). Smaller axes
# get one block per voxel.
FINGERPRINT_BLOCKS = IDENTITY_BLOCKS

# Share of an image's nonzero finite voxels below the training dtype's smallest normal
# number (float16 6.1e-5, bfloat16 1.2e-38) from which the cast is said to lose the
# image's contrast (``cast-underflow``, a warning). Measured shares, float16:
#   good: the demo cohort through t1w_mni_rigid (11 z-scored entries) 0.001-0.002%, through
#     conform_1mm (13 entries, 0-255) 0.000%; Colin27 (1 mm, brain, 0.5 mm) through
#     t1w_mni_rigid 0.001-0.003%, through conform_1mm 0.000%; the real scans as read
#     (Colin27 x3, INIA19 macaque) 0.000%, z-scored (whole image or brain) 0.000-0.006%.
#   failures: z-scored images x1e-5 or x1e-6 99.99-100% (x1e-4: 12-81%); conform output
#     x1e-5 44-58% (demo) / 0.000% (Colin27: no voxel below 2.4/255), x1e-6 60-68% (demo)
#     / 0.055-25.8% (Colin27); the raw scans x1e-6 0.78-33%.
#   bfloat16: 0.000% on all of them (x1e-6 keeps float32 values normal).
# 0.1% is 17x the largest good share; the scaled images it passes keep nearly every voxel
# normal (Colin27 0.5 mm conformed x1e-6: 0.055%, the darkest voxels only).
CAST_UNDERFLOW_SHARE = 0.001


@dataclass
class TensorScan:
    """What one pass over one tensor file learned.

    ``problems`` holds ``(code, detail)`` pairs; the caller turns them into findings
    naming the entry.
    """

    bytes_read: int = 0
    checksum: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)
    fingerprint: np.ndarray | None = None
    nonzero: int | None = None
    value_counts: dict[int, int] | None = None


class _ImageStats:
    """Per-chunk analysis of an image: finiteness, what the cast to the training dtype
    loses (overflow, underflow, rounded integers), and block sums for the fingerprint,
    all on the chunk while it is still in the CPU cache.

    The cast checks cost one ``abs`` of the chunk (into a per-thread scratch buffer),
    whose max replaces the chunk's min and max, and two counts over it: its nonzero
    voxels and those below the dtype's smallest normal number. An image whose dtype
    cannot hold a value the cast loses (uint8 for float16) is not examined for it.
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, cast: CastLimits):
        self.cast = cast
        self.is_float = np.issubdtype(dtype, np.floating)
        self.is_int = np.issubdtype(dtype, np.integer)
        info = np.finfo(dtype) if self.is_float else np.iinfo(dtype) if self.is_int else None
        self.overflow_check = (
            cast.checked
            and info is not None
            and (float(info.max) > cast.max or float(info.min) < -cast.max)
        )
        self.underflow_check = (
            cast.checked
            and self.is_float
            and dtype.itemsize in (2, 4, 8)
            and float(info.smallest_subnormal) < cast.tiny
        )
        self.precision_check = (
            cast.checked
            and self.is_int
            and (info.max > cast.exact_int or info.min < -cast.exact_int)
        )
        if self.underflow_check:
            self.tiny = np.asarray(cast.tiny, dtype=dtype)  # exact: a power of two
            self.bits = np.dtype(f"i{dtype.itemsize}")  # nonzero test on the bits of |x|
        self.nan = self.posinf = self.neginf = self.extreme = 0
        self.first_bad: tuple[int, ...] | None = None
        self.first_extreme: tuple[int, ...] | None = None
        self.voxels = self.nonzero = self.below_tiny = 0  # below_tiny counts zeros too
        self.largest = 0.0  # largest finite magnitude (with the underflow check)
        self.int_range: tuple[int, int] | None = None
        self.fingerprinting = len(shape) == 3 and min(shape) >= 4
        if self.fingerprinting:
            blocks = [min(FINGERPRINT_BLOCKS, n) for n in shape]
            self.edges = [block_edges(n, b) for n, b in zip(shape, blocks)]
            # the x block of every slice, to sum a chunk's slices block by block
            self.x_block = np.searchsorted(self.edges[0], np.arange(shape[0]), side="right") - 1
            self.block_sums = np.zeros(blocks, dtype=np.float64)
            # float16 block sums could overflow; float32 sums of a chunk's few hundred
            # values per block are exact enough for a correlation and keep the pass fast.
            self.sum_dtype = np.float32 if dtype.itemsize <= 4 else np.float64

    def add(self, chunk: np.ndarray, first_row: int) -> None:
        if self.underflow_check:
            self._add_cast_float(chunk, first_row)
        elif self.is_float:
            lo, hi = chunk.min(), chunk.max()
            if not (np.isfinite(lo) and np.isfinite(hi)):
                self._count_non_finite(chunk, first_row)
            elif self.overflow_check and (hi > self.cast.max or lo < -self.cast.max):
                self._count_extreme(chunk, first_row)
        elif self.overflow_check or self.precision_check:
            lo, hi = int(chunk.min()), int(chunk.max())
            if self.int_range is not None:
                lo, hi = min(lo, self.int_range[0]), max(hi, self.int_range[1])
            self.int_range = (lo, hi)
            if self.overflow_check and max(hi, -lo) > self.cast.max:
                self._count_extreme(chunk.astype(np.float64), first_row)
        if self.fingerprinting:
            # Summing the chunk's slices of one x block first (whole contiguous slices:
            # the cheap direction) leaves the strided y and z reductions an array about
            # X/32 times smaller; summing whole rows first cost 40% more at 32 blocks.
            # (``sum`` per block, not ``np.add.reduceat`` on axis 0: 9x slower there.)
            blocks = self.x_block[first_row : first_row + chunk.shape[0]]
            starts = np.flatnonzero(np.diff(blocks, prepend=-1))
            stops = np.append(starts[1:], len(blocks))
            x_sums = np.stack([chunk[a:b].sum(axis=0, dtype=self.sum_dtype)
                               for a, b in zip(starts.tolist(), stops.tolist())])
            y_sums = np.add.reduceat(x_sums, self.edges[1], axis=1)
            self.block_sums[blocks[starts]] += np.add.reduceat(y_sums, self.edges[2], axis=2)

    def _add_cast_float(self, chunk: np.ndarray, first_row: int) -> None:
        magnitude, below = _scratch(chunk)
        np.abs(chunk.reshape(-1), out=magnitude)
        largest = magnitude.max()  # NaN when any voxel is NaN
        if not np.isfinite(largest):
            self._count_non_finite(chunk, first_row)
        else:
            self.largest = max(self.largest, float(largest))
            if self.overflow_check and largest > self.cast.max:
                self._count_extreme(chunk, first_row)
        self.voxels += chunk.size
        self.nonzero += int(np.count_nonzero(magnitude.view(self.bits)))  # -0.0 is 0 here
        self.below_tiny += int(np.count_nonzero(np.less(magnitude, self.tiny, out=below)))

    def _count_non_finite(self, chunk: np.ndarray, first_row: int) -> None:
        nan, posinf, neginf = np.isnan(chunk), np.isposinf(chunk), np.isneginf(chunk)
        self.nan += int(nan.sum())
        self.posinf += int(posinf.sum())
        self.neginf += int(neginf.sum())
        if self.first_bad is None:
            where = np.argwhere(nan | posinf | neginf)[0]
            self.first_bad = (where[0] + first_row, *where[1:])
        finite = np.where(np.isfinite(chunk), chunk, 0)
        largest = float(np.abs(finite).max())
        self.largest = max(self.largest, largest)
        if self.overflow_check and largest > self.cast.max:
            self._count_extreme(finite, first_row)

    def _count_extreme(self, chunk: np.ndarray, first_row: int) -> None:
        beyond = np.abs(chunk) > self.cast.max
        self.extreme += int(beyond.sum())
        if self.first_extreme is None:
            where = np.argwhere(beyond)[0]
            self.first_extreme = (where[0] + first_row, *where[1:])

    def finish(self, scan: TensorScan) -> None:
        bad = self.nan + self.posinf + self.neginf
        name = self.cast.name
        if bad:
            scan.problems.append(
                (
                    "non-finite",
                    f"holds {bad} non-finite voxel(s) ({self.nan} NaN, {self.posinf} +Inf, "
                    f"{self.neginf} -Inf), first at voxel {tuple(int(i) for i in self.first_bad)}; "
                    "a single NaN turns the training loss into NaN. The file was changed "
                    "after the pipeline validated it: rebuild the entry with "
                    "`mriprep run --force`",
                )
            )
        if self.extreme:
            scan.problems.append(
                (
                    "extreme-values",
                    f"holds {self.extreme} voxel(s) beyond the {name} range "
                    f"(|x| > {self.cast.max:g}), first at voxel "
                    f"{tuple(int(i) for i in self.first_extreme)}; the cast to {name} "
                    "under mixed-precision training overflows them to Inf. Rebuild the "
                    "entry with a pipeline that sanitizes and normalizes intensities (or, "
                    "if training never casts to this dtype, check with the --dtype it uses)",
                )
            )
        if self.underflow_check:
            finite_nonzero = self.nonzero - bad
            underflow = self.below_tiny - (self.voxels - self.nonzero)
            share = underflow / finite_nonzero if finite_nonzero else 0.0
            if share > CAST_UNDERFLOW_SHARE:
                scan.problems.append(
                    (
                        "cast-underflow",
                        f"{share:.2%} of its nonzero voxels ({underflow} of {finite_nonzero}) "
                        f"are smaller in magnitude than {self.cast.tiny:.4g}, the smallest "
                        f"normal {name} (its largest |x| is {self.largest:.3g}): the cast "
                        f"to {name} makes them subnormal or zero and the image loses its "
                        "contrast. The intensities are scaled far too small: rebuild the "
                        "entry with a pipeline that normalizes them (z-score or 0-1)",
                    )
                )
        if self.int_range is not None and not self.extreme:
            magnitude = max(self.int_range[1], -self.int_range[0])
            if magnitude > self.cast.exact_int:
                scan.problems.append(
                    (
                        "cast-precision",
                        f"holds integer values up to {magnitude} (range {self.int_range[0]}"
                        f"..{self.int_range[1]}), beyond {self.cast.exact_int}, the largest "
                        f"integer {name} holds exactly: the cast to {name} rounds them. "
                        "Cache the image as float32 normalized intensities, or rescale it",
                    )
                )
        if self.fingerprinting and not bad:
            sizes = [np.diff(np.append(e, n)) for e, n in zip(self.edges, scan.shape)]
            counts = sizes[0][:, None, None] * sizes[1][None, :, None] * sizes[2][None, None, :]
            # Robust to what one pass can hold: a corrupt voxel moves one block mean,
            # which the descriptor's clipped robust z bounds.
            scan.fingerprint = identity_descriptor(self.block_sums / counts)


_SCRATCH = threading.local()


def _scratch(chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two flat scratch arrays for ``chunk``, reused by the calling thread: one of its
    dtype and size (for ``|chunk|``), one of bools (for a comparison)."""
    need = chunk.nbytes + chunk.size
    buffer = getattr(_SCRATCH, "buffer", None)
    if buffer is None or len(buffer) < need:
        buffer = _SCRATCH.buffer = bytearray(max(need, CHUNK_BYTES + CHUNK_BYTES // 4))
    magnitude = np.frombuffer(buffer, dtype=chunk.dtype, count=chunk.size)
    below = np.frombuffer(buffer, dtype=bool, count=chunk.size, offset=chunk.nbytes)
    return magnitude, below


class _NonzeroCount:
    """Count of True (non-zero) voxels of a mask."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, chunk: np.ndarray, first_row: int) -> None:
        self.count += int(np.count_nonzero(chunk))

    def finish(self, scan: TensorScan) -> None:
        scan.nonzero = self.count


class _ValueCounts:
    """Voxel count of every label value.

    Label maps hold few values in long runs. A chunk whose values span a narrow range is
    counted by one comparison pass per value (vectorised, no index arrays); otherwise by
    run-length encoding it and weighting a bincount of the run values by run length,
    which costs about one pass over the voxels plus work proportional to the runs.
    """

    NARROW = 8

    def __init__(self, dtype: np.dtype):
        self.integer = np.issubdtype(dtype, np.integer)
        self.counts: Counter = Counter()
        self.scratch: np.ndarray | None = None

    def add(self, chunk: np.ndarray, first_row: int) -> None:
        flat = chunk.reshape(-1)
        if not self.integer:
            values, counts = np.unique(flat, return_counts=True)
            self.counts.update(dict(zip(values.tolist(), counts.tolist())))
            return
        lo, hi = int(flat.min()), int(flat.max())
        if self.scratch is None or self.scratch.size < flat.size:
            self.scratch = np.empty(flat.size, dtype=bool)
        if hi - lo < self.NARROW:
            equal = self.scratch[: flat.size]
            for value in range(lo, hi + 1):
                count = np.count_nonzero(np.equal(flat, value, out=equal))
                if count:
                    self.counts[value] += count
            return
        changes = np.not_equal(flat[1:], flat[:-1], out=self.scratch[: flat.size - 1])
        starts = np.concatenate(([0], np.flatnonzero(changes) + 1))
        lengths = np.diff(np.append(starts, flat.size))
        run_values = flat[starts].astype(np.int64) - lo
        if hi - lo < 1 << 16:
            sums = np.bincount(run_values, weights=lengths)
            values = np.flatnonzero(sums)
            sums = sums[values]
        else:  # a value range too wide for a dense table
            values, inverse = np.unique(run_values, return_inverse=True)
            sums = np.bincount(inverse, weights=lengths)
        for value, total in zip(values.tolist(), sums.tolist()):
            self.counts[lo + value] += int(total)

    def finish(self, scan: TensorScan) -> None:
        scan.value_counts = {_as_label(v): int(c) for v, c in sorted(self.counts.items())}


def _as_label(value: Any) -> Any:
    return int(value) if float(value).is_integer() else float(value)


def block_edges(n: int, blocks: int) -> np.ndarray:
    """First index of each of ``blocks`` near-equal blocks along an axis of length ``n``
    (the fingerprint's block boundaries, as ``np.add.reduceat`` takes them)."""
    return np.linspace(0, n, blocks + 1)[:-1].round().astype(np.intp)


def scan_tensor_file(
    path: str | os.PathLike,
    kind: str,
    buffer: bytearray | None = None,
    cast_dtype: str | CastLimits = "float16",
) -> TensorScan:
    """Read one tensor file once: checksum its bytes and analyse its values.

    The file's format opens it as the training Dataset will (a ``.npy`` that cannot be
    memory-mapped safely, a compressed stream that cannot be decoded, are reported here)
    and reads it through one reusable ``buffer``: the bytes feed the XXH3-128 checksum,
    the values, in chunks of whole slices, the analysis for its ``kind`` (``"image"``:
    finiteness, the cast to ``cast_dtype``, fingerprint; ``"valid"``: count of True
    voxels; ``"label"``: voxel count of each value). No full copy of the tensor is made.

    Parameters
    ----------
    path : path-like
        The tensor file (``.npy``, ``.b2nd``: any registered format).
    kind : {"image", "valid", "label"}
        Which analysis to run on the values.
    buffer : bytearray, optional
        Scratch space of about 4 MiB, reused across calls by one thread.
    cast_dtype : str or CastLimits
        The dtype training casts images to (``"float16"``, ``"bfloat16"``, ``"float32"``
        or another name :func:`~mriprep.core.limits.cast_limits` takes): an image value
        that overflows in it is ``extreme-values``, a large share of nonzero values below
        its smallest normal number ``cast-underflow``, integers it cannot hold exactly
        ``cast-precision``. float32: no cast check.

    Returns
    -------
    TensorScan
        Bytes read, checksum, dtype, shape, problems found and the analysis results.
    """
    path = Path(path)
    cast = cast_limits(cast_dtype)
    scan = TensorScan()
    if not path.is_file():
        scan.problems.append(("file-missing", f"is missing ({path})"))
        return scan
    fmt = find_format(path)
    if fmt is None:
        scan.problems.append((UNREADABLE, unknown_format_problem()))
        return scan
    analysis = None

    def start(dtype: np.dtype, shape: tuple[int, ...]):
        nonlocal analysis
        analysis = _analysis_for(kind, shape, dtype, cast)
        return analysis

    stored = fmt.scan(path, buffer, start)
    scan.checksum, scan.bytes_read = stored.checksum, stored.bytes_read
    scan.problems += stored.problems
    if stored.shape is not None:
        scan.dtype, scan.shape = str(stored.dtype), stored.shape
    if stored.complete and analysis is not None:
        analysis.finish(scan)
    return scan


def _analysis_for(kind: str, shape: tuple[int, ...], dtype: np.dtype, cast: CastLimits):
    if kind == "image":
        return _ImageStats(shape, dtype, cast)
    if kind == "valid":
        return _NonzeroCount()
    if kind == "label":
        return _ValueCounts(dtype)
    return None  # a tensor this version does not know: checksum, dtype and shape only
