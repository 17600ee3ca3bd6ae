"""Score a demo run against the demo cohort's ground truth.

``make demo`` exits 0 exactly when every planted defect was handled as designed. This
module says, subject by subject and defect by defect, whether it was, from three sources
only: the ground truth written by :mod:`mriprep.demo`, the run's per-subject results (the
runner's report), and the integrity check's findings. It reads nothing else and decides
nothing about the pipeline: it is the referee, not a player.

What "as designed" means:

* recoverable defects (NaN blob, extreme values, zero slab, artifact slices, a flipped
  file) end as cached tensors, with exactly the planted voxels counted by sanitize and
  the planted slices flagged by mask_slices;
* unrecoverable ones (truncated file, dead volume) are reported as failed, with a reason;
* the leak (one scan under two ids in two splits) is flagged by ``mriprep check``;
* every registered subject lands within the registration accuracy bounds (mean target
  registration error over the template brain <= 0.25 mm, max <= 0.5 mm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from mriprep.registration.geometry import target_registration_error
from mriprep.registration.template import template_brain_points

FLOAT32_MAX = float(np.finfo(np.float32).max)
TRE_MEAN_LIMIT_MM = 0.25
TRE_MAX_LIMIT_MM = 0.5
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
    results: Iterable[dict[str, Any]],
    findings: Iterable[Any] | None = None,
    brain_points: np.ndarray | None = None,
) -> list[Verdict]:
    """One verdict per expectation of the ground truth.

    Parameters
    ----------
    truth
        The demo's ``ground_truth.json`` document.
    results
        The run's per-subject results (``RunResult.results`` or the report's
        ``subjects``): ``subject_id``, ``status``, ``stage``, ``reason``, ``metrics``.
    findings
        The check's findings (objects with ``code`` and ``subjects``), or None when the
        check was not run: the leak then cannot be verified and is reported as such.
    brain_points
        Points for the registration error (default: every ``BRAIN_POINT_STEP``-th
        brain voxel of the MNI152 template, see
        :func:`~mriprep.registration.template.template_brain_points`).
    """
    by_subject = {r["subject_id"]: r for r in results}
    verdicts: list[Verdict] = []
    points = None
    for subject_id, subject in truth["subjects"].items():
        result = by_subject.get(subject_id)
        if result is None:
            verdicts.append(Verdict(subject_id, "processed", False, "not in the run's results"))
            continue
        verdicts.append(_outcome(subject_id, subject, result))
        if result["status"] not in ("cached", "skipped"):
            continue
        metrics = result.get("metrics") or {}
        for defect in subject["defects"]:
            verdict = _defect_verdict(subject_id, defect, metrics, findings)
            if verdict is not None:
                verdicts.append(verdict)
        if "register" in metrics:
            if points is None:
                points = (brain_points if brain_points is not None
                          else template_brain_points("mni152", step=BRAIN_POINT_STEP))
            verdicts.append(_registration_verdict(subject_id, subject, metrics, points))
    return verdicts


def _outcome(subject_id: str, subject: dict[str, Any], result: dict[str, Any]) -> Verdict:
    status = result["status"]
    if subject["expected"] == "fail":
        planted = ", ".join(d["kind"] for d in subject["defects"])
        ok = status == "failed" and bool(result.get("reason"))
        detail = (f"failed at {result.get('stage')}: {result.get('reason')}" if ok
                  else f"status {status!r}, but the planted {planted} must fail")
        return Verdict(subject_id, f"reported as failed ({planted})", ok, detail)
    ok = status in ("cached", "skipped")
    detail = status if ok else f"failed at {result.get('stage')}: {result.get('reason')}"
    return Verdict(subject_id, "cached", ok, detail)


def _defect_verdict(subject_id, defect, metrics, findings) -> Verdict | None:
    kind = defect["kind"]
    if kind == "nan_blob":
        found = metrics.get("sanitize", {}).get("nan")
        ok = found == defect["n_voxels"]
        return Verdict(subject_id, "NaN blob filled and masked", ok,
                       f"sanitize counted {found} NaN of {defect['n_voxels']} planted")
    if kind == "extreme_values":
        return _extreme_verdict(subject_id, defect, metrics.get("sanitize", {}))
    if kind == "zero_slab":
        flagged = _flagged(metrics, defect["axis"])
        missed = sorted(set(defect["slices"]) - flagged)
        return Verdict(subject_id, "zero-filled slab masked", not missed,
                       f"{len(defect['slices']) - len(missed)}/{len(defect['slices'])} "
                       f"slices flagged on axis {defect['axis']}"
                       + (f", missed {missed}" if missed else ""))
    if kind in ("spike_slice", "dropout_slice"):
        found = defect["index"] in _flagged(metrics, defect["axis"])
        return Verdict(subject_id, f"{kind.replace('_', ' ')} masked", found,
                       f"slice {defect['index']} on axis {defect['axis']} "
                       + ("flagged" if found else "NOT flagged"))
    if kind == "leak":
        return _leak_verdict(subject_id, defect["copy_of"], findings)
    return None


def _extreme_verdict(subject_id, defect, sanitize) -> Verdict:
    values = np.asarray(defect["values"], dtype=float)
    expected = {
        "posinf": int(np.sum(values > FLOAT32_MAX)),  # overflow float32 on load
        "neginf": int(np.sum(values < -FLOAT32_MAX)),
        "extreme": int(np.sum(np.abs(values) <= FLOAT32_MAX)),
    }
    found = {k: sanitize.get(k) for k in expected}
    return Verdict(subject_id, "extreme values (1e30, 1e308) replaced", found == expected,
                   f"sanitize counted {found}, planted {expected}")


def _leak_verdict(subject_id, original, findings) -> Verdict:
    expectation = f"leak of {original} flagged by the check"
    if findings is None:
        return Verdict(subject_id, expectation, False, "the check was not run")
    codes = {"duplicate-input", "duplicate-tensor", "subject-split-leak"}
    hits = [f for f in findings
            if f.code in codes and {subject_id, original} <= set(f.subjects)]
    detail = f"check reported {hits[0].code}" if hits else "no finding names both ids"
    return Verdict(subject_id, expectation, bool(hits), detail)


def _registration_verdict(subject_id, subject, metrics, points) -> Verdict:
    estimated = metrics["register"].get("template_to_subject")
    if estimated is None:
        return Verdict(subject_id, "registration within bounds", False,
                       "the register stage recorded no transform")
    mean, worst = target_registration_error(estimated, subject["template_to_subject"], points)
    ok = mean <= TRE_MEAN_LIMIT_MM and worst <= TRE_MAX_LIMIT_MM
    return Verdict(subject_id, "registration within bounds", ok,
                   f"TRE mean {mean:.3f} mm (<= {TRE_MEAN_LIMIT_MM}), "
                   f"max {worst:.3f} mm (<= {TRE_MAX_LIMIT_MM})")


def _flagged(metrics: dict[str, Any], axis: int) -> set[int]:
    return set(metrics.get("mask_slices", {}).get(f"axis_{axis}", {}).get("flagged", []))


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
