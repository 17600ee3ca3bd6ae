"""The parameters of :class:`~mriprep.training.augment.Augment`: one frozen dataclass,
loadable from YAML and written back with a training run.

Every range is sampled uniformly per sample unless its field says otherwise; every
``*_prob`` is the chance that the transform applies to a sample. Lengths are in voxels
of the item's grid (the cache's grids are isotropic; see the module's limits).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLOAT16_MAX = 65504.0

LABEL_MODES = ("nearest", "linear")


@dataclass(frozen=True)
class AugmentConfig:
    """What :class:`~mriprep.training.augment.Augment` draws, per sample.

    Geometry (one sampling grid, one interpolation):

    * ``affine_prob``; ``rotation_deg`` (uniform in ``±`` per rotation axis: 3 in 3D, 1 in
      2D); ``scale`` (uniform per axis in ``[lo, hi]``; one factor for all axes with
      ``isotropic_scale``); ``shear`` (uniform ``±`` per off-diagonal term);
      ``translation`` (uniform ``±`` voxels per axis).
    * ``elastic_prob``; ``elastic_points`` control points per axis of the coarse random
      displacement, smoothed; ``elastic_magnitude`` (RMS displacement in voxels, uniform
      in ``[lo, hi]``).
    * ``flip_prob``: left-right mirror; ``lr_axis`` the item axis that runs left-right,
      or ``"auto"`` (from the batch's ``affine``, else axis 0, RAS's left-right axis);
      ``lateralised_labels``: see :class:`~mriprep.training.augment.Augment`.
    * ``label_mode``: ``"nearest"`` or ``"linear"`` (per-label linear, then argmax);
      ``valid_threshold``: an output voxel is valid when at least this fraction of its
      interpolation weight falls on valid input; ``weight_keys``: batch keys of float
      weight maps resampled with the image.

    Intensity (after the geometry, on valid-voxel statistics): bias field (``bias_prob``,
    polynomial of order ``bias_order`` in the log domain, coefficients uniform
    ``±bias_strength``), ``gamma`` (log-uniform in ``[lo, hi]``, on the valid range
    mapped to [0, 1]), ``contrast`` (uniform factor about the valid mean) and
    ``brightness`` (uniform shift in units of the valid std), Gaussian ``noise_std`` and
    Rician ``rician_std`` (uniform, units of the valid std), ``blur_sigma`` (uniform,
    voxels, isotropic), simulated low resolution (``lowres_factor`` uniform, along one
    axis: ``lowres_axis`` or a random one when ``None``). ``clamp`` is the largest
    magnitude an output may have (float16's largest finite value by default).
    """

    seed: int = 0
    # geometry
    affine_prob: float = 1.0
    rotation_deg: float = 15.0
    scale: tuple[float, float] = (0.9, 1.1)
    isotropic_scale: bool = False
    shear: float = 0.05
    translation: float = 4.0
    elastic_prob: float = 0.3
    elastic_points: int = 5
    elastic_magnitude: tuple[float, float] = (0.0, 3.0)
    flip_prob: float = 0.0
    lr_axis: Any = "auto"
    lateralised_labels: bool = True
    label_mode: str = "nearest"
    valid_threshold: float = 0.999
    weight_keys: tuple[str, ...] = ("weight",)
    # intensity
    bias_prob: float = 0.3
    bias_order: int = 3
    bias_strength: float = 0.3
    gamma_prob: float = 0.3
    gamma: tuple[float, float] = (0.7, 1.5)
    contrast_prob: float = 0.3
    contrast: tuple[float, float] = (0.75, 1.25)
    brightness: tuple[float, float] = (-0.1, 0.1)
    noise_prob: float = 0.2
    noise_std: tuple[float, float] = (0.0, 0.1)
    rician_prob: float = 0.0
    rician_std: tuple[float, float] = (0.0, 0.1)
    blur_prob: float = 0.1
    blur_sigma: tuple[float, float] = (0.5, 1.0)
    lowres_prob: float = 0.1
    lowres_factor: tuple[float, float] = (1.5, 4.0)
    lowres_axis: int | None = None
    clamp: float = FLOAT16_MAX
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        problems, malformed = [], False
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_prob") and not (isinstance(value, (int, float))
                                                 and 0.0 <= value <= 1.0):
                problems.append(f"{f.name}={value!r} (a probability in [0, 1])")
            if f.type.startswith("tuple[float"):
                try:
                    value = tuple(float(v) for v in value)
                except (TypeError, ValueError):
                    problems.append(f"{f.name}={value!r} (a range [lo, hi] of two numbers)")
                    malformed = True
                    continue
                object.__setattr__(self, f.name, value)
                if len(value) != 2 or value[0] > value[1]:
                    problems.append(f"{f.name}={value!r} (a range [lo, hi] with lo <= hi)")
                    malformed = malformed or len(value) != 2
        object.__setattr__(self, "weight_keys", tuple(self.weight_keys))
        if malformed:  # the checks below index the ranges
            raise ValueError("AugmentConfig: " + "; ".join(problems))
        if self.scale[0] <= 0 or self.gamma[0] <= 0 or self.lowres_factor[0] < 1:
            problems.append("scale and gamma must be > 0 and lowres_factor >= 1")
        if self.lowres_axis is not None and self.lowres_axis not in (0, 1, 2):
            problems.append(f"lowres_axis={self.lowres_axis!r} (None, or an item axis 0..2)")
        if self.label_mode not in LABEL_MODES:
            problems.append(f"label_mode={self.label_mode!r} (one of {LABEL_MODES})")
        if not 0.0 < self.valid_threshold <= 1.0:
            problems.append(f"valid_threshold={self.valid_threshold!r} (in (0, 1])")
        if self.lr_axis != "auto" and not isinstance(self.lr_axis, int):
            problems.append(f"lr_axis={self.lr_axis!r} ('auto' or an item axis)")
        if self.elastic_points < 2 or self.bias_order < 1 or self.clamp <= 0:
            problems.append("elastic_points >= 2, bias_order >= 1 and clamp > 0 are needed")
        if self.extra:
            problems.append(f"unknown option(s) {sorted(self.extra)}")
        if problems:
            raise ValueError("AugmentConfig: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, options: dict) -> "AugmentConfig":
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        given = dict(options or {})
        extra = {k: given.pop(k) for k in list(given) if k not in known}
        return cls(**given, extra=extra)

    @classmethod
    def from_yaml(cls, path_or_text: str | Path) -> "AugmentConfig":
        """From a YAML file, or YAML text; an ``augment:`` top-level key is looked into."""
        import yaml

        text = str(path_or_text)
        if "\n" not in text and text.endswith((".yaml", ".yml")):
            if not Path(text).is_file():
                raise ValueError(f"AugmentConfig: {text} does not exist or is not a file")
            text = Path(text).read_text()
        elif "\n" not in text and Path(text).is_file():
            text = Path(text).read_text()
        data = yaml.safe_load(text) or {}
        if isinstance(data, dict) and set(data) == {"augment"}:
            data = data["augment"]
        if not isinstance(data, dict):
            raise ValueError(f"AugmentConfig: {str(path_or_text)[:80]!r} holds no mapping of "
                             "AugmentConfig fields (field: value lines, or under augment:)")
        return cls.from_dict(data)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("extra")
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump({"augment": self.to_dict()}, sort_keys=False)
