"""Integrity checks of a tensor cache before training (``mriprep check``).

:func:`check_cache` proves that a cache is safe to train on, or lists every reason it is
not, all at once. Each problem is a :class:`Finding` with a stable ``code``:

Tensor pass (every file read once, in chunks; see :func:`scan_tensor_file`)
    ``file-missing``, ``file-size``, ``tensor-unreadable``, ``tensor-layout``,
    ``dtype-mismatch``, ``shape-mismatch``, ``checksum-mismatch``, ``non-finite``,
    ``extreme-values`` (beyond float16 range: mixed-precision training overflows),
    ``meta-missing``, ``meta-mismatch``, ``label-values``, ``labels-unchecked`` (warning).
Index checks (pure, on the index summaries; see :func:`check_index`)
    ``index-unreadable``, ``empty-cache``, ``index-malformed``, ``geometry``,
    ``pipeline-mismatch``, ``split-missing``, ``subject-split-leak``, ``duplicate-input``,
    ``duplicate-tensor``, ``duplicate-session`` (warning), ``near-duplicate`` (warning),
    ``grid-mismatch`` (warning).
Manifest checks (with ``manifest=``)
    ``manifest-missing``, ``manifest-failed`` (warning), ``manifest-split-mismatch``,
    ``not-in-manifest`` (warning).

Errors make :attr:`CheckReport.ok` false; warnings are reported but do not fail the gate.

Allowed label values come from, in order: the ``allowed_labels`` argument (``--labels``),
an ``allowed_labels`` / ``label_values`` list recorded in the entry's index summary or
sidecar, or the ``allowed_labels`` / ``label_values`` parameter of the entry's ``validate``
provenance record. An entry with a label map and none of these gets a ``labels-unchecked``
warning listing the values found.

Near-duplicates are found on fingerprints made during the tensor pass: the 8x8x8 block
means of each image, centred on the cohort's mean fingerprint and compared by correlation
(see :func:`mriprep.splits.find_near_duplicates`: every pair up to
:data:`~mriprep.splits.EXACT_SEARCH_MAX` entries, random-hyperplane LSH above, so that
10,000 entries are not 50 million comparisons). At least 3 entries are needed.

The split-leak checks themselves (unassigned scans, subjects in two splits, identical
content) live in :mod:`mriprep.splits`, shared with ``mriprep splits``, which runs them on
a manifest before any preprocessing.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import xxhash

from mriprep.cache import Cache
from mriprep.errors import CacheError
from mriprep.splits import (
    NEAR_DUPLICATE_THRESHOLD,
    Finding,
    SplitItem,
    find_identical,
    find_near_duplicates,
    find_subject_leaks,
    find_unassigned,
    named,
)

__all__ = [
    "CheckReport",
    "Finding",
    "SplitSummary",
    "check_cache",
    "check_index",
    "scan_tensor_file",
    "find_near_duplicates",
]

FINGERPRINT_BLOCKS = 8
FLOAT16_MAX = float(np.finfo(np.float16).max)
RUN_REPORT = Path("reports") / "latest.json"
_CHUNK_BYTES = 4 << 20
_LABEL_KEYS = ("allowed_labels", "label_values")


# -- report model ----------------------------------------------------------------------


@dataclass
class SplitSummary:
    """What one split holds, so that a skewed split is visible at a glance.

    ``invalid_fraction`` is the share of voxels whose ``valid`` mask is False (filled or
    masked by the pipeline); ``label_shares`` maps each label value to its share of the
    split's labelled voxels.
    """

    split: str
    entries: int = 0
    subjects: int = 0
    sessions: int = 0
    voxels: int = 0
    invalid_voxels: int = 0
    labelled_entries: int = 0
    label_counts: dict[int, int] = field(default_factory=dict)

    @property
    def invalid_fraction(self) -> float:
        return self.invalid_voxels / self.voxels if self.voxels else 0.0

    @property
    def label_shares(self) -> dict[int, float]:
        total = sum(self.label_counts.values())
        return {v: c / total for v, c in sorted(self.label_counts.items())} if total else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "entries": self.entries,
            "subjects": self.subjects,
            "sessions": self.sessions,
            "voxels": self.voxels,
            "invalid_fraction": self.invalid_fraction,
            "labelled_entries": self.labelled_entries,
            "label_shares": {str(v): s for v, s in self.label_shares.items()},
        }


@dataclass
class CheckReport:
    """Everything :func:`check_cache` found; ``ok`` when no finding is an error."""

    cache: str
    entries: int = 0
    findings: list[Finding] = field(default_factory=list)
    splits: dict[str, SplitSummary] = field(default_factory=dict)
    pipeline_hashes: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    read_seconds: float = 0.0
    seconds: float = 0.0
    near_duplicate_search: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def read_mb_per_s(self) -> float:
        return self.bytes_read / 1e6 / self.read_seconds if self.read_seconds > 0 else 0.0

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def to_json(self) -> dict[str, Any]:
        return {
            "cache": self.cache,
            "ok": self.ok,
            "entries": self.entries,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.to_json() for f in self.findings],
            "splits": {name: s.to_json() for name, s in sorted(self.splits.items())},
            "pipeline_hashes": dict(self.pipeline_hashes),
            "bytes_read": self.bytes_read,
            "read_seconds": round(self.read_seconds, 4),
            "read_mb_per_s": round(self.read_mb_per_s, 1),
            "seconds": round(self.seconds, 4),
            "near_duplicate_search": self.near_duplicate_search,
        }


def entry_label(summary: dict[str, Any], key: str) -> str:
    """How messages name an entry: ``subject/session [key prefix]``."""
    subject = summary.get("subject_id", "?")
    session = summary.get("session_id") or ""
    return f"{subject}{'/' + session if session else ''} [{key[:12]}]"


# -- tensor pass -----------------------------------------------------------------------


@dataclass
class TensorScan:
    """What one pass over one ``.npy`` file learned.

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
    """Per-chunk analysis of an image: finiteness, range, and block sums for the
    fingerprint, all on the chunk while it is still in the CPU cache."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype):
        self.is_float = np.issubdtype(dtype, np.floating)
        self.nan = self.posinf = self.neginf = self.extreme = 0
        self.first_bad: tuple[int, ...] | None = None
        self.first_extreme: tuple[int, ...] | None = None
        blocks = FINGERPRINT_BLOCKS
        self.fingerprinting = len(shape) == 3 and min(shape) >= blocks
        if self.fingerprinting:
            self.edges = [_block_edges(n, blocks) for n in shape]
            self.slice_sums = np.zeros((shape[0], blocks, blocks), dtype=np.float64)
            # float16 block sums could overflow; float32 sums of <=~30 values are exact
            # enough for a correlation and keep the pass fast.
            self.sum_dtype = np.float32 if dtype.itemsize <= 4 else np.float64

    def add(self, chunk: np.ndarray, first_row: int) -> None:
        if self.is_float:
            lo, hi = chunk.min(), chunk.max()
            if not (np.isfinite(lo) and np.isfinite(hi)):
                self._count_non_finite(chunk, first_row)
            elif hi > FLOAT16_MAX or lo < -FLOAT16_MAX:
                self._count_extreme(chunk, first_row)
        if self.fingerprinting:
            # Summing whole rows first (contiguous vectors) is the cheap direction; the
            # strided reduction then runs on an array Y/8 times smaller.
            y_sums = np.add.reduceat(chunk, self.edges[1], axis=1, dtype=self.sum_dtype)
            yz_sums = np.add.reduceat(y_sums, self.edges[2], axis=2)
            self.slice_sums[first_row : first_row + chunk.shape[0]] = yz_sums

    def _count_non_finite(self, chunk: np.ndarray, first_row: int) -> None:
        nan, posinf, neginf = np.isnan(chunk), np.isposinf(chunk), np.isneginf(chunk)
        self.nan += int(nan.sum())
        self.posinf += int(posinf.sum())
        self.neginf += int(neginf.sum())
        if self.first_bad is None:
            where = np.argwhere(nan | posinf | neginf)[0]
            self.first_bad = (where[0] + first_row, *where[1:])
        finite = np.where(np.isfinite(chunk), chunk, 0)
        if np.abs(finite).max() > FLOAT16_MAX:
            self._count_extreme(finite, first_row)

    def _count_extreme(self, chunk: np.ndarray, first_row: int) -> None:
        beyond = np.abs(chunk) > FLOAT16_MAX
        self.extreme += int(beyond.sum())
        if self.first_extreme is None:
            where = np.argwhere(beyond)[0]
            self.first_extreme = (where[0] + first_row, *where[1:])

    def finish(self, scan: TensorScan) -> None:
        bad = self.nan + self.posinf + self.neginf
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
                    f"holds {self.extreme} voxel(s) beyond the float16 range "
                    f"(|x| > {FLOAT16_MAX:g}), first at voxel "
                    f"{tuple(int(i) for i in self.first_extreme)}; mixed-precision "
                    "training overflows to Inf on them. Rebuild the entry with a pipeline "
                    "that sanitizes and normalizes intensities",
                )
            )
        if self.fingerprinting and not bad:
            x_sums = np.add.reduceat(self.slice_sums, self.edges[0], axis=0)
            sizes = [np.diff(np.append(e, n)) for e, n in zip(self.edges, scan.shape)]
            counts = sizes[0][:, None, None] * sizes[1][None, :, None] * sizes[2][None, None, :]
            scan.fingerprint = (x_sums / counts).astype(np.float32).ravel()


class _NonzeroCount:
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


def _block_edges(n: int, blocks: int) -> np.ndarray:
    return np.linspace(0, n, blocks + 1)[:-1].round().astype(np.intp)


def _read_full(fh, view: memoryview) -> int:
    """Fill ``view`` from ``fh`` unless the file ends first; return the bytes read."""
    total = 0
    while total < len(view):
        n = fh.readinto(view[total:])
        if not n:
            break
        total += n
    return total


def scan_tensor_file(
    path: str | os.PathLike, kind: str, buffer: bytearray | None = None
) -> TensorScan:
    """Read one ``.npy`` tensor once: checksum its bytes and analyse its values.

    The header is parsed by ``np.load(..., mmap_mode="r", allow_pickle=False)``, exactly
    as the training Dataset will open the file, so a file that cannot be memory-mapped
    safely is reported here. The data are then read in chunks of whole slices into one
    reusable ``buffer``: each chunk feeds the XXH3-128 checksum and, while it is still in
    the CPU cache, the analysis for its ``kind`` (``"image"``: finiteness, float16 range,
    fingerprint; ``"valid"``: count of True voxels; ``"label"``: voxel count of each
    value). No full copy of the tensor is ever made.

    Parameters
    ----------
    path : path-like
        The ``.npy`` file.
    kind : {"image", "valid", "label"}
        Which analysis to run on the values.
    buffer : bytearray, optional
        Scratch space of about 4 MiB, reused across calls by one thread.

    Returns
    -------
    TensorScan
        Bytes read, checksum, dtype, shape, problems found and the analysis results.
    """
    path = Path(path)
    scan = TensorScan()
    if not path.is_file():
        scan.problems.append(("file-missing", f"is missing ({path})"))
        return scan
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
        dtype, shape, offset = mapped.dtype, tuple(mapped.shape), int(mapped.offset)
        fortran = mapped.ndim > 1 and not mapped.flags.c_contiguous
        del mapped
    except (ValueError, OSError, EOFError) as exc:
        scan.problems.append(
            ("tensor-unreadable", f"cannot be opened as a safe .npy ({exc}); rebuild the entry")
        )
        scan.checksum, scan.bytes_read = _checksum_whole(path, buffer)
        return scan
    scan.dtype, scan.shape = str(dtype), shape
    if fortran:
        scan.problems.append(
            ("tensor-layout", "is stored in Fortran order; the cache writes C order only")
        )
    analysis = None if fortran else _analysis_for(kind, shape, dtype)
    row_elems = math.prod(shape[1:])
    row_bytes = max(1, row_elems * dtype.itemsize)
    rows_total = (shape[0] if shape else 1) if row_elems else 0  # an empty array has no data
    if buffer is None or len(buffer) < row_bytes:
        buffer = bytearray(max(_CHUNK_BYTES, row_bytes))
    view = memoryview(buffer)
    rows_per_chunk = max(1, len(buffer) // row_bytes)
    digest = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as fh:
        header = fh.read(offset)
        digest.update(header)
        scan.bytes_read += len(header)
        row = 0
        while row < rows_total:
            want = min(rows_per_chunk, rows_total - row) * row_bytes
            got = _read_full(fh, view[:want])
            digest.update(view[:got])
            scan.bytes_read += got
            rows = got // row_bytes
            if rows and analysis is not None and row_elems:
                chunk = np.frombuffer(buffer, dtype=dtype, count=rows * row_elems)
                analysis.add(chunk.reshape((rows,) + shape[1:]), row)
            row += rows
            if got < want:
                scan.problems.append(
                    ("file-size", f"ends after {row} of {rows_total} slices (truncated)")
                )
                analysis = None
                break
        trailing = 0
        while got := fh.readinto(buffer):
            digest.update(view[:got])
            trailing += got
        if trailing:
            scan.bytes_read += trailing
            scan.problems.append(
                ("file-size", f"has {trailing} bytes after the array data (rewritten?)")
            )
    scan.checksum = digest.hexdigest()
    if analysis is not None:
        analysis.finish(scan)
    return scan


def _analysis_for(kind: str, shape: tuple[int, ...], dtype: np.dtype):
    if kind == "image":
        return _ImageStats(shape, dtype)
    if kind == "valid":
        return _NonzeroCount()
    if kind == "label":
        return _ValueCounts(dtype)
    return None  # a tensor this version does not know: checksum, dtype and shape only


def _checksum_whole(path: Path, buffer: bytearray | None) -> tuple[str, int]:
    buffer = buffer or bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    digest = xxhash.xxh3_128()
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while got := fh.readinto(buffer):
            digest.update(view[:got])
            total += got
    return digest.hexdigest(), total


@dataclass
class EntryScan:
    """The tensor pass over one entry: its findings and what its tensors contain."""

    key: str
    findings: list[Finding] = field(default_factory=list)
    bytes_read: int = 0
    fingerprint: np.ndarray | None = None
    voxels: int = 0
    valid_voxels: int | None = None
    label_counts: dict[int, int] | None = None
    meta: dict[str, Any] | None = None


_META_FIELDS = (
    "subject_id",
    "session_id",
    "pipeline_hash",
    "shape",
    "spacing",
    "affine",
    "files",
    "extra_files",
)


def scan_entry(
    cache: Cache, key: str, summary: dict[str, Any], buffer: bytearray | None = None
) -> EntryScan:
    """Read every file of one index entry once and compare it with the index.

    Also compares the sidecar ``meta.json`` with the index summary: an index edited by
    hand (a checksum "fixed" after a file was changed) no longer matches its sidecar.
    """
    result = EntryScan(key)
    name = entry_label(summary, key)
    subject = (summary.get("subject_id", "?"),)

    def report(code: str, message: str) -> None:
        result.findings.append(Finding("error", code, f"{name}: {message}", (key,), subject))

    meta_path = cache.entry_dir(key) / "meta.json"
    try:
        result.meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        report("meta-missing", f"meta.json is missing ({meta_path}); the entry is incomplete")
    except (OSError, ValueError) as exc:
        report("meta-missing", f"meta.json cannot be read ({exc}); the entry is corrupt")
    if result.meta is not None:
        differing = [
            f for f in _META_FIELDS if f in summary and result.meta.get(f) != summary.get(f)
        ]
        if result.meta.get("key", key) != key:
            differing.insert(0, "key")
        if differing:
            report(
                "meta-mismatch",
                f"meta.json and index.json disagree on {', '.join(differing)}; the index or "
                "the entry was edited after writing: rebuild it with `mriprep run --force`",
            )
    for kind, info in summary["files"].items():
        path = cache.entry_dir(key) / info.get("file", f"{kind}.npy")
        scan = scan_tensor_file(path, kind, buffer)
        result.bytes_read += scan.bytes_read
        for code, detail in scan.problems:
            report(code, f"{path.name} {detail}")
        if scan.checksum is None:
            continue  # missing: nothing more to compare
        if "file-size" not in {c for c, _ in scan.problems} and scan.bytes_read != info.get(
            "bytes"
        ):
            report(
                "file-size",
                f"{path.name} is {scan.bytes_read} bytes, the index records {info.get('bytes')}",
            )
        if scan.checksum != info.get("xxh3_128"):
            report(
                "checksum-mismatch",
                f"{path.name} checksum {scan.checksum} differs from the index's "
                f"{info.get('xxh3_128')}: the file changed on disk (bit rot, a partial copy "
                "or an edit); rebuild the entry with `mriprep run --force`",
            )
        if scan.shape is None:
            continue  # unreadable: already reported
        if scan.dtype != info.get("dtype"):
            report(
                "dtype-mismatch",
                f"{path.name} is {scan.dtype}, the index records {info.get('dtype')}",
            )
        if list(scan.shape) != list(info.get("shape", [])):
            report(
                "shape-mismatch",
                f"{path.name} has shape {list(scan.shape)}, the index records {info.get('shape')}",
            )
        if kind == "image":
            result.fingerprint = scan.fingerprint
            result.voxels = math.prod(scan.shape)
        elif kind == "valid":
            result.valid_voxels = scan.nonzero
        elif kind == "label":
            result.label_counts = scan.value_counts
    for file_name, info in (summary.get("extra_files") or {}).items():
        path = cache.entry_dir(key) / info.get("file", file_name)
        if not path.is_file():
            report("file-missing", f"{path.name} is missing ({path})")
            continue
        checksum, size = _checksum_whole(path, buffer)
        result.bytes_read += size
        if checksum != info.get("xxh3_128") or size != info.get("bytes"):
            report(
                "checksum-mismatch",
                f"{path.name} ({size} bytes, xxh3 {checksum}) differs from the index's record "
                f"({info.get('bytes')} bytes, xxh3 {info.get('xxh3_128')}); rebuild the "
                "entry with `mriprep run --force`",
            )
    return result


# -- index checks (pure) ---------------------------------------------------------------


def _required_problems(summary: Any) -> list[str]:
    if not isinstance(summary, dict):
        return ["the summary is not an object"]
    problems = [
        f"lacks {k!r}" for k in ("subject_id", "pipeline_hash", "files") if k not in summary
    ]
    files = summary.get("files")
    if isinstance(files, dict):
        for kind in ("image", "valid"):
            if kind not in files:
                problems.append(f"lists no {kind} tensor")
        for kind, info in files.items():
            if not isinstance(info, dict) or not {"dtype", "shape", "bytes", "xxh3_128"} <= set(
                info
            ):
                problems.append(f"{kind} lacks dtype/shape/bytes/xxh3_128")
    elif "files" in summary:
        problems.append("'files' is not an object")
    return problems


def check_geometry(key: str, summary: dict[str, Any]) -> list[Finding]:
    """The recorded grid is self-consistent: spacing = affine column norms, tensor shapes
    equal the recorded shape, labels are integers."""
    name = entry_label(summary, key)
    problems = []
    files = summary["files"]
    image_shape = list(files["image"].get("shape", []))
    if len(image_shape) != 3:
        problems.append(f"image shape {image_shape} is not 3-D")
    if "shape" in summary and list(summary["shape"]) != image_shape:
        problems.append(f"recorded shape {summary['shape']} differs from image.npy's {image_shape}")
    for kind in ("valid", "label"):
        if kind in files and list(files[kind].get("shape", [])) != image_shape:
            shape = files[kind].get("shape")
            problems.append(f"{kind}.npy shape {shape} differs from image.npy's {image_shape}")
    for kind, info in files.items():
        try:
            dtype = np.dtype(info["dtype"])
        except TypeError:
            problems.append(f"{kind}.npy dtype {info['dtype']!r} is not a numpy dtype")
            continue
        if kind == "label" and not np.issubdtype(dtype, np.integer):
            problems.append(f"label.npy dtype {dtype} is not an integer type")
    if "affine" in summary:
        try:
            affine = np.asarray(summary["affine"], dtype=np.float64)
        except (TypeError, ValueError):
            affine = np.full((1,), np.nan)
        if affine.shape != (4, 4) or not np.isfinite(affine).all():
            problems.append(f"affine {summary['affine']} is not a finite 4x4 matrix")
        elif abs(np.linalg.det(affine[:3, :3])) < 1e-9:
            problems.append("affine is singular")
        elif "spacing" in summary:
            norms = np.linalg.norm(affine[:3, :3], axis=0)
            spacing = np.asarray(summary["spacing"], dtype=np.float64)
            if spacing.shape != (3,) or not np.allclose(norms, spacing, rtol=1e-4, atol=1e-6):
                problems.append(
                    f"recorded spacing {summary['spacing']} differs from the affine's voxel "
                    f"size {np.round(norms, 6).tolist()}"
                )
    return [
        Finding("error", "geometry", f"{name}: {p}", (key,), (summary["subject_id"],))
        for p in problems
    ]


def image_input_hashes(summary: dict[str, Any]) -> list[str]:
    """SHA-256 of the entry's input images (every input except label maps).

    Accepts the shapes the runner may record: ``{"image": {"path", "sha256"}}``,
    ``{"image": "<sha256>"}`` or a list of ``{"name"/"role", "sha256"}``.
    """
    inputs = summary.get("inputs") or {}
    items: Iterable[tuple[str, Any]]
    if isinstance(inputs, dict):
        items = inputs.items()
    elif isinstance(inputs, list):
        items = [
            (str(i.get("name") or i.get("role") or ""), i) for i in inputs if isinstance(i, dict)
        ]
    else:
        return []
    hashes = []
    for name, value in items:
        if "label" in name:
            continue
        digest = value.get("sha256") if isinstance(value, dict) else value
        if isinstance(digest, str) and digest:
            hashes.append(digest)
    return hashes


def check_index(
    index: dict[str, dict[str, Any]],
    fingerprints: dict[str, np.ndarray] | None = None,
    near_duplicate_threshold: float = NEAR_DUPLICATE_THRESHOLD,
    near_duplicate_method: str = "auto",
    search_info: dict[str, Any] | None = None,
) -> list[Finding]:
    """Checks that need only the index summaries (and the image fingerprints).

    One pipeline hash for every entry and split; every entry has a split; no subject in
    two splits; no identical input image or cached image under two subject ids or in two
    splits; no near-duplicate images under two subject ids (warnings).

    Parameters
    ----------
    index : dict
        Cache key -> index summary (as in ``index.json``), already known to be well formed.
    fingerprints : dict, optional
        Cache key -> image fingerprint (see :func:`scan_tensor_file`); without them the
        near-duplicate search is skipped.
    near_duplicate_threshold : float
        Correlation of centred fingerprints from which two images count as near-duplicates.
    near_duplicate_method : {"auto", "exact", "lsh"}
        See :func:`find_near_duplicates`.
    search_info : dict, optional
        Filled with how the near-duplicate search ran (method, pairs compared, seconds).
    """
    items = [_entry_item(key, summary) for key, summary in index.items()]
    findings = _check_pipeline(index)
    findings += find_unassigned(
        items, "give every manifest row a split (`mriprep splits --assign`) and rerun `mriprep run`"
    )
    findings += find_subject_leaks(
        items, "assign splits per subject (`mriprep splits --assign`) and rerun `mriprep run`"
    )
    reported: list[set[str]] = []
    findings += find_identical(
        items,
        {k: image_input_hashes(s) for k, s in index.items()},
        "duplicate-input",
        "input image (sha256 {})",
        reported,
    )
    findings += find_identical(
        items,
        {k: [s["files"]["image"]["xxh3_128"]] for k, s in index.items()},
        "duplicate-tensor",
        "cached image (xxh3 {})",
        reported,
    )
    findings += _check_grids(index)
    if fingerprints:
        findings += _check_near_duplicates(
            index,
            fingerprints,
            near_duplicate_threshold,
            near_duplicate_method,
            reported,
            search_info if search_info is not None else {},
        )
    return findings


def _entry_item(key: str, summary: dict[str, Any]) -> SplitItem:
    return SplitItem(
        key,
        summary["subject_id"],
        summary.get("session_id") or "",
        summary.get("split") or "",
        entry_label(summary, key),
    )


def _check_pipeline(index: dict[str, dict[str, Any]]) -> list[Finding]:
    """Entries made by another pipeline than the majority (every group on a tie)."""
    by_hash: dict[str, list[str]] = defaultdict(list)
    for key, summary in index.items():
        by_hash[summary["pipeline_hash"]].append(key)
    if len(by_hash) <= 1:
        return []
    ranked = sorted(by_hash.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    counts = ", ".join(
        f"{h[:12]} ({index[keys[0]].get('pipeline_name', '?')}): {len(keys)}" for h, keys in ranked
    )
    has_majority = len(ranked[0][1]) > len(ranked[1][1])
    findings = []
    for pipeline_hash, keys in ranked[1:] if has_majority else ranked:
        keys = sorted(keys, key=lambda k: entry_label(index[k], k))
        splits = sorted({index[k].get("split") or "(none)" for k in keys})
        name = index[keys[0]].get("pipeline_name", "?")
        findings.append(
            Finding(
                "error",
                "pipeline-mismatch",
                f"{len(keys)} entr{'y' if len(keys) == 1 else 'ies'} (split {', '.join(splits)}) "
                f"{'was' if len(keys) == 1 else 'were'} made by pipeline {name} "
                f"{pipeline_hash[:12]}: "
                f"{named([entry_label(index[k], k) for k in keys])}. The cache mixes "
                f"{len(ranked)} pipelines (entries per hash: {counts}); train, val and test "
                "must be preprocessed the same way: rerun `mriprep run` with one pipeline, "
                "or remove the stale entries",
                tuple(sorted(keys)),
                tuple(sorted({index[k]["subject_id"] for k in keys})),
            )
        )
    return findings


def _check_grids(index: dict[str, dict[str, Any]]) -> list[Finding]:
    findings = []
    by_pipeline: dict[str, dict[tuple, list[str]]] = defaultdict(lambda: defaultdict(list))
    for key, summary in index.items():
        grid = (
            tuple(summary["files"]["image"].get("shape", [])),
            tuple(round(float(s), 4) for s in summary.get("spacing", [])),
        )
        by_pipeline[summary["pipeline_hash"]][grid].append(key)
    for pipeline_hash, grids in sorted(by_pipeline.items()):
        if len(grids) <= 1:
            continue
        ranked = sorted(grids.items(), key=lambda kv: -len(kv[1]))
        desc = "; ".join(
            f"shape {list(shape)} spacing {list(spacing)}: {len(keys)} entries "
            f"(e.g. {entry_label(index[keys[0]], keys[0])})"
            for (shape, spacing), keys in ranked
        )
        minority = sorted(k for _, keys in ranked[1:] for k in keys)
        findings.append(
            Finding(
                "warning",
                "grid-mismatch",
                f"pipeline {pipeline_hash[:12]} produced {len(grids)} different grids ({desc}); "
                "whole-volume batches need one shape",
                tuple(minority),
                tuple(sorted({index[k]["subject_id"] for k in minority})),
            )
        )
    return findings


def _check_near_duplicates(
    index: dict[str, dict[str, Any]],
    fingerprints: dict[str, np.ndarray],
    threshold: float,
    method: str,
    exact_groups: list[set[str]],
    info: dict[str, Any],
) -> list[Finding]:
    keys = sorted(k for k, f in fingerprints.items() if k in index and f is not None)
    if len(keys) < 3:
        info.update(method="skipped", reason="fewer than 3 fingerprints", entries=len(keys))
        return []
    matrix = np.stack([fingerprints[k] for k in keys])
    start = time.perf_counter()
    pairs = find_near_duplicates(matrix, threshold, method=method, info=info)
    info["seconds"] = round(time.perf_counter() - start, 4)
    findings = []
    for i, j, corr in pairs:
        a, b = keys[i], keys[j]
        sa, sb = index[a], index[b]
        if sa["subject_id"] == sb["subject_id"] or any({a, b} <= g for g in exact_groups):
            continue
        findings.append(
            Finding(
                "warning",
                "near-duplicate",
                f"{entry_label(sa, a)} ({sa.get('split') or 'no split'}) and "
                f"{entry_label(sb, b)} ({sb.get('split') or 'no split'}) look like the same "
                f"scan (fingerprint correlation {corr:.3f} >= {threshold}); if they are one "
                "person under two ids, merge the ids in the manifest",
                (a, b),
                (sa["subject_id"], sb["subject_id"]),
            )
        )
    return findings


# -- labels and summaries --------------------------------------------------------------


def recorded_label_set(summary: dict[str, Any], meta: dict[str, Any] | None) -> set[int] | None:
    """The allowed label values an entry records, if any (see the module docstring)."""
    for source in (summary, meta or {}):
        for name in _LABEL_KEYS:
            if isinstance(source.get(name), list):
                return {int(v) for v in source[name]}
    for record in (meta or {}).get("provenance") or []:
        if isinstance(record, dict) and record.get("stage") == "validate":
            params = record.get("params") or {}
            for name in _LABEL_KEYS:
                if isinstance(params.get(name), list):
                    return {int(v) for v in params[name]}
    return None


def _check_labels(
    index: dict[str, dict[str, Any]], scans: dict[str, EntryScan], allowed: set[int] | None
) -> list[Finding]:
    findings = []
    unchecked: list[str] = []
    unchecked_values: set = set()
    for key in sorted(scans, key=lambda k: entry_label(index[k], k)):
        scan = scans[key]
        if scan.label_counts is None:
            continue
        entry_allowed = (
            allowed if allowed is not None else recorded_label_set(index[key], scan.meta)
        )
        if entry_allowed is None:
            unchecked.append(key)
            unchecked_values |= set(scan.label_counts)
            continue
        bad = {v: c for v, c in scan.label_counts.items() if v not in entry_allowed}
        if bad:
            shown = ", ".join(f"{v} ({c} voxels)" for v, c in sorted(bad.items())[:10])
            findings.append(
                Finding(
                    "error",
                    "label-values",
                    f"{entry_label(index[key], key)}: label.npy holds value(s) outside the "
                    f"allowed set {_compact(entry_allowed)}: {shown}; fix the label map or "
                    "the pipeline's label list",
                    (key,),
                    (index[key]["subject_id"],),
                )
            )
    if unchecked:
        findings.append(
            Finding(
                "warning",
                "labels-unchecked",
                f"{len(unchecked)} entr{'y has' if len(unchecked) == 1 else 'ies have'} label "
                f"maps but no recorded set of allowed values (found {_compact(unchecked_values)}); "
                "pass --labels to check them",
                tuple(unchecked),
                tuple(sorted({index[k]["subject_id"] for k in unchecked})),
            )
        )
    return findings


def _compact(values: Iterable) -> str:
    values = sorted(values)
    return (
        "{" + ", ".join(str(v) for v in values[:20]) + (", ..." if len(values) > 20 else "") + "}"
    )


def summarise_splits(
    index: dict[str, dict[str, Any]], scans: dict[str, EntryScan]
) -> dict[str, SplitSummary]:
    """Per-split counts, invalid-voxel fraction and label shares."""
    summaries: dict[str, SplitSummary] = {}
    subjects: dict[str, set] = defaultdict(set)
    for key, summary in index.items():
        split = summary.get("split") or "(none)"
        s = summaries.setdefault(split, SplitSummary(split))
        s.entries += 1
        subjects[split].add(summary["subject_id"])
        s.sessions += 1 if summary.get("session_id") else 0
        scan = scans.get(key)
        if scan is None:
            continue
        if scan.valid_voxels is not None and scan.voxels:
            s.voxels += scan.voxels
            s.invalid_voxels += scan.voxels - scan.valid_voxels
        if scan.label_counts is not None:
            s.labelled_entries += 1
            for value, count in scan.label_counts.items():
                s.label_counts[value] = s.label_counts.get(value, 0) + count
    for split, s in summaries.items():
        s.subjects = len(subjects[split])
    return summaries


# -- manifest --------------------------------------------------------------------------


def read_run_report(cache_root: Path) -> dict[tuple[str, str], dict[str, Any]] | None:
    """Subject/session -> {status, reason} from ``CACHE/reports/latest.json`` (None if absent).

    Accepts a list of subject records or an object holding one under ``subjects``,
    ``results`` or ``rows``; each record has ``subject_id``, optional ``session_id``,
    ``status`` and ``reason``.
    """
    path = cache_root / RUN_REPORT
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CacheError(f"cannot read the run report {path}: {exc}") from exc
    records = doc
    if isinstance(doc, dict):
        records = next(
            (doc[k] for k in ("subjects", "results", "rows") if isinstance(doc.get(k), list)), []
        )
    report = {}
    for record in records if isinstance(records, list) else []:
        if isinstance(record, dict) and "subject_id" in record:
            ident = (str(record["subject_id"]), str(record.get("session_id") or ""))
            report[ident] = {
                "status": record.get("status", ""),
                "stage": record.get("stage") or "",
                "reason": record.get("reason") or "",
            }
    return report


def check_against_manifest(
    index: dict[str, dict[str, Any]],
    rows: Iterable[Any],
    run_report: dict[tuple[str, str], dict[str, Any]] | None,
    manifest_name: str = "the manifest",
) -> list[Finding]:
    """Every manifest row is cached (in the split the manifest gives) or failed with a reason.

    ``rows`` are manifest rows with ``subject_id``, ``session_id`` and ``split``.
    """
    cached = {(s["subject_id"], s.get("session_id") or ""): k for k, s in index.items()}
    listed = set()
    findings = []
    missing: list[str] = []
    missing_subjects: list[str] = []
    for row in rows:
        ident = (str(row.subject_id), str(row.session_id or ""))
        listed.add(ident)
        name = f"{ident[0]}{'/' + ident[1] if ident[1] else ''}"
        key = cached.get(ident)
        if key is not None:
            cache_split = index[key].get("split") or ""
            if row.split and row.split != cache_split:
                findings.append(
                    Finding(
                        "error",
                        "manifest-split-mismatch",
                        f"{name} is in split {row.split!r} in {manifest_name} but in "
                        f"{cache_split or 'no split'!r} in the cache; rerun `mriprep run` with "
                        "this manifest so the cache follows it",
                        (key,),
                        (ident[0],),
                    )
                )
            continue
        status = (run_report or {}).get(ident) or (run_report or {}).get((ident[0], ""))
        if status and status.get("status") == "failed":
            at = f" at stage {status['stage']!r}" if status.get("stage") else ""
            findings.append(
                Finding(
                    "warning",
                    "manifest-failed",
                    f"{name} failed preprocessing{at} and is not cached: "
                    f"{status.get('reason') or 'no reason recorded'}",
                    (),
                    (ident[0],),
                )
            )
            continue
        missing.append(name)
        missing_subjects.append(ident[0])
    if missing:
        why = (
            "no run report at reports/latest.json lists them as failed"
            if run_report is None
            else "the run report does not list them as failed"
        )
        findings.append(
            Finding(
                "error",
                "manifest-missing",
                f"{len(missing)} row(s) of {manifest_name} are not in the cache and {why}: "
                f"{named(missing)}; run `mriprep run` on the manifest to complete the cache",
                (),
                tuple(sorted(set(missing_subjects))),
            )
        )
    extra = sorted(k for ident, k in cached.items() if ident not in listed)
    if extra:
        findings.append(
            Finding(
                "warning",
                "not-in-manifest",
                f"{len(extra)} cache entr{'y is' if len(extra) == 1 else 'ies are'} not in "
                f"{manifest_name}: {named([entry_label(index[k], k) for k in extra])}; "
                "a Dataset over the cache will still train on them",
                tuple(extra),
                tuple(sorted({index[k]["subject_id"] for k in extra})),
            )
        )
    return findings


# -- the whole check -------------------------------------------------------------------


def check_cache(
    cache_dir: str | os.PathLike,
    manifest: Any = None,
    *,
    allowed_labels: Iterable[int] | None = None,
    near_duplicate_threshold: float = NEAR_DUPLICATE_THRESHOLD,
    near_duplicate_method: str = "auto",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """Check a cache for everything that would make training fail or mislead.

    Parameters
    ----------
    cache_dir : path-like
        The cache folder (as written by ``mriprep run``).
    manifest : path-like or Manifest, optional
        Check that every manifest row is cached, or listed as failed (with its reason) in
        the run report ``CACHE/reports/latest.json``, and in the manifest's split.
    allowed_labels : iterable of int, optional
        Allowed label values; overrides the set recorded with each entry.
    near_duplicate_threshold : float
        Correlation of centred fingerprints from which two subjects' images are reported
        as near-duplicates (warnings).
    near_duplicate_method : {"auto", "exact", "lsh"}
        See :func:`find_near_duplicates`.
    workers : int, optional
        Threads reading tensors (default: up to 4, at most the CPU count).
    progress : callable, optional
        Called as ``progress(done, total)`` after each entry's tensors are read.

    Returns
    -------
    CheckReport
        All findings and the per-split summaries; ``report.ok`` is the verdict.

    Raises
    ------
    CacheError
        When ``cache_dir`` is not a folder or not an mriprep cache (a usage error, not a
        finding).
    """
    started = time.perf_counter()
    root = Path(cache_dir)
    if not root.is_dir():
        raise CacheError(
            f"cache folder {root} does not exist; pass the folder given to `mriprep run -o`"
        )
    cache = Cache(root)
    report = CheckReport(cache=str(root))
    rows = _manifest_rows(manifest) if manifest is not None else None
    try:
        raw_index = cache.read_index()
    except CacheError as exc:
        report.findings.append(Finding("error", "index-unreadable", str(exc)))
        report.seconds = time.perf_counter() - started
        return report
    report.entries = len(raw_index)
    if not raw_index:
        report.findings.append(
            Finding(
                "error", "empty-cache", f"{root} has no indexed entries; run `mriprep run` first"
            )
        )
    index = {}
    for key, summary in raw_index.items():
        problems = _required_problems(summary)
        if problems:
            label = entry_label(summary if isinstance(summary, dict) else {}, key)
            report.findings.append(
                Finding(
                    "error",
                    "index-malformed",
                    f"{label}: index entry {'; '.join(problems)}",
                    (key,),
                )
            )
        else:
            index[key] = summary
    for key, summary in sorted(index.items()):
        report.findings += check_geometry(key, summary)

    read_start = time.perf_counter()
    scans = _scan_entries(cache, index, workers, progress)
    report.read_seconds = time.perf_counter() - read_start
    for key in sorted(scans, key=lambda k: entry_label(index[k], k)):
        report.findings += scans[key].findings
        report.bytes_read += scans[key].bytes_read

    fingerprints = {k: s.fingerprint for k, s in scans.items() if s.fingerprint is not None}
    report.findings += check_index(
        index,
        fingerprints,
        near_duplicate_threshold,
        near_duplicate_method,
        report.near_duplicate_search,
    )
    report.findings += _check_labels(
        index, scans, set(int(v) for v in allowed_labels) if allowed_labels is not None else None
    )
    report.splits = summarise_splits(index, scans)
    report.pipeline_hashes = dict(Counter(s["pipeline_hash"] for s in index.values()))
    if rows is not None:
        if getattr(manifest, "path", None):
            name = str(manifest.path)
        else:
            name = "the manifest" if hasattr(manifest, "rows") else str(manifest)
        report.findings += check_against_manifest(index, rows, read_run_report(root), name)
    report.seconds = time.perf_counter() - started
    return report


def _manifest_rows(manifest: Any) -> list[Any]:
    if hasattr(manifest, "rows"):
        return list(manifest.rows)
    from mriprep.manifest import read_manifest

    # The images need not be on the training machine: only the ids and splits matter.
    return list(read_manifest(manifest, check_files=False).rows)


def _scan_entries(
    cache: Cache,
    index: dict[str, dict[str, Any]],
    workers: int | None,
    progress: Callable[[int, int], None] | None,
) -> dict[str, EntryScan]:
    workers = workers or min(4, os.cpu_count() or 1)
    local = threading.local()

    def scan(key: str) -> EntryScan:
        if not hasattr(local, "buffer"):
            local.buffer = bytearray(_CHUNK_BYTES)
        return scan_entry(cache, key, index[key], local.buffer)

    keys = sorted(index)
    scans: dict[str, EntryScan] = {}
    if workers <= 1:
        for done, key in enumerate(keys, 1):
            scans[key] = scan(key)
            if progress:
                progress(done, len(keys))
        return scans
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="mriprep-check") as pool:
        futures = {pool.submit(scan, key): key for key in keys}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            scans[futures[future]] = future.result()
            if progress:
                progress(done, len(keys))
    return scans
