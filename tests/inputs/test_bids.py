"""mriprep.inputs.bids and `mriprep manifest from-bids`: a BIDS folder becomes a valid manifest."""

from __future__ import annotations

import zlib

import nibabel as nib
import numpy as np
import pytest

from mriprep.cli import main
from mriprep.core.errors import InputError
from mriprep.core.volume import Volume
from mriprep.inputs.bids import manifest_from_bids
from mriprep.inputs.labels import check_same_grid
from mriprep.inputs.manifest import read_manifest, validate_manifest, write_manifest
from mriprep.inputs.readers import load_volume, read_header
from mriprep.inputs.writing import save_label, save_volume
from mriprep.splits import assign_splits

from .conftest import template_block

DESCRIPTION = '{"Name": "test", "BIDSVersion": "1.9.0"}'
# FreeSurfer's conformed grid (LIA, centred), what FastSurfer's outputs lie on: 8^3 here.
CONFORMED = np.array([[-1.0, 0, 0, 4], [0, 0, 1, -4], [0, -1, 0, 4], [0, 0, 0, 1]])


def _describe(root, text=DESCRIPTION):
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_description.json").write_text(text)


def _tiny(path, affine=None, label=False):
    """An 8^3 NIfTI or MGZ (by suffix), float anatomy or an integer label map."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(zlib.crc32(str(path).encode()))  # every file its own content
    data = rng.integers(0, 4, (8, 8, 8)).astype(np.int32) if label else rng.random((8, 8, 8))
    data = data.astype(np.int32 if label else np.float32)
    affine = np.diag([1.2, 1.2, 1.2, 1.0]) if affine is None else affine
    kind = nib.MGHImage if path.name.endswith(".mgz") else nib.Nifti1Image
    nib.save(kind(data, affine), path)
    return path


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
    _describe(root)
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
    # The entities the T1w names use become columns, empty where a file lacks one.
    assert rows[1].metadata == {"bids_entities": "sub-02_ses-1", "ses": "1", "run": ""}
    assert rows[4].metadata == {"bids_entities": "sub-03_run-2", "ses": "", "run": "2"}
    assert all(r.label is None and r.split == "" for r in rows)
    assert manifest_from_bids(bids) == rows  # deterministic


def test_labels_from_a_derivatives_folder(bids):
    with pytest.warns(UserWarning, match="4 of 5 image") as caught:
        rows = manifest_from_bids(bids, labels="labels")
    assert "sub-02_ses-1, sub-02_ses-2, sub-03_run-1, sub-03_run-2" in str(caught[0].message)
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
    problems = validate_manifest(write_manifest(rows, tmp_path / "cohort.csv"))
    assert len(problems) == 1 and "sub-04_T1w.nii.gz" in problems[0], problems
    assert "does not exist" in problems[0]


def test_not_a_bids_folder(tmp_path):
    with pytest.raises(InputError, match="does not exist") as info:
        manifest_from_bids(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value)
    with pytest.raises(InputError, match="no sub-\\* folders"):
        manifest_from_bids(tmp_path)
    save_volume(_scan(0), tmp_path / "sub-01/anat/sub-01_T2w.nii.gz")
    _describe(tmp_path)
    with pytest.raises(InputError, match="no T1w image found") as info:
        manifest_from_bids(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_cli_from_bids_writes_a_valid_relative_manifest(bids, tmp_path, capsys):
    out = tmp_path / "cohort.csv"
    assert main(["manifest", "from-bids", str(bids), "-o", str(out), "--labels", "labels"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert f"wrote {out}: 5 row(s) (unassigned 5), 3 subject(s); 1 row(s) with a label map" in printed
    assert "mriprep manifest: warning: 4 of 5 image(s) have no label map" in captured.err
    lines = out.read_text().splitlines()
    assert lines[0] == "subject_id,session_id,image,label,split,bids_entities,ses,run"
    assert lines[1] == (
        "sub-01,,ds/sub-01/anat/sub-01_T1w.nii.gz,"
        "ds/derivatives/labels/sub-01/anat/sub-01_dseg.nii.gz,,sub-01,,"
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


# --------------------------------------------------------------------------- pybids cohort

COHORT = [
    "sub-01/anat/sub-01_T1w.nii.gz",
    "sub-02/anat/sub-02_T1w.nii.gz",
    "sub-03/ses-1/anat/sub-03_ses-1_T1w.nii.gz",
    "sub-03/ses-2/anat/sub-03_ses-2_acq-mprage_run-1_T1w.nii.gz",
    "sub-03/ses-2/anat/sub-03_ses-2_acq-mprage_run-2_T1w.nii.gz",
    "sub-04/anat/sub-04_T1w.nii",
]


@pytest.fixture()
def cohort(tmp_path):
    """Four subjects, sessions, an acquisition and runs, and a participants.tsv with a site."""
    root = tmp_path / "cohort"
    _describe(root)
    for relative in COHORT:
        _tiny(root / relative)
    (root / "participants.tsv").write_text(
        "participant_id\tsite\tage\n"
        "sub-01\tA\t30\n"
        "sub-02\tB\tn/a\n"
        "03\tA\t041\n"  # an export that dropped the sub- prefix
        "sub-04\tB\t28\n"
        "sub-05\tC\t50\n"  # listed, but has no scan
    )
    return root


def test_participants_columns_reach_the_metadata_and_stratify(cohort, tmp_path, capsys):
    rows = manifest_from_bids(cohort)
    assert [r.metadata["site"] for r in rows] == ["A", "B", "A", "A", "A", "B"]
    # Text as written (041 stays 041); n/a becomes the manifest's empty cell.
    assert [r.metadata["age"] for r in rows] == ["30", "", "041", "041", "041", "28"]
    result = assign_splits(rows, {"train": 0.5, "val": 0.5}, stratify="site")
    assert result.strata == {"A": {"train": 1, "val": 1}, "B": {"train": 1, "val": 1}}
    assert len({r.split for r in result.rows if r.subject_id == "sub-03"}) == 1
    # The user's command line, which failed with "'site' is not a column".
    out = tmp_path / "cohort.csv"
    assert main(["manifest", "from-bids", str(cohort), "-o", str(out)]) == 0
    split = tmp_path / "split.csv"
    code = main(["splits", str(out), "--assign", "train=0.5,val=0.5", "--stratify", "site",
                 "-o", str(split)])
    assert code == 0, capsys.readouterr()
    assert {r.split for r in read_manifest(split)} == {"train", "val"}


def test_participants_gaps_and_clashes(cohort):
    (cohort / "participants.tsv").write_text("participant_id\trun\tsite\nsub-01\t7\tA\n")
    with pytest.warns(UserWarning, match="does not list 3 subject") as caught:
        rows = manifest_from_bids(cohort)
    assert "sub-02, sub-03, sub-04" in str(caught[0].message)
    # "run" is already the entity column: participants.tsv's own is renamed, not lost.
    assert rows[0].metadata["participants_run"] == "7" and rows[0].metadata["run"] == ""
    assert rows[1].metadata["site"] == "" and rows[1].metadata["participants_run"] == ""
    (cohort / "participants.tsv").write_text("subject\tsite\nsub-01\tA\n")
    with pytest.raises(InputError, match="no participant_id column") as info:
        manifest_from_bids(cohort)
    assert str(cohort / "participants.tsv") in str(info.value)


def test_sessions_runs_and_acquisitions_are_entities(cohort):
    # Outside the raw dataset: never rows.
    _tiny(cohort / "derivatives/fmriprep/sub-01/anat/sub-01_desc-preproc_T1w.nii.gz")
    _tiny(cohort / "sourcedata/sub-01/anat/sub-01_T1w.nii.gz")
    _tiny(cohort / "sub-01/func/sub-01_task-rest_bold.nii.gz")
    rows = manifest_from_bids(cohort)
    assert [r.image for r in rows] == [cohort / rel for rel in COHORT]
    assert [(r.subject_id, r.session_id) for r in rows] == [
        ("sub-01", ""),
        ("sub-02", ""),
        ("sub-03", "ses-1"),
        ("sub-03", "ses-2_acq-mprage_run-1"),
        ("sub-03", "ses-2_acq-mprage_run-2"),
        ("sub-04", ""),
    ]
    assert rows[3].metadata == {
        "bids_entities": "sub-03_ses-2_acq-mprage_run-1",
        "ses": "2",
        "acq": "mprage",
        "run": "1",
        "site": "A",
        "age": "041",
    }
    assert [r.metadata["ses"] for r in rows] == ["", "", "1", "2", "2", ""]


def _fmriprep(root):
    """fMRIPrep's anatomical outputs: several dseg per T1w, one in template space."""
    folder = root / "derivatives/fmriprep"
    for name in ("dseg", "desc-aseg_dseg", "desc-aparcaseg_dseg",
                 "space-MNI152NLin2009cAsym_desc-aseg_dseg"):
        _tiny(folder / f"sub-01/anat/sub-01_{name}.nii.gz", label=True)
    _tiny(folder / "sub-03/ses-1/anat/sub-03_ses-1_desc-aparcaseg_dseg.nii.gz", label=True)
    _tiny(folder / "sub-03/ses-2/anat/sub-03_ses-2_acq-mprage_run-1_desc-aseg_dseg.nii.gz",
          label=True)
    return folder


def test_bids_derivatives_dseg_prefers_desc_aseg(cohort):
    folder = _fmriprep(cohort)
    with pytest.warns(UserWarning, match="3 of 6 image") as caught:
        rows = manifest_from_bids(cohort, labels="fmriprep")
    assert "sub-02, sub-03_ses-2_acq-mprage_run-2, sub-04" in str(caught[0].message)
    assert [r.label for r in rows] == [
        folder / "sub-01/anat/sub-01_desc-aseg_dseg.nii.gz",  # desc-aseg among several
        None,
        folder / "sub-03/ses-1/anat/sub-03_ses-1_desc-aparcaseg_dseg.nii.gz",  # the only one
        folder / "sub-03/ses-2/anat/sub-03_ses-2_acq-mprage_run-1_desc-aseg_dseg.nii.gz",
        None,
        None,
    ]
    assert rows[0].image == cohort / COHORT[0]
    volume = load_volume(rows[0].image, label_path=rows[0].label)
    assert volume.label.shape == (8, 8, 8)
    with pytest.warns(UserWarning, match="4 of 6"):
        rows = manifest_from_bids(cohort, labels="fmriprep", labels_desc="aparcaseg")
    assert [r.label.name for r in rows if r.label] == [
        "sub-01_desc-aparcaseg_dseg.nii.gz", "sub-03_ses-1_desc-aparcaseg_dseg.nii.gz"
    ]
    with pytest.warns(UserWarning, match="5 of 6"):
        rows = manifest_from_bids(cohort, labels="fmriprep", labels_desc="")
    assert rows[0].label == folder / "sub-01/anat/sub-01_dseg.nii.gz"


def test_several_dseg_without_desc_aseg_is_an_error_listing_them(cohort):
    folder = _fmriprep(cohort)
    (folder / "sub-01/anat/sub-01_desc-aseg_dseg.nii.gz").unlink()
    with pytest.raises(InputError, match="labels_desc=DESC") as info:
        manifest_from_bids(cohort, labels="fmriprep")
    message = str(info.value)
    assert "sub-01_T1w.nii.gz has 2 label maps" in message
    assert "sub-01_desc-aparcaseg_dseg.nii.gz, sub-01_dseg.nii.gz" in message
    assert "space-MNI" not in message  # another grid: never a candidate


def _freesurfer_subject(folder, label_name):
    """A FastSurfer/FreeSurfer subject: orig.mgz and its label map on the conformed grid."""
    _tiny(folder / "mri/orig.mgz", affine=CONFORMED)
    return _tiny(folder / "mri" / label_name, affine=CONFORMED, label=True)


def test_fastsurfer_and_freesurfer_folders_pair_orig_mgz(cohort, tmp_path, capsys):
    fastsurfer = cohort / "derivatives/fastsurfer"
    deep = _freesurfer_subject(fastsurfer / "sub-01", "aparc.DKTatlas+aseg.deep.mgz")
    _tiny(fastsurfer / "sub-01/mri/aseg.mgz", affine=CONFORMED, label=True)  # full pipeline
    # FreeSurfer: aparc+aseg.mgz (Desikan) is taken, never aseg.mgz (no cortical parcels).
    desikan = _freesurfer_subject(fastsurfer / "sub-03_ses-1", "aparc+aseg.mgz")
    _tiny(fastsurfer / "sub-03_ses-1/mri/aseg.mgz", affine=CONFORMED, label=True)
    with pytest.warns(UserWarning, match="4 of 6"):
        rows = manifest_from_bids(cohort, labels="fastsurfer")
    assert rows[0].label == deep and rows[0].image == fastsurfer / "sub-01/mri/orig.mgz"
    assert rows[2].label == desikan
    assert rows[2].image == fastsurfer / "sub-03_ses-1/mri/orig.mgz"
    assert rows[2].metadata["bids_entities"] == "sub-03_ses-1"  # the source T1w
    assert rows[1].image == cohort / COHORT[1] and rows[1].label is None
    # Why orig.mgz: the label map is not on the T1w's grid, so that pair would be refused.
    with pytest.raises(InputError, match="affine|shape"):
        check_same_grid(read_header(deep), read_header(cohort / COHORT[0]))
    check_same_grid(read_header(deep), read_header(rows[0].image))
    out = tmp_path / "cohort.csv"
    assert main(["manifest", "from-bids", str(cohort), "-o", str(out), "--labels",
                 "fastsurfer"]) == 0
    printed = capsys.readouterr().out
    assert "2 row(s) with a label map" in printed
    assert "2 row(s) take FastSurfer/FreeSurfer's mri/orig.mgz as image" in printed
    assert main(["manifest", "validate", str(out), "--headers"]) == 0


def test_a_freesurfer_folder_needs_its_orig_and_one_image(cohort):
    fastsurfer = cohort / "derivatives/fastsurfer"
    _tiny(fastsurfer / "sub-01/mri/aparc.DKTatlas+aseg.deep.mgz", affine=CONFORMED, label=True)
    with pytest.raises(InputError, match="has no orig.mgz beside it") as info:
        manifest_from_bids(cohort, labels="fastsurfer")
    assert str(fastsurfer / "sub-01/mri/aparc.DKTatlas+aseg.deep.mgz") in str(info.value)
    _freesurfer_subject(fastsurfer / "sub-03", "aseg.mgz")  # sub-03 has three T1w
    _tiny(fastsurfer / "sub-01/mri/orig.mgz", affine=CONFORMED)
    with pytest.raises(InputError, match="label map of 3 T1w images") as info:
        manifest_from_bids(cohort, labels="fastsurfer")
    assert str(fastsurfer / "sub-03") in str(info.value)


def test_a_missing_or_empty_labels_folder_is_refused(cohort, tmp_path, capsys):
    _fmriprep(cohort)
    with pytest.raises(InputError, match="does not exist") as info:
        manifest_from_bids(cohort, labels="fastsurfer")
    assert str(cohort / "derivatives/fastsurfer") in str(info.value)
    assert "derivatives/ holds fmriprep" in str(info.value)
    (cohort / "derivatives/empty/sub-01/anat").mkdir(parents=True)
    with pytest.raises(InputError, match="holds no label map") as info:
        manifest_from_bids(cohort, labels="empty")
    message = str(info.value)
    assert str(cohort / "derivatives/empty") in message
    assert "_dseg.nii[.gz]" in message and "mri/aparc.DKTatlas+aseg.deep.mgz" in message
    _tiny(cohort / "derivatives/other/sub-09/anat/sub-09_dseg.nii.gz", label=True)
    with pytest.raises(InputError, match="none of the label maps") as info:
        manifest_from_bids(cohort, labels="other")
    assert "sub-01_desc-aseg_dseg.nii.gz" in str(info.value)  # what was expected
    out = tmp_path / "m.csv"
    assert main(["manifest", "from-bids", str(cohort), "-o", str(out), "--labels", "nope"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and str(cohort / "derivatives/nope") in err and not out.exists()
    assert main(["manifest", "from-bids", str(cohort), "-o", str(out), "--labels-desc",
                 "aseg"]) == 2
    err = capsys.readouterr().err
    assert "without --labels NAME" in err and "labels_desc" not in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "dataset_description.json does not exist"),
        ('{"Name": "x", ', "is not valid JSON"),
        ('["Name"]', "holds a list"),
        ('{"Name": "x"}', "lacks BIDSVersion"),
    ],
)
def test_dataset_description_is_checked(cohort, tmp_path, capsys, text, message):
    path = cohort / "dataset_description.json"
    if text is None:
        path.unlink()
    else:
        path.write_text(text)
    with pytest.raises(InputError, match=message) as info:
        manifest_from_bids(cohort)
    assert str(path) in str(info.value) and '"BIDSVersion"' in str(info.value)
    out = tmp_path / "m.csv"
    assert main(["manifest", "from-bids", str(cohort), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
