"""One sampling grid per sample (affine, elastic and mirror composed) and one resampling
through it, valid-mask aware.

Coordinates are voxels of the item's grid, centred on the grid's centre: an output voxel
at ``u`` samples the input at ``centre + M (u + d(u)) + t``, with ``M`` the rotation,
shear, scale and mirror, ``t`` the translation and ``d`` the elastic displacement. The
rotation is about the centre of the item (a patch rotates about its own centre).
``grid_sample`` takes that point normalised to [-1, 1] with ``align_corners=True``
(voxel ``0`` at -1, voxel ``n - 1`` at +1) and its axes in reverse order (x indexes the
last tensor axis), both folded into the sample's matrix; the grid is then written by
broadcast sums of one line per axis, and the elastic field added.

Normalised interpolation: the image is sampled as ``image * valid`` together with
``valid`` and divided by the sampled ``valid``, so an invalid input voxel (or one outside
the grid, zero padding) lends nothing to any output voxel; an output voxel whose
interpolation weight on valid input is below ``valid_threshold`` is invalid.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from mriprep.training.augment.params import SampleParams

SUPPORT_EPS = 1e-6  # sampled valid weight below which a voxel has no support at all
LABEL_CHUNK = 8  # classes per grid_sample call in per-label linear mode (memory)


def rotation_matrix(angles_deg, ndim: int) -> np.ndarray:
    a = np.deg2rad(np.asarray(angles_deg, dtype=np.float64))
    if ndim == 2:
        c, s = math.cos(a[0]), math.sin(a[0])
        return np.array([[c, -s], [s, c]])
    out = np.eye(3)
    for axis, angle in enumerate(a):  # about axis 0, then 1, then 2
        c, s = math.cos(angle), math.sin(angle)
        i, j = [k for k in range(3) if k != axis]
        r = np.eye(3)
        r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
        out = r @ out
    return out


def sample_matrix(p: SampleParams, lr_axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(M, t)`` of one sample, in voxels (float64)."""
    n = p.ndim
    m, t = np.eye(n), np.zeros(n)
    if p.affine:
        shear = np.eye(n)
        off = [(i, j) for i in range(n) for j in range(n) if i != j]
        for (i, j), s in zip(off, p.shear):
            shear[i, j] = s
        m = rotation_matrix(p.rotation_deg, n) @ shear @ np.diag(p.scale)
        t = np.asarray(p.translation, dtype=np.float64)
    if p.flip and lr_axis is not None:
        mirror = np.eye(n)
        mirror[lr_axis, lr_axis] = -1.0
        m = m @ mirror
    return m, t


def spline_matrix(n: int, points: int) -> torch.Tensor:
    """``[n, points]`` weights of a cubic B-spline through ``points`` control points
    spread evenly over ``n`` voxels (ends included), each row normalised to sum to 1:
    smooth (C2) between and at the control points, and a partition of unity."""
    x = torch.linspace(0, points - 1, n, dtype=torch.float64)[:, None]
    t = (x - torch.arange(points, dtype=torch.float64)[None]).abs()
    w = torch.where(t < 1, (4 - 6 * t ** 2 + 3 * t ** 3) / 6,
                    torch.where(t < 2, (2 - t) ** 3 / 6, torch.zeros_like(t)))
    return w / w.sum(1, keepdim=True)


def elastic_field(p: SampleParams, shape: tuple[int, ...], points: int,
                  to_grid: np.ndarray, device) -> torch.Tensor:
    """The displacement of one sample in grid units, ``[*shape, ndim]`` float32.

    N(0, 1) displacements (voxels) at ``points`` control points per axis, drawn on the
    CPU from the sample's field seed (so every device deforms alike), scaled so that
    the field's RMS over the grid (per component) is the sample's magnitude, mapped by
    ``to_grid`` (the sample's matrix into
    grid units: linear, so it commutes with interpolation), and spread over the grid by
    a cubic B-spline, one axis at a time (three small matrix products instead of a
    full-resolution smoothing).
    """
    n = len(shape)
    g = torch.Generator().manual_seed(p.field_seed + 1)
    coarse = torch.randn((*(points,) * n, n), generator=g, dtype=torch.float64)
    # the field's mean square over the grid, from the control points: sum over
    # components of c^T (G (x) G (x) G) c / N, with G = U^T U per axis (U: the spline)
    smoothed = coarse
    for axis in range(n):
        u = spline_matrix(shape[axis], points)
        smoothed = torch.movedim(torch.tensordot(u.T @ u, smoothed, dims=([1], [axis])),
                                 0, axis)
    mean_square = (smoothed * coarse).sum() / math.prod(shape) / n
    scale = p.elastic_magnitude / mean_square.sqrt().clamp_min(1e-12)
    coarse = (coarse * scale) @ torch.as_tensor(to_grid).T
    field = coarse.to(device=device, dtype=torch.float32)
    letters = "abc"[:n]
    for axis in range(n):  # replace control axis `axis` by the grid's
        u = _spline(shape[axis], points, device)
        src = "".join("ijk"[a] if a < axis else ("x" if a == axis else letters[a])
                      for a in range(n))
        dst = src.replace("x", "ijk"[axis])
        field = torch.einsum(f"{'ijk'[axis]}x,{src}r->{dst}r", u, field)
    return field


_SPLINES: dict = {}


def _spline(n: int, points: int, device) -> torch.Tensor:
    key = (n, points, str(device))
    if key not in _SPLINES:
        _SPLINES[key] = spline_matrix(n, points).to(device=device, dtype=torch.float32)
    return _SPLINES[key]


def sampling_grid(params: list[SampleParams], shape: tuple[int, ...], lr_axis: int | None,
                  elastic_points: int, device) -> torch.Tensor:
    """The ``grid_sample`` grid ``[B, *shape, ndim]`` of the samples (float32).

    The affine part, in grid units, is ``P D M D^-1 P`` on the normalised axis-reversed
    coordinates plus ``P D t`` (``D`` normalises voxels, ``P`` reverses the axes). An
    affine map is separable, a sum of one line per axis: the lines of all but the last
    axis are summed on the small grid, and one broadcast add writes the grid (no
    ``[N, n+1]`` matmul, which made ``affine_grid`` slower on the CPU). The elastic field,
    mapped by ``P D M``, is added to it.
    """
    n = len(shape)
    half = np.array([(s - 1) / 2 if s > 1 else 1.0 for s in shape])
    norm = np.diag(1.0 / half)[::-1]  # P D
    grid = torch.empty((len(params), *shape, n), dtype=torch.float32, device=device)
    # normalised coordinates along each tensor axis
    coords = [torch.linspace(-1.0, 1.0, s, dtype=torch.float64) if s > 1
              else torch.zeros(1, dtype=torch.float64) for s in shape]
    for i, p in enumerate(params):
        m, t = sample_matrix(p, lr_axis)
        to_grid = norm @ m
        # column a of to_grid @ diag(half) acts on tensor axis a's normalised coordinate
        lin = torch.as_tensor(to_grid * half[None, :])
        shift = torch.as_tensor(norm @ t)
        lines = [coords[a][:, None] * lin[:, a][None, :] for a in range(n)]  # [s_a, n]
        head = shift.reshape([1] * (n - 1) + [n])
        for a in range(n - 1):
            head = head + lines[a].reshape([-1 if k == a else 1 for k in range(n - 1)] + [n])
        head = head.to(device=device, dtype=torch.float32)[..., None, :]
        last = lines[-1].to(device=device, dtype=torch.float32)
        if p.elastic:
            field = elastic_field(p, shape, elastic_points, to_grid, device)
            torch.add(field, head, out=grid[i])
            grid[i] += last
        else:
            torch.add(head, last, out=grid[i])
    return grid


def inside(grid: torch.Tensor) -> torch.Tensor:
    """Where a grid point draws only on voxels of the input grid, ``[B, *S]``."""
    return (grid.abs() <= 1.0).all(-1)


def resample(grid: torch.Tensor, image: torch.Tensor, valid: torch.Tensor | None,
             weights: list[torch.Tensor], label: torch.Tensor | None, label_mode: str,
             threshold: float):
    """Everything of the moving samples through one grid.

    ``image`` ``[B, C, *S]`` float32 (finite), ``valid`` ``[B, *S]`` bool, or None when
    every input voxel is valid, ``weights`` ``[B, *S]`` float each, ``label``
    ``[B, *S]`` integer. Returns ``(image, valid, weights, label)``, shapes and dtypes
    kept. When every input voxel is valid, normalising changes nothing inside the grid
    and validity is where the grid point lies inside (``align_corners=True``: no weight
    falls outside then), so the valid channel is not interpolated. The image of an
    invalid output voxel is a fill (normalised from valid neighbours, else zero
    padding's blend): losses must mask it.
    """
    c = image.shape[1]
    if valid is None:
        stack = [image] + [w.to(image.dtype)[:, None] for w in weights]
        sampled = F.grid_sample(torch.cat(stack, 1) if len(stack) > 1 else image, grid,
                                mode="bilinear", padding_mode="zeros", align_corners=True)
        out_image = sampled[:, :c]
        out_valid = inside(grid)
        out_weights = [sampled[:, c + k].to(w.dtype) for k, w in enumerate(weights)]
    else:
        # One input of image, valid and weights, invalid voxels zeroed, written in place
        # (each pass over a batch counts on the CPU). The image is finite here, so a
        # product with the 0/1 mask zeroes it in one pass; a weight map may hold NaN
        # where it is invalid, which only a selection removes.
        stacked = torch.empty((image.shape[0], c + 1 + len(weights), *image.shape[2:]),
                              dtype=image.dtype, device=image.device)
        mask = stacked[:, c:c + 1]
        mask.copy_(valid[:, None])
        torch.mul(image, mask, out=stacked[:, :c])
        for k, w in enumerate(weights):
            stacked[:, c + 1 + k].copy_(w).masked_fill_(~valid, 0.0)
        sampled = F.grid_sample(stacked, grid, mode="bilinear", padding_mode="zeros",
                                align_corners=True)
        support = sampled[:, c:c + 1]
        out_valid = (support >= threshold)[:, 0]
        no_support = support <= SUPPORT_EPS
        # A division, not a product with 1 / support: one rounding fewer (with the
        # product, the support itself, s * (1 / s), comes out as 0.99999994).
        divisor = support.masked_fill(no_support, 1.0)

        def normalised(first: int, stop: int) -> torch.Tensor:
            """value / support where some valid voxel contributed, else 0 (contiguous)."""
            out = torch.div(sampled[:, first:stop], divisor)
            return out.masked_fill_(no_support, 0.0)

        out_image = normalised(0, c)
        out_weights = [normalised(c + 1 + k, c + 2 + k)[:, 0].to(w.dtype)
                       for k, w in enumerate(weights)]
    out_label = None
    if label is not None:
        if label_mode == "nearest":
            # float32 holds every integer label below 2**24 exactly, and nearest
            # interpolation returns input values unchanged; outside the grid the edge's
            # label (those voxels are invalid; zero padding would add a value, 0)
            out_label = F.grid_sample(label[:, None].to(torch.float32), grid, mode="nearest",
                                      padding_mode="border", align_corners=True)[:, 0]
            out_label = out_label.to(label.dtype)
        else:
            out_label = _per_label_linear(grid, label)
    return out_image, out_valid, out_weights, out_label


def _per_label_linear(grid: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Each label's indicator sampled linearly, the largest wins (ties: the lower value).

    Outside the grid every indicator is 0 and the lowest label value wins (those voxels
    are invalid anyway). Chunks of :data:`LABEL_CHUNK` classes bound the memory.
    """
    values = torch.unique(label)
    best = torch.full(grid.shape[:-1], -1.0, device=label.device)
    index = torch.zeros(grid.shape[:-1], dtype=torch.long, device=label.device)
    for start in range(0, len(values), LABEL_CHUNK):
        chunk = values[start:start + LABEL_CHUNK]
        onehot = (label[:, None] == chunk.view(1, -1, *([1] * (label.dim() - 1)))).float()
        scores = F.grid_sample(onehot, grid, mode="bilinear", padding_mode="zeros",
                               align_corners=True)
        top, arg = scores.max(1)
        better = top > best
        best = torch.where(better, top, best)
        index = torch.where(better, arg + start, index)
    return values[index].to(label.dtype)
