"""The per-structure table of a subject page: each label value's voxels, its volume in
mm^3, and its share of the cohort's median volume of that structure. Pure: the report
(:mod:`mriprep.qc.report`) reads the counts (from the check's record, or the label map)
and hands them in.

The cohort median of a structure is taken over every labelled subject, a subject without
the structure counting 0: a structure most subjects lack has median 0 and no share. A
structure the cohort has (median above 0) but this subject lacks is listed with 0 voxels,
so that a missing cerebellum shows as a row, not as an absence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np


@dataclass(frozen=True)
class StructureRow:
    """One structure of a subject: ``share`` is its volume over the cohort median's
    (None where the median is 0)."""

    value: int
    name: str
    voxels: int
    mm3: float
    share: float | None

    @property
    def missing(self) -> bool:
        return self.voxels == 0


def label_counts(labels: np.ndarray) -> dict[int, int]:
    """Voxels per label value of a label map (values that occur only)."""
    flat = np.asarray(labels).ravel()
    if flat.size and flat.min() < 0:  # bincount takes no negative values
        values, counts = np.unique(flat, return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts)}
    counts = np.bincount(flat)
    return {int(v): int(counts[v]) for v in np.flatnonzero(counts)}


def volumes(counts: Mapping[int, int], voxel_mm3: float) -> dict[int, float]:
    """mm^3 per structure (background 0 left out)."""
    return {int(v): c * voxel_mm3 for v, c in counts.items() if int(v) != 0}


def cohort_medians(cohort: Iterable[Mapping[int, float]]) -> dict[int, float]:
    """The median volume of each structure over the subjects, 0 for a subject without it."""
    cohort = list(cohort)
    values = sorted({v for subject in cohort for v in subject})
    return {v: float(np.median([subject.get(v, 0.0) for subject in cohort]))
            for v in values}


def structure_rows(counts: Mapping[int, int], voxel_mm3: float,
                   medians: Mapping[int, float],
                   names: Mapping[int, str]) -> list[StructureRow]:
    """The table of one subject, by label value: its structures, and those the cohort
    has (median > 0) that it lacks (0 voxels). ``names`` names values (from the label
    table); a value it does not name is shown as ``label <value>``."""
    own = {int(v): int(c) for v, c in counts.items() if int(v) != 0 and c > 0}
    lacking = {v for v, m in medians.items() if m > 0 and v not in own and v != 0}
    rows = []
    for value in sorted(set(own) | lacking):
        voxels = own.get(value, 0)
        mm3 = voxels * voxel_mm3
        median = medians.get(value, 0.0)
        share = mm3 / median if median > 0 and math.isfinite(median) else None
        rows.append(StructureRow(value, names.get(value, f"label {value}"), voxels, mm3,
                                 share))
    return rows
