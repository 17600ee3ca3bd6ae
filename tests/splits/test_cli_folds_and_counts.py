"""`mriprep splits`: the summary counts every WARNING it printed, and --folds on a manifest
without splits deals every subject into folds (nnU-Net's habit) or names the fix."""

from __future__ import annotations

from mriprep.cli import main as cli_main
from mriprep.inputs.manifest import read_manifest
from tests.splits.manifests import CLEAN, manifest_csv


def _unsplit(lines):
    return [line.replace(",train,", ",,").replace(",val,", ",,").replace(",test,", ",,")
            for line in lines]


def test_summary_counts_the_assignment_warnings_it_printed(cohort, capsys):
    source = manifest_csv(cohort, _unsplit(CLEAN))
    out = cohort / "assigned.csv"
    status = cli_main(["splits", str(source), "--no-hash", "--assign",
                       "train=0.6,val=0.2,test=0.2", "--stratify", "site", "-o", str(out)])
    text = capsys.readouterr().out
    assert status == 0, text
    printed = sum(1 for line in text.splitlines() if line.startswith("WARNING"))
    assert printed >= 1, text
    assert f"OK: 0 error(s), {printed} warning(s)" in text


def test_folds_on_a_manifest_without_splits_cover_every_subject(cohort, capsys):
    source = manifest_csv(cohort, _unsplit(CLEAN))
    out = cohort / "folds.csv"
    status = cli_main(["splits", str(source), "--no-hash", "--folds", "5", "-o", str(out)])
    text = capsys.readouterr().out
    assert status == 0, text
    rows = read_manifest(out, check_files=False).rows
    folds = {r.subject_id: r.metadata["fold"] for r in rows}
    assert len(folds) == 5 and sorted(folds.values()) == ["1", "2", "3", "4", "5"]
    assert len({r.metadata["fold"] for r in rows if r.subject_id == "sub-01"}) == 1
    assert "5 folds of all" in text and "split-missing" not in text


def test_folds_of_a_split_too_small_names_the_fix(cohort, capsys):
    source = manifest_csv(cohort, CLEAN)  # train holds 3 subjects
    out = cohort / "folds.csv"
    assert cli_main(["splits", str(source), "--no-hash", "--folds", "5", "-o",
                     str(out)]) == 2
    err = capsys.readouterr().err
    assert "split 'train'" in err and "3 subject(s)" in err
    assert "--folds-of all" in err and "--assign" in err and not out.exists()
    # --folds-of still chooses the split; 'all' deals every subject even with splits.
    assert cli_main(["splits", str(source), "--no-hash", "--folds", "5", "--folds-of",
                     "all", "-o", str(out)]) == 0
    assert {r.metadata["fold"] for r in read_manifest(out, check_files=False).rows} == \
        {"1", "2", "3", "4", "5"}
