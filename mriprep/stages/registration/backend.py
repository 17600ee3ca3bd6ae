"""What a registration backend receives and returns.

A backend is a function ``(fixed, moving, shape_fixed, initial_lps, centre_lps, params,
finest_moving) -> BackendResult``: ``fixed`` and ``moving`` are the template's and the
subject's pyramid levels (coarse to fine, same spacings), ``shape_fixed`` the template's
levels with the metric mask of the fit's affine part (the brain's interior),
``initial_lps`` the starting template-to-subject 4x4 and ``centre_lps`` the rotation
centre, both in LPS, ``params`` the stage's
:class:`~mriprep.stages.register.RegisterParams`, and ``finest_moving`` a function that
gives the finest moving level from the coarser levels' fit (LPS), for a backend that
fits level by level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class BackendResult:
    """The transform a backend found (LPS, template to subject) and how it got there."""

    transform_lps: np.ndarray
    metric_value: float
    stop_condition: str
    iterations: list[int]
    details: dict[str, Any] = field(default_factory=dict)

