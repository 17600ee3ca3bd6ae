"""mriprep.inputs.freesurfer, `mriprep manifest from-freesurfer` and `from-bids --seg`: which
segmentation of a FreeSurfer/FastSurfer subject becomes the label, and who is refused."""

from __future__ import annotations

import warnings
import zlib

import nibabel as nib
import numpy as np
import pytest

from mriprep.cli import main
from mriprep.core.errors import InputError
from mriprep.inputs.bids import manifest_from_bids
from mriprep.inputs.freesurfer import (
    choose_segmentation,
    manifest_from_freesurfer,
    segmentation_files,
    subject_segmentation,
)
from mriprep.inputs.manifest import read_manifest

# FreeSurfer's conformed grid (LIA, centred), what orig.mgz and every segmentation lie on.
CONFORMED = np.array([[-1.0, 0, 0, 4], [0, 0, 1, -4], [0, -1, 0, 4], [0, 0, 0, 1]])
DEEP = "aparc.DKTatlas+aseg.deep.mgz"
DKT = "aparc.DKTatlas+aseg.mgz"
DESIKAN = "aparc+aseg.mgz"
ASEG = "aseg.mgz"


def _mgz(path, label=True):
    """An 8^3 MGZ on the conformed grid: int32 labels or float anatomy, its own content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(zlib.crc32(str(path).encode()))
    data = rng.integers(0, 4, (8, 8, 8)).astype(np.int32) if label else rng.random((8, 8, 8))
    nib.save(nib.MGHImage(data.astype(np.int32 if label else np.float32), CONFORMED), path)
    return path


def _subject(folder, *segmentations, orig=True):
    if orig:
        _mgz(folder / "mri/orig.mgz", label=False)
    for name in segmentations:
        _mgz(folder / "mri" / name)
    (folder / "mri").mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture()
def subjects(tmp_path):
    """FastSurfer, FreeSurfer 7, FreeSurfer-with-Desikan-only and aseg-only subjects, and
    the folders of a SUBJECTS_DIR that are not subjects."""
    root = tmp_path / "subjects"
    _subject(root / "sub-a", DEEP, DKT, DESIKAN, ASEG)  # FastSurfer with surfaces
    _subject(root / "sub-b", DKT, DESIKAN, ASEG, "aparc.a2009s+aseg.mgz")  # FreeSurfer 7
    _subject(root / "sub-c", DESIKAN, ASEG)  # an older FreeSurfer
    _subject(root / "sub-d", ASEG)  # stopped before the cortical parcellation
    _subject(root / "fsaverage", DESIKAN)  # FreeSurfer's template: has both files, no person
    _subject(root / "lh.EC_average", orig=False)
    (root / "notes").mkdir()
    (root / "README.txt").write_text("not a folder")
    return root


def test_auto_takes_fastsurfer_dkt_then_dkt_then_desikan_and_refuses_aseg(subjects):
    with pytest.warns(UserWarning, match="sub-d") as caught:
        result = manifest_from_freesurfer(subjects)
    rows = result.rows
    assert [(r.subject_id, r.session_id) for r in rows] == [
        ("sub-a", ""), ("sub-b", ""), ("sub-c", "")
    ]
    assert [r.label for r in rows] == [
        subjects / "sub-a/mri" / DEEP, subjects / "sub-b/mri" / DKT,
        subjects / "sub-c/mri" / DESIKAN,
    ]
    assert [r.image for r in rows] == [subjects / f"sub-{s}/mri/orig.mgz" for s in "abc"]
    assert [r.metadata for r in rows] == [{"segmentation": n} for n in (DEEP, DKT, DESIKAN)]
    assert [r.row for r in rows] == [2, 3, 4] and all(r.split == "" for r in rows)
    # aseg-only: refused, naming the file and both fixes.
    message = str(caught[0].message)
    assert str(subjects) in message and "1 (sub-d): mri/aseg.mgz only" in message
    assert "no cortical parcels" in message and "cortical parcellation" in message
    assert "seg=aseg" in message and "--processing aseg" in message
    assert list(result.refused) == ["sub-d"]
    assert result.skipped == {
        "fsaverage": "FreeSurfer's average subject",
        "lh.EC_average": "FreeSurfer's entorhinal-cortex atlas",
        "notes": "no mri/orig.mgz",
    }
    assert result.summary() == [
        f"labels: {DEEP} for 1, {DKT} for 1, {DESIKAN} (Desikan; mapped to DKT at training) "
        "for 1 row(s)",
        "refused 1 subject folder(s), without a row: sub-d (reasons in the warnings)",
        "skipped 3 folder(s) that are not subjects: fsaverage (FreeSurfer's average subject), "
        "lh.EC_average (FreeSurfer's entorhinal-cortex atlas), notes (no mri/orig.mgz)",
    ]
    with pytest.warns(UserWarning):
        assert manifest_from_freesurfer(subjects).rows == rows  # deterministic


@pytest.mark.parametrize(
    ("seg", "labels", "refused"),
    [
        ("aparc.DKTatlas+aseg", {"sub-a": DEEP, "sub-b": DKT},
         {"sub-c": f"mri/ has no {DEEP} or {DKT} (seg=aparc.DKTatlas+aseg); it has "
                   f"{DESIKAN}, {ASEG}:",
          "sub-d": f"(seg=aparc.DKTatlas+aseg); it has {ASEG}:"}),
        ("aparc+aseg", {"sub-a": DESIKAN, "sub-b": DESIKAN, "sub-c": DESIKAN},
         {"sub-d": f"mri/ has no {DESIKAN} (seg=aparc+aseg); it has {ASEG}:"}),
        ("aseg", {s: ASEG for s in ("sub-a", "sub-b", "sub-c", "sub-d")}, {}),
        ("aparc.a2009s+aseg.mgz", {"sub-b": "aparc.a2009s+aseg.mgz"},
         {"sub-a": f"it has {DEEP}, {DKT}, {DESIKAN}, {ASEG}:",
          "sub-c": f"it has {DESIKAN}, {ASEG}:", "sub-d": f"it has {ASEG}:"}),
    ],
)
def test_an_explicit_choice_refuses_the_subjects_without_it(subjects, seg, labels, refused):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = manifest_from_freesurfer(subjects, seg=seg)
    assert {r.subject_id: r.label.name for r in result.rows} == labels
    assert {r.subject_id: r.metadata["segmentation"] for r in result.rows} == labels
    assert set(result.refused) == set(refused)
    for name, words in refused.items():
        assert words in result.refused[name], result.refused[name]
    # Every refused subject is in a warning, whatever the choice.
    warned = " ".join(str(w.message) for w in caught)
    assert all(name in warned for name in refused) and bool(caught) == bool(refused)


def test_the_rule_on_file_names():
    assert choose_segmentation([ASEG, DKT, DEEP]) == DEEP
    assert choose_segmentation([ASEG, DKT], seg="aparc.DKTatlas+aseg") == DKT
    assert choose_segmentation(["mylabels.mgz"], seg="mylabels.mgz") == "mylabels.mgz"
    with pytest.raises(InputError, match="holds no segmentation") as info:
        choose_segmentation(["orig.mgz", "T1.mgz", "wmparc.mgz"], where="/x/sub/mri")
    assert str(info.value).startswith("/x/sub/mri/ holds") and "it has wmparc.mgz" in str(
        info.value)
    for bad in ("aparc.DKTatlas", "../aseg.mgz", "mri/aseg.mgz", ""):
        with pytest.raises(InputError, match="is neither one of auto, aparc.DKTatlas"):
            segmentation_files(bad)


def test_a_subject_without_orig_is_refused_and_a_folder_without_anything_skipped(tmp_path):
    root = tmp_path / "subjects"
    _subject(root / "sub-a", DEEP)
    _subject(root / "sub-b", DEEP, orig=False)  # a partial copy
    _subject(root / "sub-c", "T1.mgz", orig=False)  # nothing this rule reads
    with pytest.warns(UserWarning, match="1 \\(sub-b\\): mri/aparc.DKTatlas") as caught:
        result = manifest_from_freesurfer(root)
    assert "has no orig.mgz beside it" in str(caught[0].message)
    assert [r.subject_id for r in result.rows] == ["sub-a"]
    assert result.skipped == {"sub-c": "no mri/orig.mgz"}
    assert subject_segmentation(root / "sub-c") is None
    assert subject_segmentation(root / "sub-b").has_image is False


def test_no_usable_subject_is_an_error(tmp_path):
    root = tmp_path / "subjects"
    _subject(root / "sub-d", ASEG)
    _subject(root / "sub-e", ASEG)
    with pytest.raises(InputError, match="no usable subject") as info:
        manifest_from_freesurfer(root)
    assert "2 (sub-d, sub-e): mri/aseg.mgz only" in str(info.value)  # one line per reason
    assert "seg=aseg" in str(info.value)
    with pytest.raises(InputError, match="itself a subject folder") as info:
        manifest_from_freesurfer(root / "sub-d")
    assert f"point at its parent {root}" in str(info.value)
    _subject(root / "fsaverage", DESIKAN)
    with pytest.raises(InputError, match="holds no FreeSurfer/FastSurfer subject") as info:
        manifest_from_freesurfer(root / "sub-d" / "mri")
    with pytest.raises(InputError, match="does not exist"):
        manifest_from_freesurfer(tmp_path / "nope")
    with pytest.raises(InputError, match="is neither one of"):
        manifest_from_freesurfer(root, seg="aparc.DKTatlas")


def test_longitudinal_folders_share_the_template_s_subject_id(tmp_path):
    root = tmp_path / "subjects"
    for name in ("tp1", "tp2", "bert", "tp1.long.bert", "tp2.long.bert", "other"):
        _subject(root / name, DKT)
    (root / "bert/base-tps").write_text("tp1\ntp2\n")
    rows = manifest_from_freesurfer(root).rows
    assert [(r.subject_id, r.session_id) for r in rows] == [
        ("bert", "bert"), ("other", ""), ("bert", "tp1"), ("bert", "tp1.long.bert"),
        ("bert", "tp2"), ("bert", "tp2.long.bert"),
    ]


# --------------------------------------------------------------------------- the command


def test_cli_from_freesurfer_writes_the_choice_and_prints_it(subjects, tmp_path, capsys):
    out = tmp_path / "cohort.csv"
    assert main(["manifest", "from-freesurfer", str(subjects), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}: 3 row(s) (unassigned 3), 3 subject(s)" in captured.out
    assert f"{DESIKAN} (Desikan; mapped to DKT at training) for 1" in captured.out
    assert "refused 1 subject folder(s), without a row: sub-d" in captured.out
    assert "skipped 3 folder(s) that are not subjects: fsaverage" in captured.out
    # The warning names the flag, not the Python parameter.
    assert "mriprep manifest: warning: subject folder(s) of" in captured.err
    assert "--seg aseg" in captured.err and "seg=aseg" not in captured.err
    lines = out.read_text().splitlines()
    assert lines[0] == "subject_id,session_id,image,label,split,segmentation"
    assert lines[1] == f"sub-a,,subjects/sub-a/mri/orig.mgz,subjects/sub-a/mri/{DEEP},,{DEEP}"
    assert main(["manifest", "validate", str(out), "--headers"]) == 0
    capsys.readouterr()
    assert main(["manifest", "from-freesurfer", str(subjects), "-o", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert main(["manifest", "from-freesurfer", str(subjects), "-o", str(out), "--force",
                 "--seg", "aseg"]) == 0
    assert {r.label.name for r in read_manifest(out)} == {ASEG}
    assert "aseg.mgz (no cortical parcels: train it with an aseg table) for 4" in (
        capsys.readouterr().out)


def test_cli_from_freesurfer_errors_name_the_flag(tmp_path, capsys):
    root = tmp_path / "subjects"
    _subject(root / "sub-d", ASEG)
    out = tmp_path / "m.csv"
    assert main(["manifest", "from-freesurfer", str(root), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error: no usable subject" in err and "--seg aseg" in err
    assert "seg=" not in err and "Traceback" not in err and not out.exists()
    assert main(["manifest", "from-freesurfer", str(root), "-o", str(out), "--seg",
                 "aparc"]) == 2
    assert "--seg 'aparc' is neither one of" in capsys.readouterr().err


def test_cli_from_freesurfer_help_explains_the_choice_and_the_refusal(capsys):
    with pytest.raises(SystemExit):
        main(["manifest", "from-freesurfer", "--help"])
    printed = " ".join(capsys.readouterr().out.split())
    assert "never aseg.mgz, which has no cortical parcels" in printed
    assert "refusals: a subject with only aseg.mgz" in printed
    assert "mriprep export --processing aseg" in printed


# --------------------------------------------------------------------------- from-bids --seg


@pytest.fixture()
def bids(tmp_path):
    """Two subjects, FreeSurfer subject folders as their derivative: one full, one aseg-only."""
    root = tmp_path / "ds"
    root.mkdir()
    (root / "dataset_description.json").write_text('{"Name": "t", "BIDSVersion": "1.9.0"}')
    for subject in ("sub-01", "sub-02"):
        path = root / subject / "anat" / f"{subject}_T1w.nii.gz"
        path.parent.mkdir(parents=True)
        nib.save(nib.Nifti1Image(np.ones((8, 8, 8), np.float32), np.eye(4)), path)
    _subject(root / "derivatives/freesurfer/sub-01", DESIKAN, ASEG)
    _subject(root / "derivatives/freesurfer/sub-02", ASEG)
    _subject(root / "derivatives/freesurfer/fsaverage", DESIKAN)
    return root


def test_from_bids_takes_the_same_choice(bids):
    folder = bids / "derivatives/freesurfer"
    with pytest.warns(UserWarning, match="segmentation of their FastSurfer/FreeSurfer") as w:
        rows = manifest_from_bids(bids, labels="freesurfer")
    assert "sub-02 (" in str(w[0].message) and "mri/aseg.mgz only" in str(w[0].message)
    assert rows[0].label == folder / "sub-01/mri" / DESIKAN
    assert rows[0].image == folder / "sub-01/mri/orig.mgz"
    assert rows[1].label is None and rows[1].image == bids / "sub-02/anat/sub-02_T1w.nii.gz"
    assert [r.metadata["segmentation"] for r in rows] == [DESIKAN, ""]
    rows = manifest_from_bids(bids, labels="freesurfer", seg="aseg")
    assert [r.label for r in rows] == [folder / f"sub-0{n}/mri" / ASEG for n in (1, 2)]
    (folder / f"sub-01/mri/{DESIKAN}").unlink()
    with pytest.raises(InputError, match="segmentation of every matching") as info:
        manifest_from_bids(bids, labels="freesurfer")
    assert str(folder / "sub-01") in str(info.value) and "seg=aseg" in str(info.value)


def test_from_bids_seg_needs_labels_and_is_not_used_on_dseg(bids):
    with pytest.raises(InputError, match="seg='aseg' is given without labels=NAME"):
        manifest_from_bids(bids, seg="aseg")
    with pytest.raises(InputError, match="is neither one of"):
        manifest_from_bids(bids, labels="freesurfer", seg="aparc")
    dseg = bids / "derivatives/fmriprep/sub-01/anat/sub-01_desc-aseg_dseg.nii.gz"
    dseg.parent.mkdir(parents=True)
    nib.save(nib.Nifti1Image(np.ones((8, 8, 8), np.int16), np.eye(4)), dseg)
    with pytest.warns(UserWarning) as caught:
        rows = manifest_from_bids(bids, labels="fmriprep", seg="aseg")
    assert any("it is not used" in str(w.message) for w in caught)
    assert rows[0].label == dseg and "segmentation" not in rows[0].metadata


def test_cli_from_bids_seg(bids, tmp_path, capsys):
    out = tmp_path / "cohort.csv"
    assert main(["manifest", "from-bids", str(bids), "-o", str(out), "--labels", "freesurfer",
                 "--seg", "aseg"]) == 0
    printed = capsys.readouterr().out
    assert "FastSurfer/FreeSurfer labels: aseg.mgz (no cortical parcels" in printed
    assert out.read_text().splitlines()[0] == (
        "subject_id,session_id,image,label,split,bids_entities,segmentation"
    )
    assert main(["manifest", "validate", str(out), "--headers"]) == 0
    assert main(["manifest", "from-bids", str(bids), "-o", str(out), "--force",
                 "--labels", "freesurfer"]) == 0
    err = capsys.readouterr().err
    assert "warning: image(s) written without a label map" in err and "--seg aseg" in err
    assert main(["manifest", "from-bids", str(bids), "-o", str(out), "--force",
                 "--seg", "aseg"]) == 2
    err = capsys.readouterr().err
    assert "--seg 'aseg' is given without --labels NAME" in err
