"""Robust intensity statistics and foreground masks shared by the stages.

Kept apart from any one stage so that sanitize, mask_slices and normalize agree on what
the foreground of a scan is.
"""

from __future__ import annotations

import numpy as np


def robust_threshold(values: np.ndarray) -> float:
    """Foreground threshold of a set of intensities: 10% up the 2-98 percentile range.

    The rule FSL's BET uses to separate head from background; robust to the few bright
    or dark outliers a raw scan contains.
    """
    if values.size == 0:
        return 0.0
    p2, p98 = np.percentile(values.astype(np.float64), [2.0, 98.0])
    return float(p2 + 0.1 * (p98 - p2))


def foreground_mask(data: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Voxels that are usable and brighter than :func:`robust_threshold` of usable voxels.

    Parameters
    ----------
    data : ndarray
        Intensities; values outside ``usable`` are ignored (they may be NaN).
    usable : ndarray of bool
        Which voxels may be looked at (finite, not replaced, valid).

    Returns
    -------
    ndarray of bool
        The foreground, a subset of ``usable``; empty when nothing is usable.
    """
    foreground = np.zeros(data.shape, dtype=bool)
    values = data[usable]
    if values.size:
        foreground[usable] = values > robust_threshold(values)
    return foreground
