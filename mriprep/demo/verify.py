"""Score a demo run against the demo cohort's ground truth.

``make demo`` exits 0 exactly when every planted defect and failure was handled as
designed. This module says, scan by scan and defect by defect, whether it was, from three
sources only: the ground truth written by :mod:`mriprep.demo.cohort`, the run's
per-subject results (the runner's report), and the integrity check's findings. It reads
nothing else and decides nothing about the pipeline: it is the referee, not a player.
It reads a stage's metrics through what the stage declares they mean (the roles of
:mod:`mriprep.stages.qc_declaration`: filled counts, flagged slices, the registration's
transform, a refusal's causes), never by the stage's name.

What "as designed" means:

* recoverable defects (NaN blob, extreme values, zero slab, artifact slices, a file
  stored in another voxel order) end as cached tensors, with exactly the planted voxels
  counted by sanitize and the planted slices flagged by mask_slices;
* unrecoverable ones (truncated file, dead volume) are reported as failed, with a reason;
* scans registration must refuse (a header turned by 90 degrees, a T2 contrast, a 40 mm
  slab of the head) are refused by register or plausibility, naming an expected cause;
* the leak (one scan under two ids in two splits) is flagged by ``mriprep check``;
* every registered scan lands within the bounds against its known rigid truth, and the
  two sessions of the rescanned person agree with the known motion between them (see
  the limits below for their measured distributions).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import nibabel as nib
import numpy as np

from mriprep.stages import declared_reading
from mriprep.stages.qc_declaration import (
    FILLED_COUNTS,
    FLAGGED_SLICES,
    REFUSAL_CAUSES,
    TEMPLATE_TO_SUBJECT,
)
from mriprep.stages.registration.geometry import target_registration_error
from mriprep.stages.registration.template import template_brain_points

if TYPE_CHECKING:
    from mriprep.cache.run_report import SubjectResult

FLOAT32_MAX = float(np.finfo(np.float32).max)
# Against the known rigid truth of a synthetic person (the least-squares rigid part of
# its nonlinear warp, :mod:`mriprep.demo.anatomy`). The warp leaves the rigid answer
# ambiguous by a millimetre or so: mriprep scored 0.75 mm mean and 2.9 mm max against
# this truth on the calibration set (four people, five acquisitions each; ANTs and
# Greedy alike), and 0.27-1.26 mm mean, 0.54-2.5 mm max on the demo's people. A failed
# registration is tens of mm off, so the bounds sit well above the good cases.
TRUTH_MEAN_LIMIT_MM = 2.0
TRUTH_MAX_LIMIT_MM = 5.0
# Consistency: one person's two sessions, predicted from each other through the known
# motion between them. The warp's ambiguity cancels, so this is the sharp figure:
# calibration set 0.16 mm mean, 0.72 mm max over 27 poses (`make bench`).
CONSISTENCY_MEAN_LIMIT_MM = 0.5
CONSISTENCY_MAX_LIMIT_MM = 1.0
# The referee measures registration error at every 4th template brain voxel along each
# axis: a rigid map's error varies smoothly across the brain, so 1/64 of the points do.
BRAIN_POINT_STEP = 4


@dataclass(frozen=True)
class Verdict:
    """Whether one expectation of the ground truth held, and the evidence."""

    subject_id: str
    expectation: str
    ok: bool
    detail: str


def verify_demo_run(
    truth: dict[str, Any],
    results: Iterable[SubjectResult],
    findings: Iterable[Any] | None = None,
    brain_points: np.ndarray | None = None,
) -> list[Verdict]:
    """One verdict per expectation of the ground truth.

    Parameters
    ----------
    truth
        The demo's ``ground_truth.json`` document.
    results
        The run's per-subject :class:`~mriprep.cache.run_report.SubjectResult` s
        (``RunResult.results``, or a report read back with
        :func:`~mriprep.cache.run_report.read_run_report`).
    findings
        The check's findings (objects with ``code`` and ``subjects``), or None when the
        check was not run: the leak then cannot be verified and is reported as such.
    brain_points
        Points for the registration error (default: every ``BRAIN_POINT_STEP``-th
        brain voxel of the MNI152 template, see
        :func:`~mriprep.stages.registration.template.template_brain_points`).
    """
    by_scan = {(r.subject_id, r.session_id or ""): r for r in results}
    verdicts: list[Verdict] = []
    points = None
    estimated: dict[str, Any] = {}
    for name, scan in truth["subjects"].items():
        result = by_scan.get((scan["subject_id"], scan["session_id"]))
        if result is None:
            verdicts.append(Verdict(name, "processed", False, "not in the run's results"))
            continue
        verdicts.append(_outcome(name, scan, result))
        metrics = result.metrics or {}
        if result.status not in ("cached", "skipped"):
            continue
        for defect in scan["defects"]:
            verdict = _defect_verdict(name, scan, defect, metrics, findings,
                                      truth["subjects"])
            if verdict is not None:
                verdicts.append(verdict)
        registered = declared_reading(metrics, TEMPLATE_TO_SUBJECT)
        if registered is not None:
            if points is None:
                points = (brain_points if brain_points is not None
                          else template_brain_points("mni152", step=BRAIN_POINT_STEP))
            verdicts.append(_registration_verdict(name, scan, registered, points))
            estimated[name] = registered[1]
    for name, scan in truth["subjects"].items():
        rescan = next((d for d in scan["defects"] if d["kind"] == "rescan"), None)
        if rescan is not None and points is not None:
            verdicts.append(_consistency_verdict(name, scan, truth["subjects"][rescan["of"]],
                                                 estimated.get(name),
                                                 estimated.get(rescan["of"]), points))
    return verdicts


def _outcome(name: str, scan: dict[str, Any], result: dict[str, Any]) -> Verdict:
    status = result.status
    if scan["expected"] != "fail":
        ok = status in ("cached", "skipped")
        detail = status if ok else f"failed at {result.stage}: {result.reason}"
        return Verdict(name, "cached", ok, detail)
    planted = ", ".join(d["kind"] for d in scan["defects"])
    causes = scan.get("expected_causes") or []
    if status != "failed" or not result.reason:
        return Verdict(name, f"reported as failed ({planted})", False,
                       f"status {status!r}, but the planted {planted} must fail")
    detail = f"failed at {result.stage}: {result.reason}"
    if not causes:
        return Verdict(name, f"reported as failed ({planted})", True, detail)
    named = refusal_causes(result)
    ok = bool(set(named) & set(causes))
    return Verdict(name, f"refused as {' or '.join(causes)} ({planted})", ok,
                   f"cause {', '.join(named) or None}; {detail}")


def refusal_causes(result: SubjectResult) -> list[str]:
    """What a failed subject's refusal names: the causes the failing stage declares its
    refusals name (registration's failure, the plausibility checks that failed); none
    for a stage that declares none."""
    if not result.stage:
        return []
    found = declared_reading({result.stage: (result.metrics or {}).get(result.stage) or {}},
                             REFUSAL_CAUSES)
    return [str(cause) for cause in found[1]] if found else []


def _defect_verdict(name, scan, defect, metrics, findings, subjects) -> Verdict | None:
    kind = defect["kind"]
    if kind == "nan_blob":
        stage, counts = declared_reading(metrics, FILLED_COUNTS) or ("no stage", {})
        found = counts.get("nan")
        ok = found == defect["n_voxels"]
        return Verdict(name, "NaN blob filled and masked", ok,
                       f"{stage} counted {found} NaN of {defect['n_voxels']} planted")
    if kind == "extreme_values":
        return _extreme_verdict(name, defect,
                                declared_reading(metrics, FILLED_COUNTS) or ("no stage", {}))
    if kind == "zero_slab":
        axis, slices = as_reoriented(scan, defect["axis"], defect["slices"])
        flagged = _flagged(metrics, axis)
        missed = sorted(set(slices) - flagged)
        return Verdict(name, "zero-filled slab masked", not missed,
                       f"{len(slices) - len(missed)}/{len(slices)} "
                       f"slices flagged on axis {axis}"
                       + (f", missed {missed}" if missed else ""))
    if kind in ("spike_slice", "dropout_slice"):
        axis, (index,) = as_reoriented(scan, defect["axis"], [defect["index"]])
        found = index in _flagged(metrics, axis)
        return Verdict(name, f"{kind.replace('_', ' ')} masked", found,
                       f"slice {index} on axis {axis} " + ("flagged" if found else "NOT flagged"))
    if kind == "leak":
        original = subjects[defect["copy_of"]]["subject_id"]
        return _leak_verdict(name, scan["subject_id"], original, findings)
    return None


def as_reoriented(scan: dict[str, Any], axis: int, indices) -> tuple[int, list[int]]:
    """File voxel ``axis`` and slice ``indices`` as the reorient stage (RAS+) has them:
    mask_slices reports slices of the reoriented volume."""
    orientation = nib.orientations.io_orientation(np.asarray(scan["affine"]))
    target, direction = int(orientation[axis, 0]), orientation[axis, 1]
    n = scan["shape"][axis]
    return target, [int(i) if direction > 0 else n - 1 - int(i) for i in indices]


def _extreme_verdict(subject_id, defect, filled: tuple[str, dict]) -> Verdict:
    values = np.asarray(defect["values"], dtype=float)
    expected = {
        "posinf": int(np.sum(values > FLOAT32_MAX)),  # overflow float32 on load
        "neginf": int(np.sum(values < -FLOAT32_MAX)),
        "extreme": int(np.sum(np.abs(values) <= FLOAT32_MAX)),
    }
    stage, counts = filled
    found = {k: counts.get(k) for k in expected}
    return Verdict(subject_id, "extreme values (1e30, 1e308) replaced", found == expected,
                   f"{stage} counted {found}, planted {expected}")


def _leak_verdict(name, subject_id, original, findings) -> Verdict:
    expectation = f"leak of {original} flagged by the check"
    if findings is None:
        return Verdict(name, expectation, False, "the check was not run")
    codes = {"duplicate-input", "duplicate-tensor", "subject-split-leak"}
    hits = [f for f in findings
            if f.code in codes and {subject_id, original} <= set(f.subjects)]
    detail = f"check reported {hits[0].code}" if hits else "no finding names both ids"
    return Verdict(name, expectation, bool(hits), detail)


def _registration_verdict(name, scan, registered: tuple[str, Any], points) -> Verdict:
    stage, estimated = registered
    if estimated is None:
        return Verdict(name, "registration within bounds", False,
                       f"the {stage} stage recorded no transform")
    mean, worst = target_registration_error(estimated, scan["template_to_subject"], points)
    ok = mean <= TRUTH_MEAN_LIMIT_MM and worst <= TRUTH_MAX_LIMIT_MM
    return Verdict(name, "registration within bounds of the known rigid truth", ok,
                   f"TRE mean {mean:.3f} mm (<= {TRUTH_MEAN_LIMIT_MM}), "
                   f"max {worst:.3f} mm (<= {TRUTH_MAX_LIMIT_MM})")


def _consistency_verdict(name, scan, first, estimated, estimated_first, points) -> Verdict:
    """The rescan's transform against the first scan's, moved by the known motion
    between the two sessions (truth2 @ inv(truth1): the warp cancels)."""
    expectation = f"registration consistent with {scan['defects'][0]['of']} across the motion"
    if estimated is None or estimated_first is None:
        return Verdict(name, expectation, False, "one of the two sessions was not registered")
    motion = np.asarray(scan["template_to_subject"]) @ np.linalg.inv(
        np.asarray(first["template_to_subject"]))
    predicted = motion @ np.asarray(estimated_first)
    mean, worst = target_registration_error(estimated, predicted, points)
    ok = mean <= CONSISTENCY_MEAN_LIMIT_MM and worst <= CONSISTENCY_MAX_LIMIT_MM
    return Verdict(name, expectation, ok,
                   f"mean {mean:.3f} mm (<= {CONSISTENCY_MEAN_LIMIT_MM}), "
                   f"max {worst:.3f} mm (<= {CONSISTENCY_MAX_LIMIT_MM})")


def _flagged(metrics: dict[str, Any], axis: int) -> set[int]:
    _, by_axis = declared_reading(metrics, FLAGGED_SLICES) or ("", {})
    return set(by_axis.get(axis, []))


def format_verdicts(verdicts: list[Verdict]) -> str:
    """A readable table: one line per expectation, failures marked."""
    width = max((len(v.subject_id) for v in verdicts), default=8)
    lines = []
    for v in verdicts:
        mark = "ok  " if v.ok else "FAIL"
        lines.append(f"  {mark} {v.subject_id:<{width}}  {v.expectation}: {v.detail}")
    passed = sum(v.ok for v in verdicts)
    lines.append(f"  {passed}/{len(verdicts)} expectations of the ground truth hold")
    return "\n".join(lines)
