"""``mriprep export --format fastsurfer-hdf5``: FastSurfer's own training HDF5 from a cache.

The file holds one group per image size (``"256"`` for a ``conform_1mm`` cache) with the
datasets FastSurferCNN's ``MultiScaleDataset`` reads:

    orig_dataset    [N, H, W, 2t+1] uint8   thick slices of the cached image
    aseg_dataset    [N, H, W]       uint8   the centre slice's classes of the view
    weight_dataset  [N, H, W]       float64 its weights (mriprep.training.labels.weights)
    zoom_dataset    [N, 2]          float32 in-plane voxel size
    subject         [subjects]      str     one name per subject, as FastSurfer writes it

and, beside them, ``slice_subject`` / ``slice_index`` (int32 per slice: which subject and
which slice) and the label table's description and hash as attributes, which FastSurfer
ignores. The rules are FastSurfer's ``generate_hdf5`` defaults (thickness 3, max_w 5,
edge_w 5, no hires weight, blank-slice threshold 50, aparc processing, sagittal merge).

Unlike ``generate_hdf5``: the subjects' tensors are checked against their checksums
before any work; subjects are processed in parallel worker processes; a subject that
fails (damaged entry, no labels, values outside the table) is named with its reason and
left out, never skipped in silence; a file without any slice is refused and not written;
the file appears atomically. Time and size per subject: docs/benchmarks.md (fastsurfer).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mriprep.cache import Cache, IndexEntry
from mriprep.core.atomic import atomic_path
from mriprep.core.errors import CacheError, MriprepError
from mriprep.core.machine import process_context
from mriprep.outputs.export import verify_entry_files
from mriprep.training.labels.derived import (
    DerivedLabels,
    EntrySummary,
    check_absent_classes,
    moved_voxels,
)
from mriprep.training.labels.subject import SubjectSlices, stored_slices
from mriprep.training.labels.table import VIEWS, LabelTable
from mriprep.training.labels.weights import WeightOptions

H5PY_HINT = ("h5py is not installed; install it with `pip install 'mriprep[fastsurfer]'` "
             "(or `pip install 'h5py>=3.9'`)")


def require_h5py():
    try:
        import h5py
    except ImportError:
        raise MriprepError(H5PY_HINT) from None
    return h5py


class EmptyExportError(CacheError):
    """No slice could be written; ``problems`` names every subject left out."""

    def __init__(self, message: str, problems: list[str]):
        super().__init__(message)
        self.problems = problems


@dataclass(frozen=True)
class HDF5Options:
    view: str = "coronal"
    thickness: int = 3
    blt: float = 50
    weights: WeightOptions = field(default_factory=WeightOptions)
    absent_classes: str = "error"


@dataclass
class HDF5Result:
    path: Path | None
    slices: int = 0
    subjects: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unknown_voxels: int = 0
    moved: dict[str, int] = field(default_factory=dict)  # rule -> voxels, all subjects


def verify_entry(cache: Cache, entry: IndexEntry) -> None:
    """Raise CacheError naming the entry when a tensor is missing, damaged or absent."""
    if "label" not in entry.files:
        raise CacheError(f"{entry.finding_name}: has no label map; FastSurfer training "
                         "needs one (give the manifest a labels column)")
    verify_entry_files(cache, entry)


def subject_name(entry: IndexEntry) -> str:
    return f"{entry.subject_id}_{entry.session_id}" if entry.session_id else entry.subject_id


def _one(store: DerivedLabels, entry: IndexEntry, summary: EntrySummary,
         options: HDF5Options) -> SubjectSlices:
    """One subject's slices from its derived classes (runs in a worker process)."""
    image = np.asarray(store.cache.load_tensor(entry.key, "image"))
    if image.dtype != np.uint8:
        # FastSurfer's orig is uint8 in 0..255; casting float values would wrap silently.
        raise CacheError(f"{entry.finding_name}: image is {image.dtype}, FastSurfer's HDF5 "
                         "holds uint8 0..255; export a cache made with -p conform_1mm")
    spacing = entry.spacing  # the index holds the sidecar's spacing: no meta.json read
    if spacing is None:
        raise CacheError(f"{entry.finding_name}: its index entry records no spacing; rebuild "
                         "the entry with `mriprep run --force`")
    return stored_slices(image, store.classes(entry, options.view), summary, store.table,
                         spacing, options.view, options.weights, options.thickness,
                         options.blt)


def export_fastsurfer_hdf5(cache: Cache, entries: Sequence[IndexEntry], path,
                           table: LabelTable,
                           options: HDF5Options = HDF5Options(), workers: int = 1,
                           progress: Callable[[int, int], None] | None = None,
                           derived_dir=None,
                           derive_progress: Callable[[int, int], None] | None = None
                           ) -> HDF5Result:
    """Write FastSurfer's training HDF5 for ``entries`` (module docstring).

    The classes come from the cache's derived labels (:mod:`mriprep.training.labels.
    derived`, kept in ``derived_dir``, default ``CACHE/derived``), derived first where
    missing (``derive_progress(done, total)``); ``progress(done, total)`` follows the
    writing.

    Raises
    ------
    EmptyExportError
        No slice at all could be written (every problem named); nothing is written then.
    CacheError
        A class of the table is absent from every subject (see ``absent_classes``).
    """
    h5py = require_h5py()
    result = HDF5Result(None)
    good = []
    for entry in entries:  # checksums first: no work on a damaged cohort's subjects
        try:
            verify_entry(cache, entry)
            good.append(entry)
        except CacheError as exc:
            result.problems.append(str(exc))
    store = DerivedLabels(cache, table, derived_dir)
    summaries, problems = store.ensure(good, workers, derive_progress)
    result.problems.extend(problems.values())
    good = [e for e in good if e.key in summaries]
    result.moved = moved_voxels(summaries.values())
    check_absent_classes(table, options.view, summaries, options.absent_classes,
                         [subject_name(e) for e in good])
    result.path = Path(path)
    with atomic_path(result.path) as tmp:
        with h5py.File(tmp, "w") as hf:
            _write_attributes(hf, table, options)
            _write_subjects(hf, store, entries, good, summaries, options, workers, result,
                            progress, h5py)
        if result.slices == 0:  # raising here removes the temporary file
            raise EmptyExportError(
                f"no slice to write to {path}, nothing was written: "
                + ("; ".join(result.problems) or "no entries chosen"), result.problems)
    return result


def _write_attributes(hf, table: LabelTable, options: HDF5Options) -> None:
    hf.attrs["written_by"] = "mriprep export --format fastsurfer-hdf5"
    hf.attrs["label_table"] = json.dumps(table.describe())
    hf.attrs["label_table_sha256"] = table.hash()
    hf.attrs["view"] = options.view
    hf.attrs["thickness"] = options.thickness


def read_recorded_table(path: str | os.PathLike) -> tuple[LabelTable, str]:
    """The label table and view an export was written with, its hash checked: what
    ``to-native --classes FILE.hdf5`` maps a network's classes back through."""
    h5py = require_h5py()
    try:
        with h5py.File(path, "r") as hf:
            attrs = {k: hf.attrs.get(k) for k in ("label_table", "label_table_sha256",
                                                  "view")}
    except OSError as exc:
        raise MriprepError(f"cannot read {path} as HDF5: {exc}") from None
    if attrs["label_table"] is None or attrs["label_table_sha256"] is None:
        raise MriprepError(f"{path} records no label table (not written by `mriprep "
                           "export --format fastsurfer-hdf5`); pass the lookup table "
                           "itself to --classes")
    view = str(attrs["view"])
    if view not in VIEWS:
        raise MriprepError(f"{path} records the view {attrs['view']!r}, not one of "
                           f"{', '.join(VIEWS)}; pass the lookup table and --view instead")
    try:
        description = json.loads(attrs["label_table"])
    except (TypeError, ValueError) as exc:
        raise MriprepError(f"{path}: the recorded label table is not JSON ({exc}); export "
                           "it again, or pass the lookup table itself to --classes") from None
    table = LabelTable.from_description(description, str(path),
                                        sha256=str(attrs["label_table_sha256"]))
    return table, view


def _write_subjects(hf, store, entries, good, summaries, options, workers, result,
                    progress, h5py) -> None:
    """Cut ``good`` into slices (in worker processes when ``workers > 1``) and append each
    subject's slices as it arrives, in the entries' order: memory holds a few subjects,
    never the cohort."""
    done = len(entries) - len(good)
    pool = None
    if workers > 1 and len(good) > 1:
        pool = ProcessPoolExecutor(min(workers, len(good)), mp_context=process_context())
    ahead = 2 * workers  # subjects in flight: finished ones wait in memory until written
    calls: dict[int, Any] = {}

    def submit(j):
        return pool.submit(_one, store, good[j], summaries[good[j].key], options)

    try:
        for i, entry in enumerate(good):
            while pool and len(calls) < ahead and i + len(calls) < len(good):
                j = i + len(calls)
                calls[j] = submit(j)
            try:
                got = (calls.pop(i).result() if pool
                       else _one(store, entry, summaries[entry.key], options))
            except MriprepError as exc:
                result.problems.append(str(exc))
                got = None
            except (ValueError, OSError) as exc:  # e.g. an unreadable tensor: named too
                result.problems.append(f"{entry.finding_name}: {type(exc).__name__}: {exc}")
                got = None
            done += 1
            if progress is not None:
                progress(done, len(entries))
            if got is None:
                continue
            if len(got.index) == 0:
                result.problems.append(f"{entry.finding_name}: no slice of the {options.view} "
                                       f"view has a class sum above {options.blt}; left out")
                continue
            _append(hf, got, subject_name(entry), h5py)
            result.subjects.append(subject_name(entry))
            result.slices += len(got.index)
            result.unknown_voxels += got.unknown_voxels
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)


def _append(hf, got: SubjectSlices, name: str, h5py) -> None:
    """Append one subject to its size group, creating the group's datasets first."""
    # FastSurfer groups by the image's first dimension (cubes from conform).
    size = str(got.classes.shape[1])
    n = len(got.index)
    fields = {"orig_dataset": got.orig, "aseg_dataset": got.classes.astype(np.uint8),
              "weight_dataset": got.weights,
              "zoom_dataset": np.repeat(got.zoom[None], n, axis=0),
              "slice_index": got.index}
    if size not in hf:
        g = hf.create_group(size)
        for key, data in fields.items():
            g.create_dataset(key, shape=(0,) + data.shape[1:], dtype=data.dtype,
                             maxshape=(None,) + data.shape[1:],
                             chunks=(1,) + data.shape[1:] if data.ndim >= 3 else True)
        g.create_dataset("slice_subject", shape=(0,), maxshape=(None,), dtype=np.int32)
        g.create_dataset("subject", shape=(0,), maxshape=(None,),
                         dtype=h5py.special_dtype(vlen=str))
    g = hf[size]
    start = g["orig_dataset"].shape[0]
    for key, data in fields.items():
        g[key].resize(start + n, axis=0)
        g[key][start:] = data
    number = g["subject"].shape[0]
    g["subject"].resize(number + 1, axis=0)
    g["subject"][number] = name
    g["slice_subject"].resize(start + n, axis=0)
    g["slice_subject"][start:] = number
