"""Per-sample parameters: drawn from ``(seed, epoch, sample id)`` only.

A sample's draws never depend on the batch it is in, the worker that read it or the
device: every scalar comes from a numpy ``Generator`` seeded by
``SeedSequence([seed, epoch, *hash(sample id)])``, and every random field (noise, the
elastic control points) from a torch generator seeded by the sample's ``field_seed``
(stored with the parameters). Every scalar is drawn whether or not its transform
applies, in a fixed order, so switching one transform off changes no other draw.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mriprep.core.hashing import short_digest
from mriprep.training.augment.config import AugmentConfig


@dataclass
class SampleParams:
    """What was done to one sample; ``as_dict()`` for a log, ``from_dict`` to replay."""

    sample_id: str
    epoch: int
    field_seed: int
    ndim: int
    affine: bool
    rotation_deg: list[float]
    scale: list[float]
    shear: list[float]
    translation: list[float]
    elastic: bool
    elastic_magnitude: float
    flip: bool
    bias: bool
    bias_coefficients: list[float]
    gamma: float | None
    contrast: float | None
    brightness: float | None
    noise_std: float | None
    rician_std: float | None
    blur_sigma: float | None
    lowres_axis: int | None
    lowres_factor: float | None
    clamped: int = 0

    def as_dict(self) -> dict[str, Any]:
        # dataclasses.asdict deep-copies field by field: a twentieth of a 2.5D slice's
        # augmentation. The fields are scalars and lists of floats.
        return {name: list(value) if isinstance(value, list) else value
                for name in _FIELD_NAMES for value in (getattr(self, name),)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SampleParams":
        return cls(**values)

    @property
    def moves(self) -> bool:
        """Whether the sample's geometry differs from the identity."""
        return self.affine or self.elastic or self.flip

    @property
    def changes_intensity(self) -> bool:
        return self.bias or any(v is not None for v in (
            self.gamma, self.contrast, self.noise_std, self.rician_std, self.blur_sigma,
            self.lowres_factor))


_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(SampleParams))


def sample_id_of(parts) -> str:
    """A stable text id of a sample from its identity (subject, session, location...)."""
    return "/".join(str(p) for p in parts)


def sample_seed(seed: int, epoch: int, sample_id: str) -> np.random.SeedSequence:
    digest = short_digest(sample_id)
    words = np.frombuffer(digest, dtype=np.uint32).tolist()
    return np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch), *words])


@functools.lru_cache(maxsize=None)
def bias_terms(ndim: int, order: int) -> tuple[tuple[int, ...], ...]:
    """Exponents of the bias field's monomials (no constant term: that is brightness)."""
    terms = []
    for powers in np.ndindex(*(order + 1,) * ndim):
        if 0 < sum(powers) <= order:
            terms.append(tuple(int(p) for p in powers))
    return tuple(terms)


def draw(config: AugmentConfig, epoch: int, sample_id: str, ndim: int) -> SampleParams:
    """The parameters of one sample (``ndim`` spatial dimensions of its geometry)."""
    sequence = sample_seed(config.seed, epoch, sample_id)
    rng = np.random.default_rng(sequence)
    field_seed = int(sequence.generate_state(2, dtype=np.uint64)[1] >> np.uint64(1))
    c = config
    n_rot = 3 if ndim == 3 else 1
    n_shear = ndim * (ndim - 1)

    def happens(p: float) -> bool:
        return bool(rng.random() < p)

    def uniform(lo: float, hi: float, size=None):
        return rng.uniform(lo, hi, size)

    affine = happens(c.affine_prob)
    rotation = uniform(-c.rotation_deg, c.rotation_deg, n_rot)
    scale = uniform(*c.scale, ndim)
    if c.isotropic_scale:
        scale[:] = scale[0]
    shear = uniform(-c.shear, c.shear, n_shear)
    translation = uniform(-c.translation, c.translation, ndim)
    elastic = happens(c.elastic_prob)
    magnitude = float(uniform(*c.elastic_magnitude))
    flip = happens(c.flip_prob)
    bias = happens(c.bias_prob)
    coefficients = uniform(-c.bias_strength, c.bias_strength,
                           len(bias_terms(ndim, c.bias_order)))
    gamma_on = happens(c.gamma_prob)
    gamma = math.exp(uniform(math.log(c.gamma[0]), math.log(c.gamma[1])))
    contrast_on = happens(c.contrast_prob)
    contrast, brightness = float(uniform(*c.contrast)), float(uniform(*c.brightness))
    noise_on, noise = happens(c.noise_prob), float(uniform(*c.noise_std))
    rician_on, rician = happens(c.rician_prob), float(uniform(*c.rician_std))
    blur_on, blur = happens(c.blur_prob), float(uniform(*c.blur_sigma))
    lowres_on, factor = happens(c.lowres_prob), float(uniform(*c.lowres_factor))
    if c.lowres_axis is not None and c.lowres_axis >= ndim:
        raise ValueError(f"AugmentConfig: lowres_axis={c.lowres_axis} is not an axis of a "
                         f"{ndim}D item")
    axis = int(rng.integers(ndim)) if c.lowres_axis is None else int(c.lowres_axis)

    def kept(on: bool, value: float):
        return value if on else None

    return SampleParams(
        sample_id=sample_id, epoch=int(epoch), field_seed=field_seed, ndim=ndim,
        affine=affine, rotation_deg=rotation.tolist(), scale=scale.tolist(),
        shear=shear.tolist(), translation=translation.tolist(), elastic=elastic,
        elastic_magnitude=magnitude, flip=flip, bias=bias,
        bias_coefficients=coefficients.tolist(), gamma=kept(gamma_on, gamma),
        contrast=kept(contrast_on, contrast), brightness=kept(contrast_on, brightness),
        noise_std=kept(noise_on, noise), rician_std=kept(rician_on, rician),
        blur_sigma=kept(blur_on, blur), lowres_axis=kept(lowres_on, axis),
        lowres_factor=kept(lowres_on, factor),
    )
