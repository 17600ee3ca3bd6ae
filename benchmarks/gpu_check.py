"""Check the training side on a machine with a GPU (about 3 minutes).

Builds a cache of 8 template-sized volumes with labels in a temporary folder (2 of them
in "val"), then:

1. per loader backend: times 3 epochs of ``make_dataloader`` (pinned memory, batches
   moved with non-blocking copies by ``to_device``) and prints the throughput to the GPU;
   then runs one more epoch and confirms on the device that every tensor is finite and
   equal to the cached data (a pinned buffer reused before its copy finished would show
   up as a mismatch);
2. runs the reference training, ``examples/train_2p5d.py``, on the GPU with AMP
   (float16 autocast and a GradScaler), then with bfloat16, and confirms that it exits 0
   with finite losses that fall; it prints the script's own epoch lines;
3. times ``mriprep.training.augment.Augment`` on CUDA on a batch of 2 x 1 x 128^3
   (image, valid mask, labels; affine, elastic, bias, noise, gamma on every sample)
   against one training step of a small 3D U-Net on that batch under float16 AMP, and
   confirms the augmented batch is finite with no new label values (goal: augmentation
   at most 10% of the step on a T4-class GPU). Without CUDA it says that it has not run
   on a GPU. ``--augment-only`` runs this part alone (no cache, under a minute).

Exit 0 when every check passes, 1 otherwise. Without CUDA it says so, skips the GPU
checks, measures the CPU loader and runs a short CPU training.

``--outcome`` runs only the outcome comparison (``benchmarks/bench_outcome.py``: MONAI,
FastSurfer's data path and mriprep on a dirty cohort) at full size, float16 autocast
with a GradScaler, 1000 steps per arm (its time on a GPU is not measured yet).

    python benchmarks/gpu_check.py [--volumes 8] [--workers 4] [--steps 40] [--augment-only]
    python benchmarks/gpu_check.py --outcome [--outcome-steps 1000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import build_bench_cache  # noqa: E402

from mriprep.cache import Cache  # noqa: E402
from mriprep.training import MRIDataset, make_dataloader, to_device  # noqa: E402


def expected_sums(cache_dir: Path) -> dict[str, tuple[float, int]]:
    """Per subject: float64 sum of the image and the number of labelled voxels."""
    cache = Cache(cache_dir)
    out = {}
    for ref in cache.entries("train"):
        image = cache.load_tensor(ref.key, "image")
        label = cache.load_tensor(ref.key, "label")
        out[ref.subject_id] = (float(image.sum(dtype=np.float64)), int(np.count_nonzero(label)))
    return out


def check_backend(cache_dir: Path, backend: str, workers: int, device: str,
                  expected: dict) -> list[str]:
    """Run 3 epochs on ``device``; return the problems found (empty when all is well)."""
    problems = []
    ds = MRIDataset(cache_dir, split="train", mode="volume")
    loader = make_dataloader(ds, batch_size=2, num_workers=workers, seed=0, backend=backend)
    cuda = device.startswith("cuda")
    if cuda and not loader.pin_memory:
        problems.append(f"{backend}: pin_memory is off although CUDA is available")
    for _ in loader:  # warm-up: page cache, workers, pinned blocks
        pass
    nbytes = batches = 0
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        for batch in loader:
            if cuda and not batch["image"].is_pinned():
                problems.append(f"{backend}: a batch arrived in pageable memory")
            on_device = to_device(batch, device)
            nbytes += sum(t.nbytes for t in on_device.values() if isinstance(t, torch.Tensor))
            batches += 1
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(f"  {backend:9s}: {nbytes / seconds / 1e9:6.2f} GB/s to {device} "
          f"({batches} batches in {seconds:.2f} s, pin_memory={loader.pin_memory})")

    # One more epoch at full speed, reduced on the device and compared afterwards: a pinned
    # buffer refilled before its non-blocking copy finished would change a sum.
    sums = []
    for batch in loader:
        on_device = to_device(batch, device)
        image, label = on_device["image"], on_device["label"]
        sums.append((batch["subject_id"], image.double().sum(dim=(1, 2, 3, 4)),
                     (label > 0).sum(dim=(1, 2, 3)), torch.isfinite(image).all()))
    for subjects, image_sums, label_counts, finite in sums:
        if not bool(finite):
            problems.append(f"{backend}: non-finite values on {device} for {subjects}")
        for sid, s, n in zip(subjects, image_sums.tolist(), label_counts.tolist()):
            want_sum, want_labels = expected[sid]
            if not np.isclose(s, want_sum, rtol=1e-9) or n != want_labels:
                problems.append(f"{backend}: {sid} on {device} differs from the cache "
                                f"(sum {s} vs {want_sum}, labelled {n} vs {want_labels})")
    return problems


def check_training(cache_dir: Path, device: str, workers: int | None, steps: int) -> list[str]:
    """The reference training on ``device`` with each autocast dtype it supports there."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import train_2p5d

    problems = []
    amps = ("float16", "bfloat16") if device == "cuda" else ("bfloat16",)
    for amp in amps:
        metrics = cache_dir.parent / f"metrics-{amp}.json"
        argv = [str(cache_dir), "--device", device, "--amp", amp, "--epochs", "2",
                "--steps-per-epoch", str(steps // 2), "--metrics", str(metrics)]
        if workers is not None:
            argv += ["--workers", str(workers)]
        print(f"  train_2p5d.py {' '.join(argv[1:])}")
        code = train_2p5d.main(argv)
        if code != 0:
            problems.append(f"train_2p5d ({amp} on {device}) exited {code}")
            continue
        loss = np.array(json.loads(metrics.read_text())["loss"])
        k = max(1, len(loss) // 4)
        if not np.isfinite(loss).all():
            problems.append(f"train_2p5d ({amp} on {device}): non-finite loss {loss.tolist()}")
        elif not loss[-k:].mean() < loss[:k].mean():
            problems.append(f"train_2p5d ({amp} on {device}): the loss did not fall "
                            f"({loss[:k].mean():.4f} -> {loss[-k:].mean():.4f})")
    return problems


def _unet3d(width: int = 16, classes: int = 4):
    """A small two-level 3D U-Net: the step augmentation is weighed against."""
    from torch import nn

    def block(cin, cout):
        return nn.Sequential(nn.Conv3d(cin, cout, 3, padding=1, bias=False),
                             nn.BatchNorm3d(cout), nn.ReLU(inplace=True),
                             nn.Conv3d(cout, cout, 3, padding=1, bias=False),
                             nn.BatchNorm3d(cout), nn.ReLU(inplace=True))

    class UNet3d(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.bottom = block(1, width), block(width, 2 * width)
            self.up = nn.ConvTranspose3d(2 * width, width, 2, stride=2)
            self.dec, self.head = block(2 * width, width), nn.Conv3d(width, classes, 1)

        def forward(self, x):
            e = self.enc(x)
            b = self.bottom(nn.functional.max_pool3d(e, 2))
            return self.head(self.dec(torch.cat([self.up(b), e], 1)))

    return UNet3d()


def check_augment(device: str, repeats: int = 10) -> list[str]:
    """Augment's time per 2 x 1 x 128^3 batch on CUDA against a 3D U-Net step (AMP)."""
    if not device.startswith("cuda"):
        print("  augmentation on CUDA: NOT RUN: no GPU here (this has not run on a GPU; "
              "the CPU figures are in benchmarks/bench_augment.py)")
        return []
    from mriprep.training import CrossEntropyLoss
    from mriprep.training.augment import Augment

    problems = []
    g = torch.Generator(device=device).manual_seed(0)
    image = torch.randn(2, 1, 128, 128, 128, device=device, generator=g)
    label = torch.randint(0, 4, (2, 128, 128, 128), device=device, generator=g)
    valid = torch.ones(2, 128, 128, 128, dtype=torch.bool, device=device)
    valid[..., :8] = False
    augment = Augment(affine_prob=1.0, elastic_prob=1.0, bias_prob=1.0, noise_prob=1.0,
                      gamma_prob=1.0)
    model = _unet3d().to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    ce = CrossEntropyLoss()

    def augment_once(k):
        augment.set_epoch(k)
        return augment({"image": image, "valid": valid, "label": label,
                        "subject_id": ["a", "b"]})

    def step(batch):
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(batch["image"])
        loss = ce(logits, batch["label"], valid=batch["valid"])
        optimiser.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimiser)
        scaler.update()

    def timed(fn) -> float:
        times = []
        for k in range(repeats + 2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn(k)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return float(np.median(times[2:]))  # the first two warm up kernels and caches

    batch = augment_once(0)
    if not bool(torch.isfinite(batch["image"]).all()):
        problems.append("augment: non-finite values in the augmented batch on CUDA")
    if not set(batch["label"].unique().tolist()) <= set(label.unique().tolist()):
        problems.append("augment: the augmented labels hold new values on CUDA")
    augment_s = timed(augment_once)
    step_s = timed(lambda k: step(batch))
    share = augment_s / step_s
    print(f"  augmentation on CUDA ({torch.cuda.get_device_name(0)}): {augment_s * 1e3:.1f} ms "
          f"per 2 x 1 x 128^3 batch; 3D U-Net step under float16 AMP {step_s * 1e3:.1f} ms; "
          f"augmentation = {share:.1%} of the step (goal <= 10% on a T4)")
    return problems


def check_outcome(device: str, steps: int) -> int:
    """The outcome comparison of ``make bench`` at full size: every arm and ablation, the
    network at the slices' 1 mm, float16 autocast and a GradScaler on CUDA; its table is
    printed and its picture written under ``gpu-outcome/``. On a CPU it says it has not
    run on a GPU and runs the CPU-sized bench instead."""
    import bench_outcome

    if device != "cuda":
        print("outcome: no CUDA; running the CPU-sized comparison (`make bench`'s)")
        return bench_outcome.main(["--out", "gpu-outcome"])
    return bench_outcome.main(["--device", "cuda", "--amp", "--full-size", "--steps",
                               str(steps), "--ablation-steps", str(steps // 2),
                               "--out", "gpu-outcome"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--volumes", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None,
                        help="loader workers (default: from the machine's cores)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default 40 on CUDA, 10 on CPU)")
    parser.add_argument("--augment-only", action="store_true",
                        help="only time Augment against a 3D U-Net step (no cache)")
    parser.add_argument("--outcome", action="store_true",
                        help="only run the outcome comparison (benchmarks/bench_outcome.py) "
                        "at full size on CUDA, float16 autocast with a GradScaler")
    parser.add_argument("--outcome-steps", type=int, default=1000,
                        help="training steps per arm of --outcome (default 1000)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if cuda:
        device = "cuda"
        print(f"CUDA: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    else:
        device = "cpu"
        print("CUDA is not available: skipping the pinned-memory and GPU transfer checks; "
              "measuring the CPU loader only")
    if args.outcome:
        return check_outcome(device, args.outcome_steps)
    if args.augment_only:
        print("augmentation:")
        problems = check_augment(device)
        for p in problems:
            print(f"  - {p}")
        return 1 if problems else 0
    scratch = Path(tempfile.mkdtemp(prefix="mriprep-gpu-check-"))
    try:
        t0 = time.perf_counter()
        cache_dir = build_bench_cache(scratch / "cache", n=args.volumes, labels=True, val=2)
        print(f"built a cache of {args.volumes} volumes in {time.perf_counter() - t0:.0f} s")
        expected = expected_sums(cache_dir)
        problems = []
        for backend in ("threads", "processes"):
            problems += check_backend(cache_dir, backend, args.workers, device, expected)
        print("reference training:")
        steps = args.steps or (40 if cuda else 10)
        problems += check_training(cache_dir, device, args.workers, steps)
        print("augmentation:")
        problems += check_augment(device)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if problems:
        print(f"FAILED ({len(problems)} problem(s)):")
        for p in problems[:20]:
            print(f"  - {p}")
        return 1
    where = "on the GPU" if cuda else "on the CPU (GPU checks skipped)"
    print(f"OK: every batch finite and equal to the cache {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
