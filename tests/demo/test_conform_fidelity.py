"""The conform pipeline gives what FastSurfer's conform gives, on straight and oblique
scans of a synthetic person and of the real Colin27 (mricron-data).

The referee is :mod:`mriprep.demo.fastsurfer_conform`, FastSurfer's conform restated
without mriprep's code. Its grid sits where FastSurfer's does; where FastSurfer moves an
odd-sized 1 mm scan by many voxels to avoid interpolating, the two grids differ by whole
voxels and are compared at equal world positions.
"""

from __future__ import annotations

import functools

import nibabel as nib
import numpy as np
import pytest

from mriprep.core.volume import Volume
from mriprep.demo.calibration import ACQUISITIONS, person, real_head
from mriprep.demo.fastsurfer_conform import (
    LIA,
    agreement,
    conform_scale,
    fastsurfer_conform,
    header_affine,
)
from mriprep.demo.real_scans import HOW_TO_GET, real_scan
from mriprep.demo.scanner import Acquisition, acquire, random_pose
from mriprep.pipelines import load_pipeline
from mriprep.pipelines import run_stages
from mriprep.run.subject import output_tensors
from tests.stages.conftest import TEST_PERSON

# One xdist worker runs the whole module (make test's --dist loadgroup), so that what it
# builds once per process (module fixtures, cached scans) is built once per run.
pytestmark = pytest.mark.xdist_group("conform_fidelity")


@functools.lru_cache(maxsize=1)
def _pipeline():
    return load_pipeline("conform_1mm", output_dtype="uint8")


def _conformed(data, affine):
    volume = run_stages(Volume.from_array(data, affine, subject_id="c"), _pipeline())
    return output_tensors(volume, "uint8")["image"], volume


def _scan(acquisition: Acquisition, seed: int, anatomy=None):
    rng = np.random.default_rng([TEST_PERSON, seed])
    return acquire(anatomy or person(TEST_PERSON), random_pose(rng, 10.0, 10.0),
                   acquisition, rng)


def _check_fidelity(data, affine, oblique: bool):
    ours, volume = _conformed(data, affine)
    theirs, their_affine = fastsurfer_conform(data, affine)
    assert ours.shape == (256, 256, 256) and ours.dtype == np.uint8
    # LIA along the world axes: FastSurfer's strict LIA, obliquity removed.
    np.testing.assert_array_equal(volume.affine[:3, :3], LIA)
    found = agreement(ours, volume.affine, theirs, their_affine)
    assert found.same_axes and found.compared > 1_000_000
    if oblique:
        # Resampled: the same grid as FastSurfer's (voxel 128 at c_ras).
        assert found.offset_voxels == (0.0, 0.0, 0.0)
        np.testing.assert_allclose(volume.affine, their_affine, atol=1e-6)
        assert found.equal > 0.99 and found.within_one > 0.998 and found.mean_abs < 0.01
    else:
        assert volume.record_of("resample").metrics["kernel"].startswith("exact copy")
        assert found.equal > 0.9999 and found.max_abs <= 1
    return found


def test_a_straight_1mm_scan_is_copied_as_fastsurfer_copies_it():
    scan = _scan(ACQUISITIONS["1mm"], 0)
    _check_fidelity(scan.data, scan.affine, oblique=False)


def test_an_oblique_thick_slice_scan_is_rotated_onto_fastsurfers_grid():
    scan = _scan(ACQUISITIONS["ax3_tilt20"], 1)
    assert abs(scan.affine[1, 2]) > 0.3  # the slices really are tilted
    _check_fidelity(scan.data, scan.affine, oblique=True)


# A float32 volume holds 1e308 as Inf; numpy warns of the cast, which is the point.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_extreme_voxels_do_not_change_the_conformed_image_elsewhere():
    """FastSurfer's own histogram would be stretched to 1e308 and give a black image;
    here sanitize fills the voxels and the range stays the clean scan's."""
    scan = _scan(ACQUISITIONS["ax3_tilt20"], 1)
    clean, _ = _conformed(scan.data, scan.affine)
    spiked = scan.data.astype(np.float64)
    spots = [(60, 80, 30), (100, 120, 20), (90, 60, 40)]
    for spot, value in zip(spots, (1e308, 1e30, -1e30)):
        spiked[spot] = value
    image, volume = _conformed(spiked, scan.affine)
    assert volume.record_of("sanitize").metrics["extreme"] + \
        volume.record_of("sanitize").metrics["posinf"] == 3
    differs = np.abs(image.astype(np.int16) - clean.astype(np.int16)) > 1
    # Only the conformed neighbourhoods of the three filled voxels may differ.
    assert np.count_nonzero(differs) < 3 * 64
    assert clean.max() == image.max() == 255


@pytest.mark.calibration  # a real head at 1 mm, straight and tilted: seconds each
@pytest.mark.skipif(real_scan("colin27") is None, reason=HOW_TO_GET)
def test_real_colin27_as_stored_and_tilted_by_20_degrees():
    img = nib.load(real_scan("colin27"))
    data = np.asarray(img.dataobj, dtype=np.float32)
    straight = _check_fidelity(data, header_affine(img), oblique=False)
    # Colin27 is 181 x 217 x 181: FastSurfer moves its grid to avoid interpolation.
    assert straight.offset_voxels != (0.0, 0.0, 0.0) and straight.equal == 1.0
    tilted = acquire(real_head("colin27"), np.eye(4), Acquisition(tilt_deg=20.0),
                     np.random.default_rng(9))
    _check_fidelity(tilted.data, tilted.affine, oblique=True)


def _fastsurfer_conform_module():
    from mriprep.demo.fastsurfer_checkout import fastsurfer_module

    module = fastsurfer_module("FastSurferCNN.data_loader.conform")
    if module is None:
        pytest.skip("FastSurfer's checkout is not here: set MRIPREP_FASTSURFER to it "
                    "(../shared/fastsurfer; .ci/run does)")
    return module


def test_the_referees_range_is_fastsurfers_getscale():
    conform = _fastsurfer_conform_module()
    rng = np.random.default_rng(3)
    for data in (rng.gamma(2.0, 40.0, (30, 32, 28)), np.zeros((20, 20, 20))):
        data[:4] = 0.0
        np.testing.assert_array_equal(conform_scale(data),
                                      conform.getscale(data, 0, 255, 0.0, 0.999))
    nan = rng.gamma(2.0, 40.0, (30, 32, 28))
    nan[5, 5, 5] = np.nan  # both refuse, in numpy's histogram
    for scale in (conform_scale, lambda d: conform.getscale(d, 0, 255, 0.0, 0.999)):
        with pytest.raises(ValueError, match="not finite"):
            scale(nan)


def test_the_referee_takes_a_file_geometry_as_fastsurfer_and_mriprep_do(tmp_path):
    from mriprep.inputs.readers import load_volume

    conform = _fastsurfer_conform_module()
    sform = np.diag([1.0, 1.0, 1.2, 1.0])
    sform[:3, 3] = (-10.0, 4.0, 2.0)
    qform = sform.copy()
    qform[:3, 3] += (0.0, 3.0, 0.0)  # 3 mm apart: FastSurfer takes the qform
    for q, expected in ((sform, sform), (qform, qform)):
        image = nib.Nifti1Image(np.ones((6, 6, 6), np.float32), sform)
        image.set_qform(q, code=1)
        path = tmp_path / "scan.nii"
        nib.save(image, path)
        loaded = nib.load(path)
        np.testing.assert_allclose(header_affine(loaded), expected, atol=1e-5)
        conform.check_affine_in_nifti(loaded)  # sets the sform to its choice
        np.testing.assert_allclose(loaded.affine, header_affine(nib.load(path)), atol=1e-6)
        np.testing.assert_allclose(load_volume(path, subject_id="s").affine, expected,
                                   atol=1e-5)
