"""What a registration backend receives and returns.

A backend is a function ``(fixed, moving, shape_fixed, initial_lps, centre_lps, params)
-> BackendResult``: ``fixed`` and ``moving`` are the template's and the subject's pyramid
levels (coarse to fine, same spacings), ``shape_fixed`` the template's finest level with
the metric mask of the fit's affine part (the brain's interior), ``initial_lps`` the
starting template-to-subject 4x4 and ``centre_lps`` the rotation centre, both in LPS,
and ``params`` the stage's :class:`~mriprep.stages.register.RegisterParams`.
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


def pose_levels(n_levels: int) -> range:
    """The levels (indices, coarse to fine) the rigid pose is fitted on: every one, the
    finest included, before the affine part starts there.

    Without the rigid pass on the finest level, registration was 1.3-1.5 s a scan faster
    and as consistent on the calibration set, but a demo scan (0.9x0.9x5 mm coronal,
    flipped storage, a dropout slice) whose coarse rigid pass does not converge landed
    3.7 mm from its truth (1.4 mm with it).
    """
    return range(n_levels)
