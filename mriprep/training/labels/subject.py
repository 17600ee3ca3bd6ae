"""One subject as FastSurfer's training data: classes, weights and thick slices of a view.

:func:`stored_slices` cuts the classes a cache keeps (:mod:`.derived`) into what
FastSurfer's HDF5 holds per slice: the export writes them, and the thick-slice items of
``MRIDataset`` read the same classes and weights, so the two cannot disagree.
:func:`derive` and :func:`slices_of` do the same for a (image, FreeSurfer labels) pair
in memory, without a cache (the tests hold them against FastSurfer's functions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mriprep.training.labels.derived import EntrySummary
from mriprep.training.labels.slices import as_view, kept_slices, thick_slices, view_zoom
from mriprep.training.labels.table import LabelTable
from mriprep.training.labels.weights import (
    WeightOptions,
    cortex_threshold,
    region_factors_for,
    weight_map,
    weights_from_counts,
)


@dataclass
class Derived:
    """Classes (uint8) and weights (float64) of one view, on the cache grid."""

    classes: np.ndarray
    weights: np.ndarray
    unknown_voxels: int


@dataclass
class SubjectSlices:
    """The kept slices of one subject in FastSurfer's layout.

    The image travels once, in view order (``image``: [D, H, W]); ``orig``, the thick
    slices, is gathered from it when asked: 2t+1 times the bytes, which a worker process
    would otherwise send through a pipe."""

    image: np.ndarray     # [D, H, W] as the image is cached (uint8 from conform_1mm)
    classes: np.ndarray   # [N, H, W] uint8
    weights: np.ndarray   # [N, H, W] float64
    zoom: np.ndarray      # [2] float32
    index: np.ndarray     # [N] slice index along the view's slice axis
    thickness: int
    unknown_voxels: int

    @property
    def orig(self) -> np.ndarray:
        """[N, H, W, 2t+1] thick slices of the kept slices."""
        return thick_slices(self.image, self.index.astype(np.int64), self.thickness)


def derive(labels: np.ndarray, table: LabelTable, view: str,
           options: WeightOptions = WeightOptions(), subject: str = "") -> Derived:
    mapped = table.map(labels, view, subject=subject)
    factors = region_factors_for(table, view, options.region_weights)
    weights = weight_map(mapped.classes, table.num_classes(view), options,
                         ctx_thresh=cortex_threshold(table, view), region_factors=factors)
    return Derived(mapped.classes, weights, mapped.unknown_voxels)


def slices_of(image: np.ndarray, derived: Derived, spacing, view: str, thickness: int = 3,
              blt: float = 50) -> SubjectSlices:
    classes = as_view(derived.classes, view)
    keep = kept_slices(classes, blt)
    return SubjectSlices(
        image=np.ascontiguousarray(as_view(image, view)),
        classes=np.ascontiguousarray(classes[keep]),
        weights=np.ascontiguousarray(as_view(derived.weights, view)[keep]),
        zoom=view_zoom(spacing, view),
        index=keep.astype(np.int32),
        thickness=thickness,
        unknown_voxels=derived.unknown_voxels,
    )


def stored_slices(image: np.ndarray, classes: np.ndarray, summary: EntrySummary,
                  table: LabelTable, spacing, view: str,
                  options: WeightOptions = WeightOptions(), thickness: int = 3,
                  blt: float = 50) -> SubjectSlices:
    """:func:`slices_of` for stored classes (already in ``view``'s order) and their
    summary: the weights from the whole volume's class counts, as :func:`derive`'s."""
    keep = summary.kept(view, blt)
    weights = weight_map(np.asarray(classes), table.num_classes(view), options,
                         ctx_thresh=cortex_threshold(table, view),
                         region_factors=region_factors_for(table, view,
                                                           options.region_weights),
                         class_weight=summary_class_weights(summary, view, options))
    return SubjectSlices(
        image=np.ascontiguousarray(as_view(image, view)),
        classes=np.ascontiguousarray(classes[keep]),
        weights=np.ascontiguousarray(weights[keep]),
        zoom=view_zoom(spacing, view),
        index=keep.astype(np.int32),
        thickness=thickness,
        unknown_voxels=summary.unknown_voxels,
    )


def summary_class_weights(summary: EntrySummary, view: str,
                          options: WeightOptions) -> np.ndarray:
    """The class weights of :func:`.weights.class_weights` from a summary's counts."""
    return weights_from_counts(summary.class_counts[view], options.max_weight)
