"""mriprep.inputs.headers: the qform/sform choice, voxel sizes, and intensity scaling."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from .conftest import _load_quietly, _nifti, _patch_header, _raw_header


def test_qform_sform_disagreement_uses_qform_like_fastsurfer_and_warns(brain, tmp_path):
    img = _nifti(brain.data, brain.affine)
    moved = brain.affine.copy()
    moved[:3, 3] += [5.0, 0.0, 0.0]
    img.set_sform(moved, code=2)
    path = tmp_path / "disagree.nii.gz"
    nib.save(img, path)
    vol = _load_quietly(path)
    np.testing.assert_allclose(vol.affine, brain.affine, atol=1e-4)  # the qform
    record = vol.record_of("load")
    assert record.metrics["affine_source"] == "qform"
    (warning,) = [w for w in record.warnings if "qform and sform disagree" in w]
    assert str(path) in warning and "5 mm" in warning and "FastSurfer" in warning


def test_unusable_qform_falls_back_to_a_good_sform(brain, tmp_path):
    img = _nifti(brain.data, brain.affine)
    img.header["pixdim"][1] = np.nan  # breaks the qform only; the sform is separate
    path = tmp_path / "bad_qform.nii.gz"
    img.to_filename(path)
    vol = _load_quietly(path)
    np.testing.assert_allclose(vol.affine, brain.affine, atol=1e-4)
    assert vol.record_of("load").metrics["affine_source"] == "sform"


def test_zooms_disagreeing_with_the_affine_warn(brain, tmp_path):
    img = _nifti(brain.data, brain.affine)
    img.set_qform(None, code=0)
    img.header["pixdim"][1:4] = [1.0, 1.0, 3.0]  # affine says 1.5 mm slices
    path = tmp_path / "zooms.nii.gz"
    img.to_filename(path)
    record = _load_quietly(path).record_of("load")
    (warning,) = [w for w in record.warnings if "voxel sizes" in w]
    assert str(path) in warning and "3.0" in warning and "1.5" in warning


def test_int16_with_scl_slope_and_inter_is_scaled(brain, tmp_path):
    stored = np.round(brain.data * 1000).astype(np.int16)
    path = tmp_path / "scaled.nii.gz"
    nib.save(_nifti(stored, brain.affine, dtype=np.int16), path)
    _patch_header(path, scl_slope=2.0, scl_inter=10.0)
    assert _raw_header(path).get_slope_inter() == (2.0, 10.0)

    vol = _load_quietly(path)
    np.testing.assert_array_equal(vol.data, stored.astype(np.float32) * 2 + 10)
    metrics = vol.record_of("load").metrics
    assert metrics["scaling_applied"] and metrics["scl_slope"] == 2.0


@pytest.mark.parametrize("slope", [0.0, np.nan])
def test_unset_scl_slope_reads_unscaled_and_warns_when_an_intercept_was_meant(
    brain, tmp_path, slope
):
    stored = np.round(brain.data * 1000).astype(np.int16)
    for inter, expect_warning in ((0.0, False), (50.0, True)):
        path = tmp_path / f"slope_{inter}.nii"
        nib.save(_nifti(stored, brain.affine, dtype=np.int16), path)
        _patch_header(path, scl_slope=slope, scl_inter=inter)
        assert float(_raw_header(path)["scl_inter"]) == inter

        vol = _load_quietly(path)
        np.testing.assert_array_equal(vol.data, stored.astype(np.float32))
        record = vol.record_of("load")
        assert record.metrics["scaling_applied"] is False
        warned = [w for w in record.warnings if "scl_slope" in w]
        assert bool(warned) == expect_warning
        if warned:
            assert str(path) in warned[0] and "unscaled" in warned[0]
