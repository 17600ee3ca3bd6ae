"""What a stage tells the QC report and the demo's referee about itself.

A stage declares, when it registers (``@stage(..., qc=StageQC(...))``):

* the **measures** the QC report shows (:class:`QCMetric`: the report's name, the key of
  the stage's metrics it reads, a label, a unit, which way is better and how the
  cohort's outlier flags judge it);
* the **causes** of the invalid voxels it marks (:class:`InvalidCause`), which the QC
  pictures colour, and, when it marks voxels for more than one cause, where each lies
  (``locate_causes``);
* **readings**: named roles of its metrics (:data:`FILLED_COUNTS`,
  :data:`FLAGGED_SLICES`, :data:`TEMPLATE_TO_SUBJECT`, :data:`REFUSAL_CAUSES`), which a
  reader that must compare a stage's result with a known truth (the demo's referee)
  asks for by role, never by the stage's name.

:mod:`mriprep.qc` and :mod:`mriprep.demo` read these declarations and name no stage, so a
new stage shows in the report with nothing edited there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

# How the cohort's outlier flags judge a measure: on both sides of the median, only when
# it is high (a count of repairs: fewer than the cohort is never a problem), only when
# low, or not at all (a property of the person or the input, not of the scan's quality).
JUDGES = ("both", "high", "low", "none")

# Roles of a stage's metrics, for :func:`mriprep.stages.declared_reading`.
FILLED_COUNTS = "filled_counts"  # {"nan": n, "posinf": n, "neginf": n, "extreme": n}
FLAGGED_SLICES = "flagged_slices"  # {axis: [slice index, ...]} on the stage's grid
TEMPLATE_TO_SUBJECT = "template_to_subject"  # 4x4 nested list (RAS+), or None
REFUSAL_CAUSES = "refusal_causes"  # the causes a refusal of the stage names: [str, ...]


@dataclass(frozen=True)
class QCMetric:
    """One measure the QC report shows for every subject.

    ``name`` is the report's (and ``qc.json``'s) name of the measure, unique across
    stages; ``key`` the entry of the stage's metrics it reads (a number or a bool).
    ``fmt`` is a format spec (``".3f"``); empty: the report's general number format.
    ``column``: also a column of the index table and a panel of the cohort's plot.

    A judged measure declares how far from its cohort's median a value must lie to
    matter: ``min_effect``, in ``unit`` (a flag needs a robust z beyond the threshold
    *and* this difference; the z's spread is never taken below it over the threshold,
    see :mod:`mriprep.qc.outliers`), set from the spread of clean scans against the
    planted defects (``make bench``, report). ``bounds`` (low, high; None where open)
    are the values the measure cannot pass: a value at one is never flagged for sitting
    there. ``min_effect`` None: not declared (a ``qc.json`` written before it was, which
    :func:`mriprep.qc.measures.with_stage_declarations` completes); then any difference
    a z finds counts.
    """

    name: str
    label: str
    meaning: str
    key: str = ""
    unit: str = ""
    better: str = "-"
    judge: str = "both"
    column: bool = False
    fmt: str = ""
    min_effect: float | None = None
    bounds: tuple[float | None, float | None] | None = None

    def __post_init__(self) -> None:
        if self.judge not in JUDGES:
            raise ValueError(f"QCMetric {self.name!r}: judge {self.judge!r} is not one of "
                             f"{', '.join(JUDGES)}")
        if self.min_effect is not None and not (
                isinstance(self.min_effect, (int, float)) and self.min_effect >= 0):
            raise ValueError(f"QCMetric {self.name!r}: min_effect {self.min_effect!r} must "
                             "be a difference >= 0 in the metric's unit (0: any difference)")
        if self.bounds is not None:
            if len(self.bounds) != 2 or (None not in self.bounds
                                         and not self.bounds[0] < self.bounds[1]):
                raise ValueError(f"QCMetric {self.name!r}: bounds {self.bounds!r} must be "
                                 "(low, high) with low < high, None for an open side")
            object.__setattr__(self, "bounds", tuple(self.bounds))

    def to_json(self) -> dict[str, Any]:
        """What ``qc.json`` keeps of the declaration (the report and ``mriprep check``
        read it without importing the stage). A stage that declares no minimum effect
        is written as 0 (any difference a z finds, as it is judged): a ``qc.json`` that
        lacks the field was made before minimum effects were declared, and only that
        sends the reader to the stages."""
        return {"label": self.label, "meaning": self.meaning, "unit": self.unit,
                "better": self.better, "judge": self.judge, "column": self.column,
                "fmt": self.fmt,
                "min_effect": self.min_effect if self.min_effect is not None else 0.0,
                "bounds": list(self.bounds) if self.bounds is not None else None}

    @classmethod
    def from_json(cls, name: str, doc: Mapping[str, Any]) -> "QCMetric":
        judge = doc.get("judge")
        effect = doc.get("min_effect")
        bounds = doc.get("bounds")
        return cls(name=name, label=str(doc.get("label") or name),
                   meaning=str(doc.get("meaning") or ""), unit=str(doc.get("unit") or ""),
                   better=str(doc.get("better") or "-"),
                   judge=judge if judge in JUDGES else "both",
                   column=bool(doc.get("column")), fmt=str(doc.get("fmt") or ""),
                   min_effect=(float(effect) if isinstance(effect, (int, float))
                               and not isinstance(effect, bool) and effect >= 0 else None),
                   bounds=_bounds(bounds))


def _bounds(doc: Any) -> tuple[float | None, float | None] | None:
    """``bounds`` as ``qc.json`` keeps them ([low, high], null for an open side), or None
    when absent or not of that form."""
    if not isinstance(doc, (list, tuple)) or len(doc) != 2:
        return None
    if not all(b is None or (isinstance(b, (int, float)) and not isinstance(b, bool))
               for b in doc):
        return None
    low, high = (None if b is None else float(b) for b in doc)
    return None if low is not None and high is not None and low >= high else (low, high)


@dataclass(frozen=True)
class InvalidCause:
    """Why a voxel a stage marks invalid is invalid, as the QC pictures draw it.

    ``colour`` is an HTML colour and ``colour_name`` how people call it (the demo's
    summary says where to look). ``not_finite_input``: this cause covers the voxels
    that are not finite as read (NaN, Inf), and the input picture draws them so even
    when the subject failed before the stage ran.
    """

    name: str
    meaning: str
    colour: str
    colour_name: str
    not_finite_input: bool = False


# (the stage's metrics, the grid's shape) -> cause name -> where that cause lies (bool,
# the grid's shape): for a stage that marks voxels invalid for more than one cause. The
# QC colours the voxels the stage made invalid by it; any it does not place are drawn as
# "other invalid".
CauseLocator = Callable[[Mapping[str, Any], tuple[int, ...]], "dict[str, np.ndarray]"]
Reading = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class StageQC:
    """A stage's declaration to the QC report (see the module docstring)."""

    metrics: tuple[QCMetric, ...] = ()
    causes: tuple[InvalidCause, ...] = ()
    locate_causes: CauseLocator | None = None
    readings: Mapping[str, Reading] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.locate_causes is not None and len(self.causes) < 2:
            raise ValueError("StageQC: locate_causes tells causes apart; declare two or more")

    def measures(self, stage_metrics: Mapping[str, Any]) -> dict[str, float]:
        """The declared measures found in one record's metrics, as floats."""
        out = {}
        for metric in self.metrics:
            value = stage_metrics.get(metric.key or metric.name)
            if isinstance(value, (int, float)):  # bool too: 1.0 / 0.0
                out[metric.name] = float(value)
        return out

    def cause_codes(self, stage_metrics: Mapping[str, Any], newly: np.ndarray,
                    codes: Mapping[str, int], other: int) -> np.ndarray:
        """The cause code (``codes``: cause name -> code) of each voxel the stage made
        invalid (``newly``), 0 elsewhere; ``other`` when the stage declares no cause, or
        for a voxel its ``locate_causes`` places under none."""
        out = np.zeros(newly.shape, np.uint8)
        if not self.causes:
            out[newly] = other
            return out
        if self.locate_causes is None:
            out[newly] = codes[self.causes[0].name]
        else:
            out[newly] = other
            for name, where in self.locate_causes(stage_metrics, newly.shape).items():
                out[newly & where] = codes[name]
        return out
