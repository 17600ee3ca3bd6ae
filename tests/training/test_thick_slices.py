"""``MRIDataset(mode="thick_slice", view=..., context=3)``: FastSurfer's thick 2.5D items
from the cache, equal to the HDF5 export's slices, through ``make_dataloader`` too; the
derived classes kept beside the cache; and the losses taking their weight map."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mriprep import MRIDataset, make_dataloader
from mriprep.core.errors import CacheError
from mriprep.training import CrossEntropyLoss, DiceLoss
from mriprep.training.labels import dkt_table
from mriprep.training.labels.subject import derive, slices_of
from tests.training.fastsurfer_cache import shared_cache, subject, write_cache

THICK = dict(mode="thick_slice")


@pytest.fixture(scope="module")
def coronal(tmp_path_factory):
    derived = tmp_path_factory.mktemp("derived")
    return MRIDataset(shared_cache(), "train", view="coronal", context=3,
                      derived_dir=derived, **THICK)


def test_items_have_fastsurfer_shapes_and_identity(coronal):
    item = coronal[0]
    assert item["image"].shape == (7, 72, 72) and item["image"].dtype == torch.float32
    assert item["label"].shape == item["weight"].shape == item["valid"].shape == (72, 72)
    assert item["label"].dtype == torch.int64 and item["valid"].dtype == torch.bool
    assert item["subject_id"] == "sub-00" and item["slice_index"].dtype == torch.int64
    assert int(item["label"].max()) < 79 and bool(torch.isfinite(item["weight"]).all())
    assert item["zoom"].tolist() == [1.0, 1.0] and item["affine"].shape == (4, 4)


@pytest.mark.parametrize("view", ["axial", "sagittal"])
def test_items_equal_the_export_slices(view, tmp_path):
    ds = MRIDataset(shared_cache(), "train", view=view, context=3, derived_dir=tmp_path,
                    **THICK)
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


def test_classes_are_derived_once_beside_the_cache_and_reused(tmp_path):
    root = write_cache(tmp_path / "c", count=2)
    first = MRIDataset(root, "train", view="axial", **THICK)
    derived = root / "derived"
    stored = sorted(p.relative_to(derived) for p in derived.rglob("*.*"))
    # Three views of classes and a summary per entry, and the view's image and mask.
    assert len([p for p in stored if p.parts[0].startswith("labels-")]) == 2 * 4
    stamps = {p: (derived / p).stat().st_mtime_ns for p in stored}
    again = MRIDataset(root, "train", view="axial", **THICK)
    assert {p: (derived / p).stat().st_mtime_ns for p in stored} == stamps
    for i in (0, len(first) // 2, len(first) - 1):
        a, b = first[i], again[i]
        assert all(torch.equal(a[k], b[k]) for k in ("image", "label", "weight", "valid"))


def test_make_dataloader_serves_thick_slices(coronal):
    loader = make_dataloader(coronal, batch_size=4, num_workers=2, seed=1)
    batch = next(iter(loader))
    assert batch["image"].shape == (4, 7, 72, 72) and batch["weight"].shape == (4, 72, 72)
    assert batch["label"].dtype == torch.int64 and batch["zoom"].shape == (4, 2)
    again = next(iter(make_dataloader(coronal, batch_size=4, num_workers=0, seed=1)))
    assert torch.equal(batch["label"], again["label"]) and torch.equal(batch["image"],
                                                                       again["image"])


def test_old_spellings_name_the_working_form():
    with pytest.raises(ValueError, match="mode='thick_slice'"):
        MRIDataset(shared_cache(), "train", mode="slices")
    with pytest.raises(TypeError, match="context"):
        MRIDataset(shared_cache(), "train", mode="thick_slice", thickness=3)
    with pytest.raises(TypeError, match=r"LabelTable\(unknown='background'\)"):
        MRIDataset(shared_cache(), "train", mode="thick_slice", unknown="background")
    with pytest.raises(ValueError, match="only apply to mode='thick_slice'"):
        MRIDataset(shared_cache(), "train", mode="slice", view="coronal")


def _without_hypointensities(i, tensors):
    tensors["label"][tensors["label"] == 77] = 2


def test_a_class_no_subject_holds_is_refused_by_name(tmp_path):
    root = write_cache(tmp_path / "c", count=2, edit=_without_hypointensities)
    with pytest.raises(CacheError, match=r"1 of the 78 classes of the coronal view .* "
                       r"absent from all 2 subjects \(sub-00 .*\): WM-hypointensities"):
        MRIDataset(root, "train", mode="thick_slice")
    with pytest.warns(UserWarning, match="WM-hypointensities; accepted") as caught:
        allowed = MRIDataset(root, "train", mode="thick_slice", absent_classes="allow")
    assert len(allowed) > 0 and caught[0].filename == __file__
    val = write_cache(tmp_path / "v", count=2, split="val", edit=_without_hypointensities)
    with pytest.warns(UserWarning, match="WM-hypointensities"):  # other splits: warned
        assert len(MRIDataset(val, "val", mode="thick_slice")) > 0


def test_blank_threshold_and_context_options(coronal, tmp_path):
    strict = MRIDataset(shared_cache(), "train", view="coronal", blank_slice_threshold=20000,
                        context=1, derived_dir=tmp_path, **THICK)
    assert 0 < len(strict) < len(coronal) and strict[0]["image"].shape[0] == 3
    sums = [int(strict[i]["label"].sum()) for i in range(len(strict))]
    assert min(sums) > 20000
    with pytest.raises(ValueError, match="context"):
        MRIDataset(shared_cache(), "train", context=-1, derived_dir=tmp_path, **THICK)


def test_unknown_values_name_the_subject(tmp_path):
    def edit(i, tensors):
        tensors["label"][10, 10, 10] = 1999
    root = write_cache(tmp_path / "c", count=1, edit=edit)
    with pytest.raises(CacheError, match=r"sub-00.*\[1999\]"):
        MRIDataset(root, "train", view="axial", **THICK)


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


def test_worker_processes_read_the_same_batches(coronal):
    threads = next(iter(make_dataloader(coronal, batch_size=4, num_workers=2, seed=3)))
    processes = next(iter(make_dataloader(coronal, batch_size=4, num_workers=2, seed=3,
                                          backend="processes")))
    for key in ("image", "label", "weight", "valid"):
        assert torch.equal(threads[key], processes[key])


def test_missing_or_outdated_classes_are_derived_again(tmp_path):
    from mriprep.cache import Cache
    from mriprep.training.labels.derived import DerivedLabels
    from tests.training.fastsurfer_cache import SIZE

    root = write_cache(tmp_path / "c", count=2)
    first = MRIDataset(root, "train", **THICK)
    store = DerivedLabels(Cache(root), dkt_table())
    entry = Cache(root).entries()[0]
    (store.entry_folder(entry) / "axial.npy").unlink()        # a class file gone
    assert store.summary(entry) is None
    # The entry rebuilt under its key (`mriprep run --force`) with another label map:
    # its classes and view copies follow the new map, not the old files.
    cache = Cache(root)
    tensors = subject(0)
    tensors["label"][tensors["label"] == 17] = 2               # no left hippocampus now
    meta = cache.read_meta(entry.key)
    cache.update_index([cache.write_entry(entry.key, tensors, meta, replace=True)
                        .with_split("train")])
    again = MRIDataset(root, "train", absent_classes="allow", **THICK)
    hippocampus = dkt_table().class_of_name("Left-Hippocampus", "coronal")
    rebuilt = Cache(root).entries()[0]
    assert store.summary(rebuilt).class_counts["coronal"][hippocampus] == 0
    assert len(again) > 0 and len(first) > 0 and tensors["image"].shape == (SIZE,) * 3


def test_prune_removes_derived_data_of_entries_no_longer_indexed(tmp_path):
    from mriprep.cache import Cache
    from mriprep.maintenance import apply_prune, plan_prune

    root = write_cache(tmp_path / "c", count=2)
    MRIDataset(root, "train", **THICK)[0]                      # classes and view copies
    cache = Cache(root)
    gone = cache.entries()[1]
    cache.remove_from_index([gone.key])
    plan = plan_prune(cache, grace_seconds=0)
    folders = {r.folder for r in plan.removals if r.key == gone.key}
    assert {"entries"} < folders and any(f.startswith("derived/") for f in folders)
    apply_prune(cache, plan)
    assert not list((root / "derived").rglob(f"{gone.key}*"))
    assert list((root / "derived").rglob(f"{cache.entries()[0].key}"))


def test_item_affine_places_its_voxels_where_the_cache_does(coronal):
    from mriprep.training.labels.slices import VIEW_AXES

    index = len(coronal) // 3
    entry, k = (int(v) for v in coronal.slices[index])
    item = coronal[index]
    slice_axis, rows, cols = VIEW_AXES["coronal"]
    voxel = [0, 0, 0]
    voxel[slice_axis], voxel[rows], voxel[cols] = k, 10, 20
    np.testing.assert_allclose(item["affine"].numpy() @ [10, 20, 0, 1],
                               np.asarray(coronal.entries[entry].affine) @ [*voxel, 1])


def test_a_mixed_resolution_cohort_batches_padded_as_fastsurfer_pads(tmp_path):
    """conform_min caches a 0.8 mm scan on a larger cube than a 1 mm one: padded_size
    serves both at one size (background after the stored rows and columns), each item
    with its zoom, and the stored part equals the item without padding."""
    root = write_cache(tmp_path / "c", count=2, spacing=lambda i: 1.0 if i == 0 else 0.8)
    plain = MRIDataset(root, "train", view="coronal", derived_dir=tmp_path / "d", **THICK)
    padded = MRIDataset(root, "train", view="coronal", derived_dir=tmp_path / "d",
                        padded_size=96, **THICK)
    fine = [i for i, (e, _) in enumerate(padded.slices) if e == 1]
    coarse_item, fine_item = padded[0], padded[fine[len(fine) // 2]]
    assert coarse_item["zoom"].tolist() == [1.0, 1.0]
    np.testing.assert_allclose(fine_item["zoom"].numpy(), [0.8, 0.8])
    for item, size, index in ((coarse_item, 72, 0), (fine_item, 90, fine[len(fine) // 2])):
        assert item["image"].shape == (7, 96, 96) and item["label"].shape == (96, 96)
        stored = plain[index]
        for key in ("image", "label", "weight", "valid"):
            assert torch.equal(item[key][..., :size, :size], stored[key])
            assert not item[key][..., size:, :].any() and not item[key][..., :, size:].any()
    batch = next(iter(make_dataloader(padded, batch_size=len(padded), num_workers=0,
                                      shuffle=False)))
    assert batch["image"].shape[1:] == (7, 96, 96)
    assert sorted({round(z, 4) for z in batch["zoom"][:, 0].tolist()}) == [0.8, 1.0]
    with pytest.raises(ValueError, match="padded_size"):
        MRIDataset(root, "train", view="coronal", padded_size=0, **THICK)
    with pytest.warns(UserWarning, match=r"cuts the coronal slices of 1 entries.*sub-01"):
        cut = MRIDataset(root, "train", view="coronal", derived_dir=tmp_path / "d",
                         padded_size=80, **THICK)
    assert cut[fine[0]]["label"].shape == (80, 80)
