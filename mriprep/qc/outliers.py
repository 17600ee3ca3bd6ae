"""Robust-z outlier flags: which subject stands apart from its cohort on a metric.

The robust z of a value is its distance from the cohort's median in units of the
median absolute deviation scaled by 1.4826 (the standard deviation of a normal sample),
Iglewicz and Hoaglin's modified z. Where more than half of the cohort shares one value
(a count such as masked slices, zero for most subjects) the MAD is 0 and the mean
absolute deviation scaled by 1.2533 stands in, as is usual for this statistic; a metric
on which every subject agrees flags nobody.

A z alone measures a difference against the cohort's spread, and a cohort that agrees
closely (a registration overlap of 1.0000 against 0.9999) turns a difference nobody
cares about into a z of -8. So each metric declares, with its stage
(:class:`~mriprep.stages.qc_declaration.QCMetric`), its **minimum effect**: the smallest
difference from the cohort's median that matters, in the metric's unit. A value is
flagged when its |robust z| exceeds :data:`OUTLIER_Z` **and** it lies at least the
minimum effect from the median. The spread is never taken as smaller than the minimum
effect over :data:`OUTLIER_Z` (:func:`spread_floor`): where that floor holds, a z above
the threshold means a difference above the minimum effect, and the z shown is not
inflated by a cohort of near-copies. A value **at one of its metric's declared bounds**
on its good side (an overlap of exactly 1, no filled voxel) is never flagged for sitting
there; one at its worst (an overlap of 0) is judged as any other.

:data:`OUTLIER_Z` is 3.5, Iglewicz and Hoaglin's recommendation, with its measured
distribution where it is defined. The flags point a person at a scan; the report's
pictures show why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from mriprep.qc.measures import OWN
from mriprep.stages.qc_declaration import QCMetric

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
# A value this close to a declared bound (relative to the bound, or absolute near 0)
# sits at it: an overlap computed as 0.9999999999 is 1.
_AT_BOUND = 1e-9


@dataclass(frozen=True)
class Rule:
    """How one metric is judged: ``side`` (+1 only high values, -1 only low ones, 0
    both), the smallest difference from the median that matters (``min_effect``, in the
    metric's unit; 0: any difference a z finds) and the values it cannot pass
    (``bounds``, low and high, None where open)."""

    side: int = 0
    min_effect: float = 0.0
    bounds: tuple[float | None, float | None] = (None, None)
    better: str = "-"

    @classmethod
    def of(cls, metric: QCMetric) -> "Rule":
        """The rule a metric's declaration gives (judged ``"none"``: not a rule; the
        caller leaves the metric out)."""
        return cls(_SIDES.get(metric.judge, 0), metric.min_effect or 0.0,
                   metric.bounds or (None, None), metric.better)

    @property
    def floor(self) -> float:
        return spread_floor(self.min_effect)

    def at_bound(self, value: float) -> bool:
        """Whether ``value`` sits at its metric's best possible value: the upper bound
        of a metric where higher is better (an overlap of 1), the lower bound of one
        where lower is better (no filled voxel). The worst bound (an overlap of 0) is
        no such excuse, nor a bound of a metric with no better side."""
        low, high = self.bounds
        best = high if self.better == "higher" else low if self.better == "lower" else None
        return best is not None and abs(value - best) <= _AT_BOUND * max(1.0, abs(best))


@dataclass(frozen=True)
class Outlier:
    """One flagged value: who, which metric, the value, its robust z, the cohort's
    median, and the metric's minimum effect."""

    name: str
    metric: str
    value: float
    z: float
    median: float
    cohort: int
    min_effect: float = 0.0

    def describe(self) -> str:
        side = "above" if self.z > 0 else "below"
        effect = (f"; {abs(self.value - self.median):.3g} from it, at least "
                  f"{self.min_effect:.3g} matters" if self.min_effect > 0 else "")
        return (f"{self.metric} = {self.value:.4g} is far {side} the cohort's median "
                f"{self.median:.4g} (robust z {self.z:+.1f}, |z| > {OUTLIER_Z:g}{effect}; "
                f"{self.cohort} subjects)")


def spread_floor(min_effect: float, threshold: float = OUTLIER_Z) -> float:
    """The smallest spread a metric's robust z divides by: its minimum effect over the
    z threshold, so that where a cohort agrees more closely than that, a z above the
    threshold is a difference above the minimum effect."""
    return max(float(min_effect), 0.0) / threshold


def robust_z(values: np.ndarray, floor: float = 0.0) -> tuple[np.ndarray, float]:
    """The robust z of each finite value (NaN elsewhere) and the median; the spread is
    never taken below ``floor`` (see :func:`spread_floor`)."""
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
    scale = max(scale, floor)
    if scale == 0.0:
        z[finite] = 0.0
    else:
        z[finite] = (values[finite] - median) / scale
    return z, median


def find_outliers(metrics: Mapping[str, Mapping[str, float]],
                  threshold: float = OUTLIER_Z,
                  rules: Mapping[str, Rule] | None = None) -> list[Outlier]:
    """Every (subject, metric) with |robust z| above ``threshold``, at least its rule's
    minimum effect from the median, on its rule's side and not at one of its bounds.

    ``metrics`` maps a subject's name to its metrics. A metric is judged over the
    subjects that have a finite value of it, when they are at least :data:`MIN_COHORT`.
    ``rules`` maps a metric to its :class:`Rule`; a metric without one is judged on both
    sides with no minimum effect and no bounds.
    """
    rules = rules or {}
    names = sorted(metrics)
    keys = sorted({k for m in metrics.values() for k in m})
    found = []
    for key in keys:
        rule = rules.get(key, Rule())
        values = np.array([_number(metrics[n].get(key)) for n in names])
        cohort = int(np.isfinite(values).sum())
        if cohort < MIN_COHORT:
            continue
        z, median = robust_z(values, rule.floor)
        for name, value, score in zip(names, values, z):
            if (np.isfinite(score) and abs(score) > threshold and score * rule.side >= 0
                    and abs(value - median) >= rule.min_effect
                    and not rule.at_bound(float(value))):
                found.append(Outlier(name, key, float(value), float(score), median, cohort,
                                     rule.min_effect))
    return found


def judged(metrics: Mapping[str, float], declared: Mapping[str, QCMetric]) -> dict[str, float]:
    """The metrics of one subject that the cohort judges (``declared``: name -> its
    declaration; a name it lacks is judged both ways)."""
    return {k: v for k, v in metrics.items()
            if k not in declared or declared[k].judge != "none"}


def cohort_rules(declared: Mapping[str, QCMetric] | None = None) -> dict[str, Rule]:
    """Name -> :class:`Rule` of every declared measure: the QC's own, completed (and
    overridden) by ``declared``."""
    return {name: Rule.of(metric) for name, metric in {**OWN, **(declared or {})}.items()}


def cohort_flags(metrics: Mapping[str, Mapping[str, float]],
                 declared: Mapping[str, QCMetric] | None = None) -> list[Outlier]:
    """The report's and the check's flags: judged metrics, each by its declared rule.

    ``declared`` maps a metric to its declaration (``mriprep.qc.measures.declared_metrics``
    of the subjects' ``qc.json`` documents, completed by ``with_stage_declarations``); the
    QC's own metrics are known without it."""
    declared = {**OWN, **(declared or {})}
    return find_outliers({name: judged(m, declared) for name, m in metrics.items()},
                         rules=cohort_rules(declared))


def cohort_scores(values, metric: QCMetric | None) -> tuple[np.ndarray, float]:
    """Robust z of each value and the median, as the flags of ``metric`` compute them
    (its spread floor), for a report to show each subject's place in the cohort."""
    rule = Rule.of(metric) if metric is not None else Rule()
    return robust_z(values, rule.floor)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
