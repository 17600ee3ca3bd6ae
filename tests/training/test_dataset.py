"""MRIDataset over caches built from the MNI152 template: items, sampling rules, refusals.

The caches are written with the cache API directly (:mod:`tests.training.template_cache`;
the shared one is ``cache_dir`` in ``conftest.py``).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from mriprep.cache import Cache
from mriprep.core.errors import CacheError
from mriprep.training import MRIDataset, make_dataloader
from tests.training.template_cache import adopt_entry, build_template_cache


# -- import and items ----------------------------------------------------------------------


def test_importing_mriprep_does_not_import_torch():
    code = (
        "import sys, mriprep; assert 'torch' not in sys.modules; "
        "from mriprep import MRIDataset, make_dataloader; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_volume_items_are_the_cached_tensors(cache_dir):
    ds = MRIDataset(cache_dir, split="val")
    cache = Cache(cache_dir)
    item = ds[1]
    ref = cache.entries("val")[1]
    assert item["subject_id"] == ref.subject_id
    assert item["image"].dtype == torch.float32 and item["image"].shape == (1, 50, 59, 48)
    assert item["label"].dtype == torch.int64 and item["label"].shape == (50, 59, 48)
    assert item["valid"].dtype == torch.bool
    np.testing.assert_array_equal(item["image"][0].numpy(), cache.load_tensor(ref.key, "image"))
    np.testing.assert_array_equal(item["label"].numpy(), cache.load_tensor(ref.key, "label"))
    np.testing.assert_array_equal(item["valid"].numpy(), cache.load_tensor(ref.key, "valid"))
    np.testing.assert_allclose(item["affine"].numpy(), ref.affine)
    assert set(np.unique(item["label"].numpy())) == {0, 1, 2}


def test_opening_reads_only_the_index(cache_dir, monkeypatch):
    def no_tensor_reads(*args, **kwargs):
        raise AssertionError("MRIDataset read a tensor in __init__")

    monkeypatch.setattr(np, "load", no_tensor_reads)
    ds = MRIDataset(cache_dir, split="train", mode="patch", patch_size=16)
    assert len(ds) == 4 * 4
    monkeypatch.undo()
    assert ds[0]["image"].shape == (1, 16, 16, 16)


def test_transform_is_applied_to_each_item(cache_dir):
    def flip(item):
        return {**item, "image": torch.flip(item["image"], dims=[1])}

    plain = MRIDataset(cache_dir, split="val")[0]["image"]
    flipped = MRIDataset(cache_dir, split="val", transform=flip)[0]["image"]
    torch.testing.assert_close(flipped, torch.flip(plain, dims=[1]))


# -- sampling rules ------------------------------------------------------------------------


@pytest.mark.parametrize("axis,context", [(2, 0), (2, 3), (0, 1)])
def test_slice_mode_never_yields_a_masked_slice(cache_dir, axis, context):
    ds = MRIDataset(cache_dir, split="train", mode="slice", axis=axis, context=context,
                    min_valid_fraction=0.5)
    cache = Cache(cache_dir)
    valid = {r.subject_id: cache.load_tensor(r.key, "valid") for r in cache.entries("train")}
    expected = 0
    for mask in valid.values():
        other = tuple(a for a in range(3) if a != axis)
        fraction = mask.mean(axis=other)
        expected += int((fraction >= 0.5).sum())
        if axis == 2:
            assert (fraction == 0).sum() == 1  # the zero-filled slice of each subject
    assert len(ds) == expected
    seen = 0
    for batch in make_dataloader(ds, batch_size=16, num_workers=2, shuffle=True):
        assert batch["image"].shape[1] == 2 * context + 1
        for sid, k, mask in zip(batch["subject_id"], batch["slice_index"], batch["valid"]):
            stored = np.take(valid[sid], int(k), axis=axis)
            np.testing.assert_array_equal(mask.numpy(), stored)
            assert stored.mean() >= 0.5
            seen += 1
    assert seen == expected


def test_slice_context_channels_are_the_neighbouring_slices(cache_dir):
    ds = MRIDataset(cache_dir, split="val", mode="slice", axis=2, context=2)
    item = ds[0]  # slice 0: neighbours below the edge repeat slice 0
    ref = Cache(cache_dir).entries("val")[0]
    image = Cache(cache_dir).load_tensor(ref.key, "image")
    k = int(item["slice_index"])
    for c, offset in enumerate(range(-2, 3)):
        np.testing.assert_array_equal(
            item["image"][c].numpy(), image[:, :, min(max(k + offset, 0), image.shape[2] - 1)])


def test_patch_centres_are_valid_and_foreground_share_is_honoured(tmp_path):
    root = build_template_cache(tmp_path / "c", splits={"train": 2})
    # Invalidate most of the volume so that an unchecked centre would often be invalid.
    cache = Cache(root)
    for ref in cache.entries("train"):
        path = cache.tensor_path(ref.key, "valid")
        valid = np.load(path)
        valid[: valid.shape[0] * 2 // 3] = False
        np.save(path, valid)
    size = np.array([12, 10, 8])
    ds = MRIDataset(root, split="train", mode="patch", patch_size=tuple(size),
                    samples_per_volume=50, foreground_fraction=0.5)
    stored = {r.subject_id: (cache.load_tensor(r.key, "valid"), cache.load_tensor(r.key, "label"))
              for r in cache.entries("train")}
    on_foreground = 0
    for batch in make_dataloader(ds, batch_size=10, num_workers=2, seed=3):
        for sid, start, valid, label in zip(batch["subject_id"], batch["location"],
                                            batch["valid"], batch["label"]):
            centre = tuple(int(c) for c in start.numpy() + size // 2)
            assert stored[sid][0][centre], f"patch of {sid} centred on invalid voxel {centre}"
            assert valid[tuple(size // 2)], "the patch's own mask must agree"
            on_foreground += int(label[tuple(size // 2)] > 0)
    assert on_foreground >= 50  # 25 of every 50 samples per volume are drawn on labels


# -- refusals ------------------------------------------------------------------------------


def test_mixed_pipeline_hashes_are_refused(tmp_path):
    root = build_template_cache(tmp_path / "c", splits={"train": 2}, pipeline_hash="a" * 64)
    other = build_template_cache(tmp_path / "d", splits={"val": 1}, pipeline_hash="b" * 64,
                                 first=9)
    adopt_entry(other, root)
    with pytest.raises(CacheError, match=r"mixes 2 pipeline hashes: aaaa.*bbbb.*one pipeline"):
        MRIDataset(root, split="train")


def test_missing_tensor_files_are_refused(tmp_path):
    root = build_template_cache(tmp_path / "c", splits={"train": 2})
    cache = Cache(root)
    ref = cache.entries("train")[1]
    cache.tensor_path(ref.key, "valid").unlink()
    missing = rf"(?s){ref.subject_id}: .*valid.npy is missing.*mriprep run"
    with pytest.raises(CacheError, match=missing):
        MRIDataset(root, split="train")


def test_empty_split_is_refused_with_the_splits_that_exist(cache_dir):
    splits = r"no entries in split 'test'; its splits are 'train' \(4\), 'val' \(2\)"
    with pytest.raises(CacheError, match=splits):
        MRIDataset(cache_dir, split="test")


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(mode="voxel"), "unknown mode 'voxel'"),
        (dict(mode="volume", patch_size=32), "patch_size only apply to mode='patch'"),
        (dict(mode="patch", axis=1), "axis only apply to mode='slice'"),
        (dict(mode="patch", patch_size=64), r"patch_size \(64, 64, 64\) is larger than 4 volume"),
        (dict(mode="patch", patch_size=8, foreground_fraction=1.5), "between 0 and 1"),
        (dict(mode="patch", patch_size=8, foreground_fraction=0.5, labels=False), "needs label"),
        (dict(mode="slice", axis=3), "axis must be 0, 1 or 2"),
    ],
)
def test_bad_dataset_options_are_refused(cache_dir, options, message):
    with pytest.raises(ValueError, match=message):
        MRIDataset(cache_dir, split="train", **options)


# -- storage formats -----------------------------------------------------------------------


@pytest.mark.parametrize("mode, options", [
    ("volume", {}),
    ("patch", {"patch_size": 16, "samples_per_volume": 3, "foreground_fraction": 0.5}),
    ("slice", {"axis": 0, "context": 2}),
    ("slice", {"axis": 2, "context": 1}),
])
def test_a_compressed_cache_serves_what_the_npy_cache_serves(tmp_path, mode, options):
    """The same float16 values stored as .npy and as LZ4 .b2nd: every item of every mode
    equal, drawn with the same seed, delivered as float32."""
    plain = build_template_cache(tmp_path / "npy", image_dtype="float16")
    packed = build_template_cache(tmp_path / "b2nd", image_dtype="float16", compression="lz4")
    assert Cache(packed).tensor_path(Cache(packed).entries()[0].key, "image").suffix == ".b2nd"
    loaders = [make_dataloader(MRIDataset(root, split="train", mode=mode, **options),
                               batch_size=2, num_workers=2, seed=3) for root in (plain, packed)]
    batches = 0
    for a, b in zip(*loaders):
        assert a["image"].dtype == b["image"].dtype == torch.float32
        for name in ("image", "valid", "label"):
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
        assert a["subject_id"] == b["subject_id"]
        batches += 1
    assert batches == len(loaders[0]) > 0
