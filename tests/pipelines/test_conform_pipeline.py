"""The shipped conform_1mm pipeline end to end: what lands in the cache.

A 1 mm scan reaches the 256^3 LIA grid by an exact copy (no interpolation), so every
cached voxel can be traced back to the input voxel at the same world position: its value
must be that voxel's, scaled by the normalize stage's recorded clipping range, and its
label the input's label. This holds whatever order the stages run in, and whether the
file stores its axes as RAS or flipped (LAS); the flip moves FreeSurfer's grid centre
by one voxel, as it moves FastSurfer's. Fidelity to FastSurfer itself, on real and
oblique scans, is tested in tests/test_conform_fidelity.py.
"""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.inputs.templates import load_mni152_tissue, load_template
from mriprep.pipelines import load_pipeline
from mriprep.run.cohort import run_cohort, cohort_rows
from mriprep.stages.reorient import orientation_codes

# One xdist worker runs the whole module (make test's --dist loadgroup), so that what it
# builds once per process (module fixtures, cached scans) is built once per run.
pytestmark = pytest.mark.xdist_group("conform_pipeline")

# A 1 mm block of MNI152 around the brain: small enough to run fast, big enough for the
# slice statistics of mask_slices.
BLOCK = (slice(30, 160), slice(40, 190), slice(20, 150))


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    """One 1 mm head stored RAS, the same head stored LAS, and a 1x1x3 mm version."""
    root = tmp_path_factory.mktemp("conform")
    mni = load_template("mni152")
    tissue = load_mni152_tissue()
    data = np.ascontiguousarray(mni.data[BLOCK]).astype(np.float32)
    labels = np.select([tissue["wm"][BLOCK] > 0.5, tissue["gm"][BLOCK] > 0.5,
                        data > 0.05 * data.max()], [3, 2, 1], 0).astype(np.int16)
    affine = mni.affine.copy()
    affine[:3, 3] += affine[:3, :3] @ [b.start for b in BLOCK]
    flip = np.diag([-1.0, 1.0, 1.0, 1.0])
    flip[0, 3] = data.shape[0] - 1  # voxel i -> n-1-i keeps every world position
    thick = np.diag([1.0, 1.0, 3.0, 1.0])
    files = {
        "sub-ras": (data, labels, affine),
        "sub-las": (data[::-1], labels[::-1], affine @ flip),
        "sub-thick": (data[:, :, ::3], labels[:, :, ::3], affine @ thick),
    }
    rows = ["subject_id,image,label,split"]
    for sid, (image, label, aff) in files.items():
        nib.save(nib.Nifti1Image(np.ascontiguousarray(image), aff), root / f"{sid}.nii.gz")
        nib.save(nib.Nifti1Image(np.ascontiguousarray(label), aff), root / f"{sid}_dseg.nii.gz")
        rows.append(f"{sid},{sid}.nii.gz,{sid}_dseg.nii.gz,train")
    (root / "cohort.csv").write_text("\n".join(rows) + "\n")
    cache_root = root / "cache"
    # float32: the exact values the tests below compare (the shipped uint8 rounds them).
    result = run_cohort(cohort_rows(root / "cohort.csv"), cache_root,
                        load_pipeline("conform_1mm", output_dtype="float32"), scheduler="sync",
                        report=False)
    assert result.count("cached") == 3, result.failed
    return root, Cache(cache_root), files


def _entry(cache: Cache, subject_id: str):
    ref = next(r for r in cache.entries() if r.subject_id == subject_id)
    return ref, cache.read_meta(ref.key)


@pytest.mark.parametrize("subject_id", ["sub-ras", "sub-las", "sub-thick"])
def test_conform_entries_are_lia_256_cubed_and_0_255(scans, subject_id):
    _, cache, _ = scans
    ref, meta = _entry(cache, subject_id)
    image = cache.load_tensor(ref.key, "image")
    valid = cache.load_tensor(ref.key, "valid")
    assert image.shape == valid.shape == (256, 256, 256) and image.dtype == np.float32
    affine = np.asarray(meta["affine"])
    assert orientation_codes(affine) == "LIA"
    np.testing.assert_allclose(np.linalg.norm(affine[:3, :3], axis=0), 1.0)
    assert np.isfinite(image).all()
    assert image.min() >= 0.0 and image.max() <= 255.0
    # Invalid voxels (outside the scan, or touched by a filled one): all at 0.
    assert not valid.all() and (image[~valid] == 0).all()
    stages = [p["stage"] for p in meta["provenance"]]
    assert stages == ["load", "sanitize", "plausibility", "mask_slices", "normalize", "resample",
                      "validate"]


@pytest.mark.parametrize("subject_id", ["sub-ras", "sub-las"])
def test_1mm_scans_are_copied_exactly_onto_the_conform_grid(scans, subject_id):
    _, cache, files = scans
    data, labels, in_affine = files[subject_id]
    ref, meta = _entry(cache, subject_id)
    image = cache.load_tensor(ref.key, "image")
    label = cache.load_tensor(ref.key, "label")
    valid = cache.load_tensor(ref.key, "valid")
    normalize = next(p for p in meta["provenance"] if p["stage"] == "normalize")
    low, high = normalize["metrics"]["clip_range"]
    # Every output voxel's world position, as an input voxel index: whole numbers.
    out_to_in = np.linalg.inv(in_affine) @ np.asarray(meta["affine"])
    np.testing.assert_allclose(out_to_in, np.rint(out_to_in), atol=1e-4)
    out_to_in = np.rint(out_to_in).astype(int)
    ijk = np.argwhere(valid)
    source = (ijk @ out_to_in[:3, :3].T + out_to_in[:3, 3]).T
    assert valid.sum() == data.size  # the whole scan, and nothing else, is valid
    expected = (np.clip(data[tuple(source)], np.float32(low), np.float32(high))
                - np.float32(low)) * np.float32(255.0 / (high - low))
    np.testing.assert_allclose(image[valid], expected, rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(label[valid], labels[tuple(source)])
    assert (label[~valid] == 0).all()


def test_stored_axis_order_moves_the_grid_by_a_voxel_and_changes_nothing_else(scans):
    """FreeSurfer's c_ras is the stored voxel n/2, which a flipped axis puts one voxel
    further along: the grid moves by that voxel (as FastSurfer's does), and at equal
    world positions the tensors are equal."""
    _, cache, _ = scans
    (ras, ras_meta), (las, las_meta) = _entry(cache, "sub-ras"), _entry(cache, "sub-las")
    ras_affine, las_affine = np.asarray(ras_meta["affine"]), np.asarray(las_meta["affine"])
    np.testing.assert_array_equal(ras_affine[:3, :3], las_affine[:3, :3])
    shift = np.linalg.solve(ras_affine[:3, :3], las_affine[:3, 3] - ras_affine[:3, 3])
    np.testing.assert_allclose(np.abs(shift), [1, 0, 0], atol=1e-6)  # along L-R only
    along = int(np.rint(shift[0]))  # LAS voxel v lies at RAS voxel v + along
    for name in ("image", "valid", "label"):
        a, b = cache.load_tensor(ras.key, name), cache.load_tensor(las.key, name)
        if along > 0:
            np.testing.assert_array_equal(a[along:], b[:-along])
        else:
            np.testing.assert_array_equal(a[:along], b[-along:])
    # The quality stages ran on the stored axes (LAS flips axis 0), and still scored the
    # same voxels: their scoring lattice is anchored to the anatomy.
    scores = []
    for meta in (ras_meta, las_meta):
        masked = next(p for p in meta["provenance"] if p["stage"] == "mask_slices")
        scores.append([masked["metrics"][f"axis_{axis}"]["max_unflagged_abs_log_ratio"]
                       for axis in range(3)])
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-6)


def test_a_uint8_conform_cache_holds_fastsurfers_rounded_values_and_is_served(
        scans, tmp_path):
    """The shipped ``conform_1mm`` (uint8, masks LZ4): the cache stores what the float32
    run stores, rounded, the check passes it and the Dataset serves float32."""
    import torch

    from mriprep.check import check_cache
    from mriprep.training import MRIDataset

    root, float_cache, _ = scans
    pipeline = load_pipeline("conform_1mm")
    assert pipeline.params_of("validate").output_dtype == "uint8"
    assert pipeline.hash != load_pipeline("conform_1mm", output_dtype="float32").hash
    result = run_cohort(cohort_rows(root / "cohort.csv"), tmp_path / "cache",
                        pipeline, scheduler="sync", report=False)
    assert result.count("cached") == 3, result.failed
    cache = Cache(tmp_path / "cache")
    ref, _ = _entry(cache, "sub-thick")
    image = cache.load_tensor(ref.key, "image")
    assert image.dtype == np.uint8
    assert [ref.files[n].file for n in ("image", "valid", "label")] == [
        "image.npy", "valid.b2nd", "label.b2nd"]
    float_ref, _ = _entry(float_cache, "sub-thick")
    for name in ("valid", "label"):  # compressed, and the same values
        np.testing.assert_array_equal(cache.load_tensor(ref.key, name),
                                      float_cache.load_tensor(float_ref.key, name))
    exact = float_cache.load_tensor(float_ref.key, "image")
    np.testing.assert_array_equal(image, np.clip(np.rint(exact), 0, 255).astype(np.uint8))
    assert check_cache(tmp_path / "cache").ok
    item = MRIDataset(tmp_path / "cache", split="train")[0]["image"]
    assert item.dtype == torch.float32 and float(item.max()) == 255.0
