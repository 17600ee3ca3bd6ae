"""mriprep.inputs.headers: the qform/sform choice, voxel sizes, and intensity scaling."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from mriprep.core.errors import HeaderError
from mriprep.inputs.headers import FORM_CONFLICT_LIMIT_MM, form_conflict_mm, header_conflict
from mriprep.inputs.readers import load_volume, read_header

from .conftest import _load_quietly, _nifti, _patch_header, _raw_header, _rotation_z


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
    assert record.metrics["form_conflict_mm"] == pytest.approx(5.0, abs=1e-4)  # a shift
    (warning,) = [w for w in record.warnings if "place the field of view" in w]
    assert str(path) in warning and "up to 5 mm apart" in warning and "FastSurfer" in warning


# -- qform/sform conflicts in millimetres ---------------------------------------------

SHEARED_SHAPE = (32, 32, 32)


def _sheared_affine(degrees: float) -> np.ndarray:
    """A 1 mm grid whose second axis leans ``degrees`` toward the first, turned by 12
    degrees and centred: an affine no qform can hold."""
    shear = np.eye(4)
    shear[0, 1] = np.tan(np.deg2rad(degrees))
    turn = np.eye(4)
    t = np.deg2rad(12.0)
    turn[:2, :2] = [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]
    affine = turn @ shear
    affine[:3, 3] = [-16.0, -20.0, -12.0]
    return affine


def _save_sheared(tmp_path, degrees: float, name: str = "sheared"):
    """As nibabel saves a sheared affine with both codes 1: the sform holds it, the qform
    its rotation-only approximation (set_qform cannot store a shear)."""
    affine = _sheared_affine(degrees)
    data = np.zeros(SHEARED_SHAPE, np.float32)
    data[8:24, 8:24, 8:24] = 100.0
    img = nib.Nifti1Image(data, affine)
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    path = tmp_path / f"{name}_{degrees:g}deg.nii.gz"
    nib.save(img, path)
    hdr = nib.load(path).header
    return path, hdr.get_qform(), hdr.get_sform()


def _farthest_by_brute_force(qform, sform, shape, n_random=20000, seed=0):
    """The largest |(Q - S) p| over the voxel box [-0.5, n - 0.5]^3, found by evaluating a
    3x3x3 lattice of the box (corners, edge and face centres, the centre) and random
    points inside it, one point at a time: no corner formula."""
    rng = np.random.default_rng(seed)
    highs = [n - 0.5 for n in shape]
    lattice = [(x, y, z) for x in (-0.5, (highs[0] - 0.5) / 2, highs[0])
               for y in (-0.5, (highs[1] - 0.5) / 2, highs[1])
               for z in (-0.5, (highs[2] - 0.5) / 2, highs[2])]
    inside = rng.uniform(-0.5, highs, size=(n_random, 3))
    best_lattice = max(np.linalg.norm(qform[:3, :3] @ p + qform[:3, 3]
                                      - (sform[:3, :3] @ p + sform[:3, 3]))
                       for p in np.asarray(lattice))
    world_q = inside @ qform[:3, :3].T + qform[:3, 3]
    world_s = inside @ sform[:3, :3].T + sform[:3, 3]
    best_inside = float(np.linalg.norm(world_q - world_s, axis=1).max())
    return float(best_lattice), best_inside


@pytest.mark.parametrize("degrees", [3.0, 10.0])
def test_a_sheared_affine_saved_by_nibabel_conflicts_by_millimetres_and_says_so(
    tmp_path, degrees
):
    path, qform, sform = _save_sheared(tmp_path, degrees)
    assert np.abs(qform - sform).max() < 0.2  # what the old warning called "mm"
    on_lattice, inside = _farthest_by_brute_force(qform, sform, SHEARED_SHAPE)
    assert inside <= on_lattice + 1e-9  # the maximum is on the box's boundary

    vol = _load_quietly(path)
    record = vol.record_of("load")
    distance = record.metrics["form_conflict_mm"]
    assert distance == pytest.approx(on_lattice, rel=1e-9)
    assert distance > 5 * np.abs(qform - sform).max()
    assert distance > FORM_CONFLICT_LIMIT_MM  # a sheared header is over the limit
    assert record.metrics["affine_source"] == "qform" and record.metrics["header"] == "auto"
    np.testing.assert_allclose(vol.affine, qform, atol=1e-6)  # FastSurfer's rule kept
    (warning,) = [w for w in record.warnings if "place the field of view" in w]
    assert str(path) in warning
    assert f"up to {distance:.3g} mm apart (at a corner of the grid" in warning
    assert "using the qform as FastSurfer does" in warning
    assert "SPM-coregistered" in warning and "`header: sform`" in warning
    assert header_conflict(record.metrics) == pytest.approx(distance)


def test_the_conflict_is_the_farthest_corner_of_the_voxel_box():
    qform = np.eye(4)
    sform = np.eye(4)
    sform[0, 0] = 1.01  # 1% wider along x: 0 at x = 0, growing to the far face
    # x from -0.5 to 99.5: the far corners are 99.5 * 0.01 from where the qform has them
    assert form_conflict_mm(qform, sform, (100, 10, 10)) == pytest.approx(0.995)
    sform[:3, 3] = [0.0, 3.0, 4.0]  # plus a 5 mm shift everywhere
    assert form_conflict_mm(qform, sform, (1, 1, 1)) == pytest.approx(
        np.hypot(0.005, 5.0), rel=1e-6)


def test_float32_storage_noise_of_an_oblique_grid_is_far_below_the_limit(brain, tmp_path):
    path = tmp_path / "oblique.nii.gz"
    nib.save(_nifti(brain.data, brain.affine), path)  # both forms from one affine
    record = _load_quietly(path).record_of("load")
    assert 0 <= record.metrics["form_conflict_mm"] < 1e-3
    assert header_conflict(record.metrics) is None
    assert not [w for w in record.warnings if "field of view" in w]


def test_a_single_form_has_no_conflict(brain, tmp_path):
    img = _nifti(brain.data, brain.affine)
    img.set_qform(None, code=0)
    path = tmp_path / "sform_only.nii.gz"
    nib.save(img, path)
    metrics = _load_quietly(path).record_of("load").metrics
    assert metrics["form_conflict_mm"] is None and metrics["affine_source"] == "sform"


@pytest.mark.parametrize("form", ["sform", "qform"])
def test_header_option_takes_the_form_asked_for_without_a_warning(tmp_path, form):
    path, qform, sform = _save_sheared(tmp_path, 10.0)
    vol = _load_quietly(path, header=form)
    np.testing.assert_allclose(vol.affine, sform if form == "sform" else qform, atol=1e-6)
    record = vol.record_of("load")
    assert record.metrics["affine_source"] == form and record.metrics["header"] == form
    assert record.params["header"] == form
    assert record.metrics["form_conflict_mm"] > FORM_CONFLICT_LIMIT_MM  # still recorded
    assert header_conflict(record.metrics) is None  # chosen, so not uncertain
    assert not [w for w in record.warnings if "field of view" in w]
    assert read_header(path, header=form).affine_source == form


def test_asking_for_a_form_the_file_does_not_set_names_the_file_and_the_fix(brain, tmp_path):
    img = _nifti(brain.data, brain.affine)
    img.set_sform(None, code=0)
    path = tmp_path / "qform_only.nii.gz"
    nib.save(img, path)
    with pytest.raises(HeaderError) as caught:
        load_volume(path, header="sform")
    message = str(caught.value)
    assert str(path) in message and "sform_code is 0" in message
    assert "ask for the qform or leave `header` empty" in message
    assert load_volume(path, header="qform").record_of("load").metrics["affine_source"] == "qform"


def test_a_label_map_without_the_form_asked_for_is_read_by_the_default_rule(brain, tmp_path):
    # An SPM-like coregistration moved the image's sform (3 mm, 2 degrees); the label map
    # was written on the coregistered grid by a tool that stores the qform alone.
    moved = _rotation_z(2.0) @ brain.affine
    moved[:3, 3] += [3.0, 0.0, 0.0]
    img = _nifti(brain.data, brain.affine)
    img.set_sform(moved, code=2)
    path = tmp_path / "coregistered.nii.gz"
    nib.save(img, path)
    label = nib.Nifti1Image(brain.label, moved)
    label.set_qform(moved, code=1)
    label.set_sform(None, code=0)
    label_path = tmp_path / "coregistered_dseg.nii.gz"
    nib.save(label, label_path)
    vol = _load_quietly(path, label_path=label_path, header="sform")
    np.testing.assert_allclose(vol.affine, moved, atol=1e-4)
    np.testing.assert_array_equal(vol.label, brain.label)
    with pytest.raises(HeaderError, match="label map"):  # by FastSurfer's rule: off-grid
        load_volume(path, label_path=label_path)


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
