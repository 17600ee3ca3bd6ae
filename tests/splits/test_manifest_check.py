"""Tests of mriprep.splits.manifest_check: the leak checks on a manifest, before any
preprocessing.

Manifests point at real NIfTI scans cut from the MNI152 template.
"""

from __future__ import annotations

import shutil

from mriprep.core.volume import Volume
from mriprep.inputs.manifest import read_manifest
from mriprep.inputs.writing import save_volume
from mriprep.splits.manifest_check import check_manifest_splits
from tests.splits.manifests import CLEAN, manifest_csv, scan


def test_clean_manifest_passes(cohort):
    report = check_manifest_splits(read_manifest(manifest_csv(cohort, CLEAN)))
    assert report.ok and report.findings == []
    assert report.splits == {
        "test": {"subjects": 1, "scans": 1},
        "train": {"subjects": 3, "scans": 4},
        "val": {"subjects": 1, "scans": 1},
    }
    assert report.files_hashed == 6  # all files have one size: all were hashed


def test_sessions_of_one_subject_in_two_splits(cohort):
    lines = CLEAN[:1] + ["sub-01,ses-2,images/sub-02.nii,test,A"] + CLEAN[2:]
    report = check_manifest_splits(read_manifest(manifest_csv(cohort, lines)))
    [finding] = report.errors
    assert finding.code == "subject-split-leak"
    assert finding.subjects == ("sub-01",) and finding.keys == ("line 2", "line 3")
    assert "test: ses-2" in finding.message and "train: ses-1" in finding.message


def test_identical_image_under_two_ids_in_two_splits(cohort):
    shutil.copy(cohort / "images" / "sub-03.nii", cohort / "images" / "renamed.nii")
    lines = CLEAN + ["sub-07,,images/renamed.nii,test,A"]
    report = check_manifest_splits(read_manifest(manifest_csv(cohort, lines)))
    [finding] = report.errors
    assert finding.code == "duplicate-input"
    assert set(finding.subjects) == {"sub-03", "sub-07"}
    assert set(finding.keys) == {"line 4", "line 8"}
    assert "(train)" in finding.message and "(test)" in finding.message


def test_only_files_of_equal_size_are_hashed(cohort):
    small = scan(30)
    save_volume(Volume.from_array(small.data[:10], small.affine), cohort / "images" / "small.nii")
    lines = CLEAN + ["sub-07,,images/small.nii,test,A"]
    report = check_manifest_splits(read_manifest(manifest_csv(cohort, lines)))
    assert report.ok and report.files_hashed == 6


def test_unassigned_rows_are_reported(cohort):
    lines = CLEAN[:4] + ["sub-05,,images/sub-05.nii,,A", "sub-06,,images/sub-06.nii,,B"]
    report = check_manifest_splits(read_manifest(manifest_csv(cohort, lines)), hash_files=False)
    [finding] = report.errors
    assert finding.code == "split-missing" and finding.keys == ("line 6", "line 7")
    assert "--assign" in finding.message and report.files_hashed == 0
