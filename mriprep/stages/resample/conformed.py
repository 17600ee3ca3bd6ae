"""Whether an input is already on the conform target: FastSurfer's ``is_conform``.

FastSurfer never conforms an image that is already conformed: ``is_conform``
(``FastSurferCNN/data_loader/conform.py``) checks the header alone, and its callers
(the ``conform.py`` command and ``data_utils.load_and_conform_image``) then use the
voxels as they are. Its rules, for the resample stage's target grid:

* three dimensions of the target's shape (256^3 for FreeSurfer's conform);
* every voxel size within ``eps`` of the target's (1 mm);
* the target's voxel order (LIA): with ``strict`` (FastSurfer's default, the stage's
  ``axis_aligned``) the direction matrix has the signs of the orientation's and every
  other entry within ``eps`` of zero; otherwise each voxel axis runs mostly along the
  orientation's world axis with its sign;
* the file stores uint8 (FreeSurfer's UCHAR).

``eps`` is FastSurfer's 1e-6. FastSurfer's strict test compares the off-axis entries
without their absolute value (a negative one of any size passes); here both signs
must be within ``eps``, as its docstring means. The grid's position is not a rule, as in
FastSurfer: a conformed image keeps its own affine.
"""

from __future__ import annotations

import numpy as np
from nibabel.affines import voxel_sizes

from mriprep.stages.resample.grid import world_axes

# FastSurfer's is_conform default (for the voxel sizes and the direction matrix).
CONFORM_EPS = 1e-6
CONFORMED_DTYPE = "uint8"


def stored_dtype(load_metrics) -> str | None:
    """The dtype a file stores as its voxels, from the load stage's metrics (None:
    unknown): ``"uint8"`` only when read unscaled, since a uint8 file with a scaling
    (NIfTI's ``scl_slope``) holds other values than its bytes."""
    if load_metrics is None:
        return None
    dtype = load_metrics.get("dtype_on_disk")
    if dtype is not None and load_metrics.get("scaling_applied", False):
        return f"{dtype} with a scaling"
    return dtype


def conform_mismatches(affine: np.ndarray, shape, dtype_on_disk: str | None,
                       target_shape, target_spacing, orientation: str,
                       strict: bool = True, eps: float = CONFORM_EPS) -> list[str]:
    """The rules of FastSurfer's ``is_conform`` an image breaks, each as a sentence with
    the value found; empty when the image is already conformed (module doc).

    ``dtype_on_disk`` is the dtype the file stores (None: unknown, which is not uint8).

    Examples
    --------
    >>> lia = np.array([[-1, 0, 0, 128], [0, 0, 1, -128], [0, -1, 0, 128], [0, 0, 0, 1]])
    >>> conform_mismatches(lia, (256,) * 3, "uint8", (256,) * 3, (1.0,) * 3, "LIA")
    []
    >>> conform_mismatches(lia, (256,) * 3, "float32", (256,) * 3, (1.0,) * 3, "LIA")
    ['dtype float32, not uint8']
    """
    affine = np.asarray(affine, dtype=np.float64)
    found = []
    if tuple(int(n) for n in shape) != tuple(int(n) for n in target_shape):
        found.append(f"shape {tuple(int(n) for n in shape)}, not {tuple(target_shape)}")
    sizes = voxel_sizes(affine)
    if not np.max(np.abs(sizes - np.asarray(target_spacing, dtype=np.float64))) < eps:
        found.append(f"voxel sizes {tuple(round(float(s), 9) for s in sizes)} mm, not "
                     f"{tuple(target_spacing)}")
    target = world_axes(orientation)
    directions = affine[:3, :3]
    on_axis = target != 0
    signs = bool(np.all(np.sign(directions[on_axis]) == target[on_axis]))
    if strict:
        along = bool(np.all(np.abs(directions[~on_axis]) <= eps))
    else:
        along = bool(np.all(np.argmax(np.abs(directions), axis=0)
                            == np.argmax(np.abs(target), axis=0)))
    if not (signs and along):
        found.append(f"voxel axes {np.round(directions, 6).tolist()}, not "
                     f"{'exactly ' if strict else ''}{orientation}")
    if dtype_on_disk != CONFORMED_DTYPE:
        found.append(f"dtype {dtype_on_disk or 'unknown'}, not {CONFORMED_DTYPE}")
    return found
