"""Arm A: MONAI as its tutorials configure it, as is and with the two common input fixes.

The preparation follows MONAI's own pages, not a weakened copy of them:

* the transform chain of the 3D segmentation tutorials (``spleen_segmentation_3d``,
  ``brats_segmentation_3d`` in Project-MONAI/tutorials): ``LoadImaged``,
  ``EnsureChannelFirstd``, ``Orientationd(axcodes="RAS")``, ``Spacingd`` to 1 mm
  (bilinear image, nearest labels), an intensity scaling, then a fixed size. For MRI,
  where CT's fixed window does not apply, the scaling is
  ``ScaleIntensityRangePercentilesd(lower=0.5, upper=99.5, b_min=0, b_max=1, clip=True)``
  (MONAI's transforms reference); ``ResizeWithPadOrCropd`` to 256^3 gives every arm the
  same slice size;
* FreeSurfer's numbers become classes with ``MapLabelValued``, from the same table's
  sagittal classes every arm uses (:func:`.training.class_table`);
* MONAI's fast-training guide for data that fits in memory: ``CacheDataset``
  (``cache_rate=1.0``), ``set_track_meta(False)`` once cached;
* the loss of the tutorials: ``DiceCELoss(to_onehot_y=True, softmax=True)``.

MONAI has no 2.5D reader, so the cached volumes are cut into 7-slice sagittal stacks by
the bench's shared sampler (slices whose classes sum to at most 50 are left out, as
FastSurfer's blank filter does), shuffled, 8 per batch.

The variants (:data:`VARIANTS`): as is; and with each of the two fixes people apply to
the input, ``nan_to_zero`` and ``nan_to_mean``, each with gradient clipping
(``clip_grad_norm_`` at 12, as nnU-Net clips).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.outcome.cohort import Cohort
from benchmarks.outcome.training import (BATCH, VIEW, PreparedArm, TestVolume, class_table,
                                         thick)

SIZE = 256
BLANK_THRESHOLD = 50  # FastSurfer's blank-slice filter: the sum of a slice's classes
CLIP = 12.0


def nan_to_zero(image: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(image, nan=0.0)


def nan_to_mean(image: torch.Tensor) -> torch.Tensor:
    """Each item's NaN voxels set to the mean of its finite ones (0 where none is)."""
    out = image.clone()
    for item in out:
        finite = torch.isfinite(item)
        mean = item[finite].mean() if finite.any() else torch.tensor(0.0)
        item[torch.isnan(item)] = mean
    return out


VARIANTS = {
    "as is": dict(input_fix=None, clip=None),
    "nan_to_zero + clipping": dict(input_fix=nan_to_zero, clip=CLIP),
    "nan_to_mean + clipping": dict(input_fix=nan_to_mean, clip=CLIP),
}


def transforms(values: list[int]):
    from monai.transforms import (Compose, EnsureChannelFirstd, LoadImaged, MapLabelValued,
                                  Orientationd, ResizeWithPadOrCropd,
                                  ScaleIntensityRangePercentilesd, Spacingd)
    classes = class_of_values(values)
    keys = ["image", "label"]
    return Compose([
        LoadImaged(keys=keys),
        EnsureChannelFirstd(keys=keys),
        Orientationd(keys=keys, axcodes="RAS"),
        Spacingd(keys=keys, pixdim=(1.0, 1.0, 1.0), mode=("bilinear", "nearest")),
        ScaleIntensityRangePercentilesd(keys="image", lower=0.5, upper=99.5, b_min=0.0,
                                        b_max=1.0, clip=True),
        MapLabelValued(keys="label", orig_labels=values, target_labels=classes),
        ResizeWithPadOrCropd(keys=keys, spatial_size=(SIZE, SIZE, SIZE)),
    ])


def class_of_values(values: list[int]) -> list[int]:
    """The sagittal class of each FreeSurfer value, by the table's own lookup."""
    mapped = class_table().map(np.asarray(values, dtype=np.int32).reshape(-1, 1, 1), VIEW)
    return [int(c) for c in mapped.classes.ravel()]


def prepare(cohort: Cohort, copy: str, work: Path) -> PreparedArm:
    """The arm as is; :func:`variant` gives the others without preparing again."""
    from monai.data import CacheDataset, set_track_meta
    import nibabel as nib

    started = time.perf_counter()
    subjects = cohort.subjects(copy)
    values = sorted({int(v) for s in subjects
                     for v in np.unique(np.asarray(nib.load(s.label).dataobj))})
    items = [{"image": str(s.image), "label": str(s.label), "subject_id": s.subject_id}
             for s in subjects if s.split in ("train", "test")]
    set_track_meta(True)
    dataset = CacheDataset(items, transforms(values), cache_rate=1.0, num_workers=2,
                           progress=False)
    set_track_meta(False)
    volumes = {}
    for item in dataset:
        volumes[item["subject_id"]] = (np.asarray(item["image"][0], dtype=np.float32),
                                       np.asarray(item["label"][0], dtype=np.int64))
    train = [(s.subject_id, *volumes[s.subject_id]) for s in subjects if s.split == "train"]
    test = [TestVolume(s.subject_id, *volumes[s.subject_id])
            for s in subjects if s.split == "test"]
    return PreparedArm(
        name="A. MONAI, as is", batches=lambda seed: slice_batches(train, seed),
        loss=dice_ce_loss(), test=test, seconds=time.perf_counter() - started,
        notes=[f"{len(train)} training volumes cached by CacheDataset"])


def variant(arm: PreparedArm, name: str) -> PreparedArm:
    return dataclasses.replace(arm, name=f"A. MONAI, {name}", **VARIANTS[name])


def dice_ce_loss():
    from monai.losses import DiceCELoss
    loss = DiceCELoss(to_onehot_y=True, softmax=True)
    return lambda logits, batch: loss(logits, batch["classes"][:, None])


def slice_batches(volumes: list[tuple[str, np.ndarray, np.ndarray]], seed: int):
    """Endless shuffled batches of 7-slice sagittal stacks (axis 0 of RAS volumes) from
    the slices whose classes sum above the blank threshold."""
    pool = [(n, k) for n, (_, _, classes) in enumerate(volumes)
            for k in np.flatnonzero(classes.reshape(len(classes), -1).sum(1) > BLANK_THRESHOLD)]
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(pool))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            chosen = [pool[i] for i in order[start:start + BATCH]]
            yield {
                "image": torch.from_numpy(np.stack([thick(volumes[n][1], k)
                                                    for n, k in chosen]).astype(np.float32)),
                "classes": torch.from_numpy(np.stack([volumes[n][2][k] for n, k in chosen])),
                "subject_id": [volumes[n][0] for n, _ in chosen],
            }
