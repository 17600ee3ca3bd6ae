"""The calibration of the acquired-resolution measure: a tuning set and a frozen held-out
set of genuinely fine and falsely fine scans.

:func:`mriprep.stages.acquired_resolution.acquired_resolution` must flag a scan whose
header claims at least 1.5x finer voxels than it holds, on the axes that do, and leave a
genuine acquisition alone. Its two thresholds are tuned on the **tuning set** only
(synthetic people 0 and 1 of the calibration set, and the real Colin27 with and without
its scalp); the **held-out set** (other people: synthetic people 80001-80003, S1,
ROBEX with and without its scalp; other grids, interpolators and storage) is never
tuned on. ``make bench`` (``benchmarks/bench_resolution.py``) prints both;
``make test-calibration`` holds the held-out set.

A row is one scan:

``case``
    Its name, unique; its pose, noise and receive field are drawn from it.
``kind``
    ``genuine`` (must not be flagged) or ``falsely_fine`` (its ``fine`` axes must be,
    and no other). Colin27 at 0.5 mm (mricron-data's ``ch2better``) is genuine as the
    issue names it; how close it comes to the thresholds is in docs/benchmarks.md,
    "Acquired resolution".
``source``
    A real scan's name (:data:`~mriprep.demo.real_scans.REAL_SCANS`) or
    ``person-<seed>`` (:func:`~mriprep.demo.calibration.person`).
``acquisition``
    ``native``: a real scan as its file stores it; else a key of :data:`ACQUISITIONS`,
    the source scanned by :func:`~mriprep.demo.scanner.acquire` in a random pose.
``written``
    How the acquisition was written onto a finer grid: ``""`` (not: as acquired) or
    ``<method>:<factors>``, the method ``linear``, ``cubic`` (scipy's B-spline) or
    ``fft`` (zero-filled k-space, as a scanner's reconstruction interpolates) and one
    factor or three (per stored axis; ``1x1x3`` turns 1x1x3 mm slices into 1 mm).
    A real scan is cut to its head's box first (a field of view), to keep it small.
``after``
    What was done to the written scan, ``+``-separated: ``uint8`` (stored in 8 bits,
    0-255), ``int16`` (12 bits with a scale factor), ``defaced``, ``stripped``,
    ``zero_slices`` (three zero-filled slices in the middle of the head).
``fine``
    The stored axes the measure must find falsely fine (``"012"``, ``"2"``), empty for
    a genuine scan.

The rows are data: changing a held-out row changes the benchmark, to be said so, never
a tuning step.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import ndimage

from mriprep.demo import population as pop
from mriprep.demo.anatomy import Anatomy
from mriprep.demo.calibration import person, real_head
from mriprep.demo.real_scans import REAL_SCANS, real_scan
from mriprep.demo.scanner import Acquisition, Scan, acquire, random_pose

KINDS = ("genuine", "falsely_fine")
SETS = ("tuning", "heldout")
METHODS = ("linear", "cubic", "fft")

# The grids scans are acquired on (the source scanned in a random pose).
ACQUISITIONS: dict[str, Acquisition] = {
    "1mm": Acquisition(),
    "1mm_cor": Acquisition(slicing="coronal", flips=(True, True, False)),
    "0.8mm": Acquisition((0.8, 0.8, 0.8)),
    "0.7mm": Acquisition((0.7, 0.7, 0.7), "sagittal"),
    "ax3": Acquisition((1.0, 1.0, 3.0), "axial"),
    "cor3": Acquisition((1.0, 1.0, 3.0), "coronal", flips=(True, False, True)),
    "sag3": Acquisition((1.0, 1.0, 3.0), "sagittal", tilt_deg=10.0),
    "ax4_tilt15": Acquisition((1.0, 1.0, 4.0), "axial", tilt_deg=15.0),
    "cor5": Acquisition((0.9, 0.9, 5.0), "coronal", flips=(True, False, True)),
}
AFTER = ("uint8", "int16", "defaced", "stripped", "zero_slices")
_HEAD_BOX_MARGIN = 6  # voxels kept around a real head's box before it is written finer


@dataclass(frozen=True)
class ResolutionRow:
    """One scan of a set (module notes)."""

    case: str
    kind: str
    source: str
    acquisition: str
    written: str = ""
    after: str = ""
    fine: str = ""

    @property
    def fine_axes(self) -> tuple[int, ...]:
        return tuple(int(a) for a in self.fine)


_R = ResolutionRow
# Tuned on: synthetic people 0 and 1, Colin27 (with and without its scalp).
TUNING: tuple[ResolutionRow, ...] = (
    _R("colin27/native", "genuine", "colin27", "native"),
    _R("colin27_brain/native", "genuine", "colin27_brain", "native"),
    _R("person-0/1mm", "genuine", "person-0", "1mm"),
    _R("person-0/0.8mm", "genuine", "person-0", "0.8mm"),
    _R("person-1/0.7mm", "genuine", "person-1", "0.7mm"),
    _R("person-1/ax3", "genuine", "person-1", "ax3"),
    _R("person-0/cor5", "genuine", "person-0", "cor5"),
    _R("person-1/1mm_stripped", "genuine", "person-1", "1mm", after="stripped"),
    _R("person-0/1mm_defaced_int16", "genuine", "person-0", "1mm",
       after="defaced+int16"),
    _R("person-1/ax3_zero_slices", "genuine", "person-1", "ax3", after="zero_slices"),
    _R("colin27/ax3", "genuine", "colin27", "ax3"),
    _R("colin27>0.5mm_linear", "falsely_fine", "colin27", "native", "linear:2",
       fine="012"),
    _R("colin27>0.5mm_cubic", "falsely_fine", "colin27", "native", "cubic:2", fine="012"),
    _R("colin27>0.5mm_fft", "falsely_fine", "colin27", "native", "fft:2", fine="012"),
    _R("colin27>0.5mm_linear_uint8", "falsely_fine", "colin27", "native", "linear:2",
       "uint8", "012"),
    _R("colin27_brain>0.5mm_cubic", "falsely_fine", "colin27_brain", "native", "cubic:2",
       fine="012"),
    _R("colin27>0.5mm_cubic_uint8", "falsely_fine", "colin27", "native", "cubic:2",
       "uint8", "012"),
    _R("person-0/1mm>0.5mm_cubic_uint8", "falsely_fine", "person-0", "1mm", "cubic:2",
       "uint8", "012"),
    _R("person-1/ax3>1mm_cubic_uint8", "falsely_fine", "person-1", "ax3", "cubic:1x1x3",
       "uint8", "2"),
    _R("person-0/1mm>0.5mm_fft", "falsely_fine", "person-0", "1mm", "fft:2", fine="012"),
    _R("person-1/1mm>0.5mm_linear_int16", "falsely_fine", "person-1", "1mm", "linear:2",
       "int16", "012"),
    _R("person-1/1mm>0.5mm_cubic_defaced", "falsely_fine", "person-1", "1mm", "cubic:2",
       "defaced", "012"),
    _R("person-0/ax3>1mm_linear", "falsely_fine", "person-0", "ax3", "linear:1x1x3",
       fine="2"),
    _R("person-0/ax3>1mm_cubic", "falsely_fine", "person-0", "ax3", "cubic:1x1x3",
       fine="2"),
    _R("person-0/ax3>1mm_fft", "falsely_fine", "person-0", "ax3", "fft:1x1x3", fine="2"),
    _R("colin27/ax3>1mm_linear", "falsely_fine", "colin27", "ax3", "linear:1x1x3",
       fine="2"),
    _R("colin27/ax3>1mm_fft_zero_slices", "falsely_fine", "colin27", "ax3", "fft:1x1x3",
       "zero_slices", "2"),
)

# Frozen: never tuned on. Other people (synthetic 80001-80003, S1, ROBEX), other
# grids, interpolators and storage.
HELDOUT: tuple[ResolutionRow, ...] = (
    _R("s1/native", "genuine", "s1", "native"),
    _R("robex/native", "genuine", "robex", "native"),
    _R("robex_brain/native", "genuine", "robex_brain", "native"),
    _R("person-80001/0.7mm", "genuine", "person-80001", "0.7mm"),
    _R("person-80002/0.8mm_defaced", "genuine", "person-80002", "0.8mm", after="defaced"),
    _R("person-80003/1mm_cor_uint8", "genuine", "person-80003", "1mm_cor", after="uint8"),
    _R("person-80001/sag3", "genuine", "person-80001", "sag3"),
    _R("person-80002/ax4_tilt15_int16", "genuine", "person-80002", "ax4_tilt15",
       after="int16"),
    _R("s1/cor3", "genuine", "s1", "cor3"),
    _R("person-80003/1mm_stripped", "genuine", "person-80003", "1mm", after="stripped"),
    _R("colin27_05mm/native", "genuine", "colin27_05mm", "native"),
    _R("s1>0.5mm_linear", "falsely_fine", "s1", "native", "linear:2", fine="012"),
    _R("s1>0.5mm_cubic", "falsely_fine", "s1", "native", "cubic:2", fine="012"),
    _R("s1>0.5mm_fft", "falsely_fine", "s1", "native", "fft:2", fine="012"),
    _R("s1>0.5mm_linear_uint8", "falsely_fine", "s1", "native", "linear:2", "uint8",
       "012"),
    _R("s1>0.5mm_cubic_uint8", "falsely_fine", "s1", "native", "cubic:2", "uint8", "012"),
    _R("s1>0.47mm_fft", "falsely_fine", "s1", "native", "fft:2.128", fine="012"),
    _R("robex>0.75mm_linear", "falsely_fine", "robex", "native", "linear:2", fine="012"),
    _R("robex>0.75mm_cubic", "falsely_fine", "robex", "native", "cubic:2", fine="012"),
    _R("robex>0.75mm_fft", "falsely_fine", "robex", "native", "fft:2", fine="012"),
    _R("robex>0.5mm_linear", "falsely_fine", "robex", "native", "linear:3", fine="012"),
    _R("robex>0.5mm_cubic", "falsely_fine", "robex", "native", "cubic:3", fine="012"),
    _R("robex>0.5mm_fft", "falsely_fine", "robex", "native", "fft:3", fine="012"),
    _R("robex_brain>0.75mm_cubic_int16", "falsely_fine", "robex_brain", "native",
       "cubic:2", "int16", "012"),
    _R("person-80001/sag3>1mm_linear", "falsely_fine", "person-80001", "sag3",
       "linear:1x1x3", fine="2"),
    _R("person-80002/cor3>1mm_cubic_defaced", "falsely_fine", "person-80002", "cor3",
       "cubic:1x1x3", "defaced", "2"),
    _R("person-80003/ax3>1mm_fft_uint8", "falsely_fine", "person-80003", "ax3",
       "fft:1x1x3", "uint8", "2"),
    _R("person-80003/1mm>0.47mm_fft_int16", "falsely_fine", "person-80003", "1mm",
       "fft:2.128", "int16", "012"),
    _R("s1/cor3>1mm_linear_uint8", "falsely_fine", "s1", "cor3", "linear:1x1x3",
       "uint8", "2"),
)


@dataclass(frozen=True)
class ResolutionCase:
    """A row and how to build its scan."""

    row: ResolutionRow
    build: Callable[[], Scan] = dataclasses.field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.row.case


def rows(which: str) -> tuple[ResolutionRow, ...]:
    """The rows of set ``which`` (``"tuning"`` or ``"heldout"``), checked.

    Raises
    ------
    ValueError
        An unknown set, kind, source, acquisition, method or ``after`` item; a case
        named twice; falsely fine axes on a genuine scan or none on a falsely fine one.
    """
    if which not in SETS:
        raise ValueError(f"unknown set {which!r}; known: {', '.join(SETS)}")
    chosen = TUNING if which == "tuning" else HELDOUT
    problems, seen = [], set()
    for row in chosen:
        if row.case in seen:
            problems.append(f"{row.case}: named twice")
        seen.add(row.case)
        if row.kind not in KINDS:
            problems.append(f"{row.case}: kind {row.kind!r} is not one of {KINDS}")
        base = row.source
        if base not in REAL_SCANS and not base.startswith("person-"):
            problems.append(f"{row.case}: source {base!r} is no real scan or person-<seed>")
        if row.acquisition != "native" and row.acquisition not in ACQUISITIONS:
            problems.append(f"{row.case}: acquisition {row.acquisition!r} is unknown")
        if row.acquisition == "native" and base not in REAL_SCANS:
            problems.append(f"{row.case}: only a real scan has a native grid")
        if row.written:
            method, _, _ = row.written.partition(":")
            if method not in METHODS:
                problems.append(f"{row.case}: method {method!r} is not one of {METHODS}")
        unknown = [a for a in filter(None, row.after.split("+")) if a not in AFTER]
        if unknown:
            problems.append(f"{row.case}: unknown after item(s) {unknown}")
        if (row.kind == "falsely_fine") != bool(row.fine):
            problems.append(f"{row.case}: a falsely fine scan, and only one, names its "
                            "fine axes")
    if problems:
        raise ValueError(f"resolution set {which}: " + "; ".join(problems))
    return chosen


def set_cases(which: str) -> list[ResolutionCase]:
    """The cases of set ``which`` whose sources are installed (:func:`missing_sources`
    names the others), each built lazily."""
    return [ResolutionCase(row, functools.partial(build_scan, row))
            for row in rows(which) if _installed(row.source)]


def missing_sources(which: str) -> list[str]:
    """The real scans set ``which`` needs that are not installed here."""
    return sorted({row.source for row in rows(which) if not _installed(row.source)})


def _installed(source: str) -> bool:
    return source not in REAL_SCANS or real_scan(source) is not None


def build_scan(row: ResolutionRow) -> Scan:
    """The scan a row describes: the source acquired (or as stored), written finer,
    then altered; every random draw comes from the case's name."""
    tag = zlib.crc32(row.case.encode())
    if row.acquisition == "native":
        scan = _native(row.source)
        if row.written:
            scan = _head_box(scan)
    else:
        rng = np.random.default_rng([tag, 0])
        pose = random_pose(rng, 10.0, 10.0)
        scan = acquire(_anatomy(row.source), pose, ACQUISITIONS[row.acquisition], rng)
    if row.written:
        method, _, factors = row.written.partition(":")
        values = [float(f) for f in factors.split("x")]
        scan = written_finer(scan, values * 3 if len(values) == 1 else values, method)
    for index, item in enumerate(filter(None, row.after.split("+"))):
        scan = _altered(scan, item, np.random.default_rng([tag, index + 1]))
    return scan


def written_finer(scan: Scan, factors, method: str) -> Scan:
    """``scan`` written on a grid ``factors`` times finer along its stored axes, by
    ``method`` (:data:`METHODS`), the field of view unchanged (voxel edges aligned);
    labels, if any, by nearest neighbour. Each axis is interpolated on its own: both
    interpolators are separable, and three 1-D passes cost a fraction of one 3-D one."""
    factors = [float(f) for f in factors]
    data, labels = scan.data, scan.labels
    for axis, factor in enumerate(factors):
        if factor == 1.0:
            continue
        data = _upsampled(data, axis, factor, method)
        if labels is not None:
            zoom = [1.0, 1.0, 1.0]
            zoom[axis] = data.shape[axis] / labels.shape[axis]
            labels = ndimage.zoom(labels, zoom, order=0, grid_mode=True, mode="nearest")
    old = np.asarray(scan.data.shape, dtype=float)
    scale = old / np.asarray(data.shape, dtype=float)  # exact new spacing / old spacing
    affine = scan.affine.copy()
    # The new first voxel's centre, in old voxel coordinates: half an old voxel back
    # from the old centre, then half a new one in.
    affine[:3, 3] = scan.affine[:3, :3] @ (-0.5 + scale / 2.0) + scan.affine[:3, 3]
    affine[:3, :3] = scan.affine[:3, :3] * scale
    return dataclasses.replace(scan, data=np.ascontiguousarray(data, dtype=np.float32),
                               labels=labels, affine=affine)


def _upsampled(data: np.ndarray, axis: int, factor: float, method: str) -> np.ndarray:
    n = data.shape[axis]
    m = int(round(n * factor))
    if method in ("linear", "cubic"):
        zoom = [1.0, 1.0, 1.0]
        zoom[axis] = m / n
        return ndimage.zoom(data, zoom, order=1 if method == "linear" else 3,
                            grid_mode=True, mode="nearest", output=np.float32)
    if method != "fft":
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    spectrum = np.moveaxis(np.fft.fft(data.astype(np.float32), axis=axis), axis, 0)
    padded = np.zeros((m,) + spectrum.shape[1:], dtype=np.complex64)
    half = (n + 1) // 2
    padded[:half] = spectrum[:half]
    padded[m - (n - half):] = spectrum[half:]
    if n % 2 == 0:  # the Nyquist bin of an even length belongs to both sides
        padded[n // 2] = spectrum[n // 2] / 2
        padded[m - n // 2] = spectrum[n // 2] / 2
    out = np.fft.ifft(np.moveaxis(padded, 0, axis), axis=axis).real * (m / n)
    return np.ascontiguousarray(out, dtype=np.float32)


def _altered(scan: Scan, item: str, rng: np.random.Generator) -> Scan:
    if item == "uint8":
        top = float(np.max(scan.data))
        scale = 255.0 / top if top > 255 else 1.0
        data = np.clip(np.round(scan.data * scale), 0, 255).astype(np.float32)
        return dataclasses.replace(scan, data=data)
    if item == "int16":
        return pop.int16_scaled(scan)
    if item == "defaced":
        return pop.defaced(scan)
    if item == "stripped":
        return pop.skull_stripped(scan)
    if item == "zero_slices":
        data = scan.data.copy()
        rows_ = np.flatnonzero(pop.head_mask(data).any(axis=(0, 1)))
        middle = int(rows_[len(rows_) // 2]) if len(rows_) else data.shape[2] // 2
        data[:, :, middle - 1:middle + 2] = 0.0
        return dataclasses.replace(scan, data=data)
    raise ValueError(f"unknown alteration {item!r}; known: {', '.join(AFTER)}")


def _native(name: str) -> Scan:
    """A real scan as its file stores it (RAS+ voxel order, as mriprep reads it)."""
    head = real_head(name)
    return Scan(head.image, None, head.affine.copy(), np.eye(4), None, head.mni_frame)


def _head_box(scan: Scan) -> Scan:
    """The scan cut to its head's box and a margin: a field of view around the head."""
    head = pop.head_mask(scan.data)
    where = np.argwhere(head)
    lo = np.maximum(where.min(axis=0) - _HEAD_BOX_MARGIN, 0)
    hi = np.minimum(where.max(axis=0) + _HEAD_BOX_MARGIN + 1, scan.data.shape)
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    affine = scan.affine.copy()
    affine[:3, 3] = scan.affine[:3, :3] @ lo + scan.affine[:3, 3]
    return dataclasses.replace(scan, data=np.ascontiguousarray(scan.data[box]),
                               labels=None if scan.labels is None else scan.labels[box],
                               affine=affine)


@functools.lru_cache(maxsize=4)
def _anatomy(source: str) -> Anatomy:
    if source in REAL_SCANS:
        anatomy = real_head(source)
        if anatomy is None:
            raise FileNotFoundError(f"real scan {source!r} is not installed")
        return anatomy
    return person(int(source.split("-", 1)[1]))
