"""Thick 2.5D slices of a conformed (LIA) volume in FastSurfer's three views.

FastSurfer reads ``orig.mgz`` in its voxel order (LIA: axis 0 runs to the left, 1 down,
2 to the front) and cuts it per view:

=========  ==========  =====================  ============================
view       slice axis  in-plane (rows, cols)  zoom pair from the spacing
=========  ==========  =====================  ============================
coronal    2 (A)       (0, 1)                 (s0, s1)
axial      1 (I)       (2, 0)                 (s1, s2)
sagittal   0 (L)       (2, 1)                 (s2, s1)
=========  ==========  =====================  ============================

A thick slice holds ``2t+1`` neighbours as its last axis; neighbours past the volume's
edge repeat the edge slice (``numpy.pad`` mode ``edge``, as FastSurfer pads). A slice is
*blank* when the **sum of its class values** is at most ``blt`` (FastSurfer's
``filter_blank_slices_thick`` sums class numbers, not voxels, so the threshold of 50
means fewer than 50 voxels of class 1 or two of class 25; kept as it is so that the
slices chosen equal FastSurfer's).
"""

from __future__ import annotations

import numpy as np

from mriprep.training.labels.table import VIEWS

# view -> (slice axis, row axis, column axis) of the LIA volume.
VIEW_AXES = {"coronal": (2, 0, 1), "axial": (1, 2, 0), "sagittal": (0, 2, 1)}


def view_axes(view: str) -> tuple[int, int, int]:
    if view not in VIEW_AXES:
        raise ValueError(f"view {view!r} is unknown; choose one of {VIEWS}")
    return VIEW_AXES[view]


def as_view(volume: np.ndarray, view: str) -> np.ndarray:
    """A view of ``volume`` ordered (slice, row, column) for ``view`` (no copy)."""
    return np.transpose(volume, view_axes(view))


def view_zoom(spacing, view: str) -> np.ndarray:
    _, rows, cols = view_axes(view)
    return np.asarray([spacing[rows], spacing[cols]], dtype=np.float32)


def kept_slices(classes_sliced: np.ndarray, blt: float) -> np.ndarray:
    """Indices of the slices (axis 0) whose class sum exceeds ``blt``."""
    sums = classes_sliced.reshape(len(classes_sliced), -1).sum(axis=1, dtype=np.int64)
    return np.flatnonzero(sums > blt)


def neighbours(k: int, thickness: int, depth: int) -> np.ndarray:
    """The slices of slice ``k``'s thick slice: ``thickness`` each side, the edge slice
    repeated past the volume's edge."""
    return np.clip(np.arange(k - thickness, k + thickness + 1), 0, depth - 1)


def thick_slices(image_sliced: np.ndarray, keep: np.ndarray, thickness: int) -> np.ndarray:
    """``[len(keep), rows, cols, 2t+1]`` thick slices of ``keep`` (FastSurfer's layout)."""
    out = np.empty((len(keep),) + image_sliced.shape[1:] + (2 * thickness + 1,),
                   dtype=image_sliced.dtype)
    depth = len(image_sliced)
    for c, offset in enumerate(range(-thickness, thickness + 1)):
        # One gather per channel: the neighbours of every kept slice at this offset.
        out[..., c] = image_sliced[np.clip(keep + offset, 0, depth - 1)]
    return out
