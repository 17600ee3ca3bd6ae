"""Augmentation throughput on the CPU: mriprep's batched ``Augment`` against MONAI and
TorchIO run per item in DataLoader workers, each as its own documentation configures it.

Two workloads, the same items for every tool:

* 3D: patches ``[1, 128, 128, 128]`` (image, valid mask, int64 labels), batch 2;
* 2.5D: thick slices ``[7, 256, 256]`` (7 neighbouring slices as channels), batch 16.

The same five transforms, each applied to every sample (probability 1, the worst case):
random affine (rotation, scale, shear, translation), elastic deformation, bias field,
Gaussian noise, gamma/contrast.

The anchors, and the documentation each configuration follows (MONAI 1.6, TorchIO 1.2):

* MONAI: ``Rand3DElasticd`` (``Rand2DElasticd`` for slices) given the affine's rotate,
  scale, shear and translate ranges itself, so that affine and deformation are one
  resampling, then ``RandBiasFieldd + RandGaussianNoised + RandAdjustContrastd``, on dict
  items, with ``monai.data.set_track_meta(False)`` in every worker. The single elastic
  transform follows the ``Rand3DElasticd`` / ``Rand2DElasticd`` reference
  (docs.monai.io, "Transforms"; ``monai/transforms/spatial/dictionary.py``: its
  ``rotate_range``, ``shear_range``, ``translate_range`` and ``scale_range`` arguments);
  switching metadata off follows MONAI's fast-training tutorial (Project-MONAI/tutorials
  ``acceleration/fast_training_tutorial.ipynb``, item 4: "``set_track_meta(False)``: to
  disable meta tracking in the random transforms to avoid unnecessary computation").
  No MONAI page configures ``RandAffined`` followed by ``Rand3DElasticd`` (two
  resamplings), the set-up before issue 49, so that row is gone. The guide's other fast
  paths do not apply to this work: ``CacheDataset`` caches the deterministic transforms
  before the first random one (the items here are already in memory, and every transform
  is random), and ``ThreadDataLoader`` is for light transforms on cached data (one thread
  runs them; these transforms take seconds a patch).
* TorchIO: ``RandomAffineElasticDeformation`` (affine and elastic in one SimpleITK
  resampling, "Optimization to use only a single SimpleITK resampling" in its docstring,
  ``torchio/transforms/augmentation/spatial/random_affine_elastic_deformation.py``, and
  the API reference at docs.torchio.org) then ``RandomBiasField + RandomNoise +
  RandomGamma``, on ``tio.Subject`` s (slices as ``[7, 256, 256, 1]`` volumes), per item
  in as many workers;
* TorchIO through ``tio.Queue`` (3D only), as the ``Queue`` docstring's example runs it
  (``torchio/data/queue.py``; docs.torchio.org, "Patch-based pipelines", ``Queue``): a
  ``SubjectsDataset`` of the same 128^3 items as volumes, the transform in the queue's
  ``num_workers`` processes, a ``UniformSampler`` of the item's size,
  ``samples_per_volume=1`` and an outer ``SubjectsLoader`` with ``num_workers=0``. With
  ``samples_per_volume=k`` the queue augments a volume once for k patches, which share
  one draw: less augmentation per patch, not the same work, so k is 1 here. The queue
  restarts its workers every epoch, as it does in training. Thick slices are whole items,
  not patches of a volume: the queue would add only its own overhead to the per-item row,
  so it is not run there.
* mriprep, batched in workers (the headline row): ``Augment.collate`` as the loaders'
  ``collate_fn``, each batch augmented in its worker, one torch thread each: how a
  CPU-only host runs it;
* mriprep, batched in the main process with ``--workers`` torch threads (the workers
  only hand over the items): where a GPU host runs it, on the GPU instead (see
  ``benchmarks/gpu_check.py``);
* mriprep, per item: ``Augment`` as the dataset's transform in the workers, as the
  anchors run (to separate batching from the transform's own cost).

Every loader gets one batch per worker per epoch of 3D patches, four of slices. Every
loader is built and warmed up (one untimed epoch: workers started, kernels and
allocators warm) before timing; then the rows take turns, one epoch each, for
``--rounds`` rounds (A B C A B C ...), so that the machine's load falls on all alike.
Each row reports the median samples/s over its rounds and the range; the ratio is the
headline row's median over the faster anchor's median, with the range of the per-round
ratios beside it. Nothing is asserted.

    python benchmarks/bench_augment.py [--quick] [--workers 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mriprep.training.augment import Augment  # noqa: E402

# every epoch replays the same items: the repeat warning is expected here
warnings.filterwarnings("ignore", message="Augment: sample")

#: the transforms of the comparison, each at probability 1
OURS = dict(affine_prob=1.0, elastic_prob=1.0, bias_prob=1.0, noise_prob=1.0,
            gamma_prob=1.0, contrast_prob=0.0, rician_prob=0.0, blur_prob=0.0,
            lowres_prob=0.0, flip_prob=0.0, rotation_deg=15.0, scale=(0.9, 1.1),
            shear=0.05, translation=4.0, elastic_magnitude=(1.0, 3.0), noise_std=(0, 0.1))


def make_items(n: int, channels: int, shape: tuple[int, ...], seed: int = 0) -> list[dict]:
    """``n`` phantom items: a bright ellipsoid in noise, 4 labels, a masked slab."""
    rng = np.random.default_rng(seed)
    grids = np.meshgrid(*[np.linspace(-1, 1, s, dtype=np.float32) for s in shape],
                        indexing="ij")
    radius = sum(g ** 2 for g in grids)
    label = np.digitize(radius, [0.2, 0.4, 0.7]).astype(np.int64)
    items = []
    for i in range(n):
        image = (1.0 + label + 0.1 * rng.standard_normal((channels, *shape))).astype(np.float32)
        valid = np.ones(shape, dtype=bool)
        valid[..., : shape[-1] // 16] = False
        items.append({"image": image, "valid": valid, "label": label.copy(),
                      "subject_id": f"s{i}"})
    return items


class Items(Dataset):
    def __init__(self, items, transform=None, form="dict"):
        self.items, self.transform, self.form = items, transform, form

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        item = self.items[i]
        if self.form == "torchio":
            return self.transform(_subject(item))
        item = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                for k, v in item.items()}
        if self.form == "monai":
            item["valid"], item["label"] = item["valid"][None].float(), item["label"][None]
        return self.transform(item) if self.transform is not None else item


def _subject(item):
    import torchio as tio

    image = torch.from_numpy(item["image"])
    three_d = image.dim() == 4

    def vol(t):
        return t if three_d else t[..., None]

    return tio.Subject(
        image=tio.ScalarImage(tensor=vol(image)),
        valid=tio.LabelMap(tensor=vol(torch.from_numpy(item["valid"])[None].to(torch.uint8))),
        label=tio.LabelMap(tensor=vol(torch.from_numpy(item["label"])[None])),
    )


def monai_transform(three_d: bool):
    """MONAI's chain: one elastic transform carrying the affine ranges (one resampling)."""
    from monai.transforms import (Compose, Rand2DElasticd, Rand3DElasticd, RandAdjustContrastd,
                                  RandBiasFieldd, RandGaussianNoised)

    keys, modes = ["image", "valid", "label"], ("bilinear", "nearest", "nearest")
    n = 3 if three_d else 2
    affine = dict(rotate_range=(0.26,) * (3 if three_d else 1), scale_range=(0.1,) * n,
                  shear_range=(0.05,) * (6 if three_d else 2), translate_range=(4,) * n)
    elastic = (Rand3DElasticd(keys, sigma_range=(5, 7), magnitude_range=(50, 150), prob=1.0,
                              mode=modes, padding_mode="zeros", **affine) if three_d else
               Rand2DElasticd(keys, spacing=(32, 32), magnitude_range=(1, 3), prob=1.0,
                              mode=modes, padding_mode="zeros", **affine))
    return Compose([
        elastic,
        RandBiasFieldd(["image"], prob=1.0, coeff_range=(0.0, 0.3)),
        RandGaussianNoised(["image"], prob=1.0, std=0.1),
        RandAdjustContrastd(["image"], prob=1.0, gamma=(0.7, 1.5)),
    ])


def _monai_worker(_):
    """MONAI's fast-training setting, in each worker: no metadata on the tensors."""
    from monai.data import set_track_meta

    set_track_meta(False)


def torchio_transform(three_d: bool):
    """TorchIO's chain: affine and elastic in one resampling
    (``RandomAffineElasticDeformation``), then bias, noise and gamma."""
    import torchio as tio

    if three_d:
        affine = dict(scales=0.1, degrees=15, translation=4)
        elastic = dict(num_control_points=7, max_displacement=3.0)
    else:  # a slice is a [C, H, W, 1] volume: in-plane only
        affine = dict(scales=(0.9, 1.1, 0.9, 1.1, 1, 1), degrees=(0, 0, 0, 0, -15, 15),
                      translation=(-4, 4, -4, 4, 0, 0))
        elastic = dict(num_control_points=7, max_displacement=(3.0, 3.0, 0.0))
    return tio.Compose([
        tio.RandomAffineElasticDeformation(affine_kwargs=affine, elastic_kwargs=elastic,
                                           p=1.0),
        tio.RandomBiasField(coefficients=0.3, p=1.0),
        tio.RandomNoise(std=(0, 0.1), p=1.0),
        tio.RandomGamma(log_gamma=(-0.3, 0.3), p=1.0),
    ])


def torchio_queue(items: list[dict], batch: int, workers: int):
    """The items as volumes of a ``tio.Queue``, as its docstring's example runs it: the
    transform in the queue's workers, one patch of the item's size per volume."""
    import torchio as tio

    shape = items[0]["image"].shape[1:]
    subjects = tio.SubjectsDataset([_subject(item) for item in items],
                                   transform=torchio_transform(three_d=True))
    queue = tio.Queue(subjects, max_length=len(items), samples_per_volume=1,
                      sampler=tio.UniformSampler(shape), num_workers=workers)
    return tio.SubjectsLoader(queue, batch_size=batch, num_workers=0)


def _per_item(sample):
    out = Augment(**OURS)({k: (v[None] if isinstance(v, torch.Tensor) else [v])
                           for k, v in sample.items()})
    return {k: (v[0] if isinstance(v, torch.Tensor) else v) for k, v in out.items()
            if k != "augment"}


def _collate_subjects(batch):
    return batch  # TorchIO's users collate with SubjectsLoader; the cost is the transform


class Row:
    """One way of augmenting: a loader, and what runs on each of its batches."""

    def __init__(self, loader, augment=None, threads: int | None = None):
        self.loader, self.augment, self.threads = loader, augment, threads
        self.epoch = 0

    def epoch_rate(self) -> float:
        """Samples/s of one epoch, timed from the start of its iteration."""
        threads = torch.get_num_threads()
        if self.threads:
            # torch's intra-op threads, as on a GPU host the device would do this work; on
            # a CPU shared with other jobs, threads wait on each other (docs/benchmarks.md)
            torch.set_num_threads(self.threads)
        try:
            if self.augment is not None:
                self.augment.set_epoch(self.epoch)
            self.epoch += 1
            start = time.perf_counter()
            n = 0
            for batch in self.loader:
                if self.augment is not None:
                    batch = self.augment(batch)
                n += _batch_size(batch)
            return n / (time.perf_counter() - start)
        finally:
            torch.set_num_threads(threads)


def _batch_size(batch) -> int:
    if isinstance(batch, dict):
        image = batch["image"]
        return len(image["data"] if isinstance(image, dict) else image)
    return len(batch)


def rows(items: list[dict], batch: int, workers: int, skip: set[str],
         main_process: bool) -> dict[str, Row]:
    """Every way of this workload, each loader built once (persistent workers)."""
    three_d = items[0]["image"].ndim == 4
    common = dict(batch_size=batch, num_workers=workers, persistent_workers=workers > 0)
    built = {"mriprep Augment, batched in workers": Row(
        DataLoader(Items(items), collate_fn=Augment(**OURS).collate, **common))}
    if main_process:
        built[f"mriprep Augment, batched in main ({workers} threads)"] = Row(
            DataLoader(Items(items), **common), augment=Augment(**OURS), threads=workers)
    built["mriprep Augment, per item in workers"] = Row(
        DataLoader(Items(items, _per_item), **common))
    if "monai" not in skip:
        built["MONAI, per item in workers"] = Row(DataLoader(
            Items(items, monai_transform(three_d), "monai"), worker_init_fn=_monai_worker,
            **common))
    if "torchio" not in skip:
        built["TorchIO, per item in workers"] = Row(DataLoader(
            Items(items, torchio_transform(three_d), "torchio"),
            collate_fn=_collate_subjects, **common))
        if three_d:
            built["TorchIO, tio.Queue"] = Row(torchio_queue(items, batch, workers))
    return built


def workload(name: str, items: list[dict], batch: int, workers: int, rounds: int,
             skip: set[str], main_process: bool) -> dict[str, list[float]]:
    """Samples/s of every row in each of ``rounds`` interleaved rounds, after one
    untimed warm-up epoch of each."""
    if "monai" not in skip and workers == 0:
        _monai_worker(0)
    built = rows(items, batch, workers, skip, main_process)
    for row in built.values():
        row.epoch_rate()
    print(f"  {name}: {len(built)} rows warmed up", flush=True)
    rates = {label: [] for label in built}
    for r in range(rounds):
        for label, row in built.items():
            rates[label].append(row.epoch_rate())
        print(f"  {name}: round {r + 1} of {rounds} done", flush=True)
    return rates


def report(name: str, rates: dict[str, list[float]]) -> tuple[float, float, float] | None:
    """Print every row's median and range; return the headline's ratio to the faster
    anchor (by median) as (median ratio, lowest and highest per-round ratio)."""
    anchors = {k: statistics.median(v) for k, v in rates.items()
               if not k.startswith("mriprep")}
    fastest = max(anchors, key=anchors.get) if anchors else None
    print(f"{name}, median (range) over {len(next(iter(rates.values())))} rounds:")
    print(f"  {'':42s} {'samples/s':>22s} {'x faster anchor':>16s}")
    for k, v in rates.items():
        median = statistics.median(v)
        ratio = f"{median / anchors[fastest]:16.2f}" if fastest else f"{'-':>16s}"
        print(f"  {k:42s} {median:8.2f} ({min(v):.2f}-{max(v):.2f}) {ratio}")
    if fastest is None:
        return None
    ours = rates["mriprep Augment, batched in workers"]
    per_round = [a / b for a, b in zip(ours, rates[fastest])]
    print(f"  faster anchor: {fastest}")
    return statistics.median(ours) / anchors[fastest], min(per_round), max(per_round)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2,
                        help="DataLoader workers of every tool, and mriprep's torch threads")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed epochs of every row, taken in turn after one untimed "
                        "warm-up epoch each; the median and range count")
    parser.add_argument("--quick", action="store_true",
                        help="two rounds, no main-process row (a smoke run, noisier)")
    parser.add_argument("--slices-per-worker", type=int, default=4,
                        help="batches of slices per worker and epoch (a smaller run: 1)")
    parser.add_argument("--skip", action="append", default=[], choices=("monai", "torchio"))
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    # whole batches per worker: every tool keeps every worker busy
    workers = max(args.workers, 1)
    n3d, n2d = 2 * workers, args.slices_per_worker * 16 * workers
    print(f"CPU, {args.workers} workers, torch {torch.__version__}; this bench does not use "
          "a GPU (benchmarks/gpu_check.py times Augment on CUDA)")
    skip = set(args.skip)
    ratios = {}
    for name, items, batch in (
            ("3D patches 2 x 1 x 128^3", make_items(n3d, 1, (128,) * 3), 2),
            ("2.5D slices 16 x 7 x 256 x 256", make_items(n2d, 7, (256, 256)), 16)):
        rates = workload(name, items, batch, args.workers, rounds, skip,
                         main_process=not args.quick)
        ratios[name] = report(name, rates)
    for name, ratio in ratios.items():
        if ratio is not None:
            median, low, high = ratio
            print(f"{name}: mriprep batched is {median:.2f}x the faster anchor (per round "
                  f"{low:.2f}-{high:.2f}x; goal >= 3x): {'met' if median >= 3 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
