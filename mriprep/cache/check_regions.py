"""Where the last check's spatial label findings lie: ``CACHE/check/regions.npz``.

``mriprep check --lut`` keeps, beside its findings (:mod:`mriprep.cache.check_record`),
the voxels of each map's spatial findings (``label-off-anatomy``, ``label-islands``,
``label-side-swap``; :mod:`mriprep.check.label_regions`), so that the QC report draws
them on the label map. One NumPy archive (no pickle) holds an array of voxel indices
per entry and code, named ``KEY/CODE``; it is written atomically before the record, and
the record names its SHA-256 (``regions``). A reader takes the archive only when the
record names it: an archive left by another check, or a record without one, is refused
with the command that writes them again. Entries the record is stale for are stale here
too (the record's :meth:`~mriprep.cache.check_record.CheckRecord.stale`).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mriprep.core.atomic import atomic_path
from mriprep.core.errors import CacheError

REGIONS_FILE = "regions.npz"
# The codes whose findings can have a region, in the order a legend lists them.
REGION_CODES = ("label-off-anatomy", "label-islands", "label-side-swap", "label-misfit")


def regions_path(cache_root: str | os.PathLike) -> Path:
    """Where a cache keeps its last check's flagged regions (it may not exist)."""
    from mriprep.cache.check_record import record_path

    return record_path(cache_root).with_name(REGIONS_FILE)


def write_regions(cache_root: str | os.PathLike, points: Mapping[str, Mapping[str, np.ndarray]]
                  ) -> tuple[Path | None, str | None]:
    """Write ``points`` (key -> code -> (k, 3) voxel indices) atomically; return the
    archive's path and SHA-256, or (None, None) when there is nothing to keep (an older
    archive is removed: no record names it any more). OSError when the cache cannot be
    written."""
    path = regions_path(cache_root)
    arrays = {f"{key}/{code}": np.ascontiguousarray(found, dtype=np.uint16).reshape(-1, 3)
              for key, codes in sorted(points.items()) for code, found in sorted(codes.items())}
    if not arrays:
        path.unlink(missing_ok=True)
        return None, None
    # The digest is of the bytes written, not of the file read back: another check may
    # replace the file between the two, and its digest must not be the one recorded.
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    data = buffer.getvalue()
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def read_regions(cache_root: str | os.PathLike,
                 kept: Mapping[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    """Every entry's regions (key -> code -> (k, 3) voxel indices) from the archive that
    the record's ``regions`` (``kept``) names; empty when the check flagged none.

    Raises
    ------
    CacheError
        The record keeps no regions (written before they were kept), or the archive is
        missing, another check's, or unreadable; the message says which, and the fix.
    """
    path = regions_path(cache_root)
    again = f"`mriprep check {Path(cache_root)} --lut dkt` (or your table) writes it again"
    if "entries" not in kept:
        raise CacheError(f"the check record keeps no flagged regions (it was written "
                         f"before mriprep kept them): {again}")
    if not kept.get("sha256"):
        return {}  # the check flagged no region: it wrote no archive
    if not path.is_file():
        raise CacheError(f"the check's flagged regions {path} are missing: {again}")
    try:
        # The bytes hashed are the bytes loaded: a file replaced between a digest and a
        # second read would be loaded unchecked.
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != kept["sha256"]:
            raise CacheError(f"{path} is not the file the check record names (another "
                             f"check wrote it, or it was changed since): {again}")
        out: dict[str, dict[str, np.ndarray]] = {}
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            for name in archive.files:
                key, _, code = name.partition("/")
                out.setdefault(key, {})[code] = np.asarray(archive[name], dtype=np.intp)
        return out
    except (OSError, ValueError) as exc:
        raise CacheError(f"cannot read the check's flagged regions {path} "
                         f"({type(exc).__name__}: {exc}): {again}") from exc
