"""The tensor pass over cache entries: every file of every entry read once (in threads)
and compared with the entry's index record and its ``meta.json`` sidecar."""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mriprep.cache import Cache, IndexEntry
from mriprep.check.tensors import scan_tensor_file
from mriprep.core.findings import Finding
from mriprep.core.hashing import CHUNK_BYTES, file_checksum
from mriprep.core.limits import CastLimits


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
    cache: Cache,
    entry: IndexEntry,
    buffer: bytearray | None = None,
    cast_dtype: str | CastLimits = "float16",
) -> EntryScan:
    """Read every file of one index entry once and compare it with the index; the image
    is checked for what the cast to ``cast_dtype`` loses (see :func:`scan_tensor_file`).

    Also compares the sidecar ``meta.json`` with the index entry: an index edited by
    hand (a checksum "fixed" after a file was changed) no longer matches its sidecar.
    """
    key = entry.key
    result = EntryScan(key)
    name = entry.finding_name
    subject = (entry.subject_id,)

    def report(code: str, message: str) -> None:
        # the code's severity is the registry's (mriprep.core.finding_codes)
        result.findings.append(Finding(code, f"{name}: {message}", (key,), subject))

    meta_path = cache.entry_dir(key) / "meta.json"
    try:
        result.meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        report("meta-missing", f"meta.json is missing ({meta_path}); the entry is incomplete")
    except (OSError, ValueError) as exc:
        report("meta-missing", f"meta.json cannot be read ({exc}); the entry is corrupt")
    if result.meta is not None:
        recorded = entry.to_json()  # the sidecar fields as the index stores them
        differing = [
            f for f in _META_FIELDS if f in recorded and result.meta.get(f) != recorded[f]
        ]
        if result.meta.get("key", key) != key:
            differing.insert(0, "key")
        if differing:
            report(
                "meta-mismatch",
                f"meta.json and index.json disagree on {', '.join(differing)}; the index or "
                "the entry was edited after writing: rebuild it with `mriprep run --force`",
            )
    for kind, record in entry.files.items():
        path = cache.entry_dir(key) / record.file
        scan = scan_tensor_file(path, kind, buffer, cast_dtype)
        result.bytes_read += scan.bytes_read
        for code, detail in scan.problems:
            report(code, f"{path.name} {detail}")
        if scan.checksum is None:
            continue  # missing: nothing more to compare
        if "file-size" not in {c for c, _ in scan.problems} and scan.bytes_read != record.bytes:
            report(
                "file-size",
                f"{path.name} is {scan.bytes_read} bytes, the index records {record.bytes}",
            )
        if scan.checksum != record.xxh3_128:
            report(
                "checksum-mismatch",
                f"{path.name} checksum {scan.checksum} differs from the index's "
                f"{record.xxh3_128}: the file changed on disk (bit rot, a partial copy "
                "or an edit); rebuild the entry with `mriprep run --force`",
            )
        if scan.shape is None:
            continue  # unreadable: already reported
        if scan.dtype != record.dtype:
            report(
                "dtype-mismatch",
                f"{path.name} is {scan.dtype}, the index records {record.dtype}",
            )
        if list(scan.shape) != list(record.shape):
            report(
                "shape-mismatch",
                f"{path.name} has shape {list(scan.shape)}, the index records "
                f"{list(record.shape)}",
            )
        if kind == "image":
            result.fingerprint = scan.fingerprint
            result.voxels = math.prod(scan.shape)
        elif kind == "valid":
            result.valid_voxels = scan.nonzero
        elif kind == "label":
            result.label_counts = scan.value_counts
    for record in entry.extra_files.values():
        path = cache.entry_dir(key) / record.file
        if not path.is_file():
            report("file-missing", f"{path.name} is missing ({path})")
            continue
        checksum, size = file_checksum(path, buffer)
        result.bytes_read += size
        if checksum != record.xxh3_128 or size != record.bytes:
            report(
                "checksum-mismatch",
                f"{path.name} ({size} bytes, xxh3 {checksum}) differs from the index's record "
                f"({record.bytes} bytes, xxh3 {record.xxh3_128}); rebuild the "
                "entry with `mriprep run --force`",
            )
    return result

def scan_entries(
    cache: Cache,
    index: dict[str, IndexEntry],
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cast_dtype: str | CastLimits = "float16",
) -> dict[str, EntryScan]:
    """:func:`scan_entry` on every entry of ``index``, in ``workers`` threads.

    Parameters
    ----------
    cache : Cache
        The cache the entries live in.
    index : dict
        Cache key -> :class:`~mriprep.cache.IndexEntry`.
    workers : int, optional
        Reader threads (default: up to 4, at most the CPU count); each reuses one buffer.
    progress : callable, optional
        Called as ``progress(done, total)`` after each entry.
    cast_dtype : str or CastLimits
        The dtype training casts images to (see :func:`scan_tensor_file`).

    Returns
    -------
    dict
        Cache key -> :class:`EntryScan`.
    """
    workers = workers or min(4, os.cpu_count() or 1)
    local = threading.local()

    def scan(key: str) -> EntryScan:
        if not hasattr(local, "buffer"):
            local.buffer = bytearray(CHUNK_BYTES)
        return scan_entry(cache, index[key], local.buffer, cast_dtype)

    return map_in_threads(scan, sorted(index), workers, progress, "mriprep-check")


def map_in_threads(work: Callable[[str], Any], keys: list[str], workers: int,
                   progress: Callable[[int, int], None] | None = None,
                   name: str = "mriprep-check") -> dict[str, Any]:
    """``{key: work(key)}``, in ``workers`` threads (the reads and NumPy work release the
    GIL), calling ``progress(done, total)`` as each finishes."""
    results: dict[str, Any] = {}
    if workers <= 1 or len(keys) <= 1:
        for done, key in enumerate(keys, 1):
            results[key] = work(key)
            if progress:
                progress(done, len(keys))
        return results
    with concurrent.futures.ThreadPoolExecutor(min(workers, len(keys)),
                                               thread_name_prefix=name) as pool:
        futures = {pool.submit(work, key): key for key in keys}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            results[futures[future]] = future.result()
            if progress:
                progress(done, len(keys))
    return results
