"""A misspelt required column is named with the closest column the manifest has."""

from __future__ import annotations

import pytest

from mriprep.core.errors import ManifestError
from mriprep.inputs.manifest import read_manifest


def test_a_column_typo_suggests_the_known_column(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("subjet_id,image,site\nsub-01,a.nii.gz,A\n")
    with pytest.raises(ManifestError) as caught:
        read_manifest(path, check_files=False)
    text = str(caught.value)
    assert "missing required column(s) subject_id" in text
    assert "did you mean 'subjet_id' for subject_id" in text and "'site' for" not in text


def test_no_suggestion_without_a_close_column(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("participant,image\nsub-01,a.nii.gz\n")
    with pytest.raises(ManifestError) as caught:
        read_manifest(path, check_files=False)
    assert "did you mean" not in str(caught.value)
