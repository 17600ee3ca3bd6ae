"""A label map: on exactly its image's grid, integer class ids, compact dtype.

:func:`check_same_grid` takes a label map's and its image's
:class:`~mriprep.inputs.headers.ImageHeader` and refuses with
:class:`~mriprep.core.errors.HeaderError` a different shape, or affines more than
:data:`LABEL_AFFINE_ATOL_MM` apart. :func:`read_label` takes an opened label file and
returns its values, scaled as its header says, as int16 when they fit, else int32, in C
order; it refuses with :class:`~mriprep.core.errors.InputError` a non-integer or non-finite
value, or one outside the int32 range.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mriprep.core.errors import HeaderError, InputError
from mriprep.core.limits import smallest_label_dtype
from mriprep.inputs.formats import OpenedImage, read_voxels
from mriprep.inputs.headers import ImageHeader, matrix_text

# A label map must sit on exactly its image's grid; float32 storage of a shared affine
# reproduces it to ~1e-5 mm, so anything above 1e-4 mm is a different grid.
LABEL_AFFINE_ATOL_MM = 1e-4


def check_same_grid(label: ImageHeader, image: ImageHeader) -> None:
    """Require a label map's header to describe exactly its image's grid.

    Raises
    ------
    HeaderError
        The shapes differ, or the affines differ by more than 1e-4 mm.
    """
    path, header = label.path, label  # the label is what the messages are about
    if header.shape != image.shape:
        raise HeaderError(
            f"label map {path} has shape {header.shape} but its image {image.path} has "
            f"{image.shape}; a label map must be on the image's exact grid: pair the right "
            "files or resample the labels (nearest neighbour) onto the image"
        )
    diff = float(np.max(np.abs(header.affine - image.affine)))
    if diff > LABEL_AFFINE_ATOL_MM:
        raise HeaderError(
            f"label map {path} has an affine that differs from its image {image.path} by up "
            f"to {diff:.4g} mm (tolerance {LABEL_AFFINE_ATOL_MM} mm); label "
            f"{matrix_text(header.affine)}, image {matrix_text(image.affine)}: pair the "
            "right files or resample the labels onto the image grid"
        )


def read_label(opened: OpenedImage) -> np.ndarray:
    """The label map's integer values, compacted (see the module docstring)."""
    header = opened.header
    raw = read_voxels(opened)
    with np.errstate(over="ignore", invalid="ignore"):
        if header.scl_slope is not None and (header.scl_slope != 1 or header.scl_inter != 0):
            raw = raw * header.scl_slope + header.scl_inter
    return _integer_labels(header.path, raw)


def _integer_labels(path: Path, raw: np.ndarray) -> np.ndarray:
    info = np.iinfo(np.int32)
    if raw.dtype.kind in "ui":
        if raw.size and (int(raw.min()) < info.min or int(raw.max()) > info.max):
            raise InputError(
                f"label map {path} has values outside the int32 range "
                f"({raw.min()} .. {raw.max()}); renumber the labels"
            )
        return _compact_labels(raw)
    bad = ~np.isfinite(raw) | (raw != np.round(raw))
    if np.any(bad):
        example = raw[bad].flat[0]
        raise InputError(
            f"label map {path} holds {int(np.count_nonzero(bad))} non-integer value(s) "
            f"(e.g. {example!r}, dtype {raw.dtype}); a label map must hold integer class "
            "ids: if it was resampled with linear interpolation, resample it again with "
            "nearest neighbour"
        )
    if raw.size and (raw.min() < info.min or raw.max() > info.max):
        raise InputError(
            f"label map {path} has values outside the int32 range "
            f"({raw.min()} .. {raw.max()}); renumber the labels"
        )
    return _compact_labels(raw)


def _compact_labels(raw: np.ndarray) -> np.ndarray:
    """Integer labels as int16 when every value fits (the cache's label type), else
    int32; C order, so that later stages walk them as they walk the image."""
    return raw.astype(smallest_label_dtype(raw), order="C")
