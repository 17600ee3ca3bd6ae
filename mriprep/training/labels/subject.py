"""One subject as FastSurfer's training data: classes, weights and thick slices of a view.

:func:`derive` turns a cached (image, FreeSurfer labels) pair into the class map and
weight map of one view, both in the cache's voxel order; :func:`slices_of` cuts them into
what FastSurfer's HDF5 holds per slice. The HDF5 export and the thick-slice dataset both
use these two, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mriprep.training.labels.slices import as_view, kept_slices, thick_slices, view_zoom
from mriprep.training.labels.table import LabelTable
from mriprep.training.labels.weights import (
    WeightOptions,
    cortex_threshold,
    region_factors_for,
    weight_map,
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
