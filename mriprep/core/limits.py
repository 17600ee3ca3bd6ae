"""Numeric limits of the cache's dtypes, defined once.

A float16 cache (and any tensor fed to a network under AMP autocast) overflows to Inf
beyond :data:`FLOAT16_MAX`; the sanitize stage fills such values, validate refuses them
and ``mriprep check`` reports them. Label maps are cached as int16.
"""

from __future__ import annotations

import numpy as np

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
INT16 = np.iinfo(np.int16)
UINT8_MAX = int(np.iinfo(np.uint8).max)  # 255: FastSurfer's conformed intensity range


def smallest_label_dtype(values: np.ndarray) -> type:
    """int16 when every label value fits (the cache's label type), else int32."""
    fits = values.size == 0 or (values.min() >= INT16.min and values.max() <= INT16.max)
    return np.int16 if fits else np.int32
