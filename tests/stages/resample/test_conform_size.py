"""FastSurfer's voxel-size and image-size rules (``spacing: min``, ``shape: fov``), the
parameters that carry them, and that adding them kept every shipped pipeline's hash.

With ``MRIPREP_FASTSURFER`` set, the rules are compared with FastSurfer's own
``get_conformed_vox_img_size`` on many headers; the voxel-for-voxel comparison of the
whole pipeline is tests/demo/test_conform_min_fidelity.py.
"""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from mriprep.core.errors import PipelineConfigError
from mriprep.core.volume import Volume
from mriprep.demo.fastsurfer_checkout import HOW_TO_ENABLE, fastsurfer_module
from mriprep.pipelines import load_pipeline
from mriprep.stages import get_stage
from mriprep.stages.resample import ResampleParams
from mriprep.stages.resample.conform_size import conformed_image_size, conformed_voxel_size

# The hashes of the shipped pipelines as they were without the FastSurfer sizing options:
# their caches must stay valid. The package version is part of every hash, so a release
# that raises it records its own hashes here (0.8.1's).
HASHES_BEFORE = {
    "conform_1mm": "7faef3e2bd08b4c916d10a97f48a2e1927183b8b396b4dbf1729a1a87ae29a52",
    "t1w_mni_rigid": "9a4f592d7eef03415e07d6c67b7797f877892f809f55ed4cc8b86f71a75dac63",
}


@pytest.mark.parametrize("name", sorted(HASHES_BEFORE))
def test_options_left_at_their_defaults_keep_a_pipelines_hash(name):
    assert load_pipeline(name).hash == HASHES_BEFORE[name]


def test_an_option_that_is_set_changes_the_hash(tmp_path):
    text = (load_pipeline("conform_1mm").source and
            open(load_pipeline("conform_1mm").source).read())
    edited = tmp_path / "edited.yaml"
    edited.write_text(text.replace("      label_interpolation: nearest",
                                   "      label_interpolation: nearest\n"
                                   "      snap_to_input: false"))
    assert load_pipeline(str(edited)).hash != HASHES_BEFORE["conform_1mm"]


@pytest.mark.parametrize("sizes, threshold, expected", [
    ((0.8, 0.8, 0.8), None, 0.8),
    ((0.9, 0.7, 1.2), None, 0.7),
    ((1.2, 1.2, 1.2), None, 1.0),           # never above 1 mm
    ((0.99, 0.99, 1.0), 0.98, 1.0),         # run_fastsurfer.sh's threshold
    ((0.98, 0.98, 1.0), 0.98, 0.98),        # at the threshold: kept
    ((0.833333, 0.833333, 1.0), None, 0.8333),  # rounded to 1e-4 mm
])
def test_voxel_size_min(sizes, threshold, expected):
    assert conformed_voxel_size(sizes, threshold) == expected


def test_the_image_size_covers_the_largest_field_of_view():
    assert conformed_image_size((512, 512, 176), (0.5, 0.5, 1.0), 0.5) == 512
    assert conformed_image_size((240, 320, 320), (0.8, 0.8, 0.8), 0.8) == 320
    # 200 * 0.8 mm is 160 mm, 200 voxels: the cube keeps FreeSurfer's 256.
    assert conformed_image_size((200, 200, 200), (0.8, 0.8, 0.8), 0.8) == 256
    # At 1 mm always 256, whatever the field of view (FreeSurfer's conform crops).
    assert conformed_image_size((300, 300, 300), (1.0, 1.0, 1.0), 1.0) == 256


def test_fastsurfers_own_rules_agree_on_many_headers():
    conform = fastsurfer_module("FastSurferCNN.data_loader.conform")
    if conform is None:
        pytest.skip(HOW_TO_ENABLE)
    rng = np.random.default_rng(0)
    for _ in range(300):
        sizes = rng.choice([0.5, 0.6, 0.7, 0.75, 0.8, 0.833333, 0.9, 0.94, 0.98, 0.99,
                            1.0, 1.2, 1.5, 3.0], size=3)
        shape = tuple(int(n) for n in rng.integers(60, 520, size=3))
        # A zero-stride array: FastSurfer reads the shape and the zooms only.
        img = nib.Nifti1Image(np.broadcast_to(np.uint8(0), shape), np.diag([*sizes, 1.0]))
        for threshold in (None, 0.98, 0.9):
            theirs = conform.get_conformed_vox_img_size(img, "min", threshold)
            size = conformed_voxel_size(sizes, threshold)
            assert (size, conformed_image_size(shape, sizes, size)) == theirs, \
                (sizes, shape, threshold)


@pytest.mark.parametrize("params, says", [
    (dict(spacing=(0.8, 0.8, 1.0), shape="fov"), "isotropic"),
    (dict(spacing=1.2, shape="fov"), "(0, 1.0] mm"),
    (dict(spacing=(1.0, 1.0, 1.0), to_1mm_threshold=0.98), "applies to spacing: min"),
    (dict(spacing=0.8, voxel_size_from="header"), "does nothing: remove it"),
    (dict(spacing="min", to_1mm_threshold=1.5), "(0, 1] mm"),
    (dict(clip_to=(255.0, 0.0)), "low < high"),
])
def test_what_fastsurfer_refuses_is_refused_when_the_pipeline_loads(params, says):
    with pytest.raises(PipelineConfigError, match=f".*{says}".replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        ResampleParams(**params)


def test_one_number_is_an_isotropic_spacing():
    assert ResampleParams(spacing=0.8, shape="fov").spacing == (0.8, 0.8, 0.8)


def _cube(spacing, shape=(80, 96, 80)) -> Volume:
    rng = np.random.default_rng(1)
    data = rng.uniform(10, 200, size=shape).astype(np.float32)
    return Volume.from_array(data, np.diag([*spacing, 1.0]), subject_id="s")


def test_min_and_fov_choose_fastsurfers_grid_and_say_why():
    params = ResampleParams(spacing="min", shape="fov", orientation="LIA",
                            axis_aligned=True, centre="freesurfer", snap_to_input=False,
                            voxel_size_from="header")
    out = get_stage("resample")(_cube((0.8, 0.8, 0.9), shape=(300, 340, 280)), params)
    assert out.shape == (340,) * 3
    np.testing.assert_allclose(out.spacing, (0.8, 0.8, 0.8))
    record = out.record_of("resample")
    rule = record.metrics["voxel_size_rule"]
    assert rule["voxel_size_mm"] == 0.8 and rule["claimed_mm"] == [0.8, 0.8, 0.9]
    assert rule["acquired_mm"] is None and not record.warnings


def test_a_voxel_size_under_0_7_mm_is_served_with_fastsurfers_warning():
    params = ResampleParams(spacing="min", shape="fov", orientation="LIA",
                            axis_aligned=True, voxel_size_from="header")
    out = get_stage("resample")(_cube((0.6, 0.6, 0.6), shape=(200, 240, 200)), params)
    assert out.shape == (256,) * 3
    assert any("experimental" in w and "0.6 mm" in w
               for w in out.record_of("resample").warnings)


def test_clip_to_clips_after_interpolating_without_touching_the_input():
    """A spike of 1000 in a field of 100, onto a grid twice as fine: clipped after the
    interpolation, every output voxel that takes more than a sixth of the spike reaches
    255; clipped before, only a voxel on the spike's own centre could."""
    volume = _cube((1.0, 1.0, 1.0))
    volume.data[35:46, 35:46, 35:46] = 100.0
    volume.data[40, 40, 40] = 1000.0
    before = volume.data.copy()
    params = ResampleParams(spacing=(0.5, 0.5, 0.5), shape=(160, 192, 160), clip_to=(0, 255))
    out = get_stage("resample")(volume, params)
    assert out.data.max() == 255.0
    assert int((out.data == 255.0).sum()) >= 8
    np.testing.assert_array_equal(volume.data, before)


def test_min_takes_the_resolution_the_image_carries_not_a_false_claim():
    """A 1 mm acquisition exported on a 0.5 mm grid (linear interpolation, as a
    converter does) is conformed to 1 mm, not to a 0.5 mm cube eight times its size,
    and the warning names both sizes; the header's claim wins with voxel_size_from:
    header."""
    from scipy.ndimage import zoom

    from mriprep.demo.calibration import person
    from mriprep.demo.scanner import Acquisition, acquire

    rng = np.random.default_rng(3)
    scan = acquire(person(0), np.eye(4), Acquisition(spacing=(1.0, 1.0, 1.0)), rng)
    block = scan.data[40:150, 40:150, 60:170]
    fine = zoom(block, 2.0, order=1).astype(np.float32)
    affine = scan.affine.copy()
    affine[:3, :3] /= 2.0
    volume = Volume.from_array(fine, affine, subject_id="s")
    params = ResampleParams(spacing="min", shape="fov", orientation="LIA",
                            axis_aligned=True, centre="freesurfer", snap_to_input=False)
    out = get_stage("resample")(volume, params)
    record = out.record_of("resample")
    assert record.metrics["voxel_size_rule"]["acquired_mm"] == [1.0, 1.0, 1.0]
    np.testing.assert_allclose(out.spacing, (1.0, 1.0, 1.0))
    assert out.shape == (256,) * 3
    assert any("claims 0.5 mm" in w for w in record.warnings)
    as_claimed = get_stage("resample")(volume, params, voxel_size_from="header")
    assert as_claimed.spacing[0] == pytest.approx(0.5)
