"""What the training guards cost per step, against a bare step and detect_anomaly.

A small 3D network (three 3x3x3 convolution blocks with in-place ReLUs, 16 channels,
4 classes; the kind of block FastSurfer and U-Nets stack) trains on random
``[2, 1, 48, 48, 48]`` batches with DiceLoss + CrossEntropyLoss, on the CPU with
torch's default threads. Four variants alternate, step by step, so that the machine's
noise falls on all of them alike: a bare step; with NaNGuard at the input; under
NonFiniteLocator watching activations and their gradients only (``parameters=False``);
under NonFiniteLocator as it comes, which also checks every parameter gradient after
backward; under ``torch.autograd.detect_anomaly`` (the stock way to find a NaN's first
module). Median seconds per step over the rounds, each variant's ratio to the bare step
and its share of detect_anomaly's overhead. Nothing is asserted.

Run: ``python benchmarks/bench_guards.py [--steps 12]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch
    from torch import nn

    from mriprep.training import CrossEntropyLoss, DiceLoss, NaNGuard, NonFiniteLocator
    from mriprep.training.guards import non_finite_gradients

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
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
        "NaNGuard": lambda: step(guarded, contextlib.nullcontext()),
        "Locator, no params": lambda: step(net, activations_only(step=0)),
        "NonFiniteLocator": lambda: step(net, locator(step=0)),
        "detect_anomaly": lambda: step(net, torch.autograd.detect_anomaly(check_nan=True)),
    }
    times = {name: [] for name in variants}
    for run in variants.values():  # warm-up: allocator, kernels
        run()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # detect_anomaly warns that it is slow
        for _ in range(args.steps):
            for name, run in variants.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    bare = statistics.median(times["bare"])
    anomaly = statistics.median(times["detect_anomaly"]) - bare
    print(f"training step, [2, 1, 48, 48, 48], {torch.get_num_threads()} thread(s), "
          f"{sum(p.numel() for p in net.parameters())} parameters in "
          f"{len(list(net.parameters()))} tensors, median of {args.steps} alternating steps:")
    for name, values in times.items():
        median = statistics.median(values)
        share = ((median - bare) / anomaly if anomaly > 0 else float("nan"))
        print(f"  {name:<20} {median * 1000:8.1f} ms  {median / bare:5.2f}x the bare step "
              f"({(median - bare) * 1000:+.1f} ms, {share:6.1%} of detect_anomaly's "
              "overhead)")
    with_params = statistics.median(times["NonFiniteLocator"])
    without = statistics.median(times["Locator, no params"])
    print(f"  parameter-gradient check: {(with_params - without) * 1000:+.2f} ms per step "
          f"({with_params / without:.3f}x the locator without it; within the noise)")
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


if __name__ == "__main__":
    sys.exit(main())
