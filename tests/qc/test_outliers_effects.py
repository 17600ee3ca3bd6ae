"""Outlier flags need a robust z AND a difference that matters (issue 47).

Each judged metric declares its minimum effect and, where it has them, its bounds
(``QCMetric.min_effect``, ``QCMetric.bounds``); the cases here were flagged by the robust
z alone.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mriprep.qc.measures import OWN, declared_metrics, with_stage_declarations
from mriprep.qc.outliers import (
    OUTLIER_Z,
    Rule,
    cohort_flags,
    find_outliers,
    robust_z,
    spread_floor,
)
from mriprep.stages.qc_declaration import QCMetric


@pytest.fixture(scope="module")
def stage_declared() -> dict[str, QCMetric]:
    """Every measure's declaration as the check and the report read it for a qc.json
    that carries none (the stages' declarations fill in)."""
    from mriprep.stages import all_stages

    names = [m.name for s in all_stages() if s.qc is not None for m in s.qc.metrics
             if s.func.__module__.startswith("mriprep.")]  # not a test's own stage
    return with_stage_declarations({}, names)


def overlap_cohort() -> dict[str, dict[str, float]]:
    """12 scans whose registration overlap is 1 but for a few in the 6th decimal: the
    robust z of the lowest, 0.999966 ("1"), was -8.8."""
    values = [1.0] * 8 + [0.999999] * 3 + [0.999966]
    return {f"sub-{i:02d}": {"registration_overlap": v} for i, v in enumerate(values)}


def test_overlap_of_1_against_a_median_of_1_is_no_outlier(stage_declared):
    cohort = overlap_cohort()
    z, median = robust_z([m["registration_overlap"] for m in cohort.values()])
    assert median == 1.0 and z[-1] == pytest.approx(-8.8, abs=0.05)  # the z alone
    assert cohort_flags(cohort, stage_declared) == []


def test_a_value_at_its_bound_is_never_an_outlier_for_sitting_there(stage_declared):
    """The cohort's overlaps spread below 1 and one scan covers all of the template's
    brain: above the median by more than the minimum effect, and at the bound."""
    declared = stage_declared["registration_overlap"]
    assert declared.bounds == (0.0, 1.0)
    effect = declared.min_effect
    values = [1.0 - 2 * effect + 0.001 * i for i in range(11)] + [1.0]
    cohort = {f"sub-{i:02d}": {"registration_overlap": v} for i, v in enumerate(values)}
    z, _ = robust_z(values, spread_floor(effect))
    assert z[-1] > OUTLIER_Z  # far above, and more than the minimum effect
    assert cohort_flags(cohort, stage_declared) == []
    # the same scan a little below the bound is judged as any value
    cohort["sub-11"]["registration_overlap"] = 1.0 - 1e-4
    assert [o.name for o in cohort_flags(cohort, stage_declared)] == ["sub-11"]


def test_a_value_at_its_worst_bound_is_flagged(stage_declared):
    """No overlap at all, or every voxel invalid: the bound on the bad side is no excuse."""
    rng = np.random.default_rng(1)
    cohort = {f"sub-{i:02d}": {"registration_overlap": 0.97 + 0.005 * rng.standard_normal(),
                               "invalid_fraction": 0.01 + 0.002 * rng.standard_normal()}
              for i in range(12)}
    cohort["sub-12"] = {"registration_overlap": 0.0, "invalid_fraction": 1.0}
    flagged = {(o.name, o.metric) for o in cohort_flags(cohort, stage_declared)}
    assert {("sub-12", "registration_overlap"), ("sub-12", "invalid_fraction")} <= flagged


def test_wm2max_0_36_percent_off_at_z_4_is_no_outlier():
    """WM2MAX 0.36% from a cohort that agrees closely: z 4.0, a difference nobody minds."""
    rng = np.random.default_rng(0)
    values = list(0.88 + rng.normal(0, 0.0008, 11)) + [0.88 * 1.0036]
    values[:11] = 0.88 + (np.asarray(values[:11]) - np.median(values[:11]))  # median 0.88
    cohort = {f"sub-{i:02d}": {"wm2max": v} for i, v in enumerate(values)}
    z, median = robust_z(values)
    assert z[-1] > OUTLIER_Z and abs(values[-1] - median) / median < 0.004
    assert [o for o in find_outliers(cohort) if o.name == "sub-11"]  # the z alone flags it
    assert cohort_flags(cohort) == []
    # a scan whose brightest voxels are not the white matter's is still flagged
    cohort["sub-11"]["wm2max"] = 0.88 - 3 * OWN["wm2max"].min_effect
    [flag] = cohort_flags(cohort)
    assert flag.name == "sub-11" and "at least" in flag.describe()


def test_the_spread_has_a_floor_so_near_copies_make_no_large_z():
    values = [1.0] * 8 + [0.999999] * 3 + [0.999966]
    z, _ = robust_z(values, spread_floor(0.02))
    assert abs(z[-1]) < 0.01
    # where the cohort spreads more than the floor, the floor changes nothing
    spread = np.random.default_rng(1).normal(10, 2, 50)
    np.testing.assert_allclose(robust_z(spread, spread_floor(0.1))[0], robust_z(spread)[0])


def test_a_flag_needs_both_the_z_and_the_minimum_effect():
    cohort = {f"s{i}": {"m": v} for i, v in enumerate([10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 11.0])}
    assert [o.name for o in find_outliers(cohort)] == ["s6"]
    assert find_outliers(cohort, rules={"m": Rule(min_effect=1.5)}) == []
    assert [o.name for o in find_outliers(cohort, rules={"m": Rule(min_effect=0.9)})] == ["s6"]


def test_every_judged_metric_declares_a_minimum_effect(stage_declared):
    declared = {**OWN, **stage_declared}
    lacking = sorted(n for n, m in declared.items()
                     if m.judge != "none" and not (m.min_effect and m.min_effect > 0))
    assert lacking == []


def test_an_old_qc_json_reads_and_the_stages_fill_in_what_it_lacks():
    """qc.json written before min_effect and bounds were declared."""
    old = {"metric_info": {"registration_overlap": {
        "label": "reg. overlap", "meaning": "share", "unit": "", "better": "higher",
        "judge": "both", "column": False, "fmt": ""}}}
    declared = declared_metrics([old])
    assert declared["registration_overlap"].min_effect is None
    filled = with_stage_declarations(declared, ["registration_overlap"])
    assert filled["registration_overlap"].min_effect > 0
    assert filled["registration_overlap"].bounds == (0.0, 1.0)
    assert filled["registration_overlap"].label == "reg. overlap"  # the rest as recorded
    assert cohort_flags(overlap_cohort(), filled) == []


def test_the_declaration_round_trips_through_qc_json():
    metric = QCMetric("m", "m", "a measure", min_effect=0.5, bounds=(0.0, None))
    again = QCMetric.from_json("m", metric.to_json())
    assert again.min_effect == 0.5 and again.bounds == (0.0, None)
    with pytest.raises(ValueError, match="min_effect"):
        QCMetric("m", "m", "x", min_effect=-1.0)
    with pytest.raises(ValueError, match="bounds"):
        QCMetric("m", "m", "x", bounds=(1.0, 0.0))
    assert math.isclose(spread_floor(0.35), 0.1)
