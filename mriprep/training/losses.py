"""Segmentation losses that are finite by construction: soft Dice and cross-entropy, both
restricted to valid voxels, with per-label weights and label smoothing.

Why not MONAI's or torch's as they are: neither takes the cache's ``valid`` mask (filled
and masked voxels must not teach the network), and the usual repair for a Dice of NaN
on an empty class, ``torch.where(isnan(loss), 0, loss)`` after the fact, hides the
cause. Here every ratio has a positive denominator by construction (Dice's smoothing
terms; cross-entropy's count of valid voxels, floored), so an empty class or an empty
mask gives a finite, meaningful value: a class absent from both the target and the
prediction scores a Dice of 1 (loss 0), as MONAI's does.

Both compute in float32 whatever the logits' dtype: under AMP the logits arrive in
float16, whose largest value (65504) a sum over a volume's voxels exceeds.

Where both are defined (every voxel valid, no weights, no smoothing) the values agree
with MONAI's ``DiceLoss(softmax=True, to_onehot_y=True)`` and with
``torch.nn.functional.cross_entropy``; the tests compare them.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def _target_and_mask(logits: torch.Tensor, target: torch.Tensor,
                     valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``target`` as ``[B, ...]`` int64 and ``valid`` as ``[B, ...]`` bool, checked
    against the logits' ``[B, C, ...]`` (a ``[B, 1, ...]`` target is accepted, and a
    float one holding whole numbers, as MONAI's transforms return labels)."""
    if target.dim() == logits.dim() and target.shape[1] == 1:
        target = target[:, 0]
    if target.shape != logits.shape[:1] + logits.shape[2:]:
        raise ValueError(
            f"target shape {tuple(target.shape)} does not match logits {tuple(logits.shape)}: "
            "give logits [B, C, ...] and an integer target [B, ...] or [B, 1, ...]")
    if target.is_floating_point():
        # MONAI's spatial transforms hand labels back as floats; nearest interpolation
        # keeps them whole numbers, any other would blend labels into meaningless ones.
        fractional = ~torch.isfinite(target) | (target != target.round())
        if fractional.any():
            value = float(target[fractional].flatten()[0])
            raise ValueError(
                f"target holds non-integer label values (e.g. {value}): a label map must "
                "be resampled with nearest-neighbour interpolation (MONAI: mode='nearest')")
    if valid is not None:
        if valid.dim() == logits.dim() and valid.shape[1] == 1:
            valid = valid[:, 0]
        if valid.shape != target.shape:
            raise ValueError(f"valid shape {tuple(valid.shape)} does not match the "
                             f"target's {tuple(target.shape)}")
        valid = valid.bool()
    classes = logits.shape[1]
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= classes):
        raise ValueError(f"target labels {int(target.min())}..{int(target.max())} are "
                         f"outside the logits' {classes} classes 0..{classes - 1}")
    return target.long(), valid


def _weights(weights: Sequence[float] | torch.Tensor | None, classes: int,
             device) -> torch.Tensor | None:
    if weights is None:
        return None
    w = torch.as_tensor(weights, dtype=torch.float32, device=device)
    if w.shape != (classes,) or not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"label weights must be {classes} finite values >= 0, not all 0; "
                         f"got {w.tolist()}")
    return w


def _weight_map(weight_map: torch.Tensor | None, target: torch.Tensor) -> torch.Tensor | None:
    """The per-voxel weights as float32 ``[B, ...]``, checked finite and >= 0."""
    if weight_map is None:
        return None
    w = torch.as_tensor(weight_map, device=target.device)
    if w.dim() == target.dim() + 1 and w.shape[1] == 1:
        w = w[:, 0]
    if w.shape != target.shape:
        raise ValueError(f"weight_map shape {tuple(w.shape)} does not match the target's "
                         f"{tuple(target.shape)}; give one weight per voxel")
    w = w.float()
    if not torch.isfinite(w).all() or (w < 0).any():
        raise ValueError("weight_map holds non-finite or negative values; weights must be "
                         "finite and >= 0 (see mriprep.training.labels.weights)")
    return w


class DiceLoss(nn.Module):
    """Soft multi-class Dice loss of logits ``[B, C, ...]`` against integer labels.

    Parameters
    ----------
    weights
        Per-label weights (length C) for the mean over labels, e.g. 1.3 on cerebellum
        labels as FastSurfer weights them; default equal.
    smooth_nr, smooth_dr
        Added to the numerator and denominator of each Dice ratio (MONAI's defaults):
        they keep it finite on an empty class and make an empty class, absent from the
        prediction too, score 1.
    label_smoothing
        The one-hot target becomes ``(1 - e) * onehot + e / C``.
    include_background
        Whether label 0 enters the mean (default True, as MONAI's default).

    Notes
    -----
    Call as ``loss(logits, target, valid=None, weight_map=None)``: ``valid`` (bool, the
    target's shape) leaves out voxels where it is False; ``weight_map`` (>= 0, the
    target's shape, e.g. a thick-slice item's ``weight``) weighs each voxel's share of
    the sums, a weighted soft Dice. The Dice is computed per item and label and
    averaged, as MONAI's is.
    """

    def __init__(self, weights=None, smooth_nr: float = 1e-5, smooth_dr: float = 1e-5,
                 label_smoothing: float = 0.0, include_background: bool = True):
        super().__init__()
        if not (smooth_dr > 0 and smooth_nr >= 0):
            raise ValueError("smooth_dr must be > 0 and smooth_nr >= 0: they keep an "
                             "empty class finite")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
        self.weights = weights
        self.smooth_nr, self.smooth_dr = float(smooth_nr), float(smooth_dr)
        self.label_smoothing = float(label_smoothing)
        self.include_background = include_background

    def forward(self, logits: torch.Tensor, target: torch.Tensor,
                valid: torch.Tensor | None = None,
                weight_map: torch.Tensor | None = None) -> torch.Tensor:
        target, valid = _target_and_mask(logits, target, valid)
        voxel_w = _weight_map(weight_map, target)
        classes = logits.shape[1]
        probs = torch.softmax(logits.float(), dim=1)
        onehot = F.one_hot(target, classes).movedim(-1, 1).to(probs.dtype)
        if self.label_smoothing:
            onehot = onehot * (1.0 - self.label_smoothing) + self.label_smoothing / classes
        if valid is not None:
            keep = valid.unsqueeze(1).to(probs.dtype)
            probs, onehot = probs * keep, onehot * keep
        if voxel_w is not None:
            probs, onehot = probs * voxel_w.unsqueeze(1), onehot * voxel_w.unsqueeze(1)
        dims = tuple(range(2, logits.dim()))
        intersection = (probs * onehot).sum(dims)
        denominator = probs.sum(dims) + onehot.sum(dims)
        dice = (2.0 * intersection + self.smooth_nr) / (denominator + self.smooth_dr)
        loss = 1.0 - dice  # [B, C]
        weights = _weights(self.weights, classes, logits.device)
        if not self.include_background:
            loss = loss[:, 1:]
            weights = weights[1:] if weights is not None else None
        if weights is None:
            return loss.mean()
        return (loss * weights).sum(1).mean() / weights.sum()


class CrossEntropyLoss(nn.Module):
    """Cross-entropy of logits ``[B, C, ...]`` against integer labels, over valid voxels.

    ``weights`` (per label) and ``label_smoothing`` act as in
    :func:`torch.nn.functional.cross_entropy`, whose weighted mean divides by the
    weights of the voxels' targets; so does this one, over valid voxels only. With no
    valid voxel the loss is 0 (and its gradient too), not 0/0.
    """

    def __init__(self, weights=None, label_smoothing: float = 0.0):
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
        self.weights = weights
        self.label_smoothing = float(label_smoothing)

    def forward(self, logits: torch.Tensor, target: torch.Tensor,
                valid: torch.Tensor | None = None,
                weight_map: torch.Tensor | None = None) -> torch.Tensor:
        target, valid = _target_and_mask(logits, target, valid)
        voxel_w = _weight_map(weight_map, target)
        weights = _weights(self.weights, logits.shape[1], logits.device)
        per_voxel = F.cross_entropy(logits.float(), target, weight=weights, reduction="none",
                                    label_smoothing=self.label_smoothing)
        share = weights[target] if weights is not None else torch.ones_like(per_voxel)
        if voxel_w is not None:
            # The map scales the numerator only: the mean stays over voxels, so a map of
            # ones changes nothing and FastSurfer's mean(ce * w) is reproduced.
            per_voxel = per_voxel * voxel_w
        if valid is not None:
            per_voxel = per_voxel * valid
            share = share * valid
        # The floor only acts when no voxel counts: 0 / tiny = 0, never 0 / 0.
        return per_voxel.sum() / share.sum().clamp_min(torch.finfo(torch.float32).tiny)
