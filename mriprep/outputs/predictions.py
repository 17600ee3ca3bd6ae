"""What a prediction on the cache grid may be, checked in one place before it is mapped.

A prediction comes from a network, a file or a batch: a NumPy array, a torch tensor (on
any device), a nibabel image, with or without a channel axis of one. :func:`as_prediction`
turns one into a plain 3D array of the entry's grid or refuses it with
:class:`~mriprep.core.errors.InputError`, naming what it got and what the grid is: a
wrong shape (both shapes), a NIfTI off the grid (both affines), a label map that does not
hold whole numbers, an image with NaN. :func:`split_batch` cuts a batch into predictions.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mriprep.core.errors import InputError
from mriprep.core.limits import smallest_label_dtype
from mriprep.inputs.headers import FORM_ATOL_MM, matrix_text


def as_array(prediction: Any) -> np.ndarray:
    """A NumPy view or copy of an array, a torch tensor (detached, on the CPU) or a
    nibabel image's data."""
    if hasattr(prediction, "detach") and hasattr(prediction, "cpu"):  # a torch tensor
        return prediction.detach().cpu().numpy()
    if hasattr(prediction, "dataobj"):  # a nibabel image
        return np.asanyarray(prediction.dataobj)
    return np.asarray(prediction)


def as_prediction(prediction: Any, shape: tuple[int, ...], affine: np.ndarray, kind: str,
                  what: str) -> np.ndarray:
    """``prediction`` as a 3D array of the grid ``shape``/``affine``, ready to map.

    ``kind`` ``"label"`` gives integers (int16 when they fit, else int32; booleans and
    whole-valued floats are accepted), ``"image"`` float32. A leading channel axis of
    length 1 (``[1, X, Y, Z]``) is dropped. ``what`` names the prediction in messages
    (a file, or "prediction 3 of the batch (sub-04)").

    Raises
    ------
    InputError
        A shape other than the grid's, a nibabel image whose affine is not the grid's
        (within 1e-3 mm), a label map with fractional values, an image with NaN or
        infinite values.
    """
    shape = tuple(int(n) for n in shape)
    recorded = getattr(prediction, "affine", None)  # a nibabel image, a MONAI MetaTensor
    found = None if recorded is None else np.asarray(as_array(recorded), dtype=np.float64)
    if found is not None and found.shape == (4, 4):
        if not np.allclose(found, affine, rtol=0, atol=FORM_ATOL_MM):
            raise InputError(
                f"{what} has the affine {matrix_text(found)}, but the cache grid's is "
                f"{matrix_text(affine)}; a prediction must lie on the cache grid (write it "
                "with the affine of the cached image, or export it with `mriprep export`)"
            )
    array = as_array(prediction)
    if array.ndim == len(shape) + 1 and array.shape[0] == 1:
        array = array[0]
    if array.shape != shape:
        raise InputError(
            f"{what} has shape {array.shape}, but the cache grid has shape {shape}; pass "
            f"one volume [X, Y, Z] (or [1, X, Y, Z]) on the cache grid"
        )
    if kind == "image":
        if array.dtype.kind not in "biuf":
            raise InputError(f"{what} holds {array.dtype} values, not numbers")
        array = np.asarray(array, dtype=np.float32)
        bad = ~np.isfinite(array)
        if bad.any():
            raise InputError(
                f"{what} holds {int(bad.sum())} NaN or infinite value(s), which linear "
                "interpolation would spread to their neighbours; replace them first "
                "(e.g. np.nan_to_num)"
            )
        return array
    return _labels(array, what)


def _labels(array: np.ndarray, what: str) -> np.ndarray:
    if array.dtype == bool:
        array = array.astype(np.uint8)
    elif array.dtype.kind == "f":
        finite = np.isfinite(array)
        whole = finite.all() and np.array_equal(array, np.round(array))
        if not whole:
            odd = array[~finite] if not finite.all() else array[array != np.round(array)]
            raise InputError(
                f"{what} is a label map but holds non-integer values (e.g. {odd.flat[0]:.4g}); "
                "pass the network's argmax, or map probabilities with kind='image'"
            )
    elif array.dtype.kind not in "iu":
        raise InputError(f"{what} holds {array.dtype} values, not labels")
    if array.size == 0:
        return array.astype(np.int16)
    return array.astype(smallest_label_dtype(array), copy=False)


def split_batch(predictions: Any, n: int | None = None) -> list[Any]:
    """The predictions of a batch: a list or tuple as it is, an array or tensor
    ``[B, ...]`` cut along its first axis. ``n`` is the expected count (the subject
    ids'), refused when it differs."""
    if isinstance(predictions, (list, tuple)):
        items: Sequence[Any] = list(predictions)
    else:
        array = predictions if hasattr(predictions, "detach") else as_array(predictions)
        if array.ndim < 4:
            raise InputError(
                f"a batch of predictions has shape {tuple(array.shape)}; give [B, X, Y, Z] "
                "or [B, 1, X, Y, Z] (or a list of volumes)"
            )
        items = [array[i] for i in range(array.shape[0])]
    if n is not None and len(items) != n:
        raise InputError(
            f"the batch holds {len(items)} prediction(s) but {n} subject id(s) were given; "
            "give one subject id per prediction (or one for all)"
        )
    return list(items)
