"""Reference 2.5D segmentation training on an mriprep cache: a loop to copy.

FastSurfer-style input: each item is one slice with ``--context`` neighbours on each side
as channels (7 channels by default), its label slice and its valid mask. Every guard of
:mod:`mriprep.training` is in place, each where it belongs:

* ``mriprep check`` first (``--check``): the cache's integrity, splits and float16 range;
* :class:`~mriprep.training.NaNGuard` as the network's first layer: a non-finite input
  is named with its subjects, never trained on;
* :class:`~mriprep.training.DiceLoss` + :class:`~mriprep.training.CrossEntropyLoss`,
  both masked by ``valid`` (filled and masked voxels teach nothing) and finite on an
  empty class;
* mixed precision: ``torch.autocast`` float16 with a GradScaler on CUDA, bfloat16 on CPU
  (``--amp``); the losses compute in float32 whatever the logits' dtype;
* :class:`~mriprep.training.NonFiniteLocator` around every step: a NaN is named by the
  module that made it, the pass, the step and the subjects. Under float16 the GradScaler
  expects Inf gradients now and then (it skips those steps and lowers its scale), so
  there the locator watches the forward pass only and the skipped steps are counted;
* :class:`~mriprep.training.GradientClipper`: ``clip_grad_norm_`` that reports how often
  it clipped;
* :class:`~mriprep.training.augment.Augment` on each batch, on the training device, after
  the input guard has seen it (augmentation treats a non-finite voxel as invalid, so
  the guard must look first): affine and elastic geometry in one interpolation, the
  valid mask carried, intensity transforms (``--augment``: ``light``, ``off`` or a YAML
  file of :class:`~mriprep.training.augment.AugmentConfig`).

It prints the training loss per epoch and the validation Dice per label, and exits 0 when
training finished with finite losses, 3 when something turned non-finite (the message
names where), 4 when the cache has no label maps to train on (the message says how to
give them), 1 when ``--check`` found the cache unsound, 2 for a usage error.

    python examples/train_2p5d.py CACHE [--epochs 5] [--device cuda] [--check]
    python examples/train_2p5d.py CACHE --manifest folds.csv --fold 2   # K-fold: fold 2 validates

On the demo cache (``make demo``) and a 2-core CPU, ``--epochs 2 --steps-per-epoch 20``
takes about a minute. ``benchmarks/gpu_check.py`` runs it on CUDA with AMP;
``examples/train_4gpu.sbatch`` runs four folds at once on a 4-GPU Slurm node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mriprep.cli import main as mriprep_cli
from mriprep.training.augment import Augment, AugmentConfig
from mriprep.training import (
    CrossEntropyLoss,
    DiceLoss,
    GradientClipper,
    MRIDataset,
    NaNGuard,
    NonFiniteError,
    NonFiniteLocator,
    make_dataloader,
    to_device,
)

EXIT_NON_FINITE = 3
# Mild on purpose: a short CPU run must still learn. No flip: the demo's labels are
# tissue classes, but a real aseg needs lr_swap= (a label table) to flip.
LIGHT_AUGMENT = dict(affine_prob=0.5, rotation_deg=10.0, scale=(0.95, 1.05), shear=0.02,
                     translation=2.0, elastic_prob=0.2, elastic_magnitude=(0.0, 2.0),
                     bias_prob=0.2, bias_strength=0.2, gamma_prob=0.2, gamma=(0.8, 1.25),
                     contrast_prob=0.2, noise_prob=0.2, noise_std=(0.0, 0.05),
                     blur_prob=0.1, lowres_prob=0.1, lowres_factor=(1.5, 2.5))
EXIT_NO_LABELS = 4  # the cache holds images only: nothing to train a segmentation on


class NoLabelsError(Exception):
    """The training split has no label maps; the message says how to give them."""


# -- the network -------------------------------------------------------------------------


def conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class UNet2d(nn.Module):
    """A small 2D U-Net (three levels) with the input guard as its first layer.

    Slices of any size work: the decoder crops its skip connections' odd edges back by
    interpolating to the skip's size.
    """

    def __init__(self, channels: int, classes: int, width: int = 16):
        super().__init__()
        self.guard = NaNGuard("raise")
        self.enc1 = conv_block(channels, width)
        self.enc2 = conv_block(width, 2 * width)
        self.bottom = conv_block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = conv_block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = conv_block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.guard(x)
        e1 = self.enc1(x)
        e2 = self.enc2(nn.functional.max_pool2d(e1, 2))
        b = self.bottom(nn.functional.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([_fit(self.up2(b), e2), e2], 1))
        d1 = self.dec1(torch.cat([_fit(self.up1(d2), e1), e1], 1))
        return self.head(d1)


def _fit(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if x.shape[-2:] == like.shape[-2:]:
        return x
    return nn.functional.interpolate(x, size=like.shape[-2:], mode="nearest")


# -- labels --------------------------------------------------------------------------------


def label_values(dataset: MRIDataset) -> list[int]:
    """The label values of the split: as the index records them, else read once."""
    values: set[int] = set()
    for entry in dataset.entries:
        if entry.label_values is not None:
            values.update(int(v) for v in entry.label_values)
        else:
            label = dataset.cache.load_tensor(entry.key, "label", mmap=True)
            values.update(int(v) for v in np.unique(label))
    return sorted(values)


def lookup_table(values: list[int], device) -> torch.Tensor:
    """Label value -> class index (FreeSurfer's aseg values are not 0..C-1)."""
    if min(values) < 0:
        raise SystemExit(f"train_2p5d: label values must be >= 0, found {min(values)}")
    table = torch.full((max(values) + 1,), -1, dtype=torch.long)
    table[torch.tensor(values)] = torch.arange(len(values))
    return table.to(device)


# -- training and validation ---------------------------------------------------------------


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    if amp == "off":
        return None
    if amp == "auto":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[amp]


def classes_of(batch: dict, table: torch.Tensor) -> torch.Tensor:
    target = table[batch["label"]]
    if (target < 0).any():
        raise ValueError("a label value absent from the training split's label set; "
                         "validate on labels the training split holds")
    return target


def evaluate(model, batches, table, device, amp_dtype) -> list[float | None]:
    """Hard Dice per class over the validation batches' valid voxels.

    A class absent from both the labels and the prediction has no Dice (None), not 1 or
    NaN: it says nothing about the model.
    """
    classes = len(table[table >= 0])
    inter = torch.zeros(classes, dtype=torch.float64)
    total = torch.zeros(classes, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for batch in batches:
            batch = to_device(batch, device)
            with _autocast(device, amp_dtype):
                logits = model(batch["image"])
            predicted = logits.float().argmax(1)
            target = classes_of(batch, table)
            valid = batch["valid"]
            for c in range(classes):
                p, t = (predicted == c) & valid, (target == c) & valid
                inter[c] += float((p & t).sum())
                total[c] += float(p.sum() + t.sum())
    model.train()
    return [float(2 * i / n) if n > 0 else None for i, n in zip(inter, total)]


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class TrainingStep:
    """One optimiser step on a batch, with the guards in place; ``step(batch)`` returns
    the loss. Everything a step needs is built here, from the arguments and the label
    values, so that the benchmark times exactly this step."""

    def __init__(self, args: argparse.Namespace, values: list[int]):
        self.device = torch.device(args.device)
        self.amp_dtype = autocast_dtype(args.amp, self.device)
        self.table = lookup_table(values, self.device)
        self.model = UNet2d(2 * args.context + 1, len(values), args.width).to(self.device)
        weights = _class_weights(values, args.weight)
        self.dice, self.ce = DiceLoss(weights=weights), CrossEntropyLoss(weights=weights)
        self.optimiser = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=self.amp_dtype == torch.float16)
        self.clipper = GradientClipper(max_norm=args.clip)
        # With a float16 GradScaler an Inf gradient is expected (the scaler skips the
        # step and lowers its scale), so there only the forward pass is watched.
        self.locator = NonFiniteLocator(self.model, backward=not self.scaler.is_enabled())
        self.steps = self.skipped_steps = 0
        self.augment = make_augment(args.augment, args.seed)

    def __call__(self, batch: dict) -> float:
        batch = to_device(batch, self.device)
        if self.augment is not None:
            self.model.guard.set_batch(batch["subject_id"], self.steps)
            self.model.guard(batch["image"])  # names a non-finite input before it is masked
            batch = self.augment(batch)
        target = classes_of(batch, self.table)
        ids, valid = batch["subject_id"], batch["valid"]
        self.model.guard.set_batch(ids, self.steps)
        with self.locator(step=self.steps, subject_ids=ids):
            with _autocast(self.device, self.amp_dtype):
                logits = self.model(batch["image"])
            loss = self.dice(logits, target, valid=valid) + self.ce(logits, target, valid=valid)
            if not torch.isfinite(loss):
                raise NonFiniteError(f"the loss is {float(loss)} at step {self.steps} for "
                                     f"subject(s) {', '.join(ids)}")
            self.optimiser.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimiser)
        if self.scaler.is_enabled() and not _gradients_finite(self.model):
            self.skipped_steps += 1
        else:
            self.clipper.clip(self.model.parameters())
        self.scaler.step(self.optimiser)
        self.scaler.update()
        self.steps += 1
        return float(loss.detach())


def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    common = dict(mode="slice", axis=args.axis, context=args.context)
    if args.fold is not None:
        # K-fold: fold k validates, the other folds train (the manifest's fold column).
        common |= dict(manifest=args.manifest, fold=args.fold)
    elif args.manifest is not None:
        common |= dict(manifest=args.manifest)
    train_set = MRIDataset(args.cache, args.train_split, **common)
    if not train_set.labels:
        raise NoLabelsError(
            f"cache {args.cache} has no label maps in split {args.train_split!r} "
            f"({len(train_set.entries)} entries, images only): a segmentation needs one per "
            "subject. Give them in a 'label' column of the manifest (a path per row; "
            "`mriprep manifest from-bids --labels DERIVATIVE` writes it) and rerun "
            "`mriprep run MANIFEST -o CACHE`")
    val_set = MRIDataset(args.cache, args.val_split, **common)
    values = label_values(train_set)
    step = TrainingStep(args, values)
    loader = make_dataloader(train_set, batch_size=args.batch_size, num_workers=args.workers,
                             seed=args.seed, drop_last=True)
    val_batches = validation_batches(val_set, args.val_slices, args.batch_size)

    print(f"train_2p5d: {len(train_set)} training slices from {len(train_set.entries)} "
          f"subjects, {len(values)} classes {values}, device {step.device}, "
          f"autocast {step.amp_dtype or 'off'}, {args.workers} loader workers")
    history = {"loss": [], "epochs": [], "classes": values}
    for epoch in range(args.epochs):
        if step.augment is not None:
            step.augment.set_epoch(epoch)  # new draws every epoch, replayable by (seed, epoch)
        started, data_seconds, losses = time.perf_counter(), 0.0, []
        waited = time.perf_counter()
        for i, batch in enumerate(loader):
            if args.steps_per_epoch and i >= args.steps_per_epoch:
                break
            data_seconds += time.perf_counter() - waited
            losses.append(step(batch))
            waited = time.perf_counter()
        seconds = time.perf_counter() - started
        history["loss"].extend(losses)
        val_dice = evaluate(step.model, val_batches, step.table, step.device, step.amp_dtype)
        history["epochs"].append({"epoch": epoch, "train_loss": float(np.mean(losses)),
                                  "val_dice": dict(zip(map(str, values), val_dice)),
                                  "seconds": seconds, "data_seconds": data_seconds})
        shown = ", ".join(f"{v}: {'absent' if d is None else f'{d:.3f}'}"
                          for v, d in zip(values, val_dice))
        print(f"epoch {epoch}: train loss {np.mean(losses):.4f} over {len(losses)} steps "
              f"({seconds:.1f} s, {data_seconds / seconds:.0%} waiting for data); "
              f"val Dice per label {{{shown}}}", flush=True)
    history["clipping"] = step.clipper.summary()
    history["skipped_steps"] = step.skipped_steps
    print(f"train_2p5d: {step.clipper.summary()}; {step.skipped_steps} step(s) skipped by "
          "the float16 GradScaler")
    return history


def validation_batches(val_set: MRIDataset, slices: int, batch_size: int) -> list[dict]:
    """A fixed sample of validation batches: ``slices`` evenly spaced usable slices (all
    when 0), read once."""
    step = max(1, len(val_set) // slices) if slices else 1
    indices = list(range(0, len(val_set), step))
    fresh = lambda shape, dtype: torch.empty(shape, dtype=dtype)  # noqa: E731
    return [val_set.load_items(indices[i:i + batch_size], fresh).batch
            for i in range(0, len(indices), batch_size)]


def make_augment(spec: str, seed: int) -> Augment | None:
    """``--augment``: ``off``, ``light`` or a YAML file (its seed, else ``--seed``)."""
    if spec == "off":
        return None
    if spec == "light":
        return Augment(AugmentConfig(seed=seed, **LIGHT_AUGMENT))
    path = Path(spec)
    if not path.is_file():
        raise SystemExit(f"train_2p5d: --augment {spec!r} is neither 'light', 'off' nor a "
                         "YAML file of AugmentConfig fields")
    return Augment(AugmentConfig.from_yaml(path))


def _gradients_finite(model: nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


def _class_weights(values: list[int], spec: list[str]) -> list[float] | None:
    """``--weight 7=1.3 --weight 8=1.3``: per-label weights, 1 elsewhere."""
    if not spec:
        return None
    weights = {v: 1.0 for v in values}
    for item in spec:
        label, _, weight = item.partition("=")
        if not label.strip().lstrip("-").isdigit() or int(label) not in weights:
            raise SystemExit(f"train_2p5d: --weight {item!r}: label {label!r} is not one of "
                             f"the training split's labels {values}")
        weights[int(label)] = float(weight)
    return [weights[v] for v in values]


# -- command line ----------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="train_2p5d.py",
        description="Train a small 2.5D U-Net on an mriprep cache with every NaN guard in "
        "place (see the module docstring). Exit 0: trained with finite losses; 3: a value "
        "turned non-finite (named); 4: the cache has no label maps; 1: --check found the "
        "cache unsound.")
    p.add_argument("cache", type=Path, help="cache folder written by `mriprep run -o`")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps-per-epoch", type=int, default=0,
                   help="stop each epoch after N steps (default: the whole split)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="loader threads (default 2)")
    p.add_argument("--axis", type=int, default=0, choices=(0, 1, 2),
                   help="slice axis in the cache's RAS order (0: sagittal)")
    p.add_argument("--context", type=int, default=3,
                   help="neighbouring slices on each side as channels (default 3: 7 channels)")
    p.add_argument("--width", type=int, default=16, help="channels of the first U-Net level")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=12.0,
                   help="gradient norm limit (default 12, as nnU-Net clips)")
    p.add_argument("--weight", action="append", default=[], metavar="LABEL=W",
                   help="per-label loss weight, e.g. --weight 8=1.3 (repeatable)")
    p.add_argument("--amp", choices=("auto", "off", "float16", "bfloat16"), default="auto",
                   help="autocast dtype; auto: float16 with a GradScaler on CUDA, bfloat16 "
                   "on CPU")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--val-slices", type=int, default=64,
                   help="validate on this many evenly spaced slices (0: all)")
    p.add_argument("--manifest", type=Path,
                   help="read only this manifest's subjects, with its splits (and folds)")
    p.add_argument("--fold", type=int,
                   help="K-fold: validate on fold N of --manifest's fold column (`mriprep "
                   "splits --folds K`), train on the others")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--augment", default="light",
                   help="batch augmentation on the device: 'light' (default, mild), 'off', "
                   "or a YAML file of AugmentConfig fields")
    p.add_argument("--check", action="store_true",
                   help="run `mriprep check CACHE --dtype float16` first, as a job's first "
                   "step should")
    p.add_argument("--metrics", type=Path, help="write the loss history and Dice as JSON")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.fold is not None and args.manifest is None:
        print("train_2p5d: --fold needs --manifest (the manifest with the fold column)",
              file=sys.stderr)
        return 2
    if args.check:
        manifest = ["--manifest", str(args.manifest)] if args.manifest else []
        if mriprep_cli(["check", str(args.cache), "--dtype", "float16", *manifest]) != 0:
            print(f"train_2p5d: `mriprep check {args.cache}` found problems; not training",
                  file=sys.stderr)
            return 1
    try:
        history = train(args)
    except NonFiniteError as error:
        print(f"train_2p5d: stopped: {error}", file=sys.stderr)
        return EXIT_NON_FINITE
    except NoLabelsError as error:
        print(f"train_2p5d: not training: {error}", file=sys.stderr)
        return EXIT_NO_LABELS
    if args.metrics:
        args.metrics.write_text(json.dumps(history, indent=2))
    if not all(math.isfinite(v) for v in history["loss"]):
        return EXIT_NON_FINITE
    return 0


if __name__ == "__main__":
    sys.exit(main())
