"""MRIDataset and make_dataloader over caches built from the MNI152 template.

The caches here are written with the cache API directly (``build_template_cache``), from
the template downsampled to 4 mm and tissue labels thresholded from nilearn's GM/WM maps;
the training test runs on the session's demo cache (the demo cohort through the default
pipeline, see ``demo_cache`` in conftest.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mriprep.cache import Cache, entry_key
from mriprep.training import MRIDataset, make_dataloader
from mriprep.core.errors import CacheError
from mriprep.inputs.templates import load_mni152_tissue, load_template

STEP = 4  # 197x233x189 at 1 mm -> 50x59x48 at 4 mm


def template_subject(index: int, step: int = STEP) -> dict[str, np.ndarray]:
    """One subject from the template: image, valid mask, tissue labels (0 bg, 1 GM, 2 WM).

    Subjects differ by an intensity gain and noise; each has one zero-filled, masked axial
    slice (its index depends on the subject) and a few scattered invalid voxels, as the
    sanitize and mask-slices stages leave them.
    """
    template = load_template("mni152")
    tissue = load_mni152_tissue()
    sub = (slice(None, None, step),) * 3
    rng = np.random.default_rng(index)
    image = template.data[sub] * (1 + 0.05 * index) + rng.normal(0, 2, template.data[sub].shape)
    label = np.zeros(image.shape, dtype=np.int16)
    label[tissue["gm"][sub] > 0.5] = 1
    label[tissue["wm"][sub] > 0.5] = 2
    valid = np.ones(image.shape, dtype=bool)
    masked = image.shape[2] // 3 + index
    valid[:, :, masked] = False
    image[:, :, masked] = 0
    specks = tuple(rng.integers(0, n, 40) for n in image.shape)
    valid[specks] = False
    affine = template.affine.copy()
    affine[:3, :3] *= step
    return {
        "image": np.ascontiguousarray(image, dtype=np.float32),
        "valid": np.ascontiguousarray(valid),
        "label": np.ascontiguousarray(label),
        "affine": affine,
    }


def build_template_cache(
    root: Path,
    splits: dict[str, int] = {"train": 4, "val": 2},
    pipeline_hash: str = "a" * 64,
    labels: bool = True,
    step: int = STEP,
    first: int = 0,
) -> Path:
    """A cache of template-derived subjects, ``n`` per split, written with the cache API.

    Subjects are numbered from ``first`` (``sub-00``, ``sub-01``, ...) across the splits.
    """
    cache = Cache(root, create=True)
    summaries = {}
    number = first
    for split, count in splits.items():
        for _ in range(count):
            subject = template_subject(number, step)
            sid = f"sub-{number:02d}"
            meta = {
                "subject_id": sid,
                "session_id": "",
                "pipeline_name": "test",
                "pipeline_hash": pipeline_hash,
                "inputs": {"t1w": {"path": f"{sid}.nii.gz", "sha256": f"{number:064x}"}},
                "affine": subject["affine"].tolist(),
                "spacing": [float(step)] * 3,
                "shape": list(subject["image"].shape),
                "provenance": [],
            }
            names = ("image", "valid", "label") if labels else ("image", "valid")
            tensors = {k: subject[k] for k in names}
            key = entry_key(sid, "", {"t1w": f"{number:064x}"}, pipeline_hash)
            summaries[key] = {**cache.write_entry(key, tensors, meta), "split": split}
            number += 1
    cache.update_index(summaries)
    return Path(root)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return build_template_cache(tmp_path_factory.mktemp("cache") / "c")


def adopt_entry(source: Path, target: Path) -> None:
    """Copy the first entry of ``source`` into ``target`` and index it, as a stray rerun would."""
    src, dst = Cache(source), Cache(target)
    ref = src.entries()[0]
    dst.entry_dir(ref.key).mkdir()
    for f in src.entry_dir(ref.key).iterdir():
        (dst.entry_dir(ref.key) / f.name).write_bytes(f.read_bytes())
    dst.update_index({ref.key: ref.summary})


def batches_of(loader, epochs: int = 1) -> list[dict]:
    return [
        {k: (v.clone() if isinstance(v, torch.Tensor) else list(v)) for k, v in b.items()}
        for _ in range(epochs)
        for b in loader
    ]


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
    np.testing.assert_allclose(item["affine"].numpy(), np.asarray(ref.summary["affine"]))
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


# -- training ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_tiny_3d_cnn_trains_on_the_demo_cache_with_two_workers(demo_cache, backend):
    """A few steps of a tiny 3D CNN on patches of the demo cache: the loss stays finite
    and falls on a fixed batch of validation patches."""
    torch.manual_seed(0)
    patches = dict(mode="patch", patch_size=24, samples_per_volume=4, foreground_fraction=0.5)
    train = MRIDataset(demo_cache.path, split="train", **patches)
    loader = make_dataloader(train, batch_size=4, num_workers=2, seed=0, backend=backend)
    assert isinstance(loader, torch.utils.data.DataLoader)
    held_out = next(iter(make_dataloader(MRIDataset(demo_cache.path, split="val", **patches),
                                         batch_size=8, num_workers=0, shuffle=False)))
    classes = 4  # background, CSF, GM, WM
    net = torch.nn.Sequential(
        torch.nn.Conv3d(1, 8, 3, padding=1),
        torch.nn.InstanceNorm3d(8),
        torch.nn.ReLU(),
        torch.nn.Conv3d(8, classes, 1),
    )
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-2)

    def masked_loss(batch):
        voxel_loss = torch.nn.functional.cross_entropy(
            net(batch["image"]), batch["label"], reduction="none")
        return voxel_loss[batch["valid"]].mean()  # masked voxels carry no truth

    with torch.no_grad():
        before = masked_loss(held_out).item()
    losses = []
    for _ in range(2):
        for batch in loader:
            assert int(batch["label"].max()) < classes
            loss = masked_loss(batch)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
    with torch.no_grad():
        after = masked_loss(held_out).item()
    assert len(losses) == 2 * len(loader)
    assert all(np.isfinite(losses)) and np.isfinite(after)
    assert after < 0.9 * before  # learnt, not noise: 10 steps take it down by 15-30%


# -- determinism ---------------------------------------------------------------------------


def patch_dataset(cache_dir):
    return MRIDataset(
        cache_dir, split="train", mode="patch", patch_size=(24, 20, 16),
        samples_per_volume=3, foreground_fraction=0.34,
    )


def test_same_seed_gives_same_batches_across_runs_backends_and_workers(cache_dir):
    def run(seed, backend, workers):
        loader = make_dataloader(patch_dataset(cache_dir), batch_size=4, num_workers=workers,
                                 seed=seed, backend=backend)
        return batches_of(loader, epochs=2)

    first = run(0, "threads", 2)
    assert len(first) == 2 * 3  # 12 patches per epoch, batches of 4
    for other in (run(0, "threads", 2), run(0, "processes", 2), run(0, "threads", 0)):
        for a, b in zip(first, other, strict=True):
            assert a["subject_id"] == b["subject_id"]
            torch.testing.assert_close(a["location"], b["location"])
            torch.testing.assert_close(a["image"], b["image"])
    locations = lambda batches: torch.cat([b["location"] for b in batches])
    assert not torch.equal(locations(first[:3]), locations(first[3:])), "epochs must differ"
    assert not torch.equal(locations(first), locations(run(1, "threads", 2))), "seeds must differ"


def test_indexing_the_dataset_gives_epoch_zero_of_a_loader_with_its_seed(cache_dir):
    ds = patch_dataset(cache_dir)
    first = next(iter(make_dataloader(ds, batch_size=4, shuffle=False, num_workers=2, seed=0)))
    expected = torch.stack([ds[i]["location"] for i in range(4)])
    torch.testing.assert_close(first["location"], expected)


def test_a_loop_left_early_does_not_disturb_the_next_epoch(cache_dir):
    loader = make_dataloader(patch_dataset(cache_dir), batch_size=4, num_workers=2, seed=0)
    reference = batches_of(make_dataloader(patch_dataset(cache_dir), batch_size=4,
                                           num_workers=2, seed=0), epochs=2)
    for _ in loader:
        break  # epoch 0 abandoned after one batch
    again = batches_of(loader)  # epoch 1, complete
    assert len(again) == 3
    for a, b in zip(again, reference[3:], strict=True):
        torch.testing.assert_close(a["location"], b["location"])


def test_held_batches_are_never_overwritten_by_reused_buffers(cache_dir):
    ds = MRIDataset(cache_dir, split="train")
    loader = make_dataloader(ds, batch_size=1, shuffle=False, num_workers=2, backend="threads")
    held = list(loader)  # keeps every batch alive while later ones are read
    for ref, batch in zip(Cache(cache_dir).entries("train"), held, strict=True):
        assert batch["subject_id"] == [ref.subject_id]
        expected = Cache(cache_dir).load_tensor(ref.key, "image")
        np.testing.assert_array_equal(batch["image"][0, 0].numpy(), expected)


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


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(num_workers=0, persistent_workers=True), "persistent_workers=True needs workers"),
        (dict(num_workers=0, prefetch_factor=4), "prefetch_factor=4 needs workers"),
        (dict(num_workers=2, prefetch_factor=0), "prefetch_factor must be an int >= 1"),
        (dict(num_workers=-1), "num_workers must be an int >= 0"),
        (dict(backend="gpu"), "unknown backend 'gpu'"),
        (dict(batch_size=8, drop_last=True), "gives no batch at all"),
    ],
)
def test_loader_options_that_make_no_sense_are_refused(cache_dir, options, message):
    with pytest.raises(ValueError, match=message):
        make_dataloader(MRIDataset(cache_dir, split="train"), **options)


def test_volumes_of_different_grids_cannot_share_a_batch(tmp_path):
    root = build_template_cache(tmp_path / "c", splits={"train": 1})
    adopt_entry(build_template_cache(tmp_path / "d", splits={"train": 1}, step=5, first=9), root)
    ds = MRIDataset(root, split="train")
    with pytest.raises(ValueError, match=r"2 shapes .*use batch_size=1"):
        make_dataloader(ds, batch_size=2)
    assert len(list(make_dataloader(ds, batch_size=1, num_workers=1))) == 2
