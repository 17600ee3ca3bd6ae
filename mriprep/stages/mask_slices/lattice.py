"""The slices of one axis as the artifact scores see them: a lattice, blocks, the head.

Scores are computed on an in-plane lattice of about 2 mm (``score_spacing_mm``): every
second voxel of a 1 mm slice along each in-plane axis. The artifacts scored here span
the slice. The lattice is anchored to the anatomy (counted from the RAS+ end of each
axis), so a scan stored flipped or permuted scores the same voxels. Incomplete slices
are always judged on every voxel (:mod:`~mriprep.stages.mask_slices.incomplete`).

:func:`scoring_lattice` chooses the lattice of an axis, and :func:`slice_stack` cuts the
prepared volume (:func:`~mriprep.stages.mask_slices.statistics.prepare`) into a
:class:`SliceStack`: the slices along the axis, contiguous, cropped to the foreground's
in-plane bounding box, with each sample's in-plane block and the head's inside (away from
scalp and skull) that the ratio score looks at.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from nibabel import orientations
from nibabel.affines import voxel_sizes
from scipy import ndimage

from mriprep.stages.mask_slices.statistics import Prepared

# Artifact scores are judged block by block: a spike or a dropout scales the whole
# slice, while anatomy that changes fast between thick slices (the top of the head, an
# obliquely cut edge, the skull base) changes only part of it. Blocks are squares of
# this side (mm) in the slice's plane.
_BLOCK_MM = 32.0
# Ratio scores look at the head's inside only: this far (mm, in-plane) from its edge.
_EDGE_MM = 10.0


@dataclass
class SliceStack:
    """One axis of a volume as a stack of slices, with what scoring needs."""

    x: np.ndarray  # [n, ...] intensities, non-usable voxels set to 0
    usable: np.ndarray  # [n, ...]
    foreground: np.ndarray  # [n, ...]
    interior: np.ndarray  # [n, ...] the head's inside, away from scalp and skull
    all_usable: bool = False  # every voxel usable: ``usable`` need not be consulted
    voxels_per_sample: int = 1  # full-grid voxels each lattice sample stands for
    # The ratio score's in-plane block of each sample row and column (see _BLOCK_MM),
    # counted from the RAS+ end of the axis like the lattice: a flipped scan groups
    # the same voxels.
    block_of_row: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    block_of_col: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    sample_area_mm2: float = 1.0  # in-plane area each sample stands for

    @property
    def n(self) -> int:
        return self.x.shape[0]


@dataclass(frozen=True)
class Lattice:
    """Which voxels of each in-plane axis are scored: every ``step``-th, those whose index
    counted from the RAS+ end of the axis is a multiple of it. Anchored to the anatomy,
    not to the storage order, so a scan stored flipped or permuted scores the same
    voxels."""

    steps: tuple[int, int, int] = (1, 1, 1)
    phases: tuple[int, int, int] = (0, 0, 0)  # required index modulo step, per axis
    sample_mm: tuple[float, float, float] = (1.0, 1.0, 1.0)  # mm between samples, per axis
    flipped: tuple[bool, bool, bool] = (False, False, False)  # axis runs from the RAS+ end
    spacing_mm: tuple[float, float, float] = (1.0, 1.0, 1.0)  # voxel size, per axis


def scoring_lattice(volume_shape, affine, axis: int, score_spacing_mm: float) -> Lattice:
    """The lattice of slices along ``axis``: steps of about ``score_spacing_mm`` in-plane,
    every slice along ``axis`` itself."""
    spacing = voxel_sizes(np.asarray(affine, dtype=np.float64))
    steps = [max(1, int(np.floor(score_spacing_mm / s + 1e-6))) if score_spacing_mm else 1
             for s in spacing]
    steps[axis] = 1
    flipped = orientations.io_orientation(np.asarray(affine, dtype=np.float64))[:, 1] < 0
    phases = [(n - 1) % k if flip else 0 for n, k, flip in zip(volume_shape, steps, flipped)]
    sample_mm = tuple(float(k * s) for k, s in zip(steps, spacing))
    return Lattice(tuple(steps), tuple(phases), sample_mm,
                   tuple(bool(f) for f in flipped), tuple(float(s) for s in spacing))


def slice_stack(prepared: Prepared, axis: int, lattice: Lattice = Lattice()) -> SliceStack:
    # Scores only look at the neighbours' foreground, so the slices can be cropped to
    # its in-plane bounding box: the same scores, at half the cost on a typical head.
    box = []
    for extent, step, phase in zip(prepared.extent, lattice.steps, lattice.phases):
        start = extent.start or 0
        box.append(slice(start + (phase - start) % step, extent.stop, step))
    box[axis] = slice(None)
    box = tuple(box)

    # Slice by slice work wants each slice contiguous: along the last axes of a C-ordered
    # volume, a slice's voxels otherwise lie a whole row or plane apart in memory.
    def cut(array):
        return np.ascontiguousarray(np.moveaxis(array[box], axis, 0))

    x = cut(prepared.x)
    plane = [a for a in range(3) if a != axis]
    foreground = cut(prepared.foreground)
    sample_mm = [lattice.sample_mm[a] for a in plane]
    interior = _head_inside(foreground, sample_mm)
    return SliceStack(
        x=x,
        usable=np.broadcast_to(True, x.shape) if prepared.all_usable else cut(prepared.usable),
        foreground=foreground,
        interior=interior,
        all_usable=prepared.all_usable,
        voxels_per_sample=int(np.prod(lattice.steps)),
        block_of_row=_blocks_along(box[plane[0]], prepared.x.shape[plane[0]], lattice, plane[0]),
        block_of_col=_blocks_along(box[plane[1]], prepared.x.shape[plane[1]], lattice, plane[1]),
        sample_area_mm2=float(np.prod(sample_mm)),
    )


def _blocks_along(cut: slice, n: int, lattice: Lattice, axis: int) -> np.ndarray:
    """The block of each sample the ``cut`` keeps of an axis of ``n`` voxels."""
    index = np.arange(n)[cut]
    if lattice.flipped[axis]:
        index = n - 1 - index
    size = max(1, int(round(_BLOCK_MM / lattice.spacing_mm[axis])))
    return index // size


def _head_inside(foreground: np.ndarray, sample_mm) -> np.ndarray:
    """Per slice, the head's inside: the foreground within the filled head eroded by
    :data:`_EDGE_MM` in the slice's plane (away from scalp and skull). Holes are filled
    before eroding so that dark ventricles or sinuses do not eat into the inside; their
    own voxels stay out (a skull-stripped image holds zeros there)."""
    flat = np.zeros((1, 3, 3), dtype=bool)
    flat[0, 1, :] = flat[0, :, 1] = True
    filled = ndimage.binary_fill_holes(foreground, structure=flat)
    steps = max(1, int(round(_EDGE_MM / max(min(sample_mm), 1e-6))))
    inside = ndimage.binary_erosion(filled, structure=flat, iterations=steps)
    inside &= foreground
    return inside
