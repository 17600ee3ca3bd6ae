"""Where QC lives in a cache: ``CACHE/qc/<key>/``, beside the entries, never inside them.

A QC folder holds ``qc.json`` (metrics, legends, notes, what made it, and the time the
run that made the entry took) and one JPEG per picture. It is derived data: not part of an entry's checksummed payload, written after
the entry, and re-made from the cache when it is missing (``mriprep report``). A failed
subject's folder carries the key its entry would have had. Folders are written whole:
files go to a temporary folder that is renamed into place, so a report never reads half
a subject.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mriprep.cache import QC_DIR
from mriprep.core.atomic import fsync_dir, move_folder_into_place, sweep_stale, write_text

if TYPE_CHECKING:  # the check reads QC files without the plotting stack
    from mriprep.qc.subject import SubjectQC

QC_FILE = "qc.json"
QC_FORMAT = "mriprep-qc"
QC_VERSION = 1


def qc_root(cache_root: str | os.PathLike) -> Path:
    return Path(cache_root) / QC_DIR


def write_qc(cache_root: str | os.PathLike, key: str, qc: "SubjectQC",
             identity: dict[str, Any], replace: bool = True) -> bool:
    """Write one subject's QC folder whole; return whether it is now in place.

    ``replace`` swaps out an older folder (the worker, which made its QC from the data
    in memory); without it an existing folder wins (a report that made QC from the
    cache must not overwrite the worker's better one, made meanwhile).
    """
    root = qc_root(cache_root)
    tmp_root = root / ".tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    sweep_stale(tmp_root)
    final = root / key
    if final.exists() and not replace:
        return False
    tmp = tmp_root / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files = {f"{name}.jpg": picture for name, picture in qc.images.items()}
        doc = {"format": QC_FORMAT, "version": QC_VERSION, "key": key, **identity,
               **qc.to_json()}
        files[QC_FILE] = json.dumps(doc, indent=1, default=_plain).encode()
        for name, content in files.items():
            with open(tmp / name, "wb") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        # False: another writer put its folder in place first, and it is kept.
        return move_folder_into_place(tmp, final, tmp_root, replace=replace)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_qc(cache_root: str | os.PathLike, key: str) -> dict[str, Any] | None:
    """A subject's ``qc.json``, or None when it is missing, unreadable or of another
    format (the caller re-makes or reports it)."""
    path = qc_root(cache_root) / key / QC_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != QC_FORMAT \
            or doc.get("version") != QC_VERSION:
        return None
    return doc


def record_made_by_run(cache_root: str | os.PathLike, key: str,
                       made: dict[str, Any]) -> None:
    """Keep in a subject's ``qc.json`` what the run that made its entry took
    (``{"seconds": ..., "run_started": ...}``), so that the report of a later run, which
    skipped the entry, shows that time and not the skip's. The file is replaced whole.

    Raises
    ------
    OSError
        The QC folder cannot be written (a read-only cache).
    """
    doc = read_qc(cache_root, key)
    if doc is None:
        return
    doc["made_by_run"] = made
    write_text(qc_root(cache_root) / key / QC_FILE, json.dumps(doc, indent=1, default=_plain))


def picture_path(cache_root: str | os.PathLike, key: str, name: str) -> Path:
    return qc_root(cache_root) / key / f"{name}.jpg"


def _plain(value):
    """JSON for numpy scalars; anything else non-JSON is a bug worth seeing as text."""
    try:
        return value.item()
    except AttributeError:
        return str(value)
