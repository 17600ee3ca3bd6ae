"""The demo's referee must pass a run that handled every defect and fail one that did not."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest

from mriprep.check import check_cache
from mriprep.demo.verify import (
    as_reoriented,
    format_verdicts,
    target_registration_error,
    verify_demo_run,
)
from mriprep.cache.run_report import SubjectResult
from mriprep.stages.registration.template import template_brain_points as brain_points_mm


def _results(rows):
    """Report rows (the JSON form, easy to break in a test) read back as results."""
    return [SubjectResult.from_json(row) for row in rows]


def _perfect_results(truth):
    """Report rows of a run that handled every planted defect exactly as designed."""
    results = []
    for subject in truth["subjects"].values():
        ids = {"subject_id": subject["subject_id"], "session_id": subject["session_id"]}
        if subject["expected"] == "fail":
            causes = subject["expected_causes"]
            cause = causes[0] if causes else ""
            # the stage that names each cause (the test may name stages; demo/ reads them)
            stage = {"": "load", "head_size": "plausibility"}.get(cause, "register")
            metrics = {"register": {"failure": cause}} if stage == "register" else (
                {"plausibility": {"failed_checks": [cause]}} if causes else {})
            results.append({**ids, "status": "failed", "reason": "planted",
                            "stage": stage, "metrics": metrics})
            continue
        metrics = {"sanitize": {"nan": 0, "posinf": 0, "neginf": 0, "extreme": 0},
                   "mask_slices": {},
                   "register": {"template_to_subject": subject["template_to_subject"]}}
        for d in subject["defects"]:
            if d["kind"] == "nan_blob":
                metrics["sanitize"]["nan"] = d["n_voxels"]
            elif d["kind"] == "extreme_values":
                values = np.asarray(d["values"])
                big = np.abs(values) > np.finfo(np.float32).max
                metrics["sanitize"].update(posinf=int((big & (values > 0)).sum()),
                                           neginf=int((big & (values < 0)).sum()),
                                           extreme=int((~big).sum()))
            elif d["kind"] in ("zero_slab", "spike_slice", "dropout_slice"):
                axis, slices = as_reoriented(subject, d["axis"], d.get("slices", [d.get("index")]))
                flagged = metrics["mask_slices"].setdefault(f"axis_{axis}", {"flagged": []})
                flagged["flagged"] += slices
        results.append({**ids, "status": "cached", "metrics": metrics})
    return results


def _leak_findings(truth):
    leak = next((s["subject_id"], d["copy_of"]) for s in truth["subjects"].values()
                for d in s["defects"] if d["kind"] == "leak")
    return [SimpleNamespace(code="duplicate-input", subjects=leak)]


@pytest.fixture(scope="module")
def points():
    return brain_points_mm(step=8)


def test_a_run_that_handled_every_defect_passes(demo_cohort, points):
    truth = demo_cohort.truth
    verdicts = verify_demo_run(truth, _results(_perfect_results(truth)), _leak_findings(truth), points)
    assert all(v.ok for v in verdicts), [v for v in verdicts if not v.ok]
    expectations = " ".join(v.expectation for v in verdicts)
    for word in ("NaN blob", "extreme values", "zero-filled slab", "spike slice",
                 "dropout slice", "leak", "reported as failed", "registration within",
                 "refused as orientation", "consistent with"):
        assert word in expectations


@pytest.mark.parametrize("breakage", ["missed_slice", "nan_undercount", "cached_dead",
                                      "bad_transform", "inconsistent", "wrong_cause",
                                      "cached_rotated", "no_check"])
def test_each_mishandled_defect_is_named(demo_cohort, points, breakage):
    truth = demo_cohort.truth
    results = copy.deepcopy(_perfect_results(truth))
    findings = _leak_findings(truth)
    names = list(truth["subjects"])
    by_id = dict(zip(names, results))

    def with_defect(kind):
        return next(name for name, s in truth["subjects"].items()
                    if any(d["kind"] == kind for d in s["defects"]))

    if breakage == "missed_slice":
        sid = with_defect("spike_slice")
        for axis in by_id[sid]["metrics"]["mask_slices"].values():
            axis["flagged"] = []
    elif breakage == "nan_undercount":
        sid = with_defect("nan_blob")
        by_id[sid]["metrics"]["sanitize"]["nan"] -= 1
    elif breakage == "cached_dead":
        sid = with_defect("dead_volume")
        by_id[sid].update(status="cached", metrics={})
    elif breakage == "bad_transform":
        sid = with_defect("zero_slab")
        moved = np.array(truth["subjects"][sid]["template_to_subject"])
        moved[0, 3] += 5.5  # a 5.5 mm shift exceeds the 5 mm max bound
        by_id[sid]["metrics"]["register"]["template_to_subject"] = moved.tolist()
    elif breakage == "inconsistent":
        sid = with_defect("rescan")
        moved = np.array(truth["subjects"][sid]["template_to_subject"])
        moved[2, 3] += 1.2  # within the truth bounds, not within consistency's 1 mm
        by_id[sid]["metrics"]["register"]["template_to_subject"] = moved.tolist()
    elif breakage == "wrong_cause":
        sid = with_defect("not_t1")
        by_id[sid]["metrics"]["register"]["failure"] = "orientation"
    elif breakage == "cached_rotated":
        sid = with_defect("header_rotated")
        by_id[sid].update(status="cached", stage=None, metrics={})
    else:
        sid, findings = with_defect("leak"), None
    failed = [v for v in verify_demo_run(truth, _results(results), findings, points)
              if not v.ok]
    assert failed and {v.subject_id for v in failed} == {sid}


def test_registration_error_of_a_pure_translation_is_its_length():
    points = np.random.default_rng(0).uniform(-60, 60, size=(100, 3))
    shift = np.eye(4)
    shift[:3, 3] = [0.3, 0.4, 0.0]
    errors = target_registration_error(shift, np.eye(4), points)
    np.testing.assert_allclose(errors, 0.5)


@pytest.mark.slow
def test_the_demo_run_meets_every_expectation_of_the_ground_truth(demo_cohort, demo_cache):
    """What `make demo` asserts, on the session's run of the default pipeline."""
    report = check_cache(demo_cache.path, manifest=demo_cohort.manifest)
    verdicts = verify_demo_run(demo_cohort.truth, demo_cache.run.results, report.findings)
    assert all(v.ok for v in verdicts), format_verdicts(verdicts)
    checked = {v.subject_id for v in verdicts}
    assert checked == set(demo_cohort.subjects)
    registered = [v for v in verdicts if v.expectation.startswith("registration within")]
    assert len(registered) == sum(s["expected"] != "fail" for s in demo_cohort.subjects.values())
    assert any(v.expectation.startswith("leak of") for v in verdicts)
    assert any(v.expectation.startswith("registration consistent") for v in verdicts)
    refused = [v for v in verdicts if v.expectation.startswith("refused as")]
    assert len(refused) == sum(bool(s["expected_causes"])
                               for s in demo_cohort.subjects.values()) >= 3


@pytest.mark.slow
def test_demo_command_scores_an_earlier_run_from_its_report(demo_cohort, demo_cache, tmp_path,
                                                            capsys):
    """`mriprep demo DIR --check` without --run reads the run report back as results."""
    from mriprep.cli import main

    folder = tmp_path / "demo"
    folder.mkdir()
    for item in demo_cohort.root.iterdir():
        (folder / item.name).symlink_to(item)
    (folder / "cache").symlink_to(demo_cache.path)  # the check only reads it
    assert main(["demo", str(folder), "--check"]) == 0
    out = capsys.readouterr().out
    assert "demo: every planted defect was handled as designed" in out
    assert "expectations of the ground truth hold" in out
