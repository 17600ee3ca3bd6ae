"""The classes of a cache's label maps, derived once and kept beside the cache.

Turning a FreeSurfer-numbered map into classes costs a fill of the unknown parcels
(:mod:`.aparc`) and a lookup per view; the thick-slice items of :class:`MRIDataset` and
``mriprep export --format fastsurfer-hdf5`` both need them, every epoch and every view.
:class:`DerivedLabels` computes them once per entry, for the three views at once (the
fill is shared), and keeps them in the cache folder::

    derived/labels-<hash>/<entry key>/axial.npy      classes, uint8, in the view's
                                     coronal.npy      order (slice, row, column): a slice
                                     sagittal.npy     is one contiguous read
                                     summary.json     per view: voxels per class and the
                                                      class sum of every slice; the
                                                      rules' rewrites; unknown values
    derived/views-v<n>/<key>/<view>.image.<sum>.npy  the cached image and valid mask in
                             <view>.valid.<sum>.npy  the view's order, for the views read

``<hash>`` covers the label table (values, names, processing, cortex, unknown, sagittal
merge) and :data:`DERIVATION_VERSION`, so another table or a changed rule never reads
old classes. ``summary.json`` is written last and every file atomically: an entry whose
summary exists is complete. It records the label tensor's checksum, and the view copies
carry their tensor's in their names (``<sum>``), so an entry rebuilt under its key is
derived again. Two processes deriving one entry at once only repeat each other's work. Weights are not stored: a slice's weights follow from its
classes, its two neighbours' and the class counts (:func:`.weights.slab_weights`), where
storing them would cost four bytes a voxel. ``mriprep cache prune`` and removing the
folder are both safe; what is missing is derived again when needed. Sizes per subject:
docs/benchmarks.md (fastsurfer).
"""

from __future__ import annotations

import json
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mriprep.cache import DERIVED_DIR, Cache, IndexEntry
from mriprep.cache.formats.npy import open_npy
from mriprep.core.atomic import atomic_path, write_text
from mriprep.core.errors import CacheError, MriprepError
from mriprep.core.hashing import hash_json
from mriprep.core.machine import process_context
from mriprep.training.labels.slices import as_view
from mriprep.training.labels.table import VIEWS, LabelTable

# Raise when a rule of :mod:`.aparc` or the stored layout changes: old classes then
# live under another hash and are derived again.
DERIVATION_VERSION = 2


@dataclass(frozen=True)
class EntrySummary:
    """What one entry's derivation found (``summary.json``)."""

    class_counts: dict[str, np.ndarray]   # view -> voxels per class
    slice_sums: dict[str, np.ndarray]     # view -> class sum of every slice (blank test)
    moved: dict[str, int]                 # rule -> voxels it rewrote
    unknown_voxels: int
    unknown_values: tuple[int, ...]
    source: str = ""                      # the label tensor's recorded checksum

    def kept(self, view: str, blank_slice_threshold: float) -> np.ndarray:
        """The slices of ``view`` whose class sum exceeds the threshold (FastSurfer's
        blank-slice filter)."""
        return np.flatnonzero(self.slice_sums[view] > blank_slice_threshold)

    def to_json(self) -> str:
        return json.dumps({
            "class_counts": {v: c.tolist() for v, c in self.class_counts.items()},
            "slice_sums": {v: s.tolist() for v, s in self.slice_sums.items()},
            "moved": self.moved, "unknown_voxels": self.unknown_voxels,
            "unknown_values": list(self.unknown_values), "source": self.source})

    @classmethod
    def from_json(cls, text: str) -> "EntrySummary":
        doc = json.loads(text)
        return cls({v: np.asarray(c, dtype=np.int64) for v, c in doc["class_counts"].items()},
                   {v: np.asarray(s, dtype=np.int64) for v, s in doc["slice_sums"].items()},
                   {k: int(n) for k, n in doc["moved"].items()}, int(doc["unknown_voxels"]),
                   tuple(int(v) for v in doc["unknown_values"]), str(doc.get("source", "")))


class DerivedLabels:
    """The derived classes of a cache under one label table (module docstring).

    Parameters
    ----------
    cache : Cache
    table : LabelTable
    folder : path, optional
        Where to keep them; default ``CACHE/derived/``. Give another folder when the
        cache is read-only (a shared cohort cache).
    """

    def __init__(self, cache: Cache, table: LabelTable,
                 folder: str | os.PathLike | None = None):
        self.cache, self.table = cache, table
        base = Path(folder) if folder is not None else cache.root / DERIVED_DIR
        self.hash = hash_json({"table": table.describe(), "version": DERIVATION_VERSION})
        self.root = base / f"labels-{self.hash[:16]}"
        self.views = base / f"views-v{DERIVATION_VERSION}"

    def entry_folder(self, entry: IndexEntry) -> Path:
        self.cache.entry_dir(entry.key)  # refuses a key that is not a digest
        return self.root / entry.key

    def summary(self, entry: IndexEntry) -> EntrySummary | None:
        """The stored summary, or None when the entry must be derived (again): never
        derived, a class file gone, or its label map is not the one it was derived from
        (an entry rebuilt under its key by ``mriprep run --force``)."""
        folder = self.entry_folder(entry)
        path = folder / "summary.json"
        try:
            summary = EntrySummary.from_json(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as exc:
            raise CacheError(f"{path} is unreadable ({exc}); remove {folder} and it is "
                             "derived again") from None
        if summary.source != _label_checksum(entry) or not all(
                (folder / f"{view}.npy").is_file() for view in VIEWS):
            return None
        return summary

    def classes(self, entry: IndexEntry, view: str) -> np.memmap:
        """The entry's classes of ``view``, in the view's order, memory-mapped."""
        path = self.entry_folder(entry) / f"{view}.npy"
        try:
            return open_npy(path)
        except FileNotFoundError:
            raise CacheError(f"{path} is gone since the dataset was opened (subject "
                             f"{entry.finding_name}); open it again to derive it") from None

    def view_copy(self, entry: IndexEntry, name: str, view: str) -> np.memmap:
        """The entry's cached tensor ``name`` in ``view``'s order, memory-mapped, written
        on first use under ``derived/views-v<n>/``: a coronal slice of the cache's own
        order is a gather over every page of the volume, here one contiguous read.

        Raises
        ------
        CacheError
            The folder cannot be written (a read-only cache without ``derived_dir``).
        """
        self.cache.entry_dir(entry.key)  # refuses a key that is not a digest
        record = entry.files.get(name)
        # Named by the tensor's checksum: an entry rebuilt under its key gets new copies.
        stamp = (record.xxh3_128 or "unrecorded")[:16] if record else "missing"
        path = self.views / entry.key / f"{view}.{name}.{stamp}.npy"
        if not path.exists():
            ordered = np.ascontiguousarray(as_view(
                np.asarray(self.cache.load_tensor(entry.key, name)), view))
            try:
                with atomic_path(path, suffix=".npy") as tmp:
                    np.save(tmp, ordered)
            except OSError as exc:
                raise CacheError(f"cannot write {path} ({exc.strerror}); give a writable "
                                 "folder with derived_dir=DIR") from None
            for old in path.parent.glob(f"{view}.{name}.*.npy"):
                if old != path:  # the copy of the tensor as it was before a rebuild
                    old.unlink(missing_ok=True)
        return open_npy(path)

    def ensure(self, entries: Sequence[IndexEntry], workers: int = 1,
               progress: Callable[[int, int], None] | None = None
               ) -> tuple[dict[str, EntrySummary], dict[str, str]]:
        """Derive the entries not derived yet; return ``({key: summary}, {key: problem})``
        for all of them. A problem (values outside the table, a map without cortical
        parcels, an unreadable tensor) names the subject; the other entries go on."""
        summaries: dict[str, EntrySummary] = {}
        problems: dict[str, str] = {}
        todo = []
        for entry in entries:
            found = self.summary(entry)
            if found is None:
                todo.append(entry)
            else:
                summaries[entry.key] = found
        if todo:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CacheError(
                    f"cannot write the derived classes to {self.root} ({exc.strerror}); "
                    "give a writable folder with derived_dir=DIR") from None
        done = len(entries) - len(todo)
        if progress is not None and todo:
            progress(done, len(entries))
        for entry, outcome in _run(self, todo, workers):
            if isinstance(outcome, EntrySummary):
                summaries[entry.key] = outcome
            else:
                problems[entry.key] = outcome
            done += 1
            if progress is not None:
                progress(done, len(entries))
        return summaries, problems


def derive_entry(store: DerivedLabels, entry: IndexEntry) -> EntrySummary:
    """Derive and store one entry's three views (runs in a worker process)."""
    cache, table = store.cache, store.table
    if "label" not in entry.files:
        raise CacheError(f"{entry.finding_name}: has no label map; class-based training "
                         "needs one per entry (give the manifest a label column)")
    labels = np.asarray(cache.load_tensor(entry.key, "label"))
    prepared = table.prepare(labels, entry.finding_name)
    folder = store.entry_folder(entry)
    counts, sums = {}, {}
    unknown_voxels, unknown_values = 0, ()
    for view in VIEWS:
        mapped = table.lookup(prepared, view, entry.finding_name)
        unknown_voxels, unknown_values = mapped.unknown_voxels, mapped.unknown_values
        ordered = np.ascontiguousarray(as_view(mapped.classes, view))
        with atomic_path(folder / f"{view}.npy", suffix=".npy") as tmp:
            np.save(tmp, ordered)
        counts[view] = np.bincount(ordered.ravel(), minlength=table.num_classes(view))
        sums[view] = ordered.reshape(len(ordered), -1).sum(axis=1, dtype=np.int64)
    summary = EntrySummary(counts, sums, dict(prepared.moved), unknown_voxels,
                           unknown_values, _label_checksum(entry))
    write_text(folder / "summary.json", summary.to_json())
    return summary


def _label_checksum(entry: IndexEntry) -> str:
    record = entry.files.get("label")
    return (record.xxh3_128 or "") if record else ""


def _one(store: DerivedLabels, entry: IndexEntry) -> EntrySummary | str:
    try:
        return derive_entry(store, entry)
    except MriprepError as exc:
        return str(exc)
    except (ValueError, OSError) as exc:  # an unreadable tensor: named, not raised
        return f"{entry.finding_name}: {type(exc).__name__}: {exc}"


def _run(store: DerivedLabels, todo: list[IndexEntry], workers: int):
    """``(entry, summary or problem)`` in the entries' order, from worker processes
    when there are several entries and workers."""
    if workers <= 1 or len(todo) <= 1:
        for entry in todo:
            yield entry, _one(store, entry)
        return
    with ProcessPoolExecutor(min(workers, len(todo)), mp_context=process_context()) as pool:
        for entry, outcome in zip(todo, pool.map(_one, [store] * len(todo), todo)):
            yield entry, outcome


def absent_classes(table: LabelTable, view: str,
                   summaries: dict[str, EntrySummary]) -> list[str]:
    """Names of the classes of ``view`` (background aside) that no entry holds."""
    total = sum((s.class_counts[view] for s in summaries.values()),
                np.zeros(table.num_classes(view), dtype=np.int64))
    names = table.class_names(view)
    return [names[c] for c in np.flatnonzero(total == 0) if c > 0]


ABSENT_CLASSES = ("error", "allow")


def check_absent_classes(table: LabelTable, view: str, summaries: dict[str, EntrySummary],
                         policy: str, subjects: Sequence[str],
                         stacklevel: int = 3) -> list[str]:
    """Refuse (``policy="error"``) classes of ``view`` that no subject holds: the network
    would never learn them, and a class count that shrinks without a word is how a
    cohort's whole cortex went missing before. With ``"allow"`` a warning names them.
    Return their names."""
    if policy not in ABSENT_CLASSES:
        raise ValueError(f"absent_classes={policy!r}; choose one of {ABSENT_CLASSES}")
    if not summaries:
        return []
    names = absent_classes(table, view, summaries)
    if not names:
        return names
    shown = ", ".join(subjects[:8]) + (f", ... ({len(subjects) - 8} more)"
                                       if len(subjects) > 8 else "")
    what = (f"{len(names)} of the {table.num_classes(view) - 1} classes of the {view} view "
            f"(label table {table.lut.source or '(in memory)'}) are absent from all "
            f"{len(summaries)} subjects ({shown}): {', '.join(names)}")
    if policy == "error":
        raise CacheError(
            f"{what}. Check the segmentations (aseg.mgz has no cortical parcels), use a "
            "label table without these classes, or accept it with absent_classes=allow")
    warnings.warn(f"{what}; accepted (absent_classes=allow)", stacklevel=stacklevel)
    return names


def moved_voxels(summaries) -> dict[str, int]:
    """Voxels each rule rewrote, over all ``summaries`` (rule -> voxels)."""
    total: dict[str, int] = {}
    for summary in summaries:
        for rule, count in summary.moved.items():
            total[rule] = total.get(rule, 0) + count
    return dict(sorted(total.items()))
