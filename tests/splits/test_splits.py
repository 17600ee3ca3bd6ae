"""Tests of mriprep.splits and `mriprep splits`: leak checks on manifests, assignment by
subject, and the near-duplicate search shared with `mriprep check`.

Manifests point at real NIfTI scans cut from the MNI152 template.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mriprep import splits as sp
from mriprep.cli import main as cli_main
from mriprep.inputs.io import save_volume
from mriprep.inputs.manifest import ManifestRow, read_manifest, write_manifest
from mriprep.inputs.templates import load_template
from mriprep.core.volume import Volume

HEADER = "subject_id,session_id,image,split,site\n"


def _scan(offset: int) -> Volume:
    """A 20^3 block of MNI152 anatomy; each offset is a different 'subject'."""
    template = load_template("mni152")
    box = tuple(slice(70 + offset, 90 + offset) for _ in range(3))
    shift = np.eye(4)
    shift[:3, 3] = 70 + offset
    return Volume.from_array(np.ascontiguousarray(template.data[box]), template.affine @ shift)


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    """Eight uncompressed scans of equal size (so every file must be hashed)."""
    folder = tmp_path_factory.mktemp("cohort")
    for i in range(1, 9):
        save_volume(_scan(3 * i), folder / "images" / f"sub-0{i}.nii")
    return folder


def _manifest(folder: Path, lines: list[str], name: str = "cohort.csv") -> Path:
    path = folder / name
    path.write_text(HEADER + "".join(line + "\n" for line in lines))
    return path


CLEAN = [
    "sub-01,ses-1,images/sub-01.nii,train,A",
    "sub-01,ses-2,images/sub-02.nii,train,A",
    "sub-03,,images/sub-03.nii,train,B",
    "sub-04,,images/sub-04.nii,train,B",
    "sub-05,,images/sub-05.nii,val,A",
    "sub-06,,images/sub-06.nii,test,B",
]


@pytest.fixture
def cohort(scans, tmp_path):
    """A private copy of the scans, so a test can add files next to them."""
    folder = tmp_path / "cohort"
    shutil.copytree(scans, folder)
    return folder


# -- checks on a manifest --------------------------------------------------------------


def test_clean_manifest_passes(cohort):
    report = sp.check_manifest_splits(read_manifest(_manifest(cohort, CLEAN)))
    assert report.ok and report.findings == []
    assert report.splits == {
        "test": {"subjects": 1, "scans": 1},
        "train": {"subjects": 3, "scans": 4},
        "val": {"subjects": 1, "scans": 1},
    }
    assert report.files_hashed == 6  # all files have one size: all were hashed


def test_sessions_of_one_subject_in_two_splits(cohort):
    lines = CLEAN[:1] + ["sub-01,ses-2,images/sub-02.nii,test,A"] + CLEAN[2:]
    report = sp.check_manifest_splits(read_manifest(_manifest(cohort, lines)))
    [finding] = report.errors
    assert finding.code == "subject-split-leak"
    assert finding.subjects == ("sub-01",) and finding.keys == ("line 2", "line 3")
    assert "test: ses-2" in finding.message and "train: ses-1" in finding.message


def test_identical_image_under_two_ids_in_two_splits(cohort):
    shutil.copy(cohort / "images" / "sub-03.nii", cohort / "images" / "renamed.nii")
    lines = CLEAN + ["sub-07,,images/renamed.nii,test,A"]
    report = sp.check_manifest_splits(read_manifest(_manifest(cohort, lines)))
    [finding] = report.errors
    assert finding.code == "duplicate-input"
    assert set(finding.subjects) == {"sub-03", "sub-07"}
    assert set(finding.keys) == {"line 4", "line 8"}
    assert "(train)" in finding.message and "(test)" in finding.message


def test_only_files_of_equal_size_are_hashed(cohort):
    small = _scan(30)
    save_volume(Volume.from_array(small.data[:10], small.affine), cohort / "images" / "small.nii")
    lines = CLEAN + ["sub-07,,images/small.nii,test,A"]
    report = sp.check_manifest_splits(read_manifest(_manifest(cohort, lines)))
    assert report.ok and report.files_hashed == 6


def test_unassigned_rows_are_reported(cohort):
    lines = CLEAN[:4] + ["sub-05,,images/sub-05.nii,,A", "sub-06,,images/sub-06.nii,,B"]
    report = sp.check_manifest_splits(read_manifest(_manifest(cohort, lines)), hash_files=False)
    [finding] = report.errors
    assert finding.code == "split-missing" and finding.keys == ("line 6", "line 7")
    assert "--assign" in finding.message and report.files_hashed == 0


# -- assignment ------------------------------------------------------------------------


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
    first = sp.assign_splits(rows, FRACTIONS, seed=3)
    again = sp.assign_splits(rows, FRACTIONS, seed=3)
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
    other_seed = sp.assign_splits(rows, FRACTIONS, seed=4)
    assert [r.split for r in other_seed.rows] != [r.split for r in first.rows]
    assert first.assigned == 1000 and first.kept == 0


def test_adding_subjects_moves_no_existing_one():
    before = {r.subject_id: r.split for r in sp.assign_splits(_rows(400), FRACTIONS, seed=1).rows}
    # re-drawing the grown cohort from scratch: the old subjects keep their split
    grown = sp.assign_splits(_rows(400) + _rows(150, start=400), FRACTIONS, seed=1, reassign=True)
    after = {r.subject_id: r.split for r in grown.rows}
    assert all(after[s] == split for s, split in before.items())


def test_stratified_assignment_balances_each_stratum_and_keeps_existing():
    sites = lambda i: "ABBCCC"[i % 6]  # noqa: E731 - strata of 1/6, 2/6, 3/6
    rows = _rows(600, site=sites)
    result = sp.assign_splits(rows, FRACTIONS, seed=0, stratify="site")
    for site, counts in result.strata.items():
        total = sum(counts.values())
        for split, fraction in FRACTIONS.items():
            assert abs(counts[split] - fraction * total) <= 1, (site, counts)
    # new subjects added to the assigned manifest: existing splits are kept
    grown = result.rows + _rows(60, start=600, site=sites)
    regrown = sp.assign_splits(grown, FRACTIONS, seed=0, stratify="site")
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
        sp.assign_splits(rows, FRACTIONS)
    fixed = sp.assign_splits(rows, FRACTIONS, reassign=True)
    assert len({r.split for r in fixed.rows if r.subject_id == "sub-0000"}) == 1


def test_stratify_needs_an_existing_column():
    with pytest.raises(ValueError, match="no such column.*site"):
        sp.assign_splits(_rows(5), FRACTIONS, stratify="scanner")


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
        sp.parse_fractions(text)


# -- near-duplicate search -------------------------------------------------------------


@pytest.fixture(scope="module")
def cohort_fingerprints():
    """Fingerprints of 3000 distinct synthetic subjects with 30 planted near-duplicates.

    Each is the template's 8x8x8 block means plus a per-subject low-rank deviation.
    """
    data = load_template("mni152").data
    base = data
    for axis, n in enumerate(data.shape):
        base = np.add.reduceat(base, np.linspace(0, n, 9)[:-1].round().astype(int), axis=axis)
    base = base.ravel().astype(np.float64)
    rng = np.random.default_rng(7)
    n = 3000
    modes = rng.standard_normal((40, base.size))
    prints = (
        base + (rng.standard_normal((n, 40)) @ modes) * 2.0 + rng.standard_normal((n, base.size))
    )
    planted = [(i, n - 1 - i) for i in range(30)]
    for i, j in planted:
        prints[j] = prints[i] + 0.5 * rng.standard_normal(base.size)
    return prints, planted


def test_exact_and_lsh_searches_find_the_same_pairs(cohort_fingerprints):
    prints, planted = cohort_fingerprints
    exact_info, lsh_info = {}, {}
    exact = sp.find_near_duplicates(prints, 0.95, method="exact", info=exact_info)
    lsh = sp.find_near_duplicates(prints, 0.95, method="lsh", info=lsh_info)
    assert {(i, j) for i, j, _ in exact} == set(planted)
    assert [(i, j) for i, j, _ in lsh] == [(i, j) for i, j, _ in exact]
    assert [c for *_, c in lsh] == pytest.approx([c for *_, c in exact], abs=1e-5)
    # LSH computed the correlation of a tiny fraction of the 4.5 million pairs
    assert exact_info["pairs_compared"] == 3000 * 2999 // 2
    assert lsh_info["pairs_compared"] < 1000 and lsh_info["method"] == "lsh"


def test_raw_anatomy_alone_is_not_a_duplicate(cohort_fingerprints):
    """Without the cohort centring every registered brain would correlate above 0.95."""
    prints, _ = cohort_fingerprints
    raw = np.corrcoef(prints[:2])[0, 1]
    assert raw > 0.95
    assert sp.find_near_duplicates(prints[:200], 0.95) == []


def test_near_duplicate_arguments_are_validated():
    with pytest.raises(ValueError, match="threshold must be in"):
        sp.find_near_duplicates(np.ones((4, 8)), 1.5)
    with pytest.raises(ValueError, match="unknown near-duplicate method 'fast'"):
        sp.find_near_duplicates(
            np.random.default_rng(0).standard_normal((4, 8)), 0.9, method="fast"
        )


# -- command line ----------------------------------------------------------------------


def test_cli_check_exit_codes(cohort, capsys):
    clean = _manifest(cohort, CLEAN)
    assert cli_main(["splits", str(clean)]) == 0
    assert "OK: 0 error(s)" in capsys.readouterr().out
    leaky = _manifest(
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
    source = _manifest(cohort, lines)
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
    expected = sp.assign_splits(
        read_manifest(source).rows, sp.parse_fractions("train=0.6,val=0.2,test=0.2"), "5"
    )
    assert [r.split for r in assigned.rows] == [r.split for r in expected.rows]
    assert cli_main(argv) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert cli_main(argv + ["--force", "--stratify", "site"]) == 0
    assert "site" in capsys.readouterr().out


def test_cli_assign_usage_errors(cohort, capsys):
    source = _manifest(cohort, CLEAN)
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
    source = _manifest(cohort, CLEAN + ["sub-09,,images/copy.nii,,B"])
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


def test_written_manifest_round_trips_metadata(cohort):
    rows = sp.assign_splits(
        read_manifest(_manifest(cohort, CLEAN)).rows, FRACTIONS, reassign=True
    ).rows
    path = write_manifest(rows, cohort / "rt.csv")
    assert [r.metadata["site"] for r in read_manifest(path).rows] == [
        r.metadata["site"] for r in rows
    ]
