"""FastSurfer-style training on an mriprep cache: three views, DKT classes, weight maps.

What FastSurferCNN trains on, served straight from the cache (no HDF5 file):

* one network per view (coronal, axial, sagittal), each on thick slices of its view:
  ``MRIDataset(..., mode="thick_slice", view=...)`` gives the slice with 3 neighbours
  each side (7 channels), its classes of the label table (79 DKT classes; 51 in the
  sagittal view, which merges left and right) and FastSurfer's weight map;
* the loss is FastSurfer's: cross-entropy weighted voxel by voxel by the weight map,
  plus Dice, both masked by ``valid`` and finite on an empty class;
* the mirror augmentation swaps Left-* and Right-* classes with the table's ``lr_swap``
  (the sagittal view is not mirrored: its left and right are one class already);
* :func:`~mriprep.training.make_dataloader` batches 16 slices, pinned and seeded;
  :class:`~mriprep.training.NaNGuard` is the network's first layer and
  :class:`~mriprep.training.NonFiniteLocator` names the module that makes a NaN.

The classes of every subject are derived once when the first dataset opens and kept in
``CACHE/derived`` for every later run and for ``mriprep export``. After each epoch it
prints the loss and the validation Dice averaged over the classes present, per view, and
at the end the mean Dice per view. Exit status: 0 finished with finite losses, 3 a
non-finite value (named), 1 the cache or its labels cannot be served (the message names
the subjects and the fix), 2 usage.

    mriprep manifest from-freesurfer $SUBJECTS_DIR -o subjects.csv
    mriprep splits subjects.csv --assign train=0.8,val=0.2 -o cohort.csv
    mriprep run cohort.csv -o cache -p conform_1mm
    mriprep check cache --lut dkt
    python examples/train_fastsurfer.py cache [--views coronal axial sagittal] [--epochs 2]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from mriprep.core.errors import MriprepError
from mriprep.training import (
    CrossEntropyLoss,
    DiceLoss,
    MRIDataset,
    NaNGuard,
    NonFiniteError,
    NonFiniteLocator,
    make_dataloader,
    to_device,
)
from mriprep.training.augment import Augment, AugmentConfig
from mriprep.training.labels import dkt_table, load_table

EXIT_NON_FINITE = 3
# The in-plane item axis that runs left-right in each view of a conformed (LIA) cache.
LEFT_RIGHT_AXIS = {"coronal": 0, "axial": 1}


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class SmallFastSurferNet(nn.Module):
    """Two levels of a FastSurferCNN-like encoder-decoder: small enough for a CPU run.
    Swap in FastSurfer's own network for real training; the data side stays the same."""

    def __init__(self, channels: int, classes: int, width: int = 32):
        super().__init__()
        self.guard = NaNGuard("raise")
        self.enc = block(channels, width)
        self.down = block(width, width)
        self.up = nn.ConvTranspose2d(width, width, 2, stride=2)
        self.dec = block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.enc(self.guard(x))
        d = self.up(self.down(nn.functional.max_pool2d(e, 2)))
        d = nn.functional.interpolate(d, size=e.shape[-2:]) if d.shape != e.shape else d
        return self.head(self.dec(torch.cat([d, e], 1)))


def datasets(args, view: str):
    options = dict(mode="thick_slice", view=view, table=args.table,
                   absent_classes=args.absent_classes)
    train = MRIDataset(args.cache, args.train_split, **options)
    try:
        val = MRIDataset(args.cache, args.val_split, **options)
    except MriprepError as exc:
        print(f"train_fastsurfer: {view}: no validation ({exc})", file=sys.stderr)
        val = None
    return train, val


def train_view(args, view: str) -> float | None:
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    train_set, val_set = datasets(args, view)
    classes = args.table.num_classes(view)
    model = SmallFastSurferNet(2 * train_set.context + 1, classes, args.width).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ce, dice = CrossEntropyLoss(), DiceLoss()
    locator = NonFiniteLocator(model)
    flip = view in LEFT_RIGHT_AXIS
    augment = Augment(AugmentConfig(flip_prob=0.5 if flip else 0.0,
                                    lr_axis=LEFT_RIGHT_AXIS.get(view, "auto"),
                                    weight_keys=("weight",), seed=args.seed),
                      lr_swap=args.table.lr_swap(view) if flip else None).to(device)
    loader = make_dataloader(train_set, batch_size=args.batch_size, seed=args.seed)
    print(f"train_fastsurfer: {view}: {len(train_set)} slices of {len(train_set.entries)} "
          f"subjects, {classes} classes")
    step = 0
    for epoch in range(args.epochs):
        augment.set_epoch(epoch)
        losses = []
        for batch in loader:
            if args.steps and len(losses) >= args.steps:
                break
            batch = to_device(batch, device)
            batch["image"] = batch["image"] / 255.0  # FastSurfer scales orig to 0-1
            batch = augment(batch)
            target, valid = batch["label"], batch["valid"]
            model.guard.set_batch(batch["subject_id"], step)
            with locator(step=step, subject_ids=batch["subject_id"]):
                logits = model(batch["image"])
                loss = (ce(logits, target, valid=valid, weight_map=batch["weight"])
                        + dice(logits, target, valid=valid))
                if not torch.isfinite(loss):
                    raise NonFiniteError(f"{view}: the loss is {float(loss)} at step {step}")
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
            step += 1
        score = evaluate(model, val_set, classes, args, device) if val_set else None
        print(f"train_fastsurfer: {view}: epoch {epoch}: loss "
              f"{sum(losses) / max(len(losses), 1):.4f}"
              + (f", validation Dice {score:.3f}" if score is not None else ""))
    return score


def evaluate(model, val_set, classes: int, args, device) -> float | None:
    """Hard Dice averaged over the classes present in the labels or the prediction."""
    inter = torch.zeros(classes, dtype=torch.float64)
    total = torch.zeros(classes, dtype=torch.float64)
    model.eval()
    loader = make_dataloader(val_set, batch_size=args.batch_size, shuffle=False)
    with torch.no_grad():
        for n, batch in enumerate(loader):
            if args.steps and n >= args.steps:
                break
            batch = to_device(batch, device)
            predicted = model(batch["image"] / 255.0).argmax(1)
            target, valid = batch["label"], batch["valid"]
            for c in range(classes):
                p, t = (predicted == c) & valid, (target == c) & valid
                inter[c] += float((p & t).sum())
                total[c] += float(p.sum() + t.sum())
    model.train()
    seen = total > 0
    return float((2 * inter[seen] / total[seen]).mean()) if seen.any() else None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[-6:]))
    p.add_argument("cache", help="a cache made with -p conform_1mm from FreeSurfer labels")
    p.add_argument("--views", nargs="+", default=["coronal", "axial", "sagittal"],
                   choices=("coronal", "axial", "sagittal"))
    p.add_argument("--lut", default=None,
                   help="label table (default: the shipped FastSurfer DKT table)")
    p.add_argument("--absent-classes", choices=("error", "allow"), default="error",
                   help="a class of the table that no training subject holds (default: "
                        "error, naming them)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=0,
                   help="at most this many batches per epoch (0: all)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    args.table = dkt_table() if args.lut is None else load_table(args.lut)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    scores = {}
    try:
        for view in args.views:
            scores[view] = train_view(args, view)
    except NonFiniteError as exc:
        print(f"train_fastsurfer: stopped: {exc}", file=sys.stderr)
        return EXIT_NON_FINITE
    except MriprepError as exc:
        print(f"train_fastsurfer: {exc}", file=sys.stderr)
        return 1
    for view, score in scores.items():
        shown = "no validation split" if score is None else f"mean Dice {score:.3f}"
        print(f"train_fastsurfer: {view}: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
