"""An image already conformed (FastSurfer's ``is_conform``) keeps its voxels and affine.

FastSurfer uses an ``orig.mgz`` that is already conformed as it is; the conform_1mm
pipeline used to rescale its 0-255 grey levels by FastSurfer's robust range again, which
moved thousands of voxels by a grey level. These tests run the shipped pipeline on such
an image and compare every voxel of the cache with the file.
"""

from __future__ import annotations

import dataclasses

import nibabel as nib
import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.core.volume import StageRecord, Volume
from mriprep.demo.fastsurfer_conform import LIA, fastsurfer_conform, is_conform
from mriprep.inputs.templates import load_template
from mriprep.pipelines import load_pipeline
from mriprep.run.cohort import cohort_rows, run_cohort
from mriprep.stages import get_stage
from mriprep.stages.resample.conformed import conform_mismatches

# A 1 mm block of MNI152 around the head, conformed once as FastSurfer conforms it.
BLOCK = (slice(20, 170), slice(20, 200), slice(10, 160))


@pytest.fixture(scope="module")
def orig(tmp_path_factory):
    """An orig.mgz as FastSurfer writes one (uint8, 256^3, 1 mm, LIA), and its cache."""
    root = tmp_path_factory.mktemp("conformed")
    mni = load_template("mni152")
    data = np.ascontiguousarray(mni.data[BLOCK]).astype(np.float32)
    affine = mni.affine.copy()
    affine[:3, 3] += affine[:3, :3] @ [b.start for b in BLOCK]
    image, image_affine = fastsurfer_conform(data, affine)
    assert image.dtype == np.uint8 and is_conform(image, image_affine)
    path = root / "orig.mgz"
    nib.save(nib.MGHImage(image, image_affine), path)
    (root / "cohort.csv").write_text("subject_id,image\nsub-01,orig.mgz\n")
    result = run_cohort(cohort_rows(root / "cohort.csv"), root / "cache",
                        load_pipeline("conform_1mm"), scheduler="sync", report=False)
    assert result.count("cached") == 1, result.failed
    cache = Cache(root / "cache")
    ref = next(iter(cache.entries()))
    return path, cache, ref


def test_a_conformed_orig_mgz_is_cached_voxel_for_voxel(orig):
    path, cache, ref = orig
    img = nib.load(path)
    cached = cache.load_tensor(ref.key, "image")
    assert cached.dtype == np.uint8
    changed = int(np.count_nonzero(cached != np.asarray(img.dataobj)))
    assert changed == 0, f"{changed} voxels of an already conformed orig.mgz changed"
    np.testing.assert_array_equal(np.asarray(cache.read_meta(ref.key)["affine"]), img.affine)


def test_the_run_says_it_was_already_conformed(orig):
    _, cache, ref = orig
    records = {r["stage"]: r["metrics"] for r in cache.read_meta(ref.key)["provenance"]}
    assert records["resample"]["already_conformed"] is True
    assert records["resample"]["kernel"].startswith("none: already conformed")
    assert records["normalize"]["rescaled"] is False
    assert "uint8" in records["normalize"]["why_not_rescaled"]


def _uint8_volume(shape, affine, dtype_on_disk="uint8") -> Volume:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, shape).astype(np.float32)
    load = StageRecord("load", {}, {"dtype_on_disk": dtype_on_disk, "scaling_applied": False})
    return Volume.from_array(data, affine).with_record(load)


def _lia(size: int) -> np.ndarray:
    affine = np.eye(4)
    affine[:3, :3] = LIA
    affine[:3, 3] = [size / 2, -size / 2, size / 2]
    return affine


SMALL = dict(shape=(8, 8, 8), spacing=(1.0, 1.0, 1.0), orientation="LIA",
             axis_aligned=True, centre="freesurfer")


def test_round_off_within_fastsurfers_eps_is_still_conformed():
    resample = get_stage("resample")
    affine = _lia(8)
    affine[0, 1] = 5e-7   # a rotation by round-off, and a voxel size off by as little
    affine[1, 2] *= 1 + 5e-7
    volume = _uint8_volume((8, 8, 8), affine)
    out = resample(volume, **SMALL)
    assert out.record_of("resample").metrics["already_conformed"] is True
    np.testing.assert_array_equal(out.data, volume.data)
    np.testing.assert_array_equal(out.affine, affine)


@pytest.mark.parametrize("change, rule", [
    (lambda v: v.with_record(StageRecord("load", {}, {"dtype_on_disk": "float32"})),
     "dtype float32"),
    (lambda v: dataclasses.replace(v, affine=v.affine @ np.diag([1.001, 1, 1, 1])),
     "voxel sizes"),
    (lambda v: dataclasses.replace(v, affine=v.affine[:, [1, 0, 2, 3]]), "voxel axes"),
])
def test_an_image_off_the_target_is_conformed_as_usual(change, rule):
    volume = change(_uint8_volume((8, 8, 8), _lia(8)))
    load = volume.record_of("load")
    found = conform_mismatches(volume.affine, volume.shape, load.metrics["dtype_on_disk"],
                               (8, 8, 8), (1.0, 1.0, 1.0), "LIA")
    assert len(found) == 1 and found[0].startswith(rule)
    out = get_stage("resample")(volume, **SMALL)
    assert out.record_of("resample").metrics["already_conformed"] is False


def test_the_fastsurfer_restatement_keeps_a_uint8_image_unscaled():
    # FastSurfer's conform takes no range of a uint8 input: a 2 mm uint8 scan whose
    # brightest voxels would set the range keeps its grey levels (up to interpolation).
    data = np.zeros((64, 64, 64), np.uint8)
    data[16:48, 16:48, 16:48] = 100
    data[30:34, 30:34, 30:34] = 250
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    out, _ = fastsurfer_conform(data, affine)
    assert set(np.unique(out)) <= set(range(0, 251)) and out.max() == 250
    assert np.count_nonzero(out == 100) > 100_000
    # An image already conformed comes back as it is.
    again, again_affine = fastsurfer_conform(out, _)
    assert again is out or np.array_equal(again, out)
    np.testing.assert_array_equal(again_affine, _)
