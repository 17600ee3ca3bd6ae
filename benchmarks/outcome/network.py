"""The one network every arm trains: a FastSurfer-style 2.5D CNN small enough for a CPU.

Input: a sagittal slice with 3 neighbours on each side as 7 channels, 256 x 256 (each
arm's own conformed or padded grid). The network averages the slice down to 2 mm before
its first convolution and returns its logits at 2 mm: training compares them with each
2 x 2 cell's most frequent class (:func:`at_network_grid`), and :func:`full_size` brings
them back to the slice's 1 mm grid for the Dice. A step then costs about a quarter of a
full-resolution one. Three levels of a U-Net, batch norm after every convolution (the
statistic the NaN ablation measures).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

CONTEXT = 3  # neighbours on each side: 7 input channels, as FastSurfer
WIDTH = 16
STRIDE = 2  # the network computes at 2 mm in-plane


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True))


class SliceNet(nn.Module):
    """``forward(x [B, 7, H, W]) -> logits [B, classes, H, W]``; ``guard``, when given,
    is the first layer (mriprep's :class:`~mriprep.training.NaNGuard` in arm C)."""

    def __init__(self, classes: int, width: int = WIDTH, guard: nn.Module | None = None,
                 stride: int = STRIDE):
        super().__init__()
        self.stride = stride  # 1: full resolution (benchmarks/gpu_check.py on CUDA)
        self.guard = guard if guard is not None else nn.Identity()
        self.enc1 = _block(2 * CONTEXT + 1, width)
        self.enc2 = _block(width, 2 * width)
        self.bottom = _block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = _block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = _block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)
        # Channels-last: the layout oneDNN's CPU convolutions (and CUDA's tensor cores)
        # are fastest in; the same operations in another memory order, whose kernels may
        # round differently (docs/benchmarks.md, row 53).
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.guard(x).contiguous(memory_format=torch.channels_last)
        if self.stride > 1:
            x = F.avg_pool2d(x, self.stride)
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        b = self.bottom(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([_fit(self.up2(b), e2), e2], 1))
        d1 = self.dec1(torch.cat([_fit(self.up1(d2), e1), e1], 1))
        return self.head(d1)


def at_network_grid(target: torch.Tensor, stride: int, kind: str) -> torch.Tensor:
    """A per-voxel target ``[B, H, W]`` on the logits' grid, each ``stride`` x ``stride``
    cell summed up where the averaged input sees it (its centre, as the bilinear
    :func:`full_size` puts it back): ``"classes"`` the cell's most frequent class,
    ``"valid"`` valid only where all of the cell is, ``"weight"`` the cell's mean."""
    if stride == 1:
        return target
    if kind == "classes":
        return _most_frequent(target.long(), stride)
    if kind == "valid":
        return ~F.max_pool2d((~target.bool()).float()[:, None], stride)[:, 0].bool()
    if kind == "weight":
        return F.avg_pool2d(target.float()[:, None], stride)[:, 0]
    raise ValueError(f"kind={kind!r}: classes, valid or weight")


def _most_frequent(target: torch.Tensor, stride: int) -> torch.Tensor:
    """Each ``stride`` x ``stride`` cell's most frequent class, ties to the lowest, the
    trailing rows and columns that fill no cell dropped: the argmax of the average-pooled
    one-hot classes, found from the cell's members compared pairwise, because a one-hot
    volume of every class was a large part of a step on a CPU (docs/benchmarks.md,
    row 53)."""
    b, h, w = target.shape
    h, w = h // stride * stride, w // stride * stride
    members = (target[:, :h, :w].reshape(b, h // stride, stride, w // stride, stride)
               .permute(0, 1, 3, 2, 4).reshape(b, h // stride, w // stride, -1))
    counts = (members[..., :, None] == members[..., None, :]).sum(-1)
    tied = counts == counts.max(-1, keepdim=True).values
    return torch.where(tied, members, torch.iinfo(members.dtype).max).min(-1).values


def full_size(logits: torch.Tensor, size) -> torch.Tensor:
    if logits.shape[-2:] == tuple(size):
        return logits
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=False)


def _fit(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if x.shape[-2:] == like.shape[-2:]:
        return x
    return F.interpolate(x, size=like.shape[-2:], mode="nearest")
