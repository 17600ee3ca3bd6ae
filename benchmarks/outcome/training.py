"""What every arm shares: the training loop, the count of non-finite events, and Dice.

An arm (:class:`PreparedArm`) is what one way of preparing data hands to training: endless
batches of 7-channel sagittal slices with their classes, its loss, its clean test subjects
in its own space, and what it lost on the way. :func:`train` runs the same network,
optimiser, seed and number of steps for every arm. It does what a training loop of that arm
does with a non-finite value: an unguarded loop takes the optimiser step anyway (its
weights then carry the NaN into every later step), a guarded one skips the step. Either
way the step is counted, and :class:`~mriprep.training.NonFiniteLocator` names the first
one's cause.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from mriprep.training import NaNGuard, NonFiniteError, NonFiniteLocator, to_device
from mriprep.training.labels import LabelTable, load_table

from benchmarks.outcome.network import CONTEXT, STRIDE, SliceNet, at_network_grid, full_size

VIEW = "sagittal"
# The classes: FreeSurfer's aseg structures, cortex one class per hemisphere (merged with
# its partner in the sagittal view: 21 classes). The DKT table's 51 sagittal classes
# (31 cortical parcels) do not learn within the CPU budget.
TABLE = Path(__file__).with_name("aseg_classes.tsv")
BATCH = 8
LEARNING_RATE = 3e-3


@dataclass
class TestVolume:
    """One clean test subject in an arm's space, sliced along the sagittal axis (axis 0),
    its image as the arm feeds the network."""

    subject_id: str
    image: np.ndarray    # [S, H, W] float32
    classes: np.ndarray  # [S, H, W] integer classes of the table's sagittal view
    valid: np.ndarray | None = None  # the arm's own mask (not used by the Dice)


@dataclass
class PreparedArm:
    name: str
    batches: Callable[[int], Iterator[dict]]  # seed -> {"image", "classes", "subject_id", ...}
    loss: Callable[[torch.Tensor, dict], torch.Tensor]
    test: list[TestVolume]
    lost: dict[str, str] = field(default_factory=dict)  # subject -> why it was lost
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0  # preparation's wall time
    epoch_steps: int = 0  # batches in one pass over the training slices
    clip: float | None = None
    guarded: bool = False  # NaNGuard first, and a non-finite step is skipped


@dataclass
class Run:
    arm: str
    losses: list[float]
    events: dict[str, int]   # non-finite: "loss", "gradients", "input"; "skipped" steps
    event_steps: int         # steps with any non-finite value
    first_cause: str | None
    seconds: float
    model: SliceNet


@functools.lru_cache(maxsize=1)
def class_table() -> LabelTable:
    """FreeSurfer's ``aseg`` structures (:data:`TABLE`), FastSurfer's ``aseg`` rules."""
    return load_table(TABLE, processing="aseg")


def classes_count() -> int:
    return class_table().num_classes(VIEW)


def structures() -> dict[str, list[int]]:
    """The classes a reader asks about, by name (sagittal classes: left and right are one)."""
    names = class_table().class_names(VIEW)
    return {name: [c for c, n in enumerate(names) if n.endswith(suffix)]
            for name, suffix in (("cerebellar WM", "Cerebellum-White-Matter"),
                                 ("cortex", "Cerebral-Cortex"),
                                 ("lateral ventricles", "-Lateral-Ventricle"))}


def train(arm: PreparedArm, steps: int, seed: int = 0, device: str = "cpu",
          amp: bool = False, stride: int = STRIDE) -> Run:
    """``steps`` optimiser steps of :class:`SliceNet` on ``arm``'s batches.

    ``amp``: float16 autocast with a GradScaler (CUDA), in every arm alike. The scaler
    skips a step whose gradients are not finite, so there an unguarded arm's NaN does not
    reach its weights: such a step is still counted as an event. A step with a finite
    loss whose gradients overflowed is the scaler's routine (``scaler_skipped``, not an
    event), and the locator then watches the forward pass only."""
    torch.manual_seed(seed)
    device = torch.device(device)
    guard = NaNGuard("raise") if arm.guarded else None
    model = SliceNet(classes_count(), guard=guard, stride=stride).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    locator = NonFiniteLocator(model, backward=not amp)
    events = {"input": 0, "loss": 0, "gradients": 0, "skipped": 0, "scaler_skipped": 0}
    event_steps, first_cause, losses = 0, None, []
    batches = arm.batches(seed)
    started = time.perf_counter()
    for step in range(steps):
        batch = to_device(at_logit_grid(next(batches), stride), device)
        image = batch["image"]
        ids = batch.get("subject_id")
        if guard is not None:
            guard.set_batch(ids, step)
        optimiser.zero_grad(set_to_none=True)
        cause, loss, backward_ran = None, None, False
        try:
            with locator(step=step, subject_ids=ids):
                with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                    logits = model(image)
                loss = arm.loss(logits.float(), batch)
                scaler.scale(loss).backward()
                backward_ran = True
        except NonFiniteError as error:  # the guard's, or the locator's on leaving
            cause = str(error)
        bad_input = not bool(torch.isfinite(image).all())
        finite_loss = loss is not None and bool(torch.isfinite(loss.detach()).all())
        finite_grads = True
        if backward_ran:
            scaler.unscale_(optimiser)
            finite_grads = all(bool(torch.isfinite(p.grad).all())
                               for p in model.parameters() if p.grad is not None)
        events["input"] += bad_input
        events["loss"] += loss is not None and not finite_loss
        routine = amp and finite_loss and not finite_grads and not bad_input
        events["scaler_skipped"] += routine
        events["gradients"] += not finite_grads and not routine
        if bad_input or not finite_loss or (not finite_grads and not routine) or cause:
            event_steps += 1
            first_cause = first_cause or cause or "a non-finite value the locator did not name"
            if arm.guarded:
                events["skipped"] += 1
                losses.append(math.nan)
                if backward_ran:
                    scaler.update()
                continue
        if arm.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), arm.clip)
        scaler.step(optimiser)  # unguarded: the step is taken, NaN or not (amp: skipped)
        scaler.update()
        losses.append(float(loss.detach()))
        del loss
    return Run(arm.name, losses, events, event_steps, first_cause,
               time.perf_counter() - started, model)


def at_logit_grid(batch: dict, stride: int) -> dict:
    """The batch with its per-voxel targets (classes, valid, weight) at the logits' grid."""
    out = dict(batch)
    for key in ("classes", "valid", "weight"):
        if key in out:
            out[key] = at_network_grid(out[key], stride, key)
    return out


def thick(image: np.ndarray, k: int) -> np.ndarray:
    """Slice ``k`` with its neighbours, the volume's edge slices repeated beyond it (as
    FastSurfer pads)."""
    index = np.clip(np.arange(k - CONTEXT, k + CONTEXT + 1), 0, len(image) - 1)
    return image[index]


def predict(model: SliceNet, volume: TestVolume) -> np.ndarray:
    """Classes predicted for every slice of ``volume`` whose 7-slice input holds a
    non-zero voxel; background where the input is all 0 (the image, not the labels,
    decides)."""
    predicted = np.zeros(volume.classes.shape, dtype=np.int64)
    lit = np.flatnonzero(volume.image.reshape(len(volume.image), -1).any(axis=1))
    if len(lit) == 0:
        return predicted
    first, last = max(lit[0] - CONTEXT, 0), min(lit[-1] + CONTEXT, len(volume.image) - 1)
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(first, last + 1, 16):
            ks = range(start, min(start + 16, last + 1))
            x = torch.from_numpy(np.stack([thick(volume.image, k) for k in ks])
                                 .astype(np.float32)).to(device)
            # max(1).indices, not argmax(1): the same first maximal class, and on a CPU
            # a fraction of argmax's time across the planes (docs/benchmarks.md, row 53).
            # Contiguous first: the network computes channels-last, and the bilinear
            # upsampling rounds differently in that layout (the same row).
            logits = full_size(model(x).float().contiguous(), x.shape[-2:])
            predicted[list(ks)] = logits.max(1).indices.cpu().numpy()
    model.train()
    return predicted


def dice_scores(model: SliceNet, test: list[TestVolume]) -> dict[str, dict[str, float]]:
    """Per test subject: the mean hard Dice over the classes its labels hold (``mean``),
    and the Dice of each of :func:`structures` (its classes taken together), over every
    voxel of the arm's grid (what an arm holds invalid is scored too: the arms alike)."""
    classes = classes_count()
    out = {}
    for volume in test:
        predicted = predict(model, volume)
        confusion = np.bincount((volume.classes * classes + predicted).ravel(),
                                minlength=classes * classes).reshape(classes, classes)
        held = [c for c in range(1, classes) if confusion[c].sum() > 0]
        row = {"mean": float(np.mean([dice_of(confusion, [c]) for c in held]))}
        for name, members in structures().items():
            row[name] = dice_of(confusion, members)
        out[volume.subject_id] = row
    return out


def dice_of(confusion: np.ndarray, members: list[int]) -> float:
    """Dice of the classes ``members`` taken as one, from a confusion matrix (rows: truth,
    columns: prediction); NaN where neither holds a voxel."""
    both = confusion[np.ix_(members, members)].sum()
    total = confusion[members].sum() + confusion[:, members].sum()
    return 2.0 * float(both) / float(total) if total else math.nan
