"""Reorient: permute and flip the voxel axes to a canonical orientation, exactly.

Reorientation only reorders voxels (axis permutations and reversals), so no value is
interpolated and every voxel keeps its bits; the affine is updated so that each voxel
keeps its world position. The image, the ``valid`` mask and the label map move together.
A pending registration transform is expressed in world coordinates and needs no change.

The closest canonical axes of an oblique affine are chosen as nibabel does
(:func:`nibabel.orientations.io_orientation`); the obliquity itself stays in the affine,
because removing it would need an interpolation.

The stage hands on contiguous arrays, whatever comes after it: later stages walk the
volume in memory order, and on permuted views they slow down more than the copy costs
(docs/benchmarks.md, "Stage timings"). The resample stage asks :func:`reoriented` for views
instead: it reorders its input when it builds an oriented output grid (``orientation``)
and writes the new grid in the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nibabel import orientations

from mriprep.core.errors import PipelineConfigError
from mriprep.core.volume import Volume
from mriprep.stages import StageOutput, stage

_AXIS_CODES = ({"R", "L"}, {"A", "P"}, {"S", "I"})


def axis_codes(orientation: str, stage: str) -> str:
    """``orientation`` in upper case if it names each direction once (``"RAS"``,
    ``"lia"``...), else a PipelineConfigError naming ``stage``."""
    codes = str(orientation).upper()
    axes_used = sorted(i for c in codes for i, pair in enumerate(_AXIS_CODES) if c in pair)
    if len(codes) != 3 or axes_used != [0, 1, 2]:
        raise PipelineConfigError(
            f"{stage}: orientation {orientation!r} must name each of the three "
            "directions once, one letter from each of R/L, A/P and S/I, e.g. 'RAS' or "
            "'LIA'"
        )
    return codes


@dataclass(frozen=True)
class ReorientParams:
    """Parameters of the reorient stage.

    Attributes
    ----------
    orientation : str
        Three axis codes naming where each voxel axis points, nibabel style: ``"RAS"``
        (the default: nibabel's canonical RAS+), ``"LIA"`` (FreeSurfer's conformed
        orientation), ``"LPS"`` (ITK's), ...
    """

    orientation: str = "RAS"

    def __post_init__(self):
        object.__setattr__(self, "orientation", axis_codes(self.orientation, "reorient"))


def orientation_codes(affine: np.ndarray) -> str:
    """The three-letter orientation of an affine's voxel axes, e.g. ``"RAS"``."""
    return "".join(orientations.aff2axcodes(np.asarray(affine)))


def reorient_arrays(
    arrays: list[np.ndarray], affine: np.ndarray, orientation: str
) -> tuple[list[np.ndarray], np.ndarray]:
    """Reorder the voxels of same-shaped arrays to ``orientation``; no interpolation.

    Parameters
    ----------
    arrays : list of ndarray
        3D arrays on the grid described by ``affine`` (image, mask, labels).
    affine : ndarray, shape (4, 4)
        Voxel-to-RAS+ world affine of that grid.
    orientation : str
        Target axis codes, e.g. ``"RAS"``.

    Returns
    -------
    arrays : list of ndarray
        The reordered arrays: views of the input (no voxel copied), same dtypes and bits.
    affine : ndarray, shape (4, 4)
        The affine of the reordered grid: every voxel keeps its world position.

    Examples
    --------
    >>> data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    >>> las = np.diag([-1.0, 1.0, 1.0, 1.0])
    >>> (out,), new_affine = reorient_arrays([data], las, "RAS")
    >>> bool((out == data[::-1]).all()), orientation_codes(new_affine)
    (True, 'RAS')
    """
    affine = np.asarray(affine, dtype=np.float64)
    shape = arrays[0].shape
    current = orientations.io_orientation(affine)
    target = orientations.axcodes2ornt(tuple(orientation))
    transform = orientations.ornt_transform(current, target)
    moved = [orientations.apply_orientation(a, transform) for a in arrays]
    new_affine = affine @ orientations.inv_ornt_aff(transform, shape)
    return moved, new_affine


@stage("reorient", ReorientParams)
def reorient(volume: Volume, params: ReorientParams) -> StageOutput:
    """Reorient a volume to ``params.orientation`` without interpolation.

    Parameters
    ----------
    volume : Volume
    params : ReorientParams

    Returns
    -------
    StageOutput
        The reoriented volume (data, ``valid`` and label moved together, affine updated).
        Metrics: ``from`` and ``to`` orientation codes, ``changed``, the input and output
        ``shape``.
    """
    before = orientation_codes(volume.affine)
    metrics = {"from": before, "to": params.orientation, "shape_in": list(volume.shape)}
    if before == params.orientation:
        metrics.update(changed=False, shape_out=list(volume.shape))
        return StageOutput(volume, metrics)
    out = reoriented(volume, params.orientation, contiguous=True)  # see the module doc
    metrics.update(changed=True, shape_out=list(out.shape))
    return StageOutput(out, metrics)


def reoriented(volume: Volume, orientation: str, contiguous: bool) -> Volume:
    """``volume`` with image, ``valid`` and label reordered to ``orientation`` together and
    the affine updated; contiguous copies, or views when the next step copies anyway."""
    arrays = [volume.data, volume.valid] + ([volume.label] if volume.label is not None else [])
    moved, affine = reorient_arrays(arrays, volume.affine, orientation)
    if contiguous:
        moved = [np.ascontiguousarray(a) for a in moved]
    return volume.replace(data=moved[0], valid=moved[1], affine=affine,
                          label=moved[2] if volume.label is not None else None)
