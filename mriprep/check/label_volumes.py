"""Structure volumes against the cohort's (``label-volume``, ``label-structure-missing``).

A label map whose hippocampus is twice the size of everyone else's, or which has no
cerebellum, teaches a network a wrong anatomy as faithfully as a right one. Each map's
structures are judged against the other maps of the cohort, after the table's rules
(the classes training will see, :func:`mriprep.check.label_table.class_counts`):

* **Volume.** A structure's volume as a share of the map's labelled volume (every class
  but background: the brain and its ventricles, most of the intracranial volume, so
  that a big head is not a big hippocampus). Shares are compared in log space, so that
  twice and half are equally far: the robust z of a map's log share is its distance
  from the median of the cohort's other maps, in units of their spread (1.4826 MADs;
  the map itself left out, so that in a small cohort a grown structure does not widen
  the spread it is judged by; above :data:`LEAVE_ONE_OUT_UP_TO` maps the whole cohort,
  which one map hardly moves), never less than a floor: :data:`SPREAD_FLOOR` for a
  structure, :data:`PARCEL_SPREAD_FLOOR` for a cortical parcel (FreeSurfer's ``ctx-``
  names), whose borders vary more between people and between runs. A structure is
  flagged beyond :data:`VOLUME_Z`. The floor
  is why a small cohort, or one of near-identical people (copies of one template, one
  person scanned ten times), does not flag a 10% difference: with it, no structure
  within ``exp(VOLUME_Z * SPREAD_FLOOR)`` (1.42x) of the median share and no parcel
  within 2.0x is ever flagged, and structures that vary a lot between healthy people
  (the ventricles) are judged on their own, wider spread.
* **Missing.** A structure with no voxel in this map that at least
  :data:`PRESENT_SHARE` of the cohort's other maps hold, with a median volume of at
  least :data:`MISSING_MIN_MM3` (a missing cerebellum, a cut field of view; small
  structures that automatic segmentations often leave out, such as vessels, are not
  expected).

Both judge a map against at least :data:`MIN_OTHERS` other label maps of the same
table: a smaller cohort says too little, and the check's summary says the volumes were
not judged. Measured on clean maps against planted defects in ``make bench`` (labels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from mriprep.qc.outliers import OUTLIER_Z

# The least a log share's spread is taken to be (a log spread is about the coefficient
# of variation): healthy adults' structure volumes, relative to their intracranial
# volume, vary by about 10% for the least variable structures (thalamus, white matter,
# cortex as a whole) and more for the rest; cortical parcels, whose borders an
# automatic parcellation places, by about 20% for the small ones. A cohort that varies
# less (synthetic or repeated people), or too few maps to see the spread, is not allowed
# to make a z out of nothing.
SPREAD_FLOOR = 0.10
PARCEL_SPREAD_FLOOR = 0.20
PARCEL_PREFIX = "ctx"
VOLUME_Z = OUTLIER_Z
MIN_OTHERS = 5
PRESENT_SHARE = 0.8
MISSING_MIN_MM3 = 500.0
SHOWN = 6  # structures named per finding (the report's JSON has them all)
LEAVE_ONE_OUT_UP_TO = 100
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class VolumeFlag:
    """One structure of one map, out of the cohort's range."""

    structure: str
    volume_mm3: float
    ratio: float   # its share of the labelled volume over the cohort's median share
    z: float

    def describe(self) -> str:
        return (f"{self.structure} {self.volume_mm3:.0f} mm^3, {self.ratio:.2f}x the "
                f"cohort's median share (robust z {self.z:+.1f})")


@dataclass(frozen=True)
class Missing:
    """One structure the cohort holds and this map does not."""

    structure: str
    present_in: int     # other maps that hold it
    others: int         # other maps judged
    median_mm3: float

    def describe(self) -> str:
        return (f"{self.structure} (in {self.present_in} of the {self.others} other maps, "
                f"median {self.median_mm3:.0f} mm^3)")


@dataclass
class VolumeJudgement:
    """The cohort's volumes judged: per map key, its flags and its missing structures."""

    maps: int
    judged: bool
    flags: dict[str, list[VolumeFlag]]
    missing: dict[str, list[Missing]]
    largest_z: dict[str, float]  # structure -> largest |z| over the maps (for the bench)

    def summary(self) -> dict:
        return {"maps": self.maps, "judged": self.judged, "min_maps": MIN_OTHERS + 1,
                "z": VOLUME_Z, "spread_floor": SPREAD_FLOOR,
                "parcel_spread_floor": PARCEL_SPREAD_FLOOR,
                "flagged_maps": sum(1 for f in self.flags.values() if f),
                "maps_missing_structures": sum(1 for m in self.missing.values() if m)}


def judge_volumes(volumes_mm3: Mapping[str, np.ndarray],
                  names: Sequence[str]) -> VolumeJudgement:
    """Judge each map's structure volumes against the others' (module docstring).

    ``volumes_mm3`` maps a label map's key to its volume per class (class 0, the
    background, first; every map of one table, so the same classes); ``names`` are the
    classes' names."""
    keys = sorted(volumes_mm3)
    flags: dict[str, list[VolumeFlag]] = {k: [] for k in keys}
    missing: dict[str, list[Missing]] = {k: [] for k in keys}
    if len(keys) <= MIN_OTHERS:
        return VolumeJudgement(len(keys), False, flags, missing, {})
    volumes = np.stack([np.asarray(volumes_mm3[k], dtype=np.float64) for k in keys])
    labelled = volumes[:, 1:].sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_share = np.log(volumes / np.where(labelled > 0, labelled, np.nan))
    largest: dict[str, float] = {}
    for c in range(1, volumes.shape[1]):
        present = volumes[:, c] > 0
        if present.sum() > MIN_OTHERS:
            z, median = _robust_z_of_each(log_share[present, c], spread_floor(names[c]))
            largest[names[c]] = float(np.max(np.abs(z)))
            for row, score, centre in zip(np.flatnonzero(present), z, median):
                if abs(score) > VOLUME_Z:
                    flags[keys[row]].append(VolumeFlag(
                        names[c], float(volumes[row, c]),
                        float(math.exp(log_share[row, c] - centre)), float(score)))
        # A map without the structure: every map that holds it is one of its others.
        held = volumes[present, c]
        others = len(keys) - 1
        if (held.size and held.size >= PRESENT_SHARE * others
                and np.median(held) >= MISSING_MIN_MM3):
            for row in np.flatnonzero(~present):
                missing[keys[row]].append(
                    Missing(names[c], int(held.size), others, float(np.median(held))))
    for found in flags.values():
        found.sort(key=lambda f: -abs(f.z))
    return VolumeJudgement(len(keys), True, flags, missing, largest)


def spread_floor(name: str) -> float:
    """The least spread of a structure's log share (:data:`SPREAD_FLOOR`, or
    :data:`PARCEL_SPREAD_FLOOR` for a cortical parcel: ``ctx-lh-*``, ``ctx_rh_*``)."""
    return PARCEL_SPREAD_FLOOR if name.startswith(PARCEL_PREFIX) else SPREAD_FLOOR


def _robust_z_of_each(values: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Each value's robust z against the others (leave one out), and their medians.

    Leaving one out costs n medians of n - 1 values; from :data:`LEAVE_ONE_OUT_UP_TO`
    maps on, one map moves the cohort's median and spread by about 1/n of a spread, and
    the whole cohort stands in for each map's others."""
    n = values.size
    if n > LEAVE_ONE_OUT_UP_TO:
        median = float(np.median(values))
        spread = _MAD_TO_SIGMA * float(np.median(np.abs(values - median)))
        return (values - median) / max(spread, floor), np.full(n, median)
    others = np.broadcast_to(values, (n, n))[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    median = np.median(others, axis=1)
    spread = _MAD_TO_SIGMA * np.median(np.abs(others - median[:, None]), axis=1)
    return (values - median) / np.maximum(spread, floor), median


def listed(items: Sequence, shown: int = SHOWN) -> str:
    """The first ``shown`` items described, and how many more."""
    text = "; ".join(item.describe() for item in items[:shown])
    more = len(items) - shown
    return text + (f"; and {more} more" if more > 0 else "")
