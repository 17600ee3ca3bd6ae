"""Intensity transforms, per sample, on valid-voxel statistics.

Every transform reads the statistics it needs (mean, std, min, max) from the sample's
valid voxels only, so filled or out-of-field voxels never set a contrast. The
multiplicative ones (bias field, gamma, Rician noise) act on intensities above the valid
minimum, so a z-scored image (negative background) keeps its background. Order: bias,
gamma, contrast/brightness, low resolution, blur, Gaussian noise, Rician noise, clamp.
Every step maps finite values to finite values (ranges floored, no division by a
value that can be 0); the clamp (in :class:`Augment`) bounds the result and counts.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from mriprep.training.augment.params import SampleParams, bias_terms

EPS = 1e-6


SUBSAMPLE = 65536
#: the smallest gamma computed as exp(gamma * log t) (see apply_intensity)
FAST_GAMMA_MIN = 0.5


class ValidStats:
    """Statistics of one sample's valid voxels (all channels), read as the sample changes.

    Mean and std come from a strided subsample of at most :data:`SUBSAMPLE` voxels
    (their error is far below any augmentation range: gathering every valid voxel cost
    more than the transforms); the range is exact where it bounds values (gamma), from
    the subsample where it is only a reference point (bias field, Rician noise). A
    sample without a valid voxel gets mean 0, std 1 and range [0, 1].

    Which subsampled voxels are valid is found once per sample, on the first statistic
    asked for (blur or low resolution alone ask for none): the transforms change values,
    never the mask.
    """

    def __init__(self, x: torch.Tensor, valid: torch.Tensor, all_valid: bool):
        """``x`` ``[1, C, *S]`` (contiguous), ``valid`` ``[1, *S]``."""
        self.all_valid, self.valid = all_valid, valid
        self.numel, self.device = x.numel(), x.device
        self.step = max(1, self.numel // SUBSAMPLE) | 1  # odd: no aliasing with even grids

    @functools.cached_property
    def _layout(self) -> tuple[torch.Tensor | None, bool, int]:
        """(positions in the strided subsample that are valid, or None when all are;
        whether the stride missed every valid voxel, so that all of them are used; the
        flat index of one valid voxel, which invalid ones take for an exact range)."""
        if self.all_valid:
            return None, False, 0
        positions = _strided_positions(self.numel, self.step, self.valid.numel(), self.device)
        picked = torch.nonzero(self.valid.reshape(-1)[positions]).squeeze(1)
        if picked.numel():
            return picked, False, int(picked[0]) * self.step
        anywhere = torch.nonzero(self.valid.reshape(-1))
        return picked, bool(anywhere.numel()), int(anywhere[0]) if anywhere.numel() else 0

    @property
    def empty(self) -> bool:
        picked, everywhere, _ = self._layout
        return picked is not None and picked.numel() == 0 and not everywhere

    def sample(self, x: torch.Tensor) -> torch.Tensor:
        picked, everywhere, _ = self._layout
        if everywhere:
            return x[self.valid[:, None].expand_as(x)]
        flat = x.reshape(-1)[::self.step]
        return flat if picked is None else flat[picked]

    def range(self, x: torch.Tensor, exact: bool = False) -> tuple[float, float]:
        if self.empty:
            return 0.0, 1.0
        if not exact:
            lo, hi = torch.aminmax(self.sample(x))
        elif self.all_valid:
            lo, hi = torch.aminmax(x)
        else:
            # invalid voxels take a valid value: the range of the valid ones is unchanged
            fill = x.reshape(-1)[self._layout[2]]
            lo, hi = torch.aminmax(torch.where(self.valid[:, None], x, fill))
        return float(lo), float(hi)

    def moments(self, x: torch.Tensor) -> tuple[float, float]:
        sample = self.sample(x)
        if sample.numel() == 0:
            return 0.0, 1.0
        # two passes (the mean, then the squared deviations): on the CPU, torch.std_mean
        # took ten times as long
        mean = sample.mean()
        std = (sample - mean).square_().mean().sqrt_()
        return float(mean), max(float(std), EPS)


@functools.lru_cache(maxsize=8)
def _strided_positions(numel: int, step: int, spatial: int, device) -> torch.Tensor:
    """The voxel (within one channel) of every ``step``-th value of a sample: the same
    for every sample of a training run's shape."""
    return torch.arange(0, numel, step, device=device) % spatial


def _smooth_along(x: torch.Tensor, axis: int, sigma: float) -> torch.Tensor:
    """Gaussian smoothing of ``[1, C, *S]`` along spatial ``axis``, edges replicated
    (the kernel is cut to 3 sigma, and to the axis' length)."""
    length = x.shape[2 + axis]
    radius = min(max(1, int(math.ceil(3 * sigma))), length - 1)
    if radius < 1:
        return x
    taps = torch.arange(-radius, radius + 1, dtype=torch.float32, device=x.device)
    kernel = torch.exp(-0.5 * (taps / sigma) ** 2)
    kernel = kernel / kernel.sum()
    n, c = x.dim() - 2, x.shape[1]
    shape = [1] * n
    shape[axis] = kernel.numel()
    pad = [0, 0] * n
    pad[2 * (n - 1 - axis)] = pad[2 * (n - 1 - axis) + 1] = radius
    conv = F.conv3d if n == 3 else F.conv2d
    weight = kernel.reshape(1, 1, *shape).repeat(c, 1, *([1] * n))
    return conv(F.pad(x, pad, mode="replicate"), weight, groups=c)


_BASIS: dict = {}


def bias_field(p: SampleParams, shape: tuple[int, ...], order: int, device) -> torch.Tensor:
    """``exp(sum_k c_k * monomial_k)`` over [-1, 1]^n, evaluated on a grid of a quarter
    the size and interpolated (a polynomial of order 3 is smooth at that scale)."""
    coarse = tuple(max(2, s // 4) for s in shape)
    key = (coarse, order, str(device))
    if key not in _BASIS:  # the monomials of one grid, kept: one shape per training run
        axes = [torch.linspace(-1, 1, s, device=device) for s in coarse]
        coords = torch.meshgrid(*axes, indexing="ij")
        terms = []
        for powers in bias_terms(len(shape), order):
            term = torch.ones(coarse, device=device)
            for axis, power in enumerate(powers):
                if power:
                    term = term * coords[axis] ** power
            terms.append(term.reshape(-1))
        _BASIS.clear()
        _BASIS[key] = torch.stack(terms, 1)
    coefficients = torch.tensor(p.bias_coefficients, dtype=torch.float32, device=device)
    log_field = (_BASIS[key] @ coefficients).reshape(coarse)
    mode = "trilinear" if len(shape) == 3 else "bilinear"
    field = F.interpolate(log_field[None, None], size=shape, mode=mode, align_corners=True)
    return field[0].exp()


def _randn(shape, seed: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device)


def apply_intensity(x: torch.Tensor, valid: torch.Tensor, params: list[SampleParams],
                    bias_order: int, all_valid: list[bool]) -> torch.Tensor:
    """The intensity transforms of every sample; ``x`` ``[B, C, *S]`` float32,
    ``all_valid[i]`` whether every voxel of sample ``i`` is valid. Statistics are read
    back to the host (a synchronisation per transform that needs them: per-sample
    scalars are what these transforms are defined by).

    ``x`` is never changed: ``x`` itself comes back when no sample changes intensity,
    else a copy in which each sample is transformed in place, each step in as few passes
    over the sample as it can (on the CPU, passes are the cost)."""
    if not any(p.changes_intensity for p in params):
        return x
    shape = tuple(x.shape[2:])
    out = x.clone(memory_format=torch.contiguous_format)
    for i, p in enumerate(params):
        if not p.changes_intensity:
            continue
        xi = out[i:i + 1]
        stats = ValidStats(xi, valid[i:i + 1], all_valid[i])
        if p.bias:
            lo, _ = stats.range(xi)
            # (x - lo) * field + lo as x * field + lo * (1 - field): one pass over the
            # channels, the rest on the one-channel field
            field = bias_field(p, shape, bias_order, x.device)
            torch.addcmul(field.mul(-lo).add_(lo), xi, field, out=xi)
        if p.gamma is not None:
            lo, hi = stats.range(xi, exact=True)
            span = max(hi - lo, EPS)
            xi.sub_(lo).div_(span)
            if p.gamma >= FAST_GAMMA_MIN:
                # t ** gamma as exp(gamma * log t): torch's CPU pow with a float exponent
                # took 3 times these passes (relative error 2e-6 at most for gamma in
                # 0.5-4, against pow's 4e-7). t is floored at exp(-80 / max(gamma, 1))
                # so that no log(0), exp(-inf) or subnormal takes their slow paths:
                # t = 0 gives exp(-40), 4e-18, or less instead of 0.
                floor = math.exp(-80.0 / max(p.gamma, 1.0))
                xi.clamp_(floor, 1.0).log_().mul_(p.gamma).exp_()
            else:  # near 0, t ** gamma rises too steeply for a floor
                xi.clamp_(0.0, 1.0).pow_(p.gamma)
            xi.mul_(span).add_(lo)
        if p.contrast is not None:
            mean, std = stats.moments(xi)
            xi.sub_(mean).mul_(p.contrast).add_(mean + p.brightness * std)
        if p.lowres_factor is not None:
            xi.copy_(_low_resolution(xi, p.lowres_axis, p.lowres_factor))
        if p.blur_sigma is not None:
            for axis in range(len(shape)):
                xi.copy_(_smooth_along(xi, axis, p.blur_sigma))
        if p.noise_std is not None or p.rician_std is not None:
            _, std = stats.moments(xi)
            lo = stats.range(xi)[0] if p.rician_std is not None else 0.0
        if p.noise_std is not None:
            xi.add_(_randn(xi.shape, p.field_seed + 2, x.device), alpha=p.noise_std * std)
        if p.rician_std is not None:
            sigma = p.rician_std * std
            real = xi.sub(lo).add_(_randn(xi.shape, p.field_seed + 3, x.device).mul_(sigma))
            real.square_()
            imag = _randn(xi.shape, p.field_seed + 4, x.device).mul_(sigma).square_()
            xi.copy_(real.add_(imag).sqrt_().add_(lo))
    return out


def _low_resolution(x: torch.Tensor, axis: int, factor: float) -> torch.Tensor:
    """Thick slices along ``axis``: each averages ``factor`` voxels (Gaussian of that
    FWHM), sampled every ``factor`` voxels, then interpolated back linearly."""
    n = x.shape[2 + axis]
    low = max(2, int(round(n / factor)))
    if low >= n:
        return x
    x = _smooth_along(x, axis, factor / (2 * math.sqrt(2 * math.log(2))))
    size = list(x.shape[2:])
    size[axis] = low
    mode = "trilinear" if x.dim() == 5 else "bilinear"
    small = F.interpolate(x, size=size, mode=mode, align_corners=True)
    return F.interpolate(small, size=tuple(x.shape[2:]), mode=mode, align_corners=True)
