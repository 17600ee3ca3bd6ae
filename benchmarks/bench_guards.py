"""What the training guards cost per step, against a bare step and detect_anomaly.

A small 3D network (three 3x3x3 convolution blocks with in-place ReLUs, 16 channels,
4 classes; the kind of block FastSurfer and U-Nets stack) trains on random
``[2, 1, 48, 48, 48]`` batches with DiceLoss + CrossEntropyLoss, on the CPU with
torch's default threads. The variants: a bare step; the bare step again (an A/A arm, the
same work as the first, to measure the noise); with NaNGuard at the input; under
NonFiniteLocator watching activations and their gradients only (``parameters=False``);
under NonFiniteLocator as it comes, which also checks every parameter gradient after
backward; under ``torch.autograd.detect_anomaly`` (the stock way to find a NaN's first
module: PyTorch's ``torch.autograd`` reference, "Anomaly detection", with
``check_nan=True`` as documented there).

How it is measured, so that a difference of a few ms can be told from the machine's
noise: ``--warmup`` untimed steps of every variant first (allocator, kernels, autograd's
caches); then ``--steps`` rounds in which every variant takes one step, the order turned
by one each round (no variant always follows another); each variant's cost is the
median of its per-round differences to the bare step of the same round (paired, so a
slow moment falls on both), with a 95% bootstrap interval. The noise is the same
figure for the A/A arm: two identical arms differ by that much from chance alone. A
difference whose size is within the A/A interval's larger bound is printed as "within
the noise". Every variant also gets its median and range (fastest-slowest step), its
ratio to the bare step (one plus its paired difference over the bare step's median: on a
loaded machine the ratio of two medians moves with the load, the A/A arm's included)
and its share of detect_anomaly's overhead. Nothing is asserted.

Run: ``python benchmarks/bench_guards.py [--steps 40] [--warmup 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch
    from torch import nn

    from mriprep.training import CrossEntropyLoss, DiceLoss, NaNGuard, NonFiniteLocator
    from mriprep.training.guards import non_finite_gradients

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40,
                        help="timed rounds; every variant takes one step in each")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps of every variant before the rounds")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    def block(c_in, c_out):
        return nn.Sequential(nn.Conv3d(c_in, c_out, 3, padding=1), nn.BatchNorm3d(c_out),
                             nn.ReLU(inplace=True))

    guard = NaNGuard()
    net = nn.Sequential(block(1, 16), block(16, 16), block(16, 16), nn.Conv3d(16, 4, 1))
    guarded = nn.Sequential(guard, net)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    dice, ce = DiceLoss(), CrossEntropyLoss()
    image = torch.randn(2, 1, 48, 48, 48)
    label = torch.randint(0, 4, (2, 48, 48, 48))
    locator = NonFiniteLocator(net)
    activations_only = NonFiniteLocator(net, parameters=False)

    def step(model, context):
        with context:
            logits = model(image)
            loss = dice(logits, label) + ce(logits, label)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    variants = {
        "bare": lambda: step(net, contextlib.nullcontext()),
        "bare again (A/A)": lambda: step(net, contextlib.nullcontext()),
        "NaNGuard": lambda: step(guarded, contextlib.nullcontext()),
        "Locator, no params": lambda: step(net, activations_only(step=0)),
        "NonFiniteLocator": lambda: step(net, locator(step=0)),
        "detect_anomaly": lambda: step(net, torch.autograd.detect_anomaly(check_nan=True)),
    }
    names = list(variants)
    times = {name: [] for name in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # detect_anomaly warns that it is slow
        for _ in range(args.warmup):  # allocator, kernels, autograd's caches
            for run in variants.values():
                run()
        for r in range(args.steps):
            turn = r % len(names)
            for name in names[turn:] + names[:turn]:
                start = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - start)

    rng = np.random.default_rng(0)
    bare = statistics.median(times["bare"])
    paired = {name: np.subtract(times[name], times["bare"]) for name in names if name != "bare"}
    intervals = {name: _interval(values, rng) for name, values in paired.items()}
    noise_low, noise_high = intervals["bare again (A/A)"]
    noise = max(abs(noise_low), abs(noise_high))
    anomaly = float(np.median(paired["detect_anomaly"]))
    print(f"training step, [2, 1, 48, 48, 48], {torch.get_num_threads()} thread(s), "
          f"{sum(p.numel() for p in net.parameters())} parameters in "
          f"{len(list(net.parameters()))} tensors; {args.warmup} warm-up steps, then "
          f"{args.steps} rounds of one step each, the order turned every round:")
    print(f"  noise: two identical bare arms differ by "
          f"{np.median(paired['bare again (A/A)']) * 1e3:+.1f} ms (95% interval "
          f"{noise_low * 1e3:+.1f} to {noise_high * 1e3:+.1f}): a difference within "
          f"+/-{noise * 1e3:.1f} ms is noise")
    print(f"  {'':<20} {'median ms':>9} {'(range)':>17} {'x bare':>7}  paired difference")
    for name in names:
        values = times[name]
        median = statistics.median(values)
        diff = float(np.median(paired[name])) if name != "bare" else 0.0
        line = (f"  {name:<20} {median * 1e3:9.1f} ({min(values) * 1e3:6.1f}-"
                f"{max(values) * 1e3:6.1f}) {1 + diff / bare:6.3f}x")
        if name != "bare":
            low, high = intervals[name]
            if name == "bare again (A/A)":
                verdict, share = "the noise", ""
            else:
                verdict = "within the noise" if abs(diff) <= noise else "beyond the noise"
                share = (f", {diff / anomaly:.1%} of detect_anomaly's" if anomaly > noise
                         else "")
            line += (f"  {diff * 1e3:+6.1f} ms ({low * 1e3:+.1f} to {high * 1e3:+.1f}; "
                     f"{verdict}{share})")
        print(line)
    check = np.subtract(times["NonFiniteLocator"], times["Locator, no params"])
    diff = float(np.median(check))
    low, high = _interval(check, rng)
    print(f"  parameter-gradient check (the locator with it minus without, paired): "
          f"{diff * 1e3:+.2f} ms per step ({low * 1e3:+.1f} to {high * 1e3:+.1f}; "
          f"{'within' if abs(diff) <= noise else 'beyond'} the noise of "
          f"+/-{noise * 1e3:.1f} ms)")
    step(net, contextlib.nullcontext())  # leave gradients in place, then time the check alone
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    start = time.perf_counter()
    for _ in range(200):
        non_finite_gradients(net)
    alone = (time.perf_counter() - start) / 200
    print(f"  the parameter-gradient check alone (one fused reduction, one read): "
          f"{alone * 1e3:.3f} ms, {alone / bare:.4%} of the bare step")
    return 0


def _interval(values, rng, resamples: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``values``."""
    values = np.asarray(values)
    medians = np.median(rng.choice(values, (resamples, len(values))), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


if __name__ == "__main__":
    sys.exit(main())
