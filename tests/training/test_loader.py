"""make_dataloader over caches built from the MNI152 template: determinism and refusals.

The template caches are written with the cache API directly
(:mod:`tests.training.template_cache`; the shared one is ``cache_dir`` in
``conftest.py``); the training test runs on the session's demo cache (the demo cohort
through the default pipeline, see ``demo_cache`` in ``tests/conftest.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mriprep.training import MRIDataset, make_dataloader
from tests.training.template_cache import adopt_entry, build_template_cache


def batches_of(loader, epochs: int = 1) -> list[dict]:
    return [
        {k: (v.clone() if isinstance(v, torch.Tensor) else list(v)) for k, v in b.items()}
        for _ in range(epochs)
        for b in loader
    ]


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


# -- refusals ------------------------------------------------------------------------------


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
