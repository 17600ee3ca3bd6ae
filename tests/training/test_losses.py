"""The losses agree with MONAI's Dice and torch's cross-entropy where both are defined,
and stay finite and meaningful where those are not (empty classes, empty masks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mriprep.training.losses import CrossEntropyLoss, DiceLoss


def _batch(seed=0, classes=4, shape=(2, 10, 9, 8)):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((shape[0], classes) + shape[1:], generator=g) * 3
    target = torch.randint(0, classes, shape, generator=g)
    return logits, target


def test_dice_agrees_with_monai():
    monai_losses = pytest.importorskip("monai.losses")
    logits, target = _batch()
    ours = DiceLoss()(logits, target)
    theirs = monai_losses.DiceLoss(softmax=True, to_onehot_y=True)(logits, target[:, None])
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    # [B, 1, ...] targets are accepted as MONAI takes them.
    assert DiceLoss()(logits, target[:, None]).item() == pytest.approx(ours.item())
    # Per-label weights are a weighted mean of MONAI's per-label losses.
    per_label = monai_losses.DiceLoss(softmax=True, to_onehot_y=True, reduction="none")(
        logits, target[:, None]).reshape(2, 4).mean(0)
    weights = torch.tensor([1.0, 1.0, 1.3, 1.3])
    weighted = DiceLoss(weights=weights)(logits, target)
    assert weighted.item() == pytest.approx(((per_label * weights).sum() / weights.sum()).item(),
                                            rel=1e-5)


def test_cross_entropy_agrees_with_torch_and_masks_voxels():
    logits, target = _batch(1)
    weights = [1.0, 2.0, 1.3, 0.5]
    for kwargs in ({}, {"weight": torch.tensor(weights)}, {"label_smoothing": 0.1}):
        ours_kwargs = {"weights": weights} if "weight" in kwargs else \
            {"label_smoothing": kwargs.get("label_smoothing", 0.0)}
        expected = F.cross_entropy(logits, target, **kwargs)
        assert CrossEntropyLoss(**ours_kwargs)(logits, target).item() == \
            pytest.approx(expected.item(), rel=1e-5)
    # valid=False voxels are left out exactly: the loss over the kept voxels only.
    valid = torch.rand(target.shape, generator=torch.Generator().manual_seed(2)) > 0.3
    kept_logits = logits.movedim(1, -1)[valid]
    expected = F.cross_entropy(kept_logits, target[valid], weight=torch.tensor(weights))
    ours = CrossEntropyLoss(weights=weights)(logits, target, valid=valid)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


def test_invalid_voxels_do_not_change_the_dice():
    logits, target = _batch(3)
    valid = torch.ones(target.shape, dtype=torch.bool)
    valid[:, :3] = False
    base = DiceLoss()(logits, target, valid=valid)
    changed_logits, changed_target = logits.clone(), target.clone()
    changed_logits[:, :, :3] = 1e4  # garbage where the voxels are invalid
    changed_target[:, :3] = 0
    assert DiceLoss()(changed_logits, changed_target, valid=valid).item() == \
        pytest.approx(base.item(), rel=1e-6)


def test_empty_classes_and_empty_masks_stay_finite_and_meaningful():
    logits, target = _batch(4, classes=5)
    target[target == 4] = 0  # class 4 absent from the target
    logits[:, 4] = -30.0  # and from the prediction: a perfect score on it
    per_label = DiceLoss(weights=[0, 0, 0, 0, 1])(logits, target)
    assert torch.isfinite(per_label) and per_label.item() < 1e-3
    nothing = torch.zeros(target.shape, dtype=torch.bool)
    for loss in (DiceLoss(), CrossEntropyLoss(), CrossEntropyLoss(label_smoothing=0.1)):
        value = loss(logits.requires_grad_(), target, valid=nothing)
        assert torch.isfinite(value) and value.item() == pytest.approx(0.0, abs=1e-6)
        value.backward()
        assert torch.isfinite(logits.grad).all()
        logits.grad = None


def test_half_precision_logits_are_summed_in_float32():
    logits, target = _batch(5, shape=(1, 64, 64, 32))
    # float16 logits: the Dice's sums over 131,072 voxels pass float16's 65,504.
    half = DiceLoss()(logits.half(), target)
    assert half.dtype == torch.float32 and torch.isfinite(half)
    assert half.item() == pytest.approx(DiceLoss()(logits, target).item(), abs=1e-3)


def test_bad_shapes_and_labels_are_clear_errors():
    logits, target = _batch()
    with pytest.raises(ValueError, match="does not match logits"):
        DiceLoss()(logits, target[:, :5])
    with pytest.raises(ValueError, match="outside the logits' 4 classes"):
        CrossEntropyLoss()(logits, target + 4)
    with pytest.raises(ValueError, match="label weights must be 4"):
        DiceLoss(weights=[1, 1])(logits, target)
