"""Where a training step's time goes: reading data or computing (a "dummy loader" run).

The step is the reference training's (``examples/train_2p5d.py``: a 2.5D U-Net on
7-channel slices, batch 8, DiceLoss + CrossEntropyLoss, NaNGuard, NonFiniteLocator,
gradient clipping, autocast as the script picks it) on a cache's training split, fed two
ways in alternating blocks of steps, so that the machine's noise falls on both alike:

* by ``make_dataloader`` (2 reader threads, as the script runs);
* by a dummy loader that hands back one batch already in memory, as nnU-Net measures
  its data pipeline (its ``documentation/benchmarking.md``: the
  ``nnUNetTrainerBenchmark_5epochs_noDataLoading`` trainer against the regular one):
  what is left is pure compute.

The data share of a step is ``1 - dummy / real``: near 0 when reading hides behind
compute. It is taken per round (a block of each kind, medians), and printed as the median
round with the range over the rounds: the range is the measure's own noise. It also prints
how fast the loader alone delivers slices, the headroom a faster GPU would use. Nothing is
asserted.

Run: ``python benchmarks/bench_training.py [--cache CACHE] [--steps 8] [--rounds 6]``.
Without ``--cache`` it builds a cache of 6 template-sized volumes with tissue labels.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))


def main(argv=None) -> int:
    import torch

    from benchmarks.bench_loader import build_bench_cache
    from mriprep.training import MRIDataset, make_dataloader
    from train_2p5d import TrainingStep, label_values, parse_args

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help="a cache with labels (default: built)")
    parser.add_argument("--steps", type=int, default=8, help="steps per block")
    parser.add_argument("--rounds", type=int, default=6, help="blocks of each kind")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-training-") as scratch:
        cache = args.cache
        if cache is None:
            cache = build_bench_cache(Path(scratch) / "cache", n=6, labels=True)
        options = parse_args([str(cache)])
        dataset = MRIDataset(cache, "train", mode="slice", axis=options.axis,
                             context=options.context)
        step = TrainingStep(options, label_values(dataset))
        loader = make_dataloader(dataset, batch_size=options.batch_size,
                                 num_workers=options.workers, seed=0, drop_last=True)
        epochs = itertools.count()
        batches = iter(_forever(loader, step, epochs))
        held = next(batches)
        for _ in range(3):  # warm-up: kernels, allocator, page cache
            step(next(batches))

        # The loader reads this many batches ahead: they fill up during a dummy block, and
        # would make the next real block's first steps free.
        threads = getattr(loader, "io_threads", 0) or 0
        ahead = threads * (getattr(loader, "io_prefetch", 0) or 0) or 2 * options.workers
        real, dummy, shares = [], [], []
        for _ in range(args.rounds):
            for _ in range(ahead):  # untimed: the read-ahead back to its steady state
                step(next(batches))
            block = []
            for _ in range(args.steps):
                start = time.perf_counter()
                step(next(batches))
                block.append(time.perf_counter() - start)
            real += block
            held_block = []
            for _ in range(args.steps):
                # The held batch comes back every step: a new epoch each time, as a real
                # run's samples would get new draws, not the same draw with a warning.
                _new_epoch(step, epochs)
                start = time.perf_counter()
                step(held)
                held_block.append(time.perf_counter() - start)
            dummy += held_block
            shares.append(1 - statistics.median(held_block) / statistics.median(block))
        loader_only = _loader_rate(batches, options.batch_size, args.steps * 2, ahead)

    r, d = statistics.median(real), statistics.median(dummy)
    slices = options.batch_size
    print(f"training step ({dataset.mode} mode, batch {slices} x {2 * options.context + 1} "
          f"channels {tuple(held['image'].shape[2:])}, device {step.device}, autocast "
          f"{step.amp_dtype or 'off'}, {options.workers} reader threads, "
          f"{torch.get_num_threads()} torch threads), median of {len(real)} steps each, "
          f"in {args.rounds} rounds of {args.steps}:")
    print(f"  real loader   {r * 1000:8.1f} ms/step  {slices / r:7.1f} slices/s")
    print(f"  dummy loader  {d * 1000:8.1f} ms/step  {slices / d:7.1f} slices/s  (compute only)")
    print(f"  data share of a step, median round: {statistics.median(shares):.1%} "
          f"(range {min(shares):.1%} to {max(shares):.1%} over the rounds; "
          f"real/dummy {r / d:.2f}x over every step)")
    print(f"  loader alone: {loader_only:.0f} slices/s, {loader_only / (slices / d):.1f}x what "
          "this step consumes")
    return 0


def _forever(loader, step, epochs):
    while True:
        _new_epoch(step, epochs)
        yield from loader


def _new_epoch(step, epochs) -> None:
    if step.augment is not None:
        step.augment.set_epoch(next(epochs))


def _loader_rate(batches, batch_size: int, count: int, ahead: int) -> float:
    """Slices a second the loader alone delivers, once the ``ahead`` batches it had read
    ahead are taken (untimed)."""
    for _ in range(ahead):
        next(batches)
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * batch_size / (time.perf_counter() - start)


if __name__ == "__main__":
    sys.exit(main())
