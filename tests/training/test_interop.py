"""MRIDataset items as MONAI and TorchIO take them: affines on every item, session ids,
channel-first masks, MetaTensors through MONAI transforms, and TorchIO's Queue.

The caches are the template caches of :mod:`tests.training.template_cache` (RAS, 4 mm):
what is tested is geometry bookkeeping, which the anatomy does not change.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mriprep.cache import Cache
from mriprep.training import DiceLoss, MRIDataset, make_dataloader, to_torchio_subject
from tests.training.template_cache import build_template_cache


# Imported by the tests that use them, not at collection: MONAI's import alone takes
# seconds, in every xdist worker.
@pytest.fixture(scope="module")
def monai():
    return pytest.importorskip("monai", reason="pip install monai (mriprep's interop extra)")


@pytest.fixture(scope="module")
def tio():
    return pytest.importorskip("torchio", reason="pip install torchio (mriprep's interop extra)")


def world(affine, voxel) -> np.ndarray:
    return np.asarray(affine, dtype=float)[:3] @ np.append(np.asarray(voxel, dtype=float), 1.0)


@pytest.fixture(scope="module")
def session_cache(tmp_path_factory):
    return build_template_cache(tmp_path_factory.mktemp("ses") / "c",
                                splits={"train": 2}, session="ses-2")


@pytest.mark.parametrize("mode, options", [
    ("volume", {}), ("patch", {"patch_size": 16}), ("slice", {"axis": 1, "context": 1}),
])
def test_every_item_has_its_session_and_the_affine_of_its_own_voxels(
        session_cache, mode, options):
    ds = MRIDataset(session_cache, "train", mode, **options)
    entry = ds.entries[0]
    volume = Cache(session_cache).load_tensor(entry.key, "image")
    item = ds[0]
    assert item["session_id"] == "ses-2" and item["subject_id"] == entry.subject_id
    affine = item["affine"].numpy()
    if mode == "volume":
        np.testing.assert_allclose(affine, entry.affine)
        return
    if mode == "patch":
        start = item["location"].numpy()
        probe = np.array([3, 5, 7])
        cache_voxel = start + probe
        assert item["image"][0][tuple(probe)] == volume[tuple(cache_voxel)]
    else:
        k = int(item["slice_index"])
        probe = np.array([3, 5, 0])  # (in-plane i, in-plane j, along the normal)
        cache_voxel = np.array([3, k, 5])
        assert item["image"][1][3, 5] == volume[tuple(cache_voxel)]
    np.testing.assert_allclose(world(affine, probe), world(entry.affine, cache_voxel))
    batch = next(iter(make_dataloader(ds, batch_size=2, shuffle=False, seed=0)))
    assert batch["session_id"] == ["ses-2", "ses-2"]
    assert batch["affine"].shape == (2, 4, 4)


@pytest.mark.parametrize("mode, options", [("volume", {}), ("slice", {"context": 2})])
def test_channel_first_gives_masks_the_image_layout(cache_dir, mode, options):
    plain = MRIDataset(cache_dir, "val", mode, **options)
    first = MRIDataset(cache_dir, "val", mode, channel_first=True, **options)
    a, b = plain[0], first[0]
    assert b["valid"].shape == (1, *a["valid"].shape) == (1, *b["image"].shape[1:])
    assert torch.equal(b["label"][0], a["label"]) and torch.equal(b["valid"][0], a["valid"])
    batch = next(iter(make_dataloader(first, batch_size=2, shuffle=False, seed=0)))
    assert batch["label"].shape == (2, 1, *a["label"].shape)


def test_meta_tensor_items_go_through_monai_dictionary_transforms(cache_dir, monai):
    from monai.losses import DiceLoss as MonaiDice
    from monai.transforms import Compose, Orientationd, RandAffined

    keys = ["image", "valid", "label"]
    plain = MRIDataset(cache_dir, "val")[0]
    to_lps = Orientationd(keys=keys, axcodes="LPS", labels=None)
    item = to_lps(MRIDataset(cache_dir, "val", meta_tensor=True)[0])
    # RAS to LPS flips the first two axes and moves the origin with them.
    np.testing.assert_array_equal(item["image"].numpy(), plain["image"].flip(1, 2).numpy())
    np.testing.assert_array_equal(item["label"][0].numpy(), plain["label"].flip(0, 1).numpy())
    corner = np.array(plain["image"].shape[1:]) - 1
    np.testing.assert_allclose(world(item["image"].affine, [0, 0, 0]),
                               world(plain["affine"], [corner[0], corner[1], 0]))

    augment = Compose([to_lps, RandAffined(keys=keys, prob=1.0, rotate_range=0.2,
                                           mode=("bilinear", "nearest", "nearest"))])
    ds = MRIDataset(cache_dir, "train", meta_tensor=True, transform=augment)
    batch = next(iter(make_dataloader(ds, batch_size=2, num_workers=0, seed=0)))
    assert isinstance(batch["image"], monai.data.MetaTensor)
    assert batch["image"].affine.shape == (2, 4, 4)
    assert batch["subject_id"] and batch["session_id"] == ["", ""]
    logits = torch.randn(2, 3, *batch["label"].shape[2:])
    masked = DiceLoss()(logits, batch["label"], valid=batch["valid"])
    ours = DiceLoss()(logits, batch["label"])
    theirs = MonaiDice(softmax=True, to_onehot_y=True)(logits, batch["label"])
    assert torch.isfinite(masked)
    # On every voxel, the same soft Dice as MONAI's (per item and label, then the mean)
    assert torch.allclose(ours, theirs.as_tensor(), atol=1e-6), (float(ours), float(theirs))


def test_meta_tensor_needs_channel_first(cache_dir):
    with pytest.raises(ValueError, match="meta_tensor=True needs channel_first=True"):
        MRIDataset(cache_dir, "val", meta_tensor=True, channel_first=False)


def test_dice_refuses_labels_blended_by_interpolation():
    logits = torch.zeros(1, 3, 4, 4)
    target = torch.full((1, 4, 4), 1.0)
    assert torch.isfinite(DiceLoss()(logits, target))
    with pytest.raises(ValueError, match="nearest"):
        DiceLoss()(logits, target * 0.5)


def test_torchio_subject_of_an_item_keeps_data_geometry_and_ids(cache_dir, tio):
    item = MRIDataset(cache_dir, "val")[1]
    subject = to_torchio_subject(item)
    assert subject["subject_id"] == item["subject_id"]
    np.testing.assert_allclose(subject["image"].affine, item["affine"].numpy())
    assert torch.equal(subject["image"].data, item["image"])
    assert torch.equal(subject["label"].data[0], item["label"])
    assert isinstance(subject["valid"], tio.LabelMap)
    assert torch.equal(subject["valid"].data[0].bool(), item["valid"])


def test_torchio_queue_patches_are_the_cached_voxels(cache_dir, tio):
    ds = MRIDataset(cache_dir, "train")
    with pytest.raises(TypeError, match="to_torchio"):
        len(tio.Queue(ds, max_length=4, samples_per_volume=2,
                      sampler=tio.UniformSampler(16)))
    queue = tio.Queue(ds.to_torchio(), max_length=8, samples_per_volume=2,
                      sampler=tio.UniformSampler(16), num_workers=0)
    cache = Cache(cache_dir)
    keys = {e.subject_id: e.key for e in ds.entries}
    batches = list(tio.SubjectsLoader(queue, batch_size=4))
    assert sum(len(b["subject_id"]) for b in batches) == len(ds) * 2
    for batch in batches:
        for j, sid in enumerate(batch["subject_id"]):
            i, k, m = (int(v) for v in batch["location"][j, :3])
            region = (slice(i, i + 16), slice(k, k + 16), slice(m, m + 16))
            for name in ("image", "valid", "label"):
                np.testing.assert_array_equal(
                    batch[name]["data"][j, 0].numpy(),
                    cache.load_tensor(keys[sid], name)[region].astype(
                        batch[name]["data"].numpy().dtype))
