"""Numeric limits of the cache's dtypes, defined once.

A float16 cache (and any tensor fed to a network under AMP autocast) overflows to Inf
beyond :data:`FLOAT16_MAX`; the sanitize stage fills such values, validate refuses them
and ``mriprep check`` reports them. Label maps are cached as int16.

:data:`CAST_LIMITS` holds, for each dtype a network may train in, what ``mriprep check
--dtype`` proves of every cached image before the cast: no finite value beyond ``max``
(it overflows to Inf), few nonzero values below ``tiny`` (they become subnormal or zero)
and, for integer images, no value beyond ``exact_int`` (larger integers are rounded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
FLOAT16_TINY = float(np.finfo(np.float16).tiny)  # 6.104e-05: the smallest normal float16
# numpy has no bfloat16: these are torch.finfo(torch.bfloat16).max and .tiny, i.e.
# (2 - 2**-7) * 2**127 and 2**-126 (8 exponent bits as float32, 7 fraction bits).
BFLOAT16_MAX = 3.3895313892515355e38
BFLOAT16_TINY = 1.1754943508222875e-38


@dataclass(frozen=True)
class CastLimits:
    """What casting an image to the training dtype ``name`` can lose.

    ``max``: finite values of larger magnitude overflow to Inf (finfo's max, the limit
    the sanitize and validate stages use too); ``tiny``: the smallest normal number,
    below which nonzero values lose precision or flush to zero; ``exact_int``: the
    largest integer magnitude the dtype holds exactly (2**(fraction bits + 1)). ``None``
    everywhere means no cast check (float32: the cache's own image dtype).
    """

    name: str
    max: float | None = None
    tiny: float | None = None
    exact_int: int | None = None

    @property
    def checked(self) -> bool:
        return self.max is not None


CAST_LIMITS: dict[str, CastLimits] = {
    "float16": CastLimits("float16", FLOAT16_MAX, FLOAT16_TINY, 2**11),
    "bfloat16": CastLimits("bfloat16", BFLOAT16_MAX, BFLOAT16_TINY, 2**8),
    "float32": CastLimits("float32"),
}


def cast_limits(dtype: Any) -> CastLimits:
    """The :class:`CastLimits` of a training dtype given by name (``"float16"``,
    ``"bfloat16"``, ``"float32"``), numpy name or alias (``"half"``, ``"f2"``,
    ``np.float16``), torch dtype or its name (``torch.bfloat16``, ``"torch.float16"``).

    Raises
    ------
    ValueError
        For any other value, naming it and the choices.
    """
    if isinstance(dtype, CastLimits):
        return dtype
    text = dtype if isinstance(dtype, str) else str(dtype)
    name = text.strip().lower().removeprefix("torch.")
    if name not in CAST_LIMITS and not type(dtype).__module__.startswith("torch"):
        try:
            name = np.dtype(dtype).name
        except (TypeError, ValueError):
            pass
    if name not in CAST_LIMITS:
        raise ValueError(
            f"unknown training dtype {dtype!r}: choose one of {', '.join(CAST_LIMITS)}"
        )
    return CAST_LIMITS[name]
INT16 = np.iinfo(np.int16)
UINT8_MAX = int(np.iinfo(np.uint8).max)  # 255: FastSurfer's conformed intensity range


def smallest_label_dtype(values: np.ndarray) -> type:
    """int16 when every label value fits (the cache's label type), else int32."""
    fits = values.size == 0 or (values.min() >= INT16.min and values.max() <= INT16.max)
    return np.int16 if fits else np.int32
