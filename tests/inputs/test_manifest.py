"""mriprep.inputs.manifest and `mriprep manifest validate`: parsing, every problem at once, writing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mriprep.cli import main
from mriprep.core.errors import ManifestError
from mriprep.core.volume import Volume
from mriprep.inputs.manifest import (
    MAX_ID_BYTES,
    Manifest,
    ManifestRow,
    id_problems,
    read_manifest,
    validate_manifest,
    write_manifest,
)
from mriprep.inputs.readers import load_volume
from mriprep.inputs.writing import save_label, save_volume

from .conftest import template_block


def _crop(offset: int) -> Volume:
    """A 24^3 block of MNI152 anatomy; different offsets give different subjects."""
    return template_block(80 + offset, 24)


@pytest.fixture()
def cohort(tmp_path):
    """A cohort folder with three real scans (one with a label map) under images/."""
    folder = tmp_path / "cohort"
    for i, sub in enumerate(("sub-01", "sub-02", "sub-03")):
        vol = _crop(4 * i)
        save_volume(vol, folder / "images" / f"{sub}_T1w.nii.gz")
        if sub == "sub-01":
            save_label(vol, folder / "labels" / f"{sub}_dseg.nii.gz")
    return folder


def _write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


GOOD_CSV = """\
subject_id,session_id,image,label,split,age,site
sub-01,ses-1,images/sub-01_T1w.nii.gz,labels/sub-01_dseg.nii.gz,train,34,A
sub-02,,images/sub-02_T1w.nii.gz,,Val,51,B
sub-03,,images/sub-03_T1w.nii.gz,,test,28,A
"""


def test_reads_paths_relative_to_the_manifest_and_keeps_metadata(cohort, tmp_path, monkeypatch):
    path = _write(cohort / "cohort.csv", GOOD_CSV)
    monkeypatch.chdir(tmp_path)  # paths must not depend on the working directory
    manifest = read_manifest(path)

    assert isinstance(manifest, Manifest) and len(manifest) == 3
    first = manifest.rows[0]
    assert first == ManifestRow(
        row=2,
        subject_id="sub-01",
        session_id="ses-1",
        image=cohort / "images" / "sub-01_T1w.nii.gz",
        label=cohort / "labels" / "sub-01_dseg.nii.gz",
        split="train",
        metadata={"age": "34", "site": "A"},
    )
    assert manifest.rows[1].split == "val"  # split names are case-insensitive
    assert manifest.rows[1].label is None and manifest.rows[1].session_id == ""
    assert first.key == ("sub-01", "ses-1") and first.name == "sub-01/ses-1"
    assert {k: [r.subject_id for r in v] for k, v in manifest.by_split().items()} == {
        "train": ["sub-01"],
        "val": ["sub-02"],
        "test": ["sub-03"],
    }
    assert manifest.subjects() == ["sub-01", "sub-02", "sub-03"]
    assert manifest.subjects("test") == ["sub-03"]
    assert manifest.metadata_columns() == ["age", "site"]
    # The paths lead to the real scans.
    vol = load_volume(first.image, label_path=first.label, subject_id=first.subject_id)
    assert vol.shape == (24, 24, 24) and set(np.unique(vol.label)) <= {0, 1, 2}


def test_tsv_absolute_paths_and_unassigned_split(cohort, tmp_path):
    image = cohort / "images" / "sub-02_T1w.nii.gz"
    path = _write(tmp_path / "elsewhere" / "cohort.tsv", f"subject_id\timage\nsub-02\t{image}\n")
    manifest = read_manifest(path)
    assert manifest.rows[0].image == image
    assert list(manifest.by_split()) == [""]


def test_unknown_extension_is_sniffed(cohort):
    text = GOOD_CSV.replace(",", "\t")
    manifest = read_manifest(_write(cohort / "cohort.txt", text))
    assert [r.subject_id for r in manifest] == ["sub-01", "sub-02", "sub-03"]


def test_every_problem_is_reported_at_once_with_its_line(cohort):
    text = """\
subject_id,session_id,image,split
sub-01,,images/sub-01_T1w.nii.gz,train
sub-02,,images/missing_T1w.nii.gz,train
,,images/sub-02_T1w.nii.gz,val
sub-03,,images/sub-03_T1w.nii.gz,holdout
../sub-04,,images/sub-03_T1w.nii.gz,test
sub-05,ses-1,images/sub-02_T1w.nii.gz,test
sub-05,ses-1,images/sub-01_T1w.nii.gz,test
sub-06,,images,train
"""
    path = _write(cohort / "bad.csv", text)
    with pytest.raises(ManifestError) as info:
        read_manifest(path)
    problems = info.value.problems
    expected = [
        ("line 3:", "missing_T1w.nii.gz' ("),
        ("line 3:", "does not exist"),
        ("line 4:", "subject_id is empty"),
        ("line 5:", "split 'holdout' is not one of train, val, test"),
        ("line 6:", "path separator"),
        ("line 6:", "contains '..'"),
        ("line 6:", "starts with a dot"),
        ("line 9:", "'images'"),
        ("line 9:", "is not a file"),
        ("lines 7, 8:", "subject_id 'sub-05' session_id 'ses-1' appears 2 times"),
        ("lines 2, 8:", "sub-01_T1w.nii.gz is listed 2 times"),
        ("lines 4, 7:", "sub-02_T1w.nii.gz is listed 2 times"),
        ("lines 5, 6:", "sub-03_T1w.nii.gz is listed 2 times"),
        # The duplicates name their people and splits, not only lines and a path.
        ("lines 2, 8:", "(sub-01 in 'train'; sub-05/ses-1 in 'test'); so one scan is in two "
                        "splits (a leak)"),
    ]
    for where, what in expected:
        assert any(p.startswith(where) and what in p for p in problems), (where, what, problems)
    assert len(problems) == 11  # two expectations above describe one problem each
    assert str(path) in str(info.value) and "11 problem(s)" in str(info.value)
    assert validate_manifest(path) == problems


@pytest.mark.parametrize(
    "value, reason",
    [
        ("sub/01", "path separator"),
        ("sub\\01", "path separator"),
        ("..", "'..'"),
        ("sub..01", "'..'"),
        (".sub-01", "starts with a dot"),
        ("sub-01\x07", "U+0007"),
        ("sub-01\u200b", "U+200B"),  # zero-width space: invisible in a spreadsheet
        ("s" * (MAX_ID_BYTES + 1), "bytes long"),
        ("é" * (MAX_ID_BYTES // 2 + 1), "bytes long"),  # two UTF-8 bytes per character
    ],
)
def test_unsafe_ids_are_refused(value, reason):
    problems = id_problems(value)
    assert any(reason in p for p in problems), problems


@pytest.mark.parametrize("value", ["sub-01", "OAS1_0001_MR1", "s" * MAX_ID_BYTES, "sujet-é"])
def test_safe_ids_pass(value):
    assert id_problems(value) == []


def test_unsafe_session_id_is_reported(cohort):
    path = _write(
        cohort / "m.csv", "subject_id,session_id,image\nsub-01,ses/1,images/sub-01_T1w.nii.gz\n"
    )
    with pytest.raises(ManifestError, match="line 2: session_id 'ses/1' contains a path"):
        read_manifest(path)


def test_missing_required_columns_and_the_tsv_named_csv_hint(cohort):
    path = _write(cohort / "m.csv", "subject,image_path\nsub-01,images/sub-01_T1w.nii.gz\n")
    with pytest.raises(ManifestError, match="missing required column\\(s\\) subject_id, image"):
        read_manifest(path)
    tsv_as_csv = _write(cohort / "t.csv", "subject_id\timage\nsub-01\timages/sub-01_T1w.nii.gz\n")
    with pytest.raises(ManifestError, match="looks TSV-separated: name the file \\*.tsv"):
        read_manifest(tsv_as_csv)


def test_wrong_cell_count_empty_file_and_header_only(cohort):
    ragged = _write(
        cohort / "r.csv", "subject_id,image\nsub-01,images/sub-01_T1w.nii.gz,extra\n"
    )
    with pytest.raises(ManifestError, match="line 2: has 3 cells but the header has 2"):
        read_manifest(ragged)
    with pytest.raises(ManifestError, match="the file is empty") as info:
        read_manifest(_write(cohort / "e.csv", ""))
    assert "e.csv" in str(info.value)
    with pytest.raises(ManifestError, match="header but no rows"):
        read_manifest(_write(cohort / "h.csv", "subject_id,image\n"))
    with pytest.raises(ManifestError, match="does not exist"):
        read_manifest(cohort / "nope.csv")


def test_check_files_false_checks_the_table_only(cohort):
    path = _write(cohort / "m.csv", "subject_id,image\nsub-01,images/not_yet.nii.gz\n")
    assert validate_manifest(path, check_files=True) != []
    manifest = read_manifest(path, check_files=False)
    assert manifest.rows[0].image == cohort / "images" / "not_yet.nii.gz"


def test_write_manifest_round_trip_with_relative_paths(cohort):
    original = read_manifest(_write(cohort / "cohort.csv", GOOD_CSV))
    out = write_manifest(original.rows, cohort / "copy.tsv")
    lines = out.read_text().splitlines()
    assert lines[0].split("\t") == [
        "subject_id", "session_id", "image", "label", "split", "age", "site"
    ]
    assert lines[1].split("\t")[2] == "images/sub-01_T1w.nii.gz"  # relative to copy.tsv
    again = read_manifest(out)
    assert [(r.key, r.image, r.label, r.split, r.metadata) for r in again] == [
        (r.key, r.image, r.label, r.split, r.metadata) for r in original
    ]


def test_cli_validate_clean_manifest(cohort, capsys):
    path = _write(cohort / "cohort.csv", GOOD_CSV)
    assert main(["manifest", "validate", str(path), "--headers"]) == 0
    out = capsys.readouterr().out
    assert "3 row(s) (train 1, val 1, test 1), 3 subject(s)" in out
    assert "no problems found" in out


def test_cli_validate_prints_every_problem_and_exits_1(cohort, capsys):
    text = GOOD_CSV + "sub-03,,images/sub-03_T1w.nii.gz,,test,28,A\n,,images/x.nii.gz,,,1,A\n"
    path = _write(cohort / "cohort.csv", text)
    assert main(["manifest", "validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"manifest {path}: 4 problem(s)" in out
    assert "line 6: subject_id is empty" in out and "line 6: image 'images/x.nii.gz'" in out
    assert "lines 4, 5: subject_id 'sub-03' appears 2 times" in out


def test_cli_validate_headers_catches_a_label_on_another_grid(cohort, capsys):
    small = _crop(0)
    small = small.replace(
        data=small.data[:, :, :20], valid=small.valid[:, :, :20], label=small.label[:, :, :20]
    )
    save_label(small, cohort / "labels" / "sub-01_dseg.nii.gz")
    path = _write(cohort / "cohort.csv", GOOD_CSV)
    assert main(["manifest", "validate", str(path)]) == 0  # the table itself is fine
    capsys.readouterr()
    assert main(["manifest", "validate", str(path), "--headers"]) == 1
    out = capsys.readouterr().out
    assert "line 2 (sub-01/ses-1): label map" in out and "(24, 24, 20)" in out


def test_the_shipped_example_manifest_is_valid():
    repo = Path(__file__).resolve().parents[2]
    manifest = read_manifest(repo / "data_manifests" / "example.csv", check_files=False)
    assert [r.image for r in manifest][0] == repo / "demo_out" / "images" / "sub-01_T1w.nii.gz"
    assert all(r.label is not None for r in manifest)
    assert {split: len(rows) for split, rows in manifest.by_split().items()} == {
        "train": 3, "val": 1, "test": 1
    }
    assert manifest.metadata_columns() == ["voxel_size_mm", "demo_defect"]


def test_a_form_feed_inside_an_id_is_reported_on_its_own_line(cohort):
    text = (
        "subject_id,image\n"
        "sub\x0c01,images/sub-01_T1w.nii.gz\n"  # a form feed is no line end in a CSV
        "sub-02,images/sub-02_T1w.nii.gz\n"
    )
    problems = validate_manifest(_write(cohort / "m.csv", text))
    assert len(problems) == 1 and problems[0].startswith("line 2: subject_id")
    assert "U+000C" in problems[0]


# -- the header column ------------------------------------------------------------------

HEADER_CSV = """\
subject_id,image,split,Header
sub-01,images/sub-01_T1w.nii.gz,train,sform
sub-02,images/sub-02_T1w.nii.gz,val,
sub-03,images/sub-03_T1w.nii.gz,test,QFORM
"""


def test_the_header_column_chooses_a_form_per_scan(cohort):
    manifest = read_manifest(_write(cohort / "cohort.csv", HEADER_CSV))
    assert [r.header for r in manifest] == ["sform", "", "qform"]
    assert all("header" not in r.metadata and "Header" not in r.metadata for r in manifest)
    out = write_manifest(manifest.rows, cohort / "copy.csv")
    assert out.read_text().splitlines()[0].split(",")[5] == "header"
    assert [r.header for r in read_manifest(out)] == ["sform", "", "qform"]
    # A manifest without the column is written as before.
    plain = read_manifest(_write(cohort / "plain.csv", GOOD_CSV))
    assert "header" not in write_manifest(plain.rows, cohort / "plain-copy.csv").read_text()


def test_a_bad_header_value_names_the_row_and_the_value(cohort):
    (cohort / "images" / "sub-03_T1w.mgz").write_bytes(b"not read: check_files only")
    text = ("subject_id,image,header\n"
            "sub-01,images/sub-01_T1w.nii.gz,best\n"
            "sub-02,images/sub-02_T1w.nii.gz,sform\n"
            "sub-03,images/sub-03_T1w.mgz,qform\n")
    problems = validate_manifest(_write(cohort / "cohort.csv", text))
    assert len(problems) == 2
    assert problems[0].startswith("line 2: header 'best' is not one of qform, sform")
    assert "leave it empty" in problems[0]
    assert problems[1].startswith("line 4: header 'qform' is set but image")
    assert "not NIfTI" in problems[1]


def test_cli_validate_headers_reads_the_form_the_row_asks_for(cohort, capsys):
    import nibabel as nib

    image = cohort / "images" / "sub-02_T1w.nii.gz"
    img = nib.load(image)
    img.set_sform(None, code=0)  # qform only: `header: sform` cannot be served
    nib.save(img, image)
    text = "subject_id,image,header\nsub-02,images/sub-02_T1w.nii.gz,sform\n"
    path = _write(cohort / "cohort.csv", text)
    assert main(["manifest", "validate", str(path), "--headers"]) == 1
    out = capsys.readouterr().out
    assert "line 2 (sub-02)" in out and "sform_code is 0" in out and str(image) in out
