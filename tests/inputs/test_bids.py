"""mriprep.inputs.bids and `mriprep manifest from-bids`: a BIDS folder becomes a valid manifest."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.cli import main
from mriprep.core.errors import InputError
from mriprep.core.volume import Volume
from mriprep.inputs.bids import manifest_from_bids
from mriprep.inputs.manifest import read_manifest
from mriprep.inputs.readers import load_volume
from mriprep.inputs.writing import save_label, save_volume

from .conftest import template_block


def _scan(offset: int) -> Volume:
    """A 20^3 block of MNI152 anatomy with a 3-class label map."""
    return template_block(85 + offset, 20)


# (relative path, offset of the anatomy) for every T1w in the dataset
T1W_FILES = [
    ("sub-01/anat/sub-01_T1w.nii.gz", 0),
    ("sub-02/ses-1/anat/sub-02_ses-1_T1w.nii.gz", 2),
    ("sub-02/ses-2/anat/sub-02_ses-2_T1w.nii", 4),
    ("sub-03/anat/sub-03_run-1_T1w.nii.gz", 6),
    ("sub-03/anat/sub-03_run-2_T1w.nii.gz", 8),
]


@pytest.fixture()
def bids(tmp_path):
    root = tmp_path / "ds"
    for relative, offset in T1W_FILES:
        save_volume(_scan(offset), root / relative)
    # Files that are not T1w images must be ignored.
    save_volume(_scan(10), root / "sub-01/anat/sub-01_T2w.nii.gz")
    (root / "sub-01/anat/sub-01_T1w.json").write_text('{"RepetitionTime": 2.3}')
    (root / "participants.tsv").write_text("participant_id\nsub-01\nsub-02\nsub-03\n")
    # A label map for sub-01 only, in a derivatives pipeline folder.
    save_label(_scan(0), root / "derivatives/labels/sub-01/anat/sub-01_dseg.nii.gz")
    return root


def test_rows_are_sorted_with_subject_session_and_entities(bids):
    rows = manifest_from_bids(bids)
    assert [(r.subject_id, r.session_id) for r in rows] == [
        ("sub-01", ""),
        ("sub-02", "ses-1"),
        ("sub-02", "ses-2"),
        ("sub-03", "run-1"),  # two T1w in one session: their entities tell them apart
        ("sub-03", "run-2"),
    ]
    assert [r.image for r in rows] == [bids / rel for rel, _ in T1W_FILES]
    assert [r.row for r in rows] == [2, 3, 4, 5, 6]
    assert rows[1].metadata == {"bids_entities": "sub-02_ses-1"}
    assert all(r.label is None and r.split == "" for r in rows)
    assert manifest_from_bids(bids) == rows  # deterministic


def test_labels_from_a_derivatives_folder(bids):
    rows = manifest_from_bids(bids, labels="labels")
    assert rows[0].label == bids / "derivatives/labels/sub-01/anat/sub-01_dseg.nii.gz"
    assert all(r.label is None for r in rows[1:])
    vol = load_volume(rows[0].image, label_path=rows[0].label)
    np.testing.assert_array_equal(vol.label, _scan(0).label)


def test_a_broken_symlink_is_kept_so_validation_reports_it(bids, tmp_path):
    link = bids / "sub-04/anat/sub-04_T1w.nii.gz"
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path / "annex" / "not-fetched")
    rows = manifest_from_bids(bids)
    assert rows[-1].subject_id == "sub-04" and rows[-1].image == link


def test_not_a_bids_folder(tmp_path):
    with pytest.raises(InputError, match="does not exist") as info:
        manifest_from_bids(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value)
    with pytest.raises(InputError, match="no sub-\\* folders"):
        manifest_from_bids(tmp_path)
    save_volume(_scan(0), tmp_path / "sub-01/anat/sub-01_T2w.nii.gz")
    with pytest.raises(InputError, match="no T1w image found") as info:
        manifest_from_bids(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_cli_from_bids_writes_a_valid_relative_manifest(bids, tmp_path, capsys):
    out = tmp_path / "cohort.csv"
    assert main(["manifest", "from-bids", str(bids), "-o", str(out), "--labels", "labels"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}: 5 row(s), 3 subject(s) (unassigned 5), 1 with a label map" in printed
    lines = out.read_text().splitlines()
    assert lines[0] == "subject_id,session_id,image,label,split,bids_entities"
    assert lines[1] == (
        "sub-01,,ds/sub-01/anat/sub-01_T1w.nii.gz,"
        "ds/derivatives/labels/sub-01/anat/sub-01_dseg.nii.gz,,sub-01"
    )
    manifest = read_manifest(out)
    assert [r.image for r in manifest] == [bids / rel for rel, _ in T1W_FILES]
    assert main(["manifest", "validate", str(out), "--headers"]) == 0
    # Outside the manifest's folder, paths are written absolute.
    elsewhere = tmp_path / "manifests" / "cohort.tsv"
    assert main(["manifest", "from-bids", str(bids), "-o", str(elsewhere)]) == 0
    assert elsewhere.read_text().splitlines()[1].split("\t")[2] == str(bids / T1W_FILES[0][0])


def test_cli_from_bids_refuses_to_overwrite_without_force(bids, tmp_path, capsys):
    out = tmp_path / "cohort.csv"
    out.write_text("keep me\n")
    assert main(["manifest", "from-bids", str(bids), "-o", str(out)]) == 2
    assert str(out) in capsys.readouterr().err and out.read_text() == "keep me\n"
    assert main(["manifest", "from-bids", str(bids), "-o", str(out), "--force"]) == 0
    assert len(read_manifest(out)) == 5


def test_cli_from_bids_reports_an_unfetched_file(bids, tmp_path, capsys):
    link = bids / "sub-04/anat/sub-04_T1w.nii.gz"
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path / "annex" / "not-fetched")
    out = tmp_path / "cohort.csv"
    assert main(["manifest", "from-bids", str(bids), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "line 7: image" in err and "sub-04_T1w.nii.gz" in err and "does not exist" in err


def test_cli_from_bids_on_a_missing_folder_is_a_clean_error(tmp_path, capsys):
    code = main(["manifest", "from-bids", str(tmp_path / "nope"), "-o", str(tmp_path / "m.csv")])
    assert code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "nope" in err and "Traceback" not in err
