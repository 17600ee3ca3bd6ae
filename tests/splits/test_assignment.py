"""Tests of mriprep.splits.assignment: splits drawn per subject, deterministic, stable as
the cohort grows, optionally stratified; and the fractions they are drawn to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mriprep.inputs.manifest import ManifestRow, read_manifest, write_manifest
from mriprep.splits.assignment import assign_splits, parse_fractions
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
    assert counts["train"] == pytest.approx(800, abs=60)
    assert counts["val"] == pytest.approx(100, abs=35) and counts["test"] == pytest.approx(
        100, abs=35
    )
    other_seed = assign_splits(rows, FRACTIONS, seed=4)
    assert [r.split for r in other_seed.rows] != [r.split for r in first.rows]
    assert first.assigned == 1000 and first.kept == 0


def test_adding_subjects_moves_no_existing_one():
    before = {r.subject_id: r.split for r in assign_splits(_rows(400), FRACTIONS, seed=1).rows}
    # re-drawing the grown cohort from scratch: the old subjects keep their split
    grown = assign_splits(_rows(400) + _rows(150, start=400), FRACTIONS, seed=1, reassign=True)
    after = {r.subject_id: r.split for r in grown.rows}
    assert all(after[s] == split for s, split in before.items())


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
    with pytest.raises(ValueError, match="sub-0000 \\(test, train\\).*--reassign"):
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
