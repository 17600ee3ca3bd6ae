"""``mriprep export``: cache entries as NIfTI (or MGZ) files any tool opens, with their
provenance beside them.

The cache stores tensors for the loader (``.npy``, ``.b2nd``: any format of
:mod:`mriprep.cache.formats`, read through it); a viewer, another pipeline or a
collaborator needs images with their geometry. Each entry becomes a folder
``DIR/<subject>[_<session>]/``::

    image.nii.gz       the cached image, float32 or uint8 as cached (float16 is written
                       as float32: NIfTI-1 and MGH store no float16)
    valid.nii.gz       uint8, 1 where the voxel is a measurement, 0 where it was filled,
                       masked or lies outside the scan
    label.nii.gz       int16, when the entry has a label map
    transform.tfm      the registration (ITK text), when the entry was registered
    provenance.json    where it came from: the key, the pipeline's name and hash, the
                       inputs with their SHA-256, the grid, template_to_subject, and
                       every stage's record

The voxels are the cached values exactly, on the cache grid: its affine is the images'
sform and qform (code 4, MNI152, for an entry registered to the built-in template; 2,
aligned, for another template; 1, scanner, without registration). Before an entry is
written, each tensor's bytes are checked against the index's checksum, so a damaged
entry is reported, never exported. Every file goes through a temporary name renamed into
place; the folder is marked (``.mriprep-export``) so that a later export may replace
it, and a folder holding anything else is refused.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import mriprep
from mriprep.cache import Cache, IndexEntry
from mriprep.cache.sidecar import EntrySidecar, read_sidecar
from mriprep.core.atomic import atomic_path, write_text
from mriprep.core.errors import CacheError
from mriprep.core.hashing import checksum_file
from mriprep.inputs.writing import nifti_image
from mriprep.outputs.images import save_image

# Marks a folder as an mriprep export, which a new export may write into.
EXPORT_MARKER = ".mriprep-export"
EXPORT_FORMAT = "mriprep-export"
EXPORT_VERSION = 1
PROVENANCE_FILE = "provenance.json"
FORMATS = {"nifti": ".nii.gz", "mgz": ".mgz"}
# NIfTI xform codes of the cache grid's world.
_SCANNER, _ALIGNED, _MNI152 = 1, 2, 4


@dataclass
class ExportResult:
    """What an export wrote (one folder per entry) and the entries it could not."""

    folders: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_export_folder(out_dir: str | os.PathLike) -> Path:
    """``out_dir`` if an export may write there: new, empty, or an earlier export.

    Raises
    ------
    CacheError
        ``out_dir`` is a file, or a folder holding other files than an export's.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CacheError(f"{out} is a file, not a folder; choose a folder for -o")
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_MARKER).exists():
        raise CacheError(
            f"{out} is not empty and holds no mriprep export; choose an empty or new "
            "folder for -o (its files would be replaced)"
        )
    return out


def export_entries(cache: Cache, entries: Sequence[IndexEntry], out_dir: str | os.PathLike,
                   fmt: str = "nifti",
                   progress: Callable[[int, int], None] | None = None) -> ExportResult:
    """Write ``entries`` of ``cache`` into ``out_dir``, one folder each (module docstring).

    An entry whose tensors do not match their checksums, or cannot be read, is left out
    and named in ``problems``; the others are written. ``progress(done, total)`` is
    called after each entry.

    Raises
    ------
    CacheError
        An unknown ``fmt``, or an ``out_dir`` that may not be written
        (:func:`check_export_folder`).
    """
    if fmt not in FORMATS:
        raise CacheError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    out = check_export_folder(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / EXPORT_MARKER, f"written by `mriprep export` from {cache.root}\n")
    result = ExportResult()
    for done, entry in enumerate(entries, start=1):
        try:
            result.folders.append(export_entry(cache, entry, out, fmt))
        except CacheError as exc:
            result.problems.append(str(exc))
        if progress is not None:
            progress(done, len(entries))
    return result


def entry_folder_name(entry: IndexEntry) -> str:
    """``<subject>`` or ``<subject>_<session>`` (manifest ids are file-name safe)."""
    name = f"{entry.subject_id}_{entry.session_id}" if entry.session_id else entry.subject_id
    if Path(name).name != name or name in (".", ".."):
        raise CacheError(f"entry {entry.finding_name} has ids that are no folder name")
    return name


def verify_entry_files(cache: Cache, entry: IndexEntry) -> None:
    """Raise CacheError naming the file when one of ``entry``'s files is missing or does
    not match the index's checksum: what every export checks before it writes."""
    for record in entry.files.values():
        path = cache.entry_dir(entry.key) / record.file
        if not path.is_file():
            raise CacheError(f"{entry.finding_name}: {path} is missing; not exported "
                             "(`mriprep run --force` rebuilds the entry)")
        if record.xxh3_128 is not None and checksum_file(path) != record.xxh3_128:
            raise CacheError(
                f"{entry.finding_name}: {path} does not match its checksum in the index; "
                f"not exported (`mriprep check {cache.root}` lists such entries, "
                "`mriprep run --force` rebuilds them)"
            )


def export_entry(cache: Cache, entry: IndexEntry, out: Path, fmt: str = "nifti") -> Path:
    """Write one entry's folder under ``out``; return it.

    Raises
    ------
    CacheError
        A tensor is missing or does not match its checksum (nothing is written then).
    """
    verify_entry_files(cache, entry)
    sidecar = read_sidecar(cache, entry.key)
    if sidecar.affine is None:
        raise CacheError(f"{entry.finding_name}: its meta.json records no affine; rebuild "
                         "the entry with `mriprep run --force`")
    folder = out / entry_folder_name(entry)
    folder.mkdir(parents=True, exist_ok=True)
    affine = sidecar.affine
    code = _xform_code(sidecar)
    suffix = FORMATS[fmt]
    files: dict[str, Any] = {}
    for name in ("image", "valid", "label"):
        if name not in entry.files:
            continue
        array = np.asarray(cache.load_tensor(entry.key, name))
        data = _writable(name, array)
        target = folder / f"{name}{suffix}"
        save_image(nifti_image(data, affine, code=code), target)
        files[name] = {"file": target.name, "cached_dtype": str(array.dtype),
                       "written_dtype": str(data.dtype),
                       "cached_xxh3_128": entry.files[name].xxh3_128}
    for name, record in entry.extra_files.items():  # transform.tfm
        with atomic_path(folder / name) as tmp:
            shutil.copyfile(cache.entry_dir(entry.key) / record.file, tmp)
        files[name] = {"file": name, "cached_xxh3_128": record.xxh3_128}
    write_text(folder / PROVENANCE_FILE, json.dumps(_provenance(cache, entry, sidecar, files,
                                                                code), indent=1))
    return folder


def _writable(name: str, array: np.ndarray) -> np.ndarray:
    """The voxels as written: the valid mask as 0/1 bytes, float16 as float32 (NIfTI-1
    and MGH have no float16); everything else as cached."""
    if name == "valid":
        return array.astype(np.uint8)
    if array.dtype == np.float16:
        return array.astype(np.float32)
    return array


def _xform_code(sidecar: EntrySidecar) -> int:
    """The NIfTI code of the cache grid's world: the template's after a registration
    (MNI152 for the built-in one), the scanner's otherwise."""
    if sidecar.template_to_subject is None:
        return _SCANNER
    from mriprep.stages import all_stages

    registering = {s.name: s for s in all_stages() if s.hands_over_transform}
    for record in sidecar.records:
        declared = registering.get(record.get("stage"))
        if declared is not None and declared.template_fields:
            template = (record.get("params") or {}).get(declared.template_fields[0])
            return _MNI152 if template == "mni152" else _ALIGNED
    return _ALIGNED


def _provenance(cache: Cache, entry: IndexEntry, sidecar: EntrySidecar,
                files: dict[str, Any], code: int) -> dict[str, Any]:
    doc = sidecar.to_json()
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_by": f"mriprep {mriprep.__version__}",
        "cache": str(cache.root.resolve()),
        "key": entry.key,
        "subject_id": entry.subject_id,
        "session_id": entry.session_id,
        "split": entry.split,
        "pipeline": {"name": sidecar.pipeline_name, "hash": sidecar.pipeline_hash,
                     "source": sidecar.pipeline_source},
        "cached_by": sidecar.mriprep_version,
        "inputs": doc["inputs"],
        "grid": {"affine": doc["affine"], "shape": doc["shape"], "spacing": doc["spacing"],
                 "xform_code": code},
        "template_to_subject": doc.get("template_to_subject"),
        "files": files,
        "provenance": doc["provenance"],
    }
