"""Tests of `mriprep splits`: exit codes, writing an assigned manifest, and refusing to
write one that leaks.

Manifests point at real NIfTI scans cut from the MNI152 template.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mriprep.cli import main as cli_main
from mriprep.inputs.manifest import read_manifest
from mriprep.splits.assignment import assign_splits, parse_fractions
from tests.splits.manifests import CLEAN, manifest_csv


def test_cli_check_exit_codes(cohort, capsys):
    clean = manifest_csv(cohort, CLEAN)
    assert cli_main(["splits", str(clean)]) == 0
    assert "OK: 0 error(s)" in capsys.readouterr().out
    leaky = manifest_csv(
        cohort, CLEAN[:1] + ["sub-01,ses-2,images/sub-02.nii,val,A"] + CLEAN[2:], "leaky.csv"
    )
    assert cli_main(["splits", str(leaky), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and [f["code"] for f in doc["findings"]] == ["subject-split-leak"]
    assert cli_main(["splits", str(cohort / "nope.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_assign_writes_a_manifest_and_refuses_to_overwrite(cohort, capsys):
    lines = [
        line.replace(",train,", ",,").replace(",val,", ",,").replace(",test,", ",,")
        for line in CLEAN
    ]
    source = manifest_csv(cohort, lines)
    out = cohort / "assigned.csv"
    argv = [
        "splits",
        str(source),
        "--assign",
        "train=0.6,val=0.2,test=0.2",
        "--seed",
        "5",
        "-o",
        str(out),
    ]
    assert cli_main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assigned = read_manifest(out)
    assert all(r.split for r in assigned.rows)
    assert len({r.split for r in assigned.rows if r.subject_id == "sub-01"}) == 1
    expected = assign_splits(
        read_manifest(source).rows, parse_fractions("train=0.6,val=0.2,test=0.2"), "5"
    )
    assert [r.split for r in assigned.rows] == [r.split for r in expected.rows]
    assert cli_main(argv) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert cli_main(argv + ["--force", "--stratify", "site"]) == 0
    assert "site" in capsys.readouterr().out


def test_cli_assign_usage_errors(cohort, capsys):
    source = manifest_csv(cohort, CLEAN)
    out = str(cohort / "o.csv")
    assert cli_main(["splits", str(source), "--assign", "train=0.5,val=0.1", "-o", out]) == 2
    assert "sum to 0.6" in capsys.readouterr().err
    assert cli_main(["splits", str(source), "--assign", "train=0.8,val=0.2"]) == 2
    assert "needs -o" in capsys.readouterr().err
    assert cli_main(["splits", str(source), "-o", out]) == 2
    assert (
        cli_main(["splits", str(source), "--assign", "train=1", "--stratify", "scanner", "-o", out])
        == 2
    )
    assert "'scanner' is not a column" in capsys.readouterr().err
    assert not Path(out).exists()


def test_cli_assign_refuses_to_write_a_leaking_manifest(cohort, capsys):
    shutil.copy(cohort / "images" / "sub-03.nii", cohort / "images" / "copy.nii")
    source = manifest_csv(cohort, CLEAN + ["sub-09,,images/copy.nii,,B"])
    out = cohort / "o.csv"
    assert (
        cli_main(
            ["splits", str(source), "--assign", "train=0.5,val=0.25,test=0.25", "-o", str(out)]
        )
        == 1
    )
    text = capsys.readouterr().out
    assert "nothing written" in text and not out.exists()
    assert "duplicate-input" in text


def test_cli_assigns_exact_splits_and_folds_and_prints_them(cohort, capsys):
    from mriprep.inputs.manifest import read_manifest

    source = manifest_csv(cohort, CLEAN)
    out = cohort / "folds.csv"
    status = cli_main(["splits", str(source), "--no-hash", "--reassign", "--assign",
                       "train=0.5,test=0.5", "--folds", "2", "-o", str(out)])
    text = capsys.readouterr().out
    assert status == 0, text
    rows = read_manifest(out, check_files=False).rows
    subjects = {r.subject_id: (r.split, r.metadata["fold"]) for r in rows}
    train = [s for s, (split, _) in subjects.items() if split == "train"]
    test = [s for s, (split, _) in subjects.items() if split == "test"]
    assert abs(len(train) - len(test)) <= 1
    assert {subjects[s][1] for s in train} == {"1", "2"}
    assert all(subjects[s][1] == "" for s in test)
    assert "asked" in text and "2 folds of train (column 'fold')" in text
    with pytest.raises(SystemExit):
        cli_main(["splits", str(source), "--folds", "x", "-o", str(out)])
    assert cli_main(["splits", str(source), "--no-hash", "--folds", "2"]) == 2
    assert "--folds needs -o" in capsys.readouterr().err
