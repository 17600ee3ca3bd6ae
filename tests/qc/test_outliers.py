"""Robust-z outlier flags on cohorts with known structure."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.qc.outliers import MIN_COHORT, OUTLIER_Z, Rule, find_outliers, robust_z


def test_robust_z_is_the_modified_z_of_a_normal_sample():
    rng = np.random.default_rng(0)
    values = rng.normal(10.0, 2.0, 20001)
    z, median = robust_z(values)
    assert median == pytest.approx(10.0, abs=0.05)
    # The MAD scaled by 1.4826 estimates sigma: z matches the standard score.
    np.testing.assert_allclose(np.std(z), 1.0, atol=0.03)


def test_one_gross_value_is_flagged_and_does_not_hide_itself():
    cohort = {f"s{i}": {"snr": v} for i, v in enumerate([10.0, 10.4, 9.7, 10.1, 9.9, 10.2, 3.0])}
    flagged = find_outliers(cohort)
    assert [(o.name, o.metric) for o in flagged] == [("s6", "snr")]
    assert flagged[0].z < -OUTLIER_Z and flagged[0].median == pytest.approx(10.0, abs=0.2)
    assert "below" in flagged[0].describe()


def test_counts_with_a_zero_mad_fall_back_to_the_mean_deviation():
    cohort = {f"s{i}": {"masked": 0.0} for i in range(9)} | {"bad": {"masked": 6.0}}
    flagged = find_outliers(cohort)
    assert [o.name for o in flagged] == ["bad"]
    same = {f"s{i}": {"masked": 0.0} for i in range(9)}
    assert find_outliers(same) == []


def test_small_cohorts_and_missing_values_flag_nobody():
    small = {f"s{i}": {"snr": v} for i, v in enumerate([10.0, 10.0, 10.0, 1.0][: MIN_COHORT - 1])}
    assert find_outliers(small) == []
    with_nan = {f"s{i}": {"snr": float("nan")} for i in range(10)}
    assert find_outliers(with_nan) == []


def test_one_sided_metrics_flag_only_their_bad_side():
    cohort = {f"s{i}": {"invalid": v} for i, v in enumerate([0.2, 0.21, 0.19, 0.2, 0.2, 0.01])}
    assert [o.name for o in find_outliers(cohort)] == ["s5"]
    assert find_outliers(cohort, rules={"invalid": Rule(side=1)}) == []
    cohort["s6"] = {"invalid": 0.9}
    assert [o.name for o in find_outliers(cohort, rules={"invalid": Rule(side=1)})] == ["s6"]
