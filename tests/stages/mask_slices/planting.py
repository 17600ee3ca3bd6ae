"""Defects planted in the test heads, and what the mask_slices stage reports about them.

:func:`plant` changes one slice, ``ARTIFACTS`` names the changes (with the category the
stage should report), :func:`flagged_slices` reads the stage's findings per axis,
:func:`slices_valid` which slices stayed valid and :func:`head_rows` which hold head.
"""

from __future__ import annotations

import numpy as np

from mriprep.core.volume import Volume


def flagged_slices(volume: Volume) -> dict[int, dict]:
    """Per axis: {"incomplete": {index: kind}, "artifact": {index: scores}}."""
    metrics = volume.record_of("mask_slices").metrics
    return {
        axis: {
            "incomplete": {int(i): k for i, k in metrics[f"axis_{axis}"]["incomplete"].items()},
            "artifact": {int(i): s for i, s in metrics[f"axis_{axis}"]["artifact"].items()},
        }
        for axis in range(3)
    }


def plant(volume: Volume, axis: int, index: int, change) -> Volume:
    data = volume.data.copy()
    view = np.moveaxis(data, axis, 0)
    view[index] = change(view[index])
    return volume.replace(data=data)


def slices_valid(volume: Volume, axis: int) -> np.ndarray:
    """Per slice along ``axis``: is every voxel valid?"""
    return np.moveaxis(volume.valid, axis, 0).all(axis=(1, 2))


ARTIFACTS = {
    "spike": (lambda s: s * np.float32(4.0), "artifact"),
    "dropout": (lambda s: s * np.float32(0.5), "artifact"),
    "zero": (lambda s: np.zeros_like(s), "zero"),
    "constant": (lambda s: np.full_like(s, 37.0), "constant"),
    "half_zero": (lambda s: np.where(np.arange(s.shape[0])[:, None] < s.shape[0] // 2, 0, s),
                  "zero"),
    # In-plane motion: the slice is anatomy, with the right intensities, in the wrong place.
    "motion": (lambda s: np.roll(s, (8, 5), axis=(0, 1)), "artifact"),
}


def head_rows(volume: Volume, axis: int) -> np.ndarray:
    """Indices along ``axis`` of the slices that hold head (signal well above noise)."""
    head = volume.data > 0.2 * np.percentile(volume.data, 99)
    return np.flatnonzero(np.moveaxis(head, axis, 0).any(axis=(1, 2)))
