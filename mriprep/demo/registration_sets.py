"""The registration's tuning set and its frozen held-out set, as data.

Three times a calibration of this project turned out to be a fit to its own data (copies
of the template; one person; its own bench). So every registration constant is tuned on
one set and judged on another that no constant is ever tuned on:

* the **tuning set**: the calibration set and its population
  (:func:`~mriprep.demo.calibration.calibration_cases`,
  :func:`~mriprep.demo.population.population_cases`), and the combinations of
  ``registration_sets/tuning.csv``;
* the **held-out set**: ``registration_sets/heldout.csv``. Other people (synthetic people
  of seeds 80001-80003, whom nothing else builds, and ROBEX's head, in every class) and
  other combinations of the real heads the tuning set also holds (Colin27, S1), other
  poses, other voxel orders and other noise.

Both files are manifests, one row a scan, rebuilt bit for bit from the row: the same
bytes of every source scan (:mod:`mriprep.demo.real_scans`), the same seeds. Columns:

``case``
    The scan's name, unique; its noise and defects are drawn from it.
``class``
    What it varies (the bench reports consistency per class): ``reference`` (the
    person's reference scan, 1 mm), ``poses`` (orientations, voxel orders, thick and
    oblique grids), ``defects`` (NaN, zero, spike and dropout slices on thick or oblique
    grids), ``defaced``, ``lesions``, ``stripped``, ``coarse`` (2-3 mm, 8-bit integers),
    ``head_size``.
``person``
    Whose anatomy: consistency compares the scan with this person's ``reference`` row
    through the known motion between them. A skull-stripped copy is the same person.
``source``
    The anatomy scanned: a real scan's name (``colin27``, ``colin27_brain``, ``s1``,
    ``robex``, ``robex_brain``) or ``person-<seed>``, optionally resized by
    ``@<scale>`` or ``@<sx>x<sy>x<sz>`` (another head size is another person).
``acquisition``
    A key of :data:`ACQUISITIONS`.
``pose``
    A seed (the pose is drawn up to 15 degrees and 15 mm about each axis) or six numbers,
    ``rx ry rz tx ty tz`` (degrees about x, y, z, then mm).
``variations``
    Applied in order after the acquisition, ``+``-separated: a key of
    :data:`VARIATIONS`, with keyword arguments in brackets (``defects(nan=3,zero=2)``).

Changing a row changes the set: the held-out file is frozen, and a change to it is a
change of the benchmark, to be said so, never a tuning step.
"""

from __future__ import annotations

import csv
import functools
import re
import zlib
from dataclasses import dataclass
from importlib import resources
from typing import Callable

import numpy as np

from mriprep.demo import population as pop
from mriprep.demo.anatomy import Anatomy
from mriprep.demo.calibration import (
    ACQUISITIONS as CALIBRATION_ACQUISITIONS,
    MAX_POSE_ROTATION_DEG,
    MAX_POSE_TRANSLATION_MM,
    Case,
    person,
    real_head,
)
from mriprep.demo.real_scans import REAL_SCANS, real_scan
from mriprep.demo.scanner import Acquisition, Scan, acquire, random_pose
from mriprep.stages.registration.geometry import rigid_matrix

# Voxel orders: (flip i, flip j, flip k) of each slicing's stored axes.
_LIA = (True, True, False)  # coronal: FreeSurfer's conformed order
_PIR = (True, True, False)  # sagittal
_LPS = (True, True, False)  # axial: DICOM's order

ACQUISITIONS: dict[str, Acquisition] = {
    **CALIBRATION_ACQUISITIONS,
    "1mm_lia": Acquisition((1.0, 1.0, 1.0), "coronal", flips=_LIA),
    "1mm_pir": Acquisition((1.0, 1.0, 1.0), "sagittal", flips=_PIR),
    "1mm_lps_tilt10": Acquisition((1.0, 1.0, 1.0), "axial", tilt_deg=10.0, flips=_LPS),
    "ax3": Acquisition((1.0, 1.0, 3.0), "axial"),
    "ax3_lps": Acquisition((1.0, 1.0, 3.0), "axial", flips=_LPS),
    "ax4_tilt15": Acquisition((1.0, 1.0, 4.0), "axial", tilt_deg=15.0),
    "cor3_tilt15_lia": Acquisition((1.0, 1.0, 3.0), "coronal", tilt_deg=15.0, flips=_LIA),
    "sag3_pir": Acquisition((1.0, 1.0, 3.0), "sagittal", flips=_PIR),
    "cor2x2x3": Acquisition((2.0, 2.0, 3.0), "coronal"),
    "ax2x2x3_lps": Acquisition((2.0, 2.0, 3.0), "axial", flips=_LPS),
    "sag3x3x3": Acquisition((3.0, 3.0, 3.0), "sagittal"),
    "cor3x3x3_tilt10": Acquisition((3.0, 3.0, 3.0), "coronal", tilt_deg=10.0),
}

# What a ``variations`` item names, and the function that applies it.
VARIATIONS: dict[str, Callable[..., Scan]] = {
    "defects": pop.slice_defects,
    "defaced": pop.defaced,
    "lesions": pop.with_lesions,
    "ring": pop.with_bright_ring,
    "int16": pop.int16_scaled,
    "stripped": pop.skull_stripped,
    "bias": pop.with_bias,
    "mp2rage": pop.mp2rage_background,
    "ghost": pop.ghosted,
    "clipped": pop.clipped,
}
# Those that draw random numbers take an rng.
_RANDOM = {pop.slice_defects, pop.with_lesions, pop.with_bright_ring, pop.with_bias,
           pop.mp2rage_background}
CLASSES = ("reference", "poses", "defects", "defaced", "lesions", "stripped", "coarse",
           "head_size")
SETS = ("tuning", "heldout")


@dataclass(frozen=True)
class SetRow:
    """One row of a set's manifest (module notes)."""

    case: str
    variation: str
    person: str
    source: str
    acquisition: str
    pose: str
    variations: str


def read_rows(which: str) -> list[SetRow]:
    """The rows of set ``which`` (``"tuning"`` or ``"heldout"``), checked.

    Raises
    ------
    ValueError
        A row names an unknown class, acquisition, source or variation, a case twice,
        or a person without a reference row.
    """
    if which not in SETS:
        raise ValueError(f"unknown set {which!r}; known: {', '.join(SETS)}")
    text = resources.files("mriprep.demo").joinpath(
        "registration_sets", f"{which}.csv").read_text()
    return parse_rows(text, f"{which}.csv")


def parse_rows(text: str, where: str) -> list[SetRow]:
    """The rows of a set manifest's ``text`` (``where`` names it in errors), checked
    as :func:`read_rows` says."""
    rows = [SetRow(r["case"], r["class"], r["person"], r["source"], r["acquisition"],
                   r["pose"], r["variations"])
            for r in csv.DictReader(line for line in text.splitlines()
                                    if line.strip() and not line.startswith("#"))]
    problems = []
    seen = set()
    for row in rows:
        at = f"{where}, case {row.case!r}"
        if row.case in seen:
            problems.append(f"{at}: the case is listed twice")
        seen.add(row.case)
        if row.variation not in CLASSES:
            problems.append(f"{at}: class {row.variation!r} is not one of "
                            f"{', '.join(CLASSES)}")
        if row.acquisition not in ACQUISITIONS:
            problems.append(f"{at}: acquisition {row.acquisition!r} is unknown (known: "
                            f"{', '.join(ACQUISITIONS)})")
        base = row.source.split("@", 1)[0]
        if base not in REAL_SCANS and not re.fullmatch(r"person-\d+", base):
            problems.append(f"{at}: source {row.source!r} is neither a real scan "
                            f"({', '.join(REAL_SCANS)}) nor person-<seed>")
        try:
            unknown = [n for n, _ in _parsed_variations(row.variations) if n not in VARIATIONS]
        except ValueError as error:
            unknown = [str(error)]
        problems += [f"{at}: variation {n!r} is unknown (known: {', '.join(VARIATIONS)})"
                     for n in unknown]
    references = {r.person for r in rows if r.variation == "reference"}
    problems += [f"{where}: person {p!r} has no reference row"
                 for p in sorted({r.person for r in rows} - references)]
    if problems:
        raise ValueError("; ".join(problems))
    return rows


def set_cases(which: str, noise: int = 0) -> list[Case]:
    """The cases of set ``which``, each built lazily, all of kind ``good``. Cases whose
    source is not installed are left out (:func:`missing_sources` names them).

    ``noise`` other than 0 draws another realisation of each scan's noise and receive
    field, the poses and defects unchanged: what the same benchmark varies by from run
    to run of a scanner (see :func:`build_scan`)."""
    return [Case(row.case, "good", row.person, row.acquisition,
                 functools.partial(build_scan, row, noise),
                 reference=row.variation == "reference", variation=row.variation)
            for row in read_rows(which) if _installed(row.source)]


# The four scans a user reported (a 1x1x3 mm scan with NaN slices, a zero slab and a
# spike; a defaced head; lesions and a bright ring; a coarse 8-bit head in three poses),
# rebuilt in the held-out set on every real head: description -> the rows' case names
# after the person's ``/``.
REPORTED_CASES = {
    "1x1x3 mm + defects": ("ax3_defects",),
    "defaced": ("defaced", "defaced_ax4"),
    "lesions + bright ring": ("lesions_ring", "lesions_ring_sag3"),
    "2x2x3 mm int16, 3 poses": ("coarse_cor", "coarse_rot12", "coarse_tilt"),
}
REAL_PEOPLE = ("colin27", "s1", "robex")


def reported_case_names() -> dict[str, list[str]]:
    """:data:`REPORTED_CASES` as the held-out set's case names of each real person."""
    names = {r.case for r in read_rows("heldout")}
    return {label: [f"{p}/{c}" for p in REAL_PEOPLE for c in suffixes
                    if f"{p}/{c}" in names]
            for label, suffixes in REPORTED_CASES.items()}


def missing_sources(which: str) -> list[str]:
    """The real scans set ``which`` needs that are not installed here."""
    return sorted({row.source.split("@", 1)[0] for row in read_rows(which)
                   if not _installed(row.source)})


def _installed(source: str) -> bool:
    base = source.split("@", 1)[0]
    return base not in REAL_SCANS or real_scan(base) is not None


def build_scan(row: SetRow, noise: int = 0) -> Scan:
    """The scan a row describes: its source in its pose, acquired (noise and receive
    field drawn from the case's name, and ``noise`` when not 0), then varied."""
    tag = zlib.crc32(row.case.encode())
    scan = acquire(_anatomy(row.source), _pose(row.pose), ACQUISITIONS[row.acquisition],
                   np.random.default_rng([tag, 0] + ([noise] if noise else [])))
    for index, (name, kwargs) in enumerate(_parsed_variations(row.variations)):
        function = VARIATIONS[name]
        if function in _RANDOM:
            kwargs = {**kwargs, "rng": np.random.default_rng([tag, index + 1])}
        scan = function(scan, **kwargs)
    return scan


def _pose(text: str) -> np.ndarray:
    values = text.split()
    if len(values) == 1:
        return random_pose(np.random.default_rng([int(values[0]), 11]),
                           MAX_POSE_ROTATION_DEG, MAX_POSE_TRANSLATION_MM)
    if len(values) != 6:
        raise ValueError(f"a pose is a seed or 'rx ry rz tx ty tz', got {text!r}")
    numbers = [float(v) for v in values]
    return rigid_matrix(numbers[:3], numbers[3:])


@functools.lru_cache(maxsize=16)
def _anatomy(source: str) -> Anatomy:
    base, _, scale = source.partition("@")
    anatomy = real_head(base) if base in REAL_SCANS else person(int(base.split("-")[1]))
    if scale:
        factors = [float(f) for f in scale.split("x")]
        anatomy = pop.scaled_anatomy(anatomy, factors[0] if len(factors) == 1 else factors,
                                     name=source)
    return anatomy


_ITEM = re.compile(r"^\s*(\w+)\s*(?:\((.*)\))?\s*$")


def _parsed_variations(text: str) -> list[tuple[str, dict]]:
    """``"defects(nan=3,zero=2)+ring"`` as [("defects", {"nan": 3, "zero": 2}),
    ("ring", {})]."""
    out = []
    for item in filter(None, (t.strip() for t in text.split("+"))):
        match = _ITEM.match(item)
        if match is None:
            raise ValueError(f"variation {item!r} is not name or name(key=value,...)")
        kwargs = {}
        for pair in filter(None, (p.strip() for p in (match.group(2) or "").split(","))):
            key, _, value = pair.partition("=")
            number = float(value)
            kwargs[key.strip()] = int(number) if number.is_integer() and "." not in value \
                else number
        out.append((match.group(1), kwargs))
    return out


# --- scoring ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Score:
    """How one accepted scan registered against its person's reference scan: the
    consistency (mean and max mm over the template brain) of its transform with the
    reference's moved by the known motion between them, and, where the person's rigid
    truth is known (an unscaled synthetic person), the distance from that truth."""

    case: str
    variation: str
    person: str
    consistency_mean: float
    consistency_max: float
    truth_mean: float | None = None
    truth_max: float | None = None


def consistency_scores(cases: list[Case], scans: dict[str, Scan],
                       estimates: dict[str, np.ndarray | None]) -> list[Score]:
    """A :class:`Score` for every non-reference case whose transform and whose
    reference's transform are both known (``estimates`` maps a case's name to its
    template-to-subject transform, None where it was refused).

    ``scans`` holds each case's :class:`~mriprep.demo.scanner.Scan` (its pose and
    truth)."""
    from mriprep.stages.registration.geometry import target_registration_error
    from mriprep.stages.registration.template import template_brain_points

    points = template_brain_points("mni152", step=4)
    reference = {c.anatomy: c.name for c in cases if c.reference}
    out = []
    for case in cases:
        ref = reference.get(case.anatomy)
        if case.reference or ref is None:
            continue
        estimate, ref_estimate = estimates.get(case.name), estimates.get(ref)
        if estimate is None or ref_estimate is None:
            continue
        scan, ref_scan = scans[case.name], scans[ref]
        motion = scan.pose @ np.linalg.inv(ref_scan.pose)
        mean, worst = target_registration_error(estimate, motion @ ref_estimate, points)
        truth = (None, None)
        if scan.template_to_subject is not None:
            truth = target_registration_error(estimate, scan.template_to_subject, points)
        # The calibration set's own cases are named by what varies: person/variation.
        variation = case.variation or case.name.split("/", 1)[-1]
        out.append(Score(case.name, variation, case.anatomy, mean, worst, *truth))
    return out
