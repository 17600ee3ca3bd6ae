"""mriprep.inputs.readers: load records, float32 conversion, a clear error for every bad input."""

from __future__ import annotations

import gzip
import tracemalloc

import nibabel as nib
import numpy as np
import pytest

from mriprep.core.errors import HeaderError, ImageReadError
from mriprep.inputs.headers import DEFAULT_MAX_VOXELS
from mriprep.inputs.readers import load_volume, read_header
from mriprep.inputs.writing import save_volume

from .conftest import _load_quietly, _nifti


def _write_header_only(path, shape, affine=None, dtype=np.float32, n_data_bytes=64):
    """A NIfTI whose header describes ``shape`` but which carries only a few data bytes."""
    hdr = nib.Nifti1Header()
    hdr.set_data_dtype(dtype)
    hdr.set_data_shape(shape)
    affine = np.eye(4) if affine is None else affine
    hdr.set_sform(affine, code=1)
    hdr.set_qform(None, code=0)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as fh:
        hdr.write_to(fh)
        fh.write(b"\0" * (int(hdr.get_data_offset()) - hdr.sizeof_hdr))
        fh.write(b"\0" * n_data_bytes)
    return path


# --------------------------------------------------------------------------- round trips


def test_nifti_round_trip_keeps_data_affine_and_records_load(brain, tmp_path):
    path = save_volume(brain, tmp_path / "sub-01_T1w.nii.gz")
    vol = _load_quietly(path, subject_id="sub-01")

    np.testing.assert_array_equal(vol.data, brain.data)
    np.testing.assert_allclose(vol.affine, brain.affine, atol=1e-5)
    assert vol.data.dtype == np.float32 and vol.valid.all()
    assert vol.subject_id == "sub-01" and vol.source == str(path)
    record = vol.record_of("load")
    assert record.metrics["file"] == str(path)
    assert record.metrics["dtype_on_disk"] == "float32"
    assert record.metrics["shape"] == [40, 48, 36]
    np.testing.assert_allclose(record.metrics["spacing"], [1.0, 1.0, 1.5], atol=1e-6)
    assert record.metrics["affine_source"] == "sform"
    assert record.metrics["n_nan"] == 0 and record.metrics["n_overflow_float32"] == 0
    assert record.warnings == ()
    # Both forms were written and agree, so any reader gets the same geometry.
    hdr = nib.load(path).header
    assert hdr["qform_code"] == 1 and hdr["sform_code"] == 1
    np.testing.assert_allclose(hdr.get_qform(), hdr.get_sform(), atol=1e-4)


def test_nan_is_kept_counted_and_valid_starts_true(brain, tmp_path):
    data = brain.data.copy()
    data[10:14, 10:14, 10:14] = np.nan
    data[0, 0, 0] = np.inf
    data[0, 0, 1] = -np.inf
    path = save_volume(brain.replace(data=data), tmp_path / "nan.nii.gz")
    vol = _load_quietly(path)
    assert np.isnan(vol.data).sum() == 64
    assert vol.data[0, 0, 0] == np.inf and vol.data[0, 0, 1] == -np.inf
    metrics = vol.record_of("load").metrics
    assert (metrics["n_nan"], metrics["n_posinf"], metrics["n_neginf"]) == (64, 1, 1)
    assert vol.valid.all()  # sanitize, not load, decides what is valid


def test_float64_values_beyond_float32_become_inf_without_a_numpy_warning(brain, tmp_path):
    data = brain.data.astype(np.float64)
    data[5, 5, 5] = 1e30  # fits in float32
    data[6, 6, 6] = 1e308
    data[7, 7, 7] = -1e308
    path = tmp_path / "extreme.nii.gz"
    nib.save(_nifti(data, brain.affine, dtype=np.float64), path)

    vol = _load_quietly(path)  # an overflow RuntimeWarning would fail here
    assert vol.data[5, 5, 5] == np.float32(1e30)
    assert vol.data[6, 6, 6] == np.inf and vol.data[7, 7, 7] == -np.inf
    record = vol.record_of("load")
    assert record.metrics["dtype_on_disk"] == "float64"
    assert record.metrics["n_overflow_float32"] == 2
    assert record.metrics["n_posinf"] == 0
    assert any("beyond the float32 range" in w and "1e+308" in w for w in record.warnings)


def test_read_header_reads_no_voxels(brain, tmp_path):
    full = save_volume(brain, tmp_path / "full.nii.gz")
    data = gzip.decompress(full.read_bytes())
    header_only = tmp_path / "header_only.nii.gz"
    header_only.write_bytes(gzip.compress(data[:400]))
    header = read_header(header_only)
    assert header.shape == (40, 48, 36)
    np.testing.assert_allclose(header.spacing, [1.0, 1.0, 1.5], atol=1e-6)
    with pytest.raises(ImageReadError, match="voxel data"):
        load_volume(header_only)


# --------------------------------------------------------------------------- bad inputs


def _bad_missing(brain, tmp_path):
    return tmp_path / "nope.nii.gz", ImageReadError, "does not exist"


def _bad_empty(brain, tmp_path):
    path = tmp_path / "empty.nii.gz"
    path.touch()
    return path, ImageReadError, "empty"


def _bad_text(brain, tmp_path):
    path = tmp_path / "notes.nii.gz"
    path.write_text("subject 01 was moving, rescan\n")
    return path, ImageReadError, "not an image"


def _bad_truncated_gz(brain, tmp_path):
    path = save_volume(brain, tmp_path / "trunc.nii.gz")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path, ImageReadError, "truncated"


def _bad_truncated_nii(brain, tmp_path):
    path = save_volume(brain, tmp_path / "trunc.nii")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path, ImageReadError, "truncated"


def _bad_several_volumes(brain, tmp_path):
    path = tmp_path / "bold.nii.gz"
    nib.save(_nifti(np.stack([brain.data] * 3, axis=-1), brain.affine), path)
    return path, HeaderError, "holds 3 volumes"


def _bad_zero_length(brain, tmp_path):
    path = _write_header_only(tmp_path / "zero.nii.gz", (40, 0, 36))
    return path, HeaderError, "zero-length"


def _bad_singular_affine(brain, tmp_path):
    affine = brain.affine.copy()
    affine[:3, 2] = 0.0  # third axis has no extent
    path = _write_header_only(tmp_path / "singular.nii", (4, 4, 4), affine, n_data_bytes=256)
    return path, HeaderError, "singular"


def _bad_nan_affine(brain, tmp_path):
    affine = brain.affine.copy()
    affine[1, 3] = np.nan
    path = _write_header_only(tmp_path / "nan_affine.nii", (4, 4, 4), affine, n_data_bytes=256)
    return path, HeaderError, "non-finite"


def _bad_huge_header(brain, tmp_path):
    path = _write_header_only(tmp_path / "huge.nii.gz", (10000, 10000, 10000))
    return path, HeaderError, "1e\\+12 voxels"


def _bad_extension(brain, tmp_path):
    path = tmp_path / "scan.dcm"
    path.write_bytes(b"DICM" * 100)
    return path, ImageReadError, "unsupported extension"


BAD_INPUTS = {
    "missing file": _bad_missing,
    "empty file": _bad_empty,
    "text file named .nii.gz": _bad_text,
    "truncated .nii.gz": _bad_truncated_gz,
    "truncated .nii": _bad_truncated_nii,
    "4D with several volumes": _bad_several_volumes,
    "zero-length dimension": _bad_zero_length,
    "singular affine": _bad_singular_affine,
    "NaN affine": _bad_nan_affine,
    "dimensions over the limit": _bad_huge_header,
    "unsupported extension": _bad_extension,
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_image_gets_a_clear_error_naming_the_file(brain, tmp_path, case):
    path, error, pattern = BAD_INPUTS[case](brain, tmp_path)
    with pytest.raises(error, match=pattern) as info:
        load_volume(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)  # the input is at fault


def test_several_volumes_message_says_how_to_fix(brain, tmp_path):
    path, _, _ = _bad_several_volumes(brain, tmp_path)
    with pytest.raises(HeaderError) as info:
        load_volume(path)
    assert "(40, 48, 36, 3)" in str(info.value) and "fslroi" in str(info.value)


def test_huge_header_is_refused_before_allocating(tmp_path):
    path = _write_header_only(tmp_path / "huge.nii", (10000, 10000, 10000))
    tracemalloc.start()
    try:
        with pytest.raises(HeaderError, match="limit of"):
            load_volume(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20  # 1e12 float32 voxels would be 4 TB
    assert DEFAULT_MAX_VOXELS < 10**12


def test_max_voxels_is_configurable(brain, tmp_path):
    path = save_volume(brain, tmp_path / "img.nii.gz")
    with pytest.raises(HeaderError, match="69,120 voxels|6.91e\\+04 voxels"):
        load_volume(path, max_voxels=10_000)
    assert load_volume(path, max_voxels=40 * 48 * 36).shape == (40, 48, 36)
