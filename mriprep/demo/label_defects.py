"""Defects planted in FreeSurfer-numbered label maps, for the label checks' calibration
(``make bench`` labels, ``make test-calibration``): each returns a new map and leaves
its input as it was."""

from __future__ import annotations

from typing import Iterable

import numpy as np
from scipy import ndimage


def hemispheres_swapped(labels: np.ndarray) -> np.ndarray:
    """The left cortical parcels (1xxx) numbered as right ones (2xxx) and back."""
    out = labels.copy()
    out[(labels > 1000) & (labels < 2000)] += 1000
    out[labels > 2000] -= 1000
    return out


def values_swapped(labels: np.ndarray, a: int, b: int) -> np.ndarray:
    """Structure ``a`` labelled ``b`` and ``b`` labelled ``a``."""
    out = labels.copy()
    out[labels == a], out[labels == b] = b, a
    return out


def grown(labels: np.ndarray, value: int, factor: float = 2.0) -> np.ndarray:
    """Structure ``value`` grown into its labelled neighbours until it holds ``factor``
    times its voxels (its neighbours shrink by as much)."""
    region = labels == value
    if not region.any():
        raise ValueError(f"label value {value} is not in the map: nothing to grow")
    target = factor * region.sum()
    while region.sum() < target:
        region = ndimage.binary_dilation(region) & (labels > 0)
    out = labels.copy()
    out[region] = value
    return out


def removed(labels: np.ndarray, values: Iterable[int]) -> np.ndarray:
    """The map with ``values`` set to background (a structure the segmentation missed,
    or a field of view that cut it off)."""
    out = labels.copy()
    out[np.isin(labels, list(values))] = 0
    return out


def scattered(labels: np.ndarray, value: int, share: float,
              rng: np.random.Generator) -> np.ndarray:
    """Specks of structure ``value`` (2 x 2 x 1 voxels) written at random places of the
    labelled brain, ``share`` of its voxels in all (noise written as labels)."""
    voxels = int((labels == value).sum())
    if voxels == 0:
        raise ValueError(f"label value {value} is not in the map: nothing to scatter")
    brain = np.flatnonzero(labels > 0)
    out = labels.copy()
    limit = np.array(labels.shape) - 2
    for at in rng.choice(brain, max(1, round(share * voxels / 4)), replace=False):
        i, j, k = np.minimum(np.unravel_index(at, labels.shape), limit)
        out[i:i + 2, j:j + 2, k] = value
    return out


def blob_in_scalp(image: np.ndarray, labels: np.ndarray, side: int, value: int,
                  rng: np.random.Generator) -> np.ndarray:
    """A cube of ``side`` voxels labelled ``value``, centred in the head (what the image
    shows above its background) 12-18 voxels from the nearest label: in the scalp or the
    skull, off the brain."""
    faces = np.concatenate([np.moveaxis(image, a, 0)[[0, -1]].ravel() for a in range(3)])
    background = float(np.median(faces))
    head = image > background + 0.1 * (float(np.percentile(image, 99.5)) - background)
    away = ndimage.distance_transform_edt(labels == 0)
    candidates = np.argwhere(head & (away > 12) & (away < 18))
    if len(candidates) == 0:
        raise ValueError("no head 12-18 voxels from the labels: the image shows no scalp")
    centre = candidates[rng.integers(len(candidates))]
    low = np.maximum(centre - side // 2, 0)
    out = labels.copy()
    out[tuple(slice(a, a + side) for a in low)] = value
    return out
