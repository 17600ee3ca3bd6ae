"""Robust-z outlier flags: which subject stands apart from its cohort on a metric.

The robust z of a value is its distance from the cohort's median in units of the
median absolute deviation scaled by 1.4826 (the standard deviation of a normal sample),
Iglewicz and Hoaglin's modified z. Where more than half of the cohort shares one value
(a count such as masked slices, zero for most subjects) the MAD is 0 and the mean
absolute deviation scaled by 1.2533 stands in, as is usual for this statistic; a metric
on which every subject agrees flags nobody.

:data:`OUTLIER_Z` is 3.5, Iglewicz and Hoaglin's recommendation, with its measured
distribution where it is defined. The flags point a person at a scan; the report's
pictures show why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from mriprep.qc.measures import OWN, judges as own_judges

# Measured on the demo cohort (make bench, report; docs/benchmarks.md, "QC"; 2026-12-03):
# clean scans largest |z| 1.9 (5.1 on the good side of a count); planted defects that are
# image quality +3.8 to +8.7 on their measures. The registration similarity, judged on
# both sides, is tight across the cohort: it also flags the NaN-blob scan (-12.4) and a
# spike-slice scan whose fit is better than the cohort's (+5.4).
OUTLIER_Z = 3.5
# How each metric is judged is declared with it (QCMetric.judge: the QC's own in
# mriprep.qc.measures, a stage's in its declaration, carried in qc.json): a count of
# repairs only on its high side, a property of the person or the field of view (head
# size, a skull-stripped input) not at all.
_SIDES = {"both": 0, "high": 1, "low": -1}
# Below this many subjects with a value, a median and a MAD say too little to flag.
MIN_COHORT = 5
_MAD_TO_SIGMA = 1.4826
_MEAN_AD_TO_SIGMA = 1.2533


@dataclass(frozen=True)
class Outlier:
    """One flagged value: who, which metric, the value, its robust z and the cohort's
    median."""

    name: str
    metric: str
    value: float
    z: float
    median: float
    cohort: int

    def describe(self) -> str:
        side = "above" if self.z > 0 else "below"
        return (f"{self.metric} = {self.value:.4g} is far {side} the cohort's median "
                f"{self.median:.4g} (robust z {self.z:+.1f}, |z| > {OUTLIER_Z:g}, "
                f"{self.cohort} subjects)")


def robust_z(values: np.ndarray) -> tuple[np.ndarray, float]:
    """The robust z of each finite value (NaN elsewhere) and the median."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    z = np.full(values.shape, np.nan)
    if finite.sum() == 0:
        return z, math.nan
    median = float(np.median(values[finite]))
    deviation = np.abs(values[finite] - median)
    scale = _MAD_TO_SIGMA * float(np.median(deviation))
    if scale == 0.0:
        scale = _MEAN_AD_TO_SIGMA * float(np.mean(deviation))
    if scale == 0.0:
        z[finite] = 0.0
    else:
        z[finite] = (values[finite] - median) / scale
    return z, median


def find_outliers(metrics: Mapping[str, Mapping[str, float]],
                  threshold: float = OUTLIER_Z,
                  sides: Mapping[str, int] | None = None) -> list[Outlier]:
    """Every (subject, metric) with |robust z| above ``threshold``.

    ``metrics`` maps a subject's name to its metrics. A metric is judged over the
    subjects that have a finite value of it, when they are at least :data:`MIN_COHORT`.
    ``sides`` limits a metric to one side: +1 flags only high values (a count of
    problems, where fewer than the cohort is no problem), -1 only low ones.
    """
    sides = sides or {}
    names = sorted(metrics)
    keys = sorted({k for m in metrics.values() for k in m})
    found = []
    for key in keys:
        values = np.array([_number(metrics[n].get(key)) for n in names])
        cohort = int(np.isfinite(values).sum())
        if cohort < MIN_COHORT:
            continue
        z, median = robust_z(values)
        for name, value, score in zip(names, values, z):
            side = sides.get(key, 0)
            if np.isfinite(score) and abs(score) > threshold and score * side >= 0:
                found.append(Outlier(name, key, float(value), float(score), median, cohort))
    return found


def judged(metrics: Mapping[str, float], judges: Mapping[str, str]) -> dict[str, float]:
    """The metrics of one subject that the cohort judges (``judges``: name -> how, see
    :data:`mriprep.stages.qc_declaration.JUDGES`; a name it lacks is judged both ways)."""
    return {k: v for k, v in metrics.items() if judges.get(k, "both") != "none"}


def cohort_flags(metrics: Mapping[str, Mapping[str, float]],
                 judges: Mapping[str, str] | None = None) -> list[Outlier]:
    """The report's and the check's flags: judged metrics, each on its declared side.

    ``judges`` maps a metric to how it is judged (``mriprep.qc.measures.judges`` of the
    subjects' ``qc.json`` documents); the QC's own metrics are known without it."""
    judges = {**own_judges(OWN), **(judges or {})}
    sides = {name: _SIDES[how] for name, how in judges.items() if how in _SIDES}
    return find_outliers({name: judged(m, judges) for name, m in metrics.items()},
                         sides=sides)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
