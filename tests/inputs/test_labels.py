"""mriprep.inputs.labels: integer label maps, their dtype, and the same-grid check."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from mriprep.core.errors import HeaderError, InputError
from mriprep.inputs.readers import load_volume
from mriprep.inputs.writing import save_label, save_volume

from .conftest import _load_quietly, _nifti


def test_label_round_trip_as_integers(brain, tmp_path):
    image = save_volume(brain, tmp_path / "img.nii.gz")
    label = save_label(brain, tmp_path / "seg.nii.gz")
    assert nib.load(label).get_data_dtype() == np.int16
    vol = _load_quietly(image, label_path=label)
    assert vol.label.dtype == np.int16  # the cache's label type: no later conversion
    assert vol.label.flags.c_contiguous and vol.data.flags.c_contiguous
    np.testing.assert_array_equal(vol.label, brain.label)
    assert set(np.unique(vol.label)) == {0, 1, 2}
    assert vol.record_of("load").metrics["label_file"] == str(label)


def test_labels_beyond_int16_load_as_int32(brain, tmp_path):
    image = save_volume(brain, tmp_path / "img.nii.gz")
    aseg = brain.label.astype(np.int32) * 20000  # FreeSurfer-style ids reach 14175+
    path = tmp_path / "aseg.nii.gz"
    nib.save(nib.Nifti1Image(aseg, brain.affine), path)
    vol = _load_quietly(image, label_path=path)
    assert vol.label.dtype == np.int32
    np.testing.assert_array_equal(vol.label, aseg)


def test_label_with_a_different_shape_is_refused(brain, tmp_path):
    image = save_volume(brain, tmp_path / "img.nii.gz")
    cropped = brain.replace(
        data=brain.data[:, :, :30], valid=brain.valid[:, :, :30], label=brain.label[:, :, :30]
    )
    label = save_label(cropped, tmp_path / "seg.nii.gz")
    with pytest.raises(HeaderError, match="shape") as info:
        load_volume(image, label_path=label)
    assert str(label) in str(info.value) and "(40, 48, 30)" in str(info.value)


def test_label_with_a_different_affine_is_refused(brain, tmp_path):
    image = save_volume(brain, tmp_path / "img.nii.gz")
    shifted = brain.affine.copy()
    shifted[2, 3] += 0.01  # 10 micrometres: still a different grid
    label = save_label(brain.replace(affine=shifted), tmp_path / "seg.nii.gz")
    with pytest.raises(HeaderError, match="affine that differs") as info:
        load_volume(image, label_path=label)
    assert str(label) in str(info.value)


def test_label_with_non_integer_values_is_refused(brain, tmp_path):
    image = save_volume(brain, tmp_path / "img.nii.gz")
    label = tmp_path / "seg_linear.nii.gz"
    values = brain.label.astype(np.float32)
    values[3, 3, 3] = 1.5  # what a linear resampling of labels leaves behind
    nib.save(_nifti(values, brain.affine), label)
    with pytest.raises(InputError, match="non-integer") as info:
        load_volume(image, label_path=label)
    assert str(label) in str(info.value) and "1.5" in str(info.value)
    assert "nearest" in str(info.value)
