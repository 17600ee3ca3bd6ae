"""Tests of mriprep.splits.assignment: splits drawn per subject, deterministic, stable as
the cohort grows, optionally stratified; and the fractions they are drawn to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mriprep.inputs.manifest import ManifestRow, read_manifest, write_manifest
from mriprep.splits.assignment import assign_folds, assign_splits, parse_fractions
from tests.splits.manifests import CLEAN, manifest_csv


def _rows(
    n: int, start: int = 0, sessions: int = 1, site=lambda i: "AB"[i % 2]
) -> list[ManifestRow]:
    return [
        ManifestRow(
            row=2 + i * sessions + s,
            subject_id=f"sub-{i:04d}",
            session_id=f"ses-{s}" if sessions > 1 else "",
            image=Path(f"/data/sub-{i:04d}_ses-{s}.nii.gz"),
            metadata={"site": site(i)},
        )
        for i in range(start, start + n)
        for s in range(sessions)
    ]


FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


def test_assignment_is_per_subject_deterministic_and_proportional():
    rows = _rows(1000, sessions=2)
    first = assign_splits(rows, FRACTIONS, seed=3)
    again = assign_splits(rows, FRACTIONS, seed=3)
    assert [r.split for r in first.rows] == [r.split for r in again.rows]
    by_subject = {}
    for row in first.rows:
        by_subject.setdefault(row.subject_id, set()).add(row.split)
    assert all(len(s) == 1 for s in by_subject.values())  # never split a subject
    counts = {s: sum(1 for v in by_subject.values() if v == {s}) for s in FRACTIONS}
    assert counts == {"train": 800, "val": 100, "test": 100} == first.targets
    other_seed = assign_splits(rows, FRACTIONS, seed=4)
    assert [r.split for r in other_seed.rows] != [r.split for r in first.rows]
    assert first.assigned == 1000 and first.kept == 0


def test_adding_subjects_moves_no_existing_one_and_fills_the_grown_quotas():
    before = assign_splits(_rows(400), FRACTIONS, seed=1).rows
    grown = assign_splits(before + _rows(150, start=400), FRACTIONS, seed=1)
    assert grown.kept == 400 and grown.assigned == 150
    assert [r.split for r in grown.rows[:400]] == [r.split for r in before]
    counts = {s: sum(r.split == s for r in grown.rows) for s in FRACTIONS}
    assert counts == {"train": 440, "val": 55, "test": 55}


@pytest.mark.parametrize("n", [5, 7, 10, 100])
@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("stratify", [None, "site"])
@pytest.mark.parametrize("spec", ["train=0.6,val=0.2,test=0.2", "train=0.8,val=0.1,test=0.1"])
def test_quotas_are_met_to_within_one_subject_and_no_split_is_empty(n, seed, stratify, spec):
    fractions = parse_fractions(spec)
    result = assign_splits(_rows(n, sessions=2, site=lambda i: "ABC"[i % 3]), fractions,
                           seed=seed, stratify=stratify)
    subjects = {r.subject_id: r.split for r in result.rows}
    for split, fraction in fractions.items():
        count = sum(v == split for v in subjects.values())
        assert abs(count - fraction * n) <= 1 + 1e-9, (split, count, n)
        assert count >= 1, (split, subjects)
    if stratify:
        for site, counts in result.strata.items():
            size = sum(counts.values())
            # Each stratum as close as whole subjects allow, with the totals kept exact.
            assert all(abs(counts[k] - f * size) < 1.5 for k, f in fractions.items()), counts


def test_a_split_given_no_share_stays_empty_and_a_tiny_stratum_is_named():
    result = assign_splits(_rows(6, site=lambda i: "A" if i < 5 else "B"),
                           {"train": 0.5, "val": 0.5, "test": 0.0}, stratify="site")
    assert {r.split for r in result.rows} == {"train", "val"}
    assert any("site 'B' has 1 subject(s), too few for all 2 splits" in n
               for n in result.notes), result.notes


def test_stratified_assignment_balances_each_stratum_and_keeps_existing():
    sites = lambda i: "ABBCCC"[i % 6]  # noqa: E731 - strata of 1/6, 2/6, 3/6
    rows = _rows(600, site=sites)
    result = assign_splits(rows, FRACTIONS, seed=0, stratify="site")
    for site, counts in result.strata.items():
        total = sum(counts.values())
        for split, fraction in FRACTIONS.items():
            assert abs(counts[split] - fraction * total) <= 1, (site, counts)
    # new subjects added to the assigned manifest: existing splits are kept
    grown = result.rows + _rows(60, start=600, site=sites)
    regrown = assign_splits(grown, FRACTIONS, seed=0, stratify="site")
    assert regrown.kept == 600 and regrown.assigned == 60
    assert [r.split for r in regrown.rows[:600]] == [r.split for r in result.rows]
    for counts in regrown.strata.values():
        total = sum(counts.values())
        assert abs(counts["train"] - 0.8 * total) <= 1


def test_conflicting_existing_splits_need_reassign():
    rows = _rows(3, sessions=2)
    rows = [r if r.row != 3 else ManifestRow(**{**r.__dict__, "split": "test"}) for r in rows]
    rows = [r if r.row != 2 else ManifestRow(**{**r.__dict__, "split": "train"}) for r in rows]
    with pytest.raises(ValueError, match="sub-0000 \\(test, train\\).*reassign=True"):
        assign_splits(rows, FRACTIONS)
    fixed = assign_splits(rows, FRACTIONS, reassign=True)
    assert len({r.split for r in fixed.rows if r.subject_id == "sub-0000"}) == 1


def test_stratify_needs_an_existing_column():
    with pytest.raises(ValueError, match="no such column.*site"):
        assign_splits(_rows(5), FRACTIONS, stratify="scanner")


@pytest.mark.parametrize(
    "text, message",
    [
        ("train=0.8,val=0.1", "sum to 0.9"),
        ("train=0.8,dev=0.2", "'dev' is not one of"),
        ("train=0.8,train=0.2", "given twice"),
        ("train=1.2,val=-0.2", "outside"),
        ("train", "not name=fraction"),
        ("train=x,val=1", "not a number"),
    ],
)
def test_bad_fractions_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_fractions(text)


def test_written_manifest_round_trips_metadata(cohort):
    rows = assign_splits(
        read_manifest(manifest_csv(cohort, CLEAN)).rows, FRACTIONS, reassign=True
    ).rows
    path = write_manifest(rows, cohort / "rt.csv")
    assert [r.metadata["site"] for r in read_manifest(path).rows] == [
        r.metadata["site"] for r in rows
    ]


# -- K-fold ------------------------------------------------------------------------------


def _folds_of(result) -> dict[str, str]:
    folds = {}
    for row in result.rows:
        folds.setdefault(row.subject_id, set()).add(row.metadata["fold"])
    assert all(len(f) == 1 for f in folds.values())  # a subject is in one fold
    return {s: f.pop() for s, f in folds.items()}


def test_folds_are_disjoint_by_subject_balanced_and_stratified():
    rows = assign_splits(_rows(100, sessions=2, site=lambda i: "ABBC"[i % 4]), FRACTIONS,
                         seed=0).rows
    result = assign_folds(rows, 5, seed=0, stratify="site")
    folds = _folds_of(result)
    train = {r.subject_id for r in rows if r.split == "train"}
    assert {s for s, f in folds.items() if f} == train  # folds among the training subjects
    assert all(folds[s] == "" for s in folds if s not in train)
    sizes = sorted(result.sizes.values())
    assert sum(sizes) == 80 and sizes[-1] - sizes[0] <= 2  # StratifiedGroupKFold: 15-17
    for site, counts in result.strata.items():
        assert max(counts.values()) - min(counts.values()) <= 1, (site, counts)
    again = assign_folds(rows, 5, seed=0, stratify="site")
    assert [r.metadata["fold"] for r in again.rows] == [r.metadata["fold"] for r in result.rows]
    other = assign_folds(rows, 5, seed=1, stratify="site")
    assert [r.metadata["fold"] for r in other.rows] != [r.metadata["fold"] for r in result.rows]


def test_new_subjects_join_the_folds_without_moving_anyone():
    first = assign_folds(_rows(20), 4, seed=2, within=None)
    grown = assign_folds(first.rows + _rows(6, start=20), 4, seed=2, within=None)
    assert grown.kept == 20 and grown.assigned == 6
    assert [r.metadata["fold"] for r in grown.rows[:20]] == [
        r.metadata["fold"] for r in first.rows]
    assert sorted(grown.sizes.values()) == [6, 6, 7, 7]


def test_fold_requests_that_cannot_be_met_are_refused():
    with pytest.raises(ValueError, match="at least 2 folds"):
        assign_folds(_rows(5), 1, within=None)
    with pytest.raises(ValueError, match="3 subject\\(s\\), fewer than the 5 folds"):
        assign_folds(_rows(3), 5, within=None)
