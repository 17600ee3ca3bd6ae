"""`mriprep run` refusing a manifest lists every problem `manifest validate` lists, the
missing image included."""

from __future__ import annotations

import pytest

from mriprep.cli import main
from mriprep.core.errors import ManifestError
from mriprep.run.cohort import cohort_rows


def test_the_refusal_lists_the_missing_image_with_the_other_problems(tmp_path, capsys):
    (tmp_path / "a.nii.gz").write_bytes(b"not empty")
    path = tmp_path / "m.csv"
    path.write_text("subject_id,image,split\n"
                    "sub-01,a.nii.gz,train\n"
                    "sub-02,gone.nii.gz,train\n"      # the missing image
                    "sub-03,a.nii.gz,holdout\n"       # an unknown split
                    "sub 04,a.nii.gz,val\n")          # a bad id
    assert main(["manifest", "validate", str(path)]) == 1
    listed = [line.strip() for line in capsys.readouterr().out.splitlines()
              if line.startswith("  - ")]
    assert any("gone.nii.gz" in line for line in listed)
    with pytest.raises(ManifestError) as caught:
        cohort_rows(path)
    assert sorted(f"- {p}" for p in caught.value.problems) == sorted(listed)
    # A manifest whose only problem is a missing image runs: that subject fails at load.
    path.write_text("subject_id,image,split\nsub-01,a.nii.gz,train\nsub-02,gone.nii.gz,val\n")
    assert [r.subject_id for r in cohort_rows(path)] == ["sub-01", "sub-02"]
