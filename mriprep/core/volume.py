"""The data model every stage works on: a Volume and its provenance.

A Volume is immutable: a stage returns a new one (``dataclasses.replace`` under the hood
via :meth:`Volume.replace`), so the affine can never be dropped by accident and a test
can compare the input and the output of a stage side by side.

Conventions
-----------
* ``data`` is float32, 3D, indexed ``[i, j, k]`` as nibabel does.
* ``affine`` is float64 4x4 mapping voxel indices to RAS+ world millimetres (nibabel's
  convention). Conversion to ITK's LPS happens only inside the stages that call ITK/ANTs.
* ``valid`` is a boolean mask of the same shape: False where a voxel was not really
  measured (non-finite or extreme value that was filled, masked slice, outside the field of
  view after resampling).
* ``label`` is an optional integer label map on the same grid.
* ``pending`` holds a transform estimated by registration and not yet applied: the
  resample stage applies it together with the change of grid in one interpolation, and
  moves it to ``applied``, where the output checks find the grid it promised and the
  cache finds the transform to store.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from nibabel.affines import voxel_sizes


@dataclass(frozen=True)
class StageRecord:
    """What one stage did to one subject: resolved parameters, metrics, warnings, time."""

    stage: str
    params: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "params": _jsonable(self.params),
            "metrics": _jsonable(self.metrics),
            "warnings": list(self.warnings),
            "seconds": round(float(self.seconds), 4),
        }


@dataclass(frozen=True)
class PendingTransform:
    """A rigid transform found by registration, to be applied by the resample stage.

    ``template_to_subject`` maps a point in the template's RAS+ world (mm) to the subject's
    RAS+ world: the "pull-back" direction an interpolator needs (for each output voxel,
    where to read in the input). ``target_shape``/``target_affine`` define the output grid
    (the template's grid).
    """

    template_to_subject: np.ndarray
    target_shape: tuple[int, int, int]
    target_affine: np.ndarray
    # How messages name the target grid, e.g. "registration template 'mni152'".
    target_name: str = ""

    def __post_init__(self):
        m = np.asarray(self.template_to_subject, dtype=np.float64)
        a = np.asarray(self.target_affine, dtype=np.float64)
        if m.shape != (4, 4) or a.shape != (4, 4):
            raise ValueError("PendingTransform needs 4x4 matrices")
        object.__setattr__(self, "template_to_subject", m)
        object.__setattr__(self, "target_affine", a)
        object.__setattr__(self, "target_shape", tuple(int(s) for s in self.target_shape))


@dataclass(frozen=True, eq=False)
class Volume:
    """A 3D scan with its geometry, validity mask, optional labels and provenance."""

    data: np.ndarray
    affine: np.ndarray
    valid: np.ndarray
    label: np.ndarray | None = None
    subject_id: str = ""
    source: str = ""
    provenance: tuple[StageRecord, ...] = ()
    pending: PendingTransform | None = None
    applied: PendingTransform | None = None

    def __post_init__(self):
        data = np.asarray(self.data)
        if data.ndim != 3:
            raise ValueError(f"Volume data must be 3D, got shape {data.shape}")
        if data.dtype != np.float32:
            data = data.astype(np.float32)
        affine = np.asarray(self.affine, dtype=np.float64)
        if affine.shape != (4, 4):
            raise ValueError(f"Volume affine must be 4x4, got shape {affine.shape}")
        valid = np.asarray(self.valid, dtype=bool)
        if valid.shape != data.shape:
            raise ValueError(
                f"valid mask shape {valid.shape} differs from data shape {data.shape}"
            )
        if self.label is not None:
            label = np.asarray(self.label)
            if label.shape != data.shape:
                raise ValueError(
                    f"label shape {label.shape} differs from data shape {data.shape}"
                )
            if not np.issubdtype(label.dtype, np.integer):
                raise ValueError(f"label map must be integer, got {label.dtype}")
            object.__setattr__(self, "label", label)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "affine", affine)
        object.__setattr__(self, "valid", valid)

    @classmethod
    def from_array(cls, data, affine, label=None, subject_id="", source="") -> "Volume":
        """A Volume whose every voxel is valid."""
        data = np.asarray(data)
        return cls(
            data=data,
            affine=affine,
            valid=np.ones(data.shape, dtype=bool),
            label=label,
            subject_id=subject_id,
            source=source,
        )

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.data.shape)

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Voxel size in mm: the column norms of the affine's 3x3 part."""
        return tuple(float(s) for s in voxel_sizes(self.affine))

    @property
    def name(self) -> str:
        """How errors refer to this volume: the subject id, else the source file."""
        return self.subject_id or self.source or "<volume>"

    def replace(self, **changes) -> "Volume":
        """A copy with some fields changed (the arrays are not copied)."""
        return dataclasses.replace(self, **changes)

    def with_record(self, record: StageRecord) -> "Volume":
        return self.replace(provenance=self.provenance + (record,))

    def record_of(self, stage: str) -> StageRecord | None:
        """The last record a stage left, or None."""
        for record in reversed(self.provenance):
            if record.stage == stage:
                return record
        return None


def _jsonable(value: Any) -> Any:
    """Turn numpy scalars/arrays and tuples into plain JSON types, recursively."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        value = float(value)
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)  # JSON has no NaN/Inf; keep it readable
    return value


def jsonable(value: Any) -> Any:
    """Public alias used by the cache and reports."""
    return _jsonable(value)
