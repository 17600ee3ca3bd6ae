"""``MRIDataset(mode="slices", view=..., thickness=3)``: FastSurfer's thick 2.5D items from
the cache, equal to the HDF5 export's slices; and the losses taking their weight map."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mriprep import MRIDataset
from mriprep.core.errors import CacheError
from mriprep.training import CrossEntropyLoss, DiceLoss
from mriprep.training.labels import dkt_table
from mriprep.training.labels.subject import derive, slices_of
from mriprep.training.thick_slices import ThickSliceDataset
from tests.training.fastsurfer_cache import shared_cache, subject, write_cache


@pytest.fixture(scope="module")
def coronal():
    return MRIDataset(shared_cache(), "train", mode="slices", view="coronal", thickness=3)


def test_items_have_fastsurfer_shapes_and_identity(coronal):
    assert isinstance(coronal, ThickSliceDataset)
    item = coronal[0]
    assert item["image"].shape == (7, 72, 72) and item["image"].dtype == torch.float32
    assert item["label"].shape == item["weight"].shape == item["valid"].shape == (72, 72)
    assert item["label"].dtype == torch.int64 and item["valid"].dtype == torch.bool
    assert item["subject_id"] == "sub-00" and isinstance(item["slice_index"], int)
    assert int(item["label"].max()) < 79 and bool(torch.isfinite(item["weight"]).all())


@pytest.mark.parametrize("view", ["axial", "sagittal"])
def test_items_equal_the_export_slices(view):
    ds = MRIDataset(shared_cache(), "train", mode="slices", view=view, thickness=3)
    person = subject(1)
    ref = slices_of(person["image"], derive(person["label"], dkt_table(), view),
                    [1, 1, 1], view)
    rows = [i for i, (e, _) in enumerate(ds.slices) if e == 1]
    assert len(rows) == len(ref.index)
    for j in (0, len(rows) // 2, len(rows) - 1):  # first and last: edge padding
        item = ds[rows[j]]
        assert item["slice_index"] == ref.index[j]
        np.testing.assert_array_equal(item["image"].numpy(),
                                      np.moveaxis(ref.orig[j], -1, 0).astype(np.float32))
        np.testing.assert_array_equal(item["label"].numpy(), ref.classes[j])
        np.testing.assert_allclose(item["weight"].numpy(), ref.weights[j], rtol=1e-6)


def test_derived_dir_gives_the_same_items_and_reuses_files(tmp_path, coronal):
    stored = MRIDataset(shared_cache(), "train", mode="slices", view="coronal",
                        derived_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 12  # image, classes, weights, valid of 3 entries, view order
    for i in (0, len(coronal) // 2, len(coronal) - 1):
        a, b = coronal[i], stored[i]
        for key in ("image", "label", "valid"):
            assert torch.equal(a[key], b[key])
        torch.testing.assert_close(a["weight"], b["weight"])
    again = MRIDataset(shared_cache(), "train", mode="slices", view="coronal",
                       derived_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == files and len(again) == len(stored)


def test_blank_threshold_and_thickness_options(coronal):
    strict = ThickSliceDataset(shared_cache(), "train", view="coronal", blt=20000,
                               thickness=1)
    assert 0 < len(strict) < len(coronal) and strict[0]["image"].shape[0] == 3
    sums = [int(strict[i]["label"].sum()) for i in range(len(strict))]
    assert min(sums) > 20000
    with pytest.raises(ValueError, match="thickness"):
        ThickSliceDataset(shared_cache(), "train", thickness=-1)


def test_unknown_values_name_the_subject(tmp_path):
    def edit(i, tensors):
        tensors["label"][10, 10, 10] = 251
    root = write_cache(tmp_path / "c", count=1, edit=edit)
    with pytest.raises(CacheError, match=r"sub-00.*\[251\]"):
        MRIDataset(root, "train", mode="slices", view="axial")


def test_dataset_pickles_for_worker_processes(coronal):
    clone = pickle.loads(pickle.dumps(coronal))
    assert torch.equal(clone[3]["label"], coronal[3]["label"])


def test_cross_entropy_with_weight_map_is_fastsurfers_mean(coronal):
    batch = torch.utils.data.default_collate([coronal[i] for i in (0, 5)])
    logits = torch.randn(2, 79, 72, 72, generator=torch.Generator().manual_seed(0))
    got = CrossEntropyLoss()(logits, batch["label"], weight_map=batch["weight"])
    expected = (F.cross_entropy(logits, batch["label"], reduction="none")
                * batch["weight"]).mean()
    torch.testing.assert_close(got, expected)
    ones = torch.ones_like(batch["weight"])
    torch.testing.assert_close(CrossEntropyLoss()(logits, batch["label"], weight_map=ones),
                               F.cross_entropy(logits, batch["label"]))


def test_dice_with_weight_map():
    logits = torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 3, (1, 4, 4), generator=torch.Generator().manual_seed(2))
    plain = DiceLoss()(logits, target)
    torch.testing.assert_close(DiceLoss()(logits, target, weight_map=torch.ones(1, 4, 4)),
                               plain)
    heavy = torch.ones(1, 4, 4)
    heavy[0, 0, 0] = 10.0
    assert not torch.isclose(DiceLoss()(logits, target, weight_map=heavy), plain)
    with pytest.raises(ValueError, match="finite and >= 0"):
        DiceLoss()(logits, target, weight_map=-heavy)
    with pytest.raises(ValueError, match="one weight per voxel"):
        CrossEntropyLoss()(logits, target, weight_map=torch.ones(4, 4))
