"""The ``thick_slice`` reader of :class:`~mriprep.training.dataset.MRIDataset`:
FastSurfer's thick 2.5D slices of one view, with classes and weights, straight from the
cache.

``MRIDataset(cache, "train", mode="thick_slice", view="coronal", context=3)`` gives one
item per kept slice of every entry:

    image        float32 [2c+1, H, W]  the slice and its ``context`` neighbours each side
                                       (edge slices repeat, as FastSurfer pads), the
                                       cached values
    label        int64   [H, W]        the slice's classes of the view
    weight       float32 [H, W]        its weights (as over the whole volume)
    valid        bool    [H, W]        the cache's valid mask of the slice
    zoom         float32 [2]           in-plane voxel size (FastSurfer's zoom)
    affine       float64 [4, 4]        the slice as a one-voxel-thick volume: its axes
                                       (row, column, slice) in world millimetres
    subject_id, session_id, slice_index

The slices, their order and their values equal the FastSurfer HDF5 that ``mriprep export
--format fastsurfer-hdf5`` writes with the same options: both read the classes the cache
keeps (:mod:`mriprep.training.labels.derived`), derived when the dataset opens where
they are missing (in worker processes) and reused by every later opening and export.
Blank slices (class sum <= ``blank_slice_threshold``) are left out. The image and valid
mask are read from view-ordered copies kept beside the classes, so that a slice is one
contiguous read in every view and any order of items costs the same.
"""

from __future__ import annotations

import warnings

import numpy as np

from mriprep.cache import Cache, IndexEntry
from mriprep.core.errors import CacheError
from mriprep.core.progress import ProgressBar
from mriprep.training.buffers import copy_into
from mriprep.training.labels.derived import (
    DerivedLabels,
    check_absent_classes,
    moved_voxels,
)
from mriprep.training.labels.slices import neighbours, view_axes, view_zoom
from mriprep.training.labels.subject import summary_class_weights
from mriprep.training.labels.table import VIEWS, LabelTable
from mriprep.training.labels.weights import (
    WeightOptions,
    cortex_threshold,
    region_factors_for,
    slab_weights,
)


class ThickSlices:
    """The slices of one view of ``entries`` and how to read them (module docstring)."""

    def __init__(self, cache: Cache, entries: list[IndexEntry], split: str, *,
                 view: str, context: int, table: LabelTable, weights: WeightOptions,
                 blank_slice_threshold: float, derived_dir, absent_classes: str,
                 workers: int, padded_size: int | None = None):
        if view not in VIEWS:
            raise ValueError(f"MRIDataset: view {view!r} is unknown; choose one of {VIEWS}")
        if padded_size is not None and (isinstance(padded_size, bool)
                                        or not isinstance(padded_size, int)
                                        or padded_size < 1):
            raise ValueError(f"MRIDataset: padded_size must be a positive int (FastSurfer's "
                             f"PADDED_SIZE), got {padded_size!r}")
        self.padded_size = padded_size
        unlabelled = [e.finding_name for e in entries if "label" not in e.files]
        if unlabelled:
            raise CacheError(f"{', '.join(unlabelled[:8])} have no label map; "
                             "mode='thick_slice' needs one per entry")
        self.view, self.context, self.table, self.weights = view, context, table, weights
        self.store = DerivedLabels(cache, table, derived_dir)
        # Minutes on a cohort, the first time only, often in a notebook or a batch job's
        # log: plain lines there too, not only a bar on a terminal.
        bar = ProgressBar("derive labels", unit="subject", log_lines=True)
        try:
            summaries, problems = self.store.ensure(entries, workers, bar.update_to)
        finally:
            bar.close()
        if problems:
            listed = "; ".join(problems[e.key] for e in entries if e.key in problems)
            raise CacheError(f"{len(problems)} of {len(entries)} entries of split {split!r} "
                             f"cannot give classes: {listed}")
        # The warning points at the caller of MRIDataset.
        check_absent_classes(table, view, summaries, absent_classes,
                             [e.finding_name for e in entries], stacklevel=4)
        ordered = [summaries[e.key] for e in entries]
        #: Voxels each rule before the lookup rewrote, over the split (rule -> voxels).
        self.moved = moved_voxels(ordered)
        #: Voxels of values the table does not list, counted as background.
        self.unknown_voxels = sum(s.unknown_voxels for s in ordered)
        if self.unknown_voxels:
            warnings.warn(f"{self.unknown_voxels} voxels of split {split!r} hold values the "
                          f"label table does not list, served as background (class 0)",
                          stacklevel=4)
        self.class_weight = [summary_class_weights(s, view, weights) for s in ordered]
        rows = [np.stack([np.full(len(keep), e), keep], axis=1)
                for e, keep in enumerate(s.kept(view, blank_slice_threshold)
                                         for s in ordered)]
        self.slices = np.concatenate(rows).astype(np.int64)
        if len(self.slices) == 0:
            raise CacheError(f"split {split!r} of cache {cache.root} has no {view} slice "
                             f"with a class sum above {blank_slice_threshold}")
        _, rows_axis, cols_axis = view_axes(view)
        #: Each entry's in-plane size as stored, and as served (padded or cut).
        self.stored_planes = [(int(e.shape[rows_axis]), int(e.shape[cols_axis]))
                              for e in entries]
        self.planes = (self.stored_planes if padded_size is None
                       else [(padded_size, padded_size)] * len(entries))
        cut = [f"{e.finding_name} ({rows}x{cols})" for e, (rows, cols)
               in zip(entries, self.stored_planes) if padded_size is not None
               and max(rows, cols) > padded_size]
        if cut:
            # FastSurfer cuts such slices too, silently; here they are named.
            warnings.warn(f"padded_size={padded_size} cuts the {view} slices of "
                          f"{len(cut)} entries of split {split!r} to their first "
                          f"{padded_size} rows and columns: {', '.join(cut[:8])}"
                          f"{' ...' if len(cut) > 8 else ''}; raise padded_size to the "
                          "largest size to keep every voxel", stacklevel=4)
        self.zooms = [view_zoom(e.spacing or (1.0, 1.0, 1.0), view) for e in entries]
        self.ctx_thresh = cortex_threshold(table, view)
        self.factors = region_factors_for(table, view, weights.region_weights)
        self.entries = entries
        self.affines = [np.asarray(e.affine, dtype=np.float64) for e in entries]
        self._maps: dict[tuple[int, str], np.ndarray] = {}

    def __getstate__(self):
        # Memory maps are opened again in each worker process.
        return {**self.__dict__, "_maps": {}}

    def _map(self, e: int, name: str) -> np.ndarray:
        found = self._maps.get((e, name))
        if found is None:
            entry = self.entries[e]
            found = (self.store.classes(entry, self.view) if name == "classes"
                     else self.store.view_copy(entry, name, self.view))
            # Kept open: opening a map per item cost more than reading the item.
            self._maps[(e, name)] = found
        return found

    def read(self, index: int, out: dict, j: int) -> dict:
        """Item ``index`` into row ``j`` of the batch arrays ``out`` ([B, C, H, W])."""
        e, k = (int(v) for v in self.slices[index])
        place, part = self._placement(e, out, j)
        image = self._map(e, "image")
        # Each neighbour straight into its channel (edge slices repeat): contiguous
        # copies, where FastSurfer's [H, W, 2c+1] layout would need a transpose.
        for c, p in enumerate(neighbours(k, self.context, len(image))):
            copy_into(out["image"][j, c][place], image[p][part])
        classes = self._map(e, "classes")
        copy_into(out["label"][j, 0][place], classes[k][part])
        weights = slab_weights(classes, k, self.class_weight[e], self.weights,
                               ctx_thresh=self.ctx_thresh, region_factors=self.factors)
        copy_into(out["weight"][j, 0][place], weights[part])
        copy_into(out["valid"][j, 0][place], self._map(e, "valid")[k][part])
        return {"slice_index": k, "zoom": self.zooms[e],
                "affine": self.slice_affine(e, k)}

    def _placement(self, e: int, out: dict, j: int) -> tuple[tuple, tuple]:
        """Where entry ``e``'s slices go in an item, and which part of them: the whole
        item without ``padded_size``; else its first rows and columns, the rest of the
        item (batch buffers are reused) set to background first."""
        if self.padded_size is None:
            whole = (slice(None), slice(None))
            return whole, whole
        rows, cols = (min(n, self.padded_size) for n in self.stored_planes[e])
        if (rows, cols) != (self.padded_size, self.padded_size):
            for name in ("image", "label", "weight", "valid"):
                out[name][j] = 0
        region = (slice(0, rows), slice(0, cols))
        return region, region

    def slice_affine(self, e: int, k: int) -> np.ndarray:
        """The affine of slice ``k`` as a one-voxel-thick volume whose axes are the
        item's (row, column) and then the view's slice axis."""
        slice_axis, rows_axis, cols_axis = view_axes(self.view)
        to_cache = np.zeros((4, 4))
        for column, axis in enumerate((rows_axis, cols_axis, slice_axis)):
            to_cache[axis, column] = 1.0
        to_cache[slice_axis, 3] = k
        to_cache[3, 3] = 1.0
        return self.affines[e] @ to_cache
