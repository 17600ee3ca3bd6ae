"""register on the frozen held-out set: the accuracy the product promises, on people and
combinations no constant was tuned on (:mod:`mriprep.demo.registration_sets`).

Every scan of ``heldout.csv`` goes through the register stage as the default pipeline
hands it over. No good scan may be refused; every variation class must stay within
0.15 mm mean and 0.45 mm max consistency against its person's reference scan; and so
must each of the reported cases, rebuilt on the real heads. `make bench` (registration)
prints the same figures beside the tuning set's and ANTs Rigid's.

Where the held-out set is outside those goals today, the test holds it to what was
measured (no worse than the run-to-run noise allows), and a strict expected failure
asserts the goal itself, so that the day it is met the test says so and the entry goes.
A figure within its goal in the tested realisation of the scans' noise but not in
another is held to the noise's bound too: a change within the noise lands
(docs/design.md).

A change that fails here does not land, however fast it is: the held-out set is not to
be tuned on (docs/design.md, "Registration changes are judged on the held-out set").
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from mriprep.core.errors import StageError
from mriprep.demo.calibration import preprocessed
from mriprep.demo.real_scans import HOW_TO_GET
from mriprep.demo.registration_sets import (
    CLASSES,
    REPORTED_CASES,
    consistency_scores,
    missing_sources,
    reported_case_names,
    set_cases,
)
from mriprep.stages import get_stage

CLASS_MEAN_LIMIT_MM = 0.15
CLASS_MAX_LIMIT_MM = 0.45
# The held-out set's figures that are outside a goal, or inside it in one realisation of
# the scans' noise only (2026-12-07, 0.8.0, one thread; issue 43's closing note), and the
# limit a change must stay within: the worse of two realisations, plus the most such a
# figure moved between them (docs/benchmarks.md, rows 1 and 3, their 0.8.0 figures; the
# make bench run of 0.8.1 gave 0.604 / 0.635 mm and moves of up to 0.085 mm). Missing
# slices' worst scan, colin27/sag3_defects_defaced (3 mm sagittal, defaced, a 9 mm and a 3 mm gap):
# 0.605 / 0.635 mm; started from the consistent pose, its fit converges 0.45 mm away (the
# objective, not the optimiser); a class's worst scan moved up to 0.100 mm (lesions).
# robex/ax3_defects: 0.139 / 0.218 mm mean, within the goal in the tested realisation only.
# 0.8.0's flattening within the brain brought defaced heads within the goal (0.527 to
# 0.240 / 0.200).
KNOWN_OUTSIDE_CLASS_MAX_MM = {"defects": 0.74}
NOISY_CASE_MEAN_MM = {"robex/ax3_defects": 0.30}

pytestmark = [
    pytest.mark.calibration,
    # One worker registers the whole set once (about 70 scans, 4-5 minutes of one core).
    pytest.mark.xdist_group("register_heldout"),
    pytest.mark.skipif(bool(missing_sources("heldout")),
                       reason=f"the held-out set's real scans are not here: {HOW_TO_GET}"),
]


@pytest.fixture(scope="module")
def registered():
    """Every held-out case registered: (scores by case, refusals by case)."""
    cases = set_cases("heldout")
    scans, estimates, refusals = {}, {}, {}
    for case in cases:
        scans[case.name] = scan = case.build()
        try:
            out = get_stage("register")(preprocessed(scan, case.name))
        except StageError as error:
            estimates[case.name] = None
            refusals[case.name] = error.reason
        else:
            estimates[case.name] = out.pending.template_to_subject
    scores = {s.case: s for s in consistency_scores(cases, scans, estimates)}
    return scores, refusals


def test_no_good_scan_of_the_held_out_set_is_refused(registered):
    _, refusals = registered
    assert not refusals, refusals


def _class_scores(scores, variation):
    mine = [s for s in scores.values() if s.variation == variation]
    assert len({s.person.split("@")[0] for s in mine}) >= 3, variation
    mean = sum(s.consistency_mean for s in mine) / len(mine)
    return mine, mean, max(mine, key=lambda s: s.consistency_max)


@pytest.mark.parametrize("variation", [c for c in CLASSES if c != "reference"])
def test_every_class_of_the_held_out_set_is_within_its_bounds(registered, variation):
    scores, _ = registered
    mine, mean, worst = _class_scores(scores, variation)
    assert mean <= CLASS_MEAN_LIMIT_MM, (variation, mean,
                                         {s.case: round(s.consistency_mean, 3) for s in mine})
    limit = KNOWN_OUTSIDE_CLASS_MAX_MM.get(variation, CLASS_MAX_LIMIT_MM)
    assert worst.consistency_max <= limit, (worst.case, worst.consistency_max)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="issue 43: outside the 0.45 mm goal on 2026-12-07; "
                   "when this passes, drop the class from KNOWN_OUTSIDE_CLASS_MAX_MM")
@pytest.mark.parametrize("variation", sorted(KNOWN_OUTSIDE_CLASS_MAX_MM))
def test_the_classes_outside_the_goal_reach_it(registered, variation):
    scores, _ = registered
    _, _, worst = _class_scores(scores, variation)
    assert worst.consistency_max <= CLASS_MAX_LIMIT_MM, (worst.case, worst.consistency_max)


@pytest.mark.parametrize("label", list(REPORTED_CASES))
def test_each_reported_case_on_every_real_head_is_within_the_bounds(registered, label):
    scores, refusals = registered
    outside = defaultdict(list)
    for case in reported_case_names()[label]:
        if case in refusals:
            outside[case].append(f"refused: {refusals[case]}")
            continue
        s = scores[case]
        mean_limit = NOISY_CASE_MEAN_MM.get(case, CLASS_MEAN_LIMIT_MM)
        if s.consistency_mean > mean_limit or s.consistency_max > CLASS_MAX_LIMIT_MM:
            outside[case].append(f"{s.consistency_mean:.3f} / {s.consistency_max:.3f} mm")
    assert not outside, dict(outside)
