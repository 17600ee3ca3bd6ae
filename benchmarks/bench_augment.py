"""Augmentation throughput on the CPU: mriprep's batched ``Augment`` against MONAI and
TorchIO run per item in DataLoader workers, as their users run them.

Two workloads, the same items for every tool:

* 3D: patches ``[1, 128, 128, 128]`` (image, valid mask, int64 labels), batch 2;
* 2.5D: thick slices ``[7, 256, 256]`` (7 neighbouring slices as channels), batch 16.

The same five transforms, each applied to every sample (probability 1, the worst case):
random affine (rotation, scale, shear, translation), elastic deformation, bias field,
Gaussian noise, gamma/contrast.

* MONAI: ``RandAffined + Rand3DElasticd (Rand2DElasticd for slices) + RandBiasFieldd +
  RandGaussianNoised + RandAdjustContrastd`` on dict items, in ``--workers`` DataLoader
  worker processes (one torch thread each, torch's default in a worker);
* TorchIO: ``RandomAffine + RandomElasticDeformation + RandomBiasField + RandomNoise +
  RandomGamma`` on ``tio.Subject`` s (slices as ``[7, 256, 256, 1]`` volumes), in as many
  workers;
* mriprep, batched in workers (the headline row): ``Augment.collate`` as the loaders'
  ``collate_fn``, each batch augmented in its worker, one torch thread each: how a
  CPU-only host runs it;
* mriprep, batched in the main process with ``--workers`` torch threads (the workers
  only hand over the items): where a GPU host runs it, on the GPU instead (see
  ``benchmarks/gpu_check.py``);
* mriprep, per item: ``Augment`` as the dataset's transform in the workers, as the
  anchors run (to separate batching from the transform's own cost).

Every loader gets one batch per worker per epoch of 3D patches, four of slices (one
batch of slices is a quarter of a second: an epoch of one measured the loader's start
more than the transforms), and every row runs ``--rounds`` epochs (the best counts, for
mriprep and the anchors alike); the ratios are against the faster anchor in this run.
Nothing is asserted.

    python benchmarks/bench_augment.py [--quick] [--workers 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
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
    from monai.transforms import (Compose, Rand2DElasticd, Rand3DElasticd, RandAdjustContrastd,
                                  RandAffined, RandBiasFieldd, RandGaussianNoised)

    keys, modes = ["image", "valid", "label"], ("bilinear", "nearest", "nearest")
    n = 3 if three_d else 2
    elastic = (Rand3DElasticd(keys, sigma_range=(5, 7), magnitude_range=(50, 150), prob=1.0,
                              mode=modes, padding_mode="zeros") if three_d else
               Rand2DElasticd(keys, spacing=(32, 32), magnitude_range=(1, 3), prob=1.0,
                              mode=modes, padding_mode="zeros"))
    return Compose([
        RandAffined(keys, prob=1.0, rotate_range=(0.26,) * (3 if three_d else 1),
                    scale_range=(0.1,) * n, shear_range=(0.05,) * (6 if three_d else 2),
                    translate_range=(4,) * n, mode=modes, padding_mode="zeros"),
        elastic,
        RandBiasFieldd(["image"], prob=1.0, coeff_range=(0.0, 0.3)),
        RandGaussianNoised(["image"], prob=1.0, std=0.1),
        RandAdjustContrastd(["image"], prob=1.0, gamma=(0.7, 1.5)),
    ])


def torchio_transform(three_d: bool):
    import torchio as tio

    if three_d:
        affine = tio.RandomAffine(scales=0.1, degrees=15, translation=4, p=1.0)
        elastic = tio.RandomElasticDeformation(num_control_points=7, max_displacement=3.0,
                                               p=1.0)
    else:  # a slice is a [C, H, W, 1] volume: in-plane only
        affine = tio.RandomAffine(scales=(0.9, 1.1, 0.9, 1.1, 1, 1),
                                  degrees=(0, 0, 0, 0, -15, 15),
                                  translation=(-4, 4, -4, 4, 0, 0), p=1.0)
        elastic = tio.RandomElasticDeformation(num_control_points=7,
                                               max_displacement=(3.0, 3.0, 0.0), p=1.0)
    return tio.Compose([
        affine,
        elastic,
        tio.RandomBiasField(coefficients=0.3, p=1.0),
        tio.RandomNoise(std=(0, 0.1), p=1.0),
        tio.RandomGamma(log_gamma=(-0.3, 0.3), p=1.0),
    ])


def _collate_subjects(batch):
    return batch  # TorchIO's users collate with SubjectsLoader; the cost is the transform


def measure(loader, rounds: int, augment=None) -> float:
    """Best samples/s over ``rounds`` epochs, each timed from the start of its iteration
    (the first also starts the persistent workers, which the best round leaves out)."""
    best = 0.0
    for r in range(rounds):
        if augment is not None:
            augment.set_epoch(r)
        start = time.perf_counter()
        n = 0
        for batch in loader:
            if augment is not None:
                batch = augment(batch)
            n += len(batch["image"]) if isinstance(batch, dict) else len(batch)
        best = max(best, n / (time.perf_counter() - start))
    return best


def _per_item(sample):
    out = Augment(**OURS)({k: (v[None] if isinstance(v, torch.Tensor) else [v])
                           for k, v in sample.items()})
    return {k: (v[0] if isinstance(v, torch.Tensor) else v) for k, v in out.items()
            if k != "augment"}


def workload(name: str, items: list[dict], batch: int, workers: int, rounds: int,
             skip: set[str], main_process: bool) -> dict[str, float]:
    three_d = items[0]["image"].ndim == 4
    common = dict(batch_size=batch, num_workers=workers, persistent_workers=workers > 0)
    results = {}
    results["mriprep Augment, batched in workers"] = measure(
        DataLoader(Items(items), collate_fn=Augment(**OURS).collate, **common), rounds)
    if main_process:
        # torch's intra-op threads, as on a GPU host the device would do this work; on a
        # CPU shared with other jobs, threads wait on each other (see docs/benchmarks.md)
        threads = torch.get_num_threads()
        torch.set_num_threads(workers)
        results[f"mriprep Augment, batched in main ({workers} threads)"] = measure(
            DataLoader(Items(items), **common), rounds, augment=Augment(**OURS))
        torch.set_num_threads(threads)
    results["mriprep Augment, per item in workers"] = measure(
        DataLoader(Items(items, _per_item), **common), rounds)
    print(f"  {name}: mriprep done", flush=True)
    if "monai" not in skip:
        results["MONAI, per item in workers"] = measure(
            DataLoader(Items(items, monai_transform(three_d), "monai"), **common), rounds)
        print(f"  {name}: MONAI done", flush=True)
    if "torchio" not in skip:
        results["TorchIO, per item in workers"] = measure(
            DataLoader(Items(items, torchio_transform(three_d), "torchio"),
                       collate_fn=_collate_subjects, **common), rounds)
        print(f"  {name}: TorchIO done", flush=True)
    return results


def report(name: str, results: dict[str, float]) -> float | None:
    anchors = {k: v for k, v in results.items() if not k.startswith("mriprep")}
    fastest = max(anchors.values()) if anchors else None
    print(f"{name}:")
    print(f"  {'':42s} {'samples/s':>10s} {'x faster anchor':>16s}")
    for k, v in results.items():
        ratio = f"{v / fastest:16.2f}" if fastest else f"{'-':>16s}"
        print(f"  {k:42s} {v:10.2f} {ratio}")
    if fastest:
        return results["mriprep Augment, batched in workers"] / fastest
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2,
                        help="DataLoader workers of every tool, and mriprep's torch threads")
    parser.add_argument("--rounds", type=int, default=2,
                        help="timed epochs of every row, mriprep's and the anchors' alike "
                        "(the best counts: the first also starts the persistent workers)")
    parser.add_argument("--quick", action="store_true",
                        help="one round, no main-process row (a smoke run, noisier)")
    parser.add_argument("--skip", action="append", default=[], choices=("monai", "torchio"))
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    # whole batches per worker: every tool keeps every worker busy
    n3d, n2d = 2 * args.workers, 4 * 16 * args.workers
    print(f"CPU, {args.workers} workers, torch {torch.__version__}; this bench does not use "
          "a GPU (benchmarks/gpu_check.py times Augment on CUDA)")
    skip = set(args.skip)
    ratios = {}
    for name, items, batch in (
            ("3D patches 2 x 1 x 128^3", make_items(n3d, 1, (128,) * 3), 2),
            ("2.5D slices 16 x 7 x 256 x 256", make_items(n2d, 7, (256, 256)), 16)):
        results = workload(name, items, batch, args.workers, rounds, skip,
                           main_process=not args.quick)
        ratios[name] = report(name, results)
    for name, ratio in ratios.items():
        if ratio is not None:
            print(f"{name}: mriprep batched is {ratio:.2f}x the faster anchor "
                  f"(goal >= 3x): {'met' if ratio >= 3 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
