"""The ablations: how NaN voxels are handled, at 5, 15 and 30% of the brain.

On the clean cohort as mriprep caches it (conform_1mm), NaN blobs are put into every
training volume until the given share of its brain voxels is NaN; then they are handled
one of three ways before training, the rest of the path the same (the shared sampler,
mriprep's losses with median-frequency class weights, the same network, seed and steps):

* ``zero``: NaN -> 0, every voxel trains;
* ``mean``: NaN -> the mean of the volume's other non-zero voxels (the head: a conformed
  image's background is 0), every voxel trains;
* ``mriprep``: NaN -> the Gaussian-weighted mean of the known neighbours
  (:func:`mriprep.stages.sanitize.fill_local`, the sanitize stage's ``local`` strategy,
  sigma 2 mm) and marked invalid: the losses leave those voxels out. (Two changes at
  once: the fill and the mask; a masked zero fill is not run.)

Two figures per handling and share: the test Dice against the same path at 0% NaN, and
the batch-norm statistics error: the first batch norm's per-channel batch variance on the
handled slices against the same slices without NaN, through one fixed network (the 0%
run's), as a mean relative error.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from mriprep.stages.sanitize import fill_local
from mriprep.training import CrossEntropyLoss, DiceLoss
from mriprep.training.labels.weights import weights_from_counts

from benchmarks.outcome.sampler import slice_batches, slice_pool
from benchmarks.outcome.training import PreparedArm, TestVolume, classes_count

SHARES = (0.05, 0.15, 0.30)
HANDLINGS = ("zero", "mean", "mriprep")


@dataclasses.dataclass
class Volumes:
    """Training volumes, sagittal slices first: (subject, image 0-1, classes, valid)."""

    items: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]


def from_test_volumes(volumes: list[TestVolume]) -> Volumes:
    return Volumes([(v.subject_id, v.image, v.classes,
                     np.ones(v.image.shape, bool) if v.valid is None else v.valid)
                    for v in volumes])


def with_nan(volumes: Volumes, share: float, handling: str, seed: int = 0) -> Volumes:
    out = []
    for n, (sid, image, classes, valid) in enumerate(volumes.items):
        holes = nan_blobs(classes > 0, share, np.random.default_rng([seed, n]))
        handled, kept = handle(image, holes, valid, handling)
        out.append((sid, handled, classes, kept))
    return Volumes(out)


def nan_blobs(brain: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """Balls of 4-10 voxels' radius centred in the brain until ``share`` of its voxels
    are covered."""
    holes = np.zeros(brain.shape, bool)
    points = np.argwhere(brain)
    target = share * brain.sum()
    while (holes & brain).sum() < target:
        centre = points[rng.integers(len(points))]
        radius = float(rng.uniform(4.0, 10.0))
        box = tuple(slice(max(int(c - radius), 0), min(int(c + radius) + 1, n))
                    for c, n in zip(centre, brain.shape))
        grid = np.ogrid[box]
        ball = sum((g - c) ** 2 for g, c in zip(grid, centre)) <= radius ** 2
        holes[box] |= ball
    return holes


def handle(image: np.ndarray, holes: np.ndarray, valid: np.ndarray, handling: str):
    """(image, valid) after NaN in ``holes`` was handled as ``handling`` says."""
    image = image.copy()
    if handling == "zero":
        image[holes] = 0.0
        return image, valid
    if handling == "mean":
        image[holes] = float(image[~holes & (image > 0)].mean())
        return image, valid
    if handling == "mriprep":
        known = ~holes
        image[holes] = fill_local(image, known, holes, np.full(3, 2.0)).astype(np.float32)
        return image, valid & known
    raise ValueError(f"handling {handling!r}; choose one of {HANDLINGS}")


def arm(name: str, volumes: Volumes, test: list[TestVolume]) -> PreparedArm:
    """The ablation's training: the shared sampler, mriprep's valid-aware losses with
    median-frequency class weights (FastSurfer's, capped at 5) from the training classes."""
    counts = np.bincount(np.concatenate([classes.ravel() for _, _, classes, _ in volumes.items]),
                         minlength=classes_count())
    weights = [float(w) for w in weights_from_counts(counts, max_weight=5.0)]
    dice, ce = DiceLoss(), CrossEntropyLoss(weights=weights)

    def loss(logits, batch):
        return (ce(logits, batch["classes"], valid=batch["valid"])
                + dice(logits, batch["classes"], valid=batch["valid"]))
    return PreparedArm(name=name, batches=lambda seed: batches(volumes, seed), loss=loss,
                       test=test)


def batches(volumes: Volumes, seed: int):
    return slice_batches(volumes.items, slice_pool(volumes.items), seed)


def batch_norm_error(model, clean: Volumes, handled: Volumes, batches_: int = 6,
                     seed: int = 1) -> float:
    """Mean relative error of the first batch norm's per-channel batch variance, handled
    slices against the same slices clean, through ``model`` (its weights fixed)."""
    first = model.enc1[1]
    seen = {}

    def hook(module, inputs, output):
        x = inputs[0]
        seen["var"] = x.transpose(0, 1).reshape(x.shape[1], -1).var(dim=1)
    handle_ = first.register_forward_hook(hook)
    device = next(model.parameters()).device
    errors = []
    model.eval()  # what reaches the first batch norm does not depend on its mode
    try:
        with torch.no_grad():
            for a, b, _ in zip(_same_slices(clean, seed), _same_slices(handled, seed),
                               range(batches_)):
                model(a.to(device))
                clean_var = seen["var"].clone()
                model(b.to(device))
                errors.append(float(((seen["var"] - clean_var).abs() / clean_var).mean()))
    finally:
        handle_.remove()
        model.train()
    return float(np.mean(errors))


def _same_slices(volumes: Volumes, seed: int):
    for batch in batches(volumes, seed):
        yield batch["image"]
