"""Arm A: MONAI as its tutorials configure it, as is and with the two common input fixes.

The preparation follows MONAI's own pages, not a weakened copy of them:

* the deterministic part of the transform chain of MONAI's 3D segmentation tutorial
  (``spleen_segmentation_3d`` in Project-MONAI/tutorials): ``LoadImaged``,
  ``EnsureChannelFirstd``, ``Orientationd(axcodes="RAS")``, ``Spacingd`` to 1 mm
  (bilinear image, nearest labels) and an intensity scaling. For MRI, where CT's fixed
  window does not apply, the scaling is its percentile form,
  ``ScaleIntensityRangePercentilesd(lower=0.5, upper=99.5, b_min=0, b_max=1, clip=True)``
  (MONAI's transforms reference). ``ResizeWithPadOrCropd`` to 256^3 gives every arm the
  same slice size. No arm augments (the comparison is of data paths);
* FreeSurfer's numbers become classes with ``MapLabelValued``, from the same table's
  sagittal classes every arm uses (:func:`.training.class_table`);
* MONAI's fast-training guide for data that fits in memory: ``CacheDataset``
  (``cache_rate=1.0``), ``set_track_meta(False)`` once cached;
* the loss of the tutorials: ``DiceCELoss(to_onehot_y=True, softmax=True)``.

MONAI has no 2.5D reader, so the cached volumes are cut into 7-slice sagittal stacks by
the bench's shared sampler (slices whose classes sum to at most 50 are left out, as
FastSurfer's blank filter does), shuffled, 8 per batch.

The variants (:data:`VARIANTS`): as is; and with each of the two fixes people apply to
the input, ``nan_to_zero`` and ``nan_to_mean``, right after loading (where a fix must
act: one NaN makes the percentile scaling's bounds NaN and with them the whole volume),
each with gradient clipping (``clip_grad_norm_`` at 12, as nnU-Net's
``nnUNetTrainer.train_step`` clips). The bench notes every training volume that leaves
the chain non-finite or constant: trained on as it is, as a tutorial's loop would.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.outcome.cohort import Cohort
from benchmarks.outcome.sampler import slice_batches, slice_pool
from benchmarks.outcome.training import BATCH, VIEW, PreparedArm, TestVolume, class_table

SIZE = 256
CLIP = 12.0


def nan_to_zero(image: torch.Tensor) -> torch.Tensor:
    """``torch.nan_to_num(x, nan=0.0)``: NaN to 0 (an infinity to the dtype's extreme)."""
    return torch.nan_to_num(image, nan=0.0)


def nan_to_mean(image: torch.Tensor) -> torch.Tensor:
    """NaN voxels set to the mean of the volume's finite ones (0 where none is)."""
    out = torch.as_tensor(image).clone()
    finite = torch.isfinite(out)
    out[torch.isnan(out)] = out[finite].mean() if finite.any() else 0.0
    return out


# variant -> the fix on the loaded image (before resampling and scaling spread a NaN)
VARIANTS = {"as is": None, "nan_to_zero + clipping": nan_to_zero,
            "nan_to_mean + clipping": nan_to_mean}


def transforms(values: list[int], fix=None):
    from monai.transforms import (Compose, EnsureChannelFirstd, Lambdad, LoadImaged,
                                  MapLabelValued, Orientationd, ResizeWithPadOrCropd,
                                  ScaleIntensityRangePercentilesd, Spacingd)
    classes = class_of_values(values)
    keys = ["image", "label"]
    fixed = [Lambdad(keys="image", func=fix)] if fix is not None else []
    return Compose([
        LoadImaged(keys=keys),
        EnsureChannelFirstd(keys=keys),
        *fixed,
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


def prepare(cohort: Cohort, copy: str, work: Path, variant: str = "as is") -> PreparedArm:
    """Arm A in ``variant`` (:data:`VARIANTS`) on ``copy`` of the cohort."""
    from monai.data import CacheDataset, set_track_meta
    import nibabel as nib

    started = time.perf_counter()
    fix = VARIANTS[variant]
    subjects = cohort.subjects(copy)
    values = sorted({int(v) for s in subjects
                     for v in np.unique(np.asarray(nib.load(s.label).dataobj))})
    items = [{"image": str(s.image), "label": str(s.label), "subject_id": s.subject_id}
             for s in subjects if s.split in ("train", "test")]
    set_track_meta(True)
    dataset = CacheDataset(items, transforms(values, fix), cache_rate=1.0, num_workers=2,
                           progress=False)
    set_track_meta(False)
    volumes = {}
    for item in dataset:
        volumes[item["subject_id"]] = (np.asarray(item["image"][0], dtype=np.float32),
                                       np.asarray(item["label"][0], dtype=np.int64))
    train = [(s.subject_id, *volumes[s.subject_id]) for s in subjects if s.split == "train"]
    test = [TestVolume(s.subject_id, *volumes[s.subject_id])
            for s in subjects if s.split == "test"]
    notes = [f"{len(train)} training volumes cached by CacheDataset"]
    for sid, image, _ in train:  # what the chain made of each: trained on as it is
        bad = 1.0 - float(np.isfinite(image).mean())
        if bad > 0:
            notes.append(f"{sid}: {bad:.1%} of its voxels non-finite after the transforms")
        elif float(image.max()) == float(image.min()):
            notes.append(f"{sid}: constant ({float(image.max())}) after the transforms")
    pool = slice_pool(train)
    return PreparedArm(
        name=f"A. MONAI, {variant}", batches=lambda seed: slice_batches(train, pool, seed),
        loss=dice_ce_loss(), test=test, seconds=time.perf_counter() - started,
        notes=notes, clip=CLIP if fix is not None else None,
        epoch_steps=len(pool) // BATCH)


def dice_ce_loss():
    from monai.losses import DiceCELoss
    loss = DiceCELoss(to_onehot_y=True, softmax=True)
    return lambda logits, batch: loss(logits, batch["classes"][:, None])
