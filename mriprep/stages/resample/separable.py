"""The separable path: axis-aligned maps as three 1D passes.

Axis-aligned maps
    Without a rotation (a change of spacing or of field of view, FastSurfer's 256^3
    conform grid, a registration that found none) each output axis reads along one input
    axis only. Trilinear interpolation is then the product of three 1D linear
    interpolations, and it is computed as three 1D passes over the part of the output
    grid inside the field of view (a box), never materialising per-voxel coordinates:
    the same values up to float32 rounding, at a fraction of the cost. Validity becomes
    three 1D dilations of the invalid mask, each keeping the input voxels whose 1D weight
    exceeds ``TOUCH_WEIGHT / 8``. That is conservative with respect to the stage's
    validity rule (:mod:`mriprep.stages.resample`): an output voxel whose kernel gives
    invalid voxels more than ``TOUCH_WEIGHT`` of weight in total gives one of its (at
    most 8) support voxels more than an eighth of that, and each 1D weight of that voxel
    is at least its 3D weight. It marks more voxels only where an invalid voxel's weight
    lies below ``TOUCH_WEIGHT``, within about 1e-6 voxel of a grid plane.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mriprep.core.volume import Volume
from mriprep.stages.resample.kernel import INDEX_MAP_TOLERANCE, INSIDE_TOLERANCE, TOUCH_WEIGHT


def axis_sources(vox_map: np.ndarray, out_shape: tuple[int, int, int]) -> tuple[int, ...] | None:
    """For each output axis, the one input axis it reads along; None if the map rotates.

    A coefficient coupling an output axis to a second input axis is negligible when it
    moves no output voxel by more than ``INDEX_MAP_TOLERANCE`` of an input voxel.
    """
    linear = vox_map[:3, :3]
    sources = tuple(int(i) for i in np.argmax(np.abs(linear), axis=0))
    if sorted(sources) != [0, 1, 2]:
        return None
    reach = np.abs(linear) * np.maximum(np.asarray(out_shape, dtype=np.float64) - 1, 1)
    reach[list(sources), [0, 1, 2]] = 0.0
    return sources if bool(np.all(reach <= INDEX_MAP_TOLERANCE)) else None


@dataclass(frozen=True)
class _AxisSampling:
    """Where the output positions along one axis read the input, along one input axis.

    ``inside`` is the run of output positions within the input's field of view; the index
    arrays cover that run. ``weight`` (float32) is the share of ``upper`` in the linear
    interpolation, None when every position is a voxel centre. ``first``/``second`` are
    the input voxels whose 1D weight exceeds ``TOUCH_WEIGHT / 8`` (``second`` None when
    that is one voxel everywhere).
    """

    inside: slice
    lower: np.ndarray
    upper: np.ndarray
    weight: np.ndarray | None
    nearest: np.ndarray
    first: np.ndarray
    second: np.ndarray | None

    @property
    def size(self) -> int:
        return self.inside.stop - self.inside.start


def _axis_sampling(scale: float, offset: float, n_out: int, n_in: int) -> _AxisSampling:
    position = scale * np.arange(n_out, dtype=np.float64) + offset
    within = (position >= -INSIDE_TOLERANCE) & (position <= n_in - 1 + INSIDE_TOLERANCE)
    # Positions move monotonically along the axis, so the inside positions form one run.
    run = np.flatnonzero(within)
    inside = slice(int(run[0]), int(run[-1]) + 1) if run.size else slice(0, 0)
    position = np.clip(position[inside], 0.0, n_in - 1)
    lower = np.floor(position).astype(np.intp)
    upper = np.minimum(lower + 1, n_in - 1)
    fraction = position - lower
    touch = TOUCH_WEIGHT / 8
    first = np.where(1.0 - fraction > touch, lower, upper)
    second = np.where(fraction > touch, upper, first)
    return _AxisSampling(
        inside=inside,
        lower=lower,
        upper=upper,
        weight=fraction.astype(np.float32) if np.any(fraction) else None,
        nearest=np.rint(position).astype(np.intp),
        first=first,
        second=None if np.array_equal(first, second) else second,
    )


def _along(axis: int, vector: np.ndarray) -> np.ndarray:
    """``vector`` shaped to broadcast along ``axis`` of a 3D array."""
    shape = [1, 1, 1]
    shape[axis] = -1
    return vector.reshape(shape)


def _interpolate_axis(values: np.ndarray, axis: int, s: _AxisSampling, out=None) -> np.ndarray:
    """1D linear interpolation along ``axis`` (float32, in place on fresh gathers),
    into ``out`` if given."""
    lower = np.take(values, s.lower, axis=axis)
    if s.weight is None:
        if out is None:
            return lower
        out[...] = lower
        return out
    upper = np.take(values, s.upper, axis=axis)
    # The convex form is exact at the voxel centres and cannot overflow near float32's
    # maximum, as the difference of two extreme values would.
    lower *= _along(axis, np.float32(1.0) - s.weight)
    upper *= _along(axis, s.weight)
    return np.add(upper, lower, out=upper if out is None else out)


def _touched_axis(invalid: np.ndarray, axis: int, s: _AxisSampling) -> np.ndarray:
    """1D dilation along ``axis``: an output position is touched if a voxel it reads is."""
    touched = np.take(invalid, s.first, axis=axis)
    if s.second is not None:
        touched |= np.take(invalid, s.second, axis=axis)
    return touched


def _nearest_axis(values: np.ndarray, axis: int, s: _AxisSampling) -> np.ndarray:
    return np.take(values, s.nearest, axis=axis)


def _separable(values: np.ndarray, samplings, order, one_axis, **last) -> np.ndarray:
    """Apply ``one_axis`` along each axis in ``order``: a separable 3D operation. The
    keywords ``last`` (e.g. ``out``) go to the last pass only."""
    for i, axis in enumerate(order):
        extra = last if i == len(order) - 1 else {}
        values = one_axis(values, axis, samplings[axis], **extra)
    return values


def resample_axis_aligned(
    volume: Volume,
    data: np.ndarray,
    vox_map: np.ndarray,
    out_shape: tuple[int, int, int],
    sources: tuple[int, ...],
    label_mode: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """:func:`~mriprep.stages.resample.general.resample_arrays` for an axis-aligned map and
    a linear or copy kernel.

    ``data`` is the volume's image with non-finite (invalid) voxels zeroed.
    """
    columns = [0, 1, 2]
    scales, offsets = vox_map[list(sources), columns], vox_map[list(sources), 3]
    in_shape = [volume.shape[i] for i in sources]
    samplings = [
        _axis_sampling(float(scales[j]), float(offsets[j]), out_shape[j], in_shape[j])
        for j in columns
    ]
    box = tuple(s.inside for s in samplings)
    box_voxels = int(np.prod([s.size for s in samplings]))
    outside = int(np.prod(out_shape)) - box_voxels
    # Axes that shrink first: every later pass then runs over fewer voxels.
    order = sorted(columns, key=lambda j: samplings[j].size / in_shape[j])

    image = np.zeros(out_shape, dtype=np.float32)
    valid = np.zeros(out_shape, dtype=bool)
    label = None if volume.label is None else np.zeros(out_shape, dtype=volume.label.dtype)
    if box_voxels == 0:
        return image, valid, label, outside
    # The last pass writes straight into the output grid: no 256^3 temporary.
    _separable(data.transpose(sources), samplings, order, _interpolate_axis, out=image[box])
    invalid = ~volume.valid
    if invalid.any():
        valid[box] = ~_separable(invalid.transpose(sources), samplings, order, _touched_axis)
    else:
        valid[box] = True
    if label is not None:
        source_label = volume.label.transpose(sources)
        copy = all(s.weight is None for s in samplings)
        if label_mode == "label_linear" and not copy:
            label[box] = _label_linear_separable(source_label, samplings, order)
        else:
            label[box] = _separable(source_label, samplings, order, _nearest_axis)
    return image, valid, label, outside


def _label_linear_separable(label: np.ndarray, samplings, order) -> np.ndarray:
    """:func:`~mriprep.stages.resample.general._label_linear` on the inside box of an
    axis-aligned map."""
    best = None
    out = None
    for value in np.unique(label):
        indicator = (label == value).astype(np.float32)
        score = _separable(indicator, samplings, order, _interpolate_axis)
        if best is None:
            best = np.full(score.shape, -1.0, dtype=np.float32)
            out = np.zeros(score.shape, dtype=label.dtype)
        better = score > best
        out[better] = value
        best[better] = score[better]
    return out
