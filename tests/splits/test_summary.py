"""Tests of mriprep.splits.summary: ``mriprep splits``'s work without its command line.

An assignment is made and checked without writing anything, and its result renders the
same way as JSON and as text (the command's own output is tested in test_cli*.py)."""

from __future__ import annotations

import pytest

from mriprep.inputs.manifest import read_manifest
from mriprep.splits import check_manifest_splits
from mriprep.splits.summary import (
    SplitsSummary,
    assign_and_check,
    assigned_rows,
    default_folds_of,
)
from tests.splits.manifests import CLEAN, manifest_csv


def unassigned(lines: list[str]) -> list[str]:
    """The manifest lines with their split column emptied."""
    return [",".join(line.split(",")[:3] + ["", line.split(",")[4]]) for line in lines]


def test_an_assignment_is_checked_and_nothing_is_written(cohort):
    manifest = read_manifest(manifest_csv(cohort, unassigned(CLEAN)))
    before = sorted(p.name for p in cohort.iterdir())
    summary = assign_and_check(manifest, fractions={"train": 0.6, "val": 0.2, "test": 0.2},
                               seed="7", output=cohort / "out.csv")
    assert sorted(p.name for p in cohort.iterdir()) == before
    assert summary.report.ok and summary.written is None and summary.folds is None
    assert summary.report.manifest == str(manifest.path)
    assert {s: c["subjects"] for s, c in summary.report.splits.items()} == {
        "test": 1, "train": 3, "val": 1}
    rows = assigned_rows(summary)
    assert len(rows) == len(CLEAN) and all(r.split for r in rows)
    doc = summary.to_json()
    assert doc["assignment"]["fractions"] == {"train": 0.6, "val": 0.2, "test": 0.2}
    assert doc["assignment"]["seed"] == "7" and doc["output"] is None
    text = summary.render()
    assert "assigned 5 subject(s) in the order of their hash (seed 7)" in text
    assert text.endswith("\nOK: 0 error(s), 0 warning(s)")  # and no line on writing
    summary.written = cohort / "out.csv"
    assert summary.render().endswith(f"OK: 0 error(s), 0 warning(s)\nwrote {cohort / 'out.csv'}")
    assert summary.to_json()["output"] == str(cohort / "out.csv")


def test_folds_of_a_manifest_without_splits_stand_in_for_them(cohort):
    manifest = read_manifest(manifest_csv(cohort, unassigned(CLEAN)))
    assert default_folds_of(manifest.rows, assigning_splits=False) == "all"
    assert default_folds_of(manifest.rows, assigning_splits=True) == "train"
    summary = assign_and_check(manifest, folds=2, output=cohort / "out.csv")
    # no split-missing error: the folds, over every subject, are the splits
    assert summary.report.ok and summary.folds_of == "all" and summary.assignment is None
    assert sorted(summary.folds.sizes.values()) == [2, 3]
    assert summary.to_json()["folds"]["of"] == "all" and "assignment" not in summary.to_json()


def test_a_plain_check_renders_without_assignment_lines(cohort):
    lines = CLEAN[:1] + ["sub-01,ses-2,images/sub-02.nii,test,A"] + CLEAN[2:]
    summary = SplitsSummary(check_manifest_splits(read_manifest(manifest_csv(cohort, lines))))
    doc = summary.to_json()
    assert not summary.assigning and "output" not in doc and doc["errors"] == 1
    text = summary.render().splitlines()
    assert text[-1] == "FAILED: 1 error(s), 0 warning(s)"
    assert any(line.startswith("ERROR   subject-split-leak  subject sub-01") for line in text)
    with pytest.raises(ValueError, match="nothing was assigned"):
        assigned_rows(summary)
