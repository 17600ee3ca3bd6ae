"""mriprep.inputs.writing: sform-only sheared affines, and NIfTI names only."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from mriprep.core.errors import InputError
from mriprep.inputs.writing import save_volume

from .conftest import _load_quietly


def test_sheared_affine_is_written_as_sform_only_and_read_back_exactly(brain, tmp_path):
    sheared = brain.affine.copy()
    sheared[0, 1] += 0.2
    path = save_volume(brain.replace(affine=sheared), tmp_path / "sheared.nii.gz")
    hdr = nib.load(path).header
    assert hdr["qform_code"] == 0 and hdr["sform_code"] == 1
    np.testing.assert_allclose(_load_quietly(path).affine, sheared, atol=1e-5)


def test_save_refuses_a_non_nifti_name(brain, tmp_path):
    with pytest.raises(InputError, match="NIfTI") as info:
        save_volume(brain, tmp_path / "out.mgz")
    assert "out.mgz" in str(info.value)
    assert not list(tmp_path.iterdir())  # nothing half-written
