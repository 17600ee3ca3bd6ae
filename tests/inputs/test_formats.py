"""mriprep.inputs.formats: MGH, NRRD and MetaImage, 4D singletons, nibabel's header fixes."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

from mriprep.inputs.writing import save_volume

from .conftest import _load_quietly, _nifti, _patch_header


def test_mgz_round_trip(brain, tmp_path):
    path = tmp_path / "orig.mgz"
    nib.save(nib.MGHImage(brain.data, brain.affine), path)
    vol = _load_quietly(path)
    np.testing.assert_array_equal(vol.data, brain.data)
    np.testing.assert_allclose(vol.affine, brain.affine, atol=1e-4)
    assert vol.record_of("load").metrics["format"] == "mgh"


@pytest.mark.parametrize("suffix", [".nrrd", ".mha"])
def test_itk_formats_convert_lps_to_ras(brain, tmp_path, suffix):
    nifti = save_volume(brain, tmp_path / "ref.nii.gz")
    # ITK reads the NIfTI into LPS itself; writing that out gives an independent LPS file.
    other = tmp_path / f"ref{suffix}"
    sitk.WriteImage(sitk.ReadImage(str(nifti)), str(other))
    from_nifti, from_itk = _load_quietly(nifti), _load_quietly(other)
    np.testing.assert_array_equal(from_itk.data, from_nifti.data)
    np.testing.assert_allclose(from_itk.affine, from_nifti.affine, atol=1e-4)
    assert from_itk.record_of("load").metrics["affine_source"] == "itk"


def test_singleton_4d_is_squeezed(brain, tmp_path):
    path = tmp_path / "one_volume.nii.gz"
    nib.save(_nifti(brain.data[..., None], brain.affine), path)
    vol = _load_quietly(path)
    assert vol.shape == (40, 48, 36)
    assert vol.record_of("load").metrics["shape_on_disk"] == [40, 48, 36, 1]


def test_header_fixes_nibabel_makes_are_recorded_not_printed(brain, tmp_path, capfd):
    path = save_volume(brain, tmp_path / "zero_pixdim.nii.gz")
    _patch_header(path, pixdim=[1.0, 0.0, 1.0, 1.5, 1.0, 1.0, 1.0, 1.0])
    record = _load_quietly(path).record_of("load")
    (warning,) = [w for w in record.warnings if "nibabel fixed the header" in w]
    assert str(path) in warning and "pixdim" in warning
    assert capfd.readouterr().err == ""
