"""``mriprep check`` given a file instead of a cache folder says what the file is and
what to pass, instead of claiming the path does not exist."""

from __future__ import annotations

import numpy as np
import nibabel as nib
import pytest

from mriprep.check import check_cache
from mriprep.cli import main
from mriprep.core.errors import CacheError
from mriprep.core.exit_codes import ExitCode


def _check(path, capsys) -> str:
    assert main(["check", str(path)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "does not exist" not in err and "Traceback" not in err
    return err


def test_a_manifest_is_named_and_check_manifest_suggested(tmp_path, capsys):
    manifest = tmp_path / "cohort.csv"
    manifest.write_text("subject_id,image,split\nsub-01,sub-01_T1w.nii.gz,train\n")
    err = _check(manifest, capsys)
    assert f"{manifest} is a manifest" in err
    assert f"mriprep check CACHE --manifest {manifest}" in err


def test_an_image_is_named_with_its_format_and_the_run_that_makes_a_cache(tmp_path, capsys):
    image = tmp_path / "sub-01_T1w.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.float32), np.eye(4)), image)
    err = _check(image, capsys)
    assert f"{image} is a NIfTI image (.nii.gz)" in err and "mriprep run" in err


@pytest.mark.parametrize("name, text, expected", [
    ("scores.csv", "subject,score\na,1\n", "is a CSV table without the subject_id and image"),
    ("notes.txt", "hello\n", "is a file (6 bytes), not a cache folder"),
])
def test_other_files_are_named_too(tmp_path, capsys, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    assert expected in _check(path, capsys)


def test_check_cache_from_python_says_a_file_is_a_file(tmp_path):
    path = tmp_path / "cohort.csv"
    path.write_text("subject_id,image\n")
    with pytest.raises(CacheError, match="is a file, not a cache folder"):
        check_cache(path)


@pytest.mark.parametrize("command", [["report"], ["export", "-o", "OUT"],
                                     ["to-native", "sub-01", "pred.nii.gz", "-o", "out.nii.gz"]])
def test_every_command_that_reads_a_cache_names_a_file_for_what_it_is(tmp_path, capsys,
                                                                      command):
    manifest = tmp_path / "cohort.csv"
    manifest.write_text("subject_id,image\nsub-01,a.nii.gz\n")
    code = main([command[0], str(manifest), *command[1:]])
    err = capsys.readouterr().err
    assert code != 0 and f"{manifest} is a manifest" in err, err
    assert "does not exist" not in err and "Traceback" not in err
