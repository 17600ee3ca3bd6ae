"""mriprep.inputs.io: round trips, header sanity, and a clear error for every bad input.

Every file is built in tmp_path from a cropped piece of the MNI152 template, so the tests
run on real anatomy in a few seconds.
"""

from __future__ import annotations

import gzip
import io
import tracemalloc
import warnings

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

from mriprep.core.errors import HeaderError, ImageReadError, InputError
from mriprep.inputs.io import (
    DEFAULT_MAX_VOXELS,
    load_volume,
    read_header,
    save_label,
    save_volume,
)
from mriprep.inputs.templates import load_template
from mriprep.core.volume import Volume

# A 40x48x36 block through the middle of the brain.
CROP = (slice(80, 120), slice(100, 148), slice(70, 106))


def _rotation_z(degrees: float) -> np.ndarray:
    t = np.deg2rad(degrees)
    r = np.eye(4)
    r[:2, :2] = [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]
    return r


@pytest.fixture(scope="module")
def brain() -> Volume:
    """Cropped MNI152 anatomy on an oblique, anisotropic grid (a realistic scanner header)."""
    template = load_template("mni152")
    data = np.ascontiguousarray(template.data[CROP])
    shift = np.eye(4)
    shift[:3, 3] = [s.start for s in CROP]
    affine = _rotation_z(12.0) @ template.affine @ shift @ np.diag([1.0, 1.0, 1.5, 1.0])
    label = np.digitize(data, [0.5, 0.8]).astype(np.int16)  # dark / grey / bright
    return Volume.from_array(data, affine, label=label, subject_id="crop", source="mni152")


def _nifti(data, affine, dtype=None) -> nib.Nifti1Image:
    img = nib.Nifti1Image(np.asarray(data), affine, dtype=dtype)
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    return img


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


def _file_bytes(path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def _raw_header(path) -> nib.Nifti1Header:
    """The header as stored (nib.load moves scl_slope/scl_inter out of img.header)."""
    return nib.Nifti1Header.from_fileobj(io.BytesIO(_file_bytes(path)[:348]))


def _patch_header(path, **fields):
    """Set raw header fields in a saved NIfTI (nibabel's save would recompute scaling)."""
    raw = bytearray(_file_bytes(path))
    hdr = _raw_header(path)
    for name, value in fields.items():
        hdr[name] = value
    buffer = io.BytesIO()
    hdr.write_to(buffer)
    stored = buffer.getvalue()  # 348 header bytes + the 4-byte extension flag
    raw[: len(stored)] = stored
    path.write_bytes(gzip.compress(bytes(raw)) if path.suffix == ".gz" else bytes(raw))
    return path


def _load_quietly(path, **kwargs):
    """load_volume with every Python warning turned into an error (none may leak)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_volume(path, **kwargs)


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


def test_sheared_affine_is_written_as_sform_only_and_read_back_exactly(brain, tmp_path):
    sheared = brain.affine.copy()
    sheared[0, 1] += 0.2
    path = save_volume(brain.replace(affine=sheared), tmp_path / "sheared.nii.gz")
    hdr = nib.load(path).header
    assert hdr["qform_code"] == 0 and hdr["sform_code"] == 1
    np.testing.assert_allclose(_load_quietly(path).affine, sheared, atol=1e-5)


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


# --------------------------------------------------------------------------- header sanity


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


def test_header_fixes_nibabel_makes_are_recorded_not_printed(brain, tmp_path, capfd):
    path = save_volume(brain, tmp_path / "zero_pixdim.nii.gz")
    _patch_header(path, pixdim=[1.0, 0.0, 1.0, 1.5, 1.0, 1.0, 1.0, 1.0])
    record = _load_quietly(path).record_of("load")
    (warning,) = [w for w in record.warnings if "nibabel fixed the header" in w]
    assert str(path) in warning and "pixdim" in warning
    assert capfd.readouterr().err == ""


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


def test_save_refuses_a_non_nifti_name(brain, tmp_path):
    with pytest.raises(InputError, match="NIfTI") as info:
        save_volume(brain, tmp_path / "out.mgz")
    assert "out.mgz" in str(info.value)
    assert not list(tmp_path.iterdir())  # nothing half-written
