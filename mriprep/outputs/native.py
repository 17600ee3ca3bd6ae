"""Predictions on the cache grid back onto each subject's native scan, in one interpolation.

A network trained on the cache predicts on the cache grid (the MNI template's box after
registration, or the 256^3 conformed grid). The result a clinician or an evaluation needs
lies on the scan as acquired. :func:`to_native` maps one prediction there and
:func:`to_native_batch` a batch; both return NIfTI images with the native scan's
geometry (its qform and sform), which overlay the scan in any viewer.

One map, one interpolation
    Every native voxel ``n`` is sent to a continuous cache voxel by one affine map,
    ``inv(cache affine) @ inv(template_to_subject) @ native affine`` (the middle factor
    is the identity when the entry was not registered): native voxel to the subject's
    world, to the template's world, to the cache grid. It inverts the resample stage's
    map (:mod:`mriprep.stages.resample`), and the prediction is read there once, by
    SimpleITK (:mod:`~mriprep.outputs.sampling`). Going back through the pipeline's
    steps (undo the resampling, then the reorientation) would interpolate twice.

Interpolation
    Labels: ``nearest`` by default (every native voxel takes a predicted label), or
    ``per-label``: each label's indicator is interpolated linearly and the label of
    largest weight wins, which gives smoother boundaries when the native voxels are
    smaller than the cache's or the map rotates (it costs one pass per label). Images
    (intensities, one class's probability): ``linear``. Native voxels that fall outside
    the cache grid (beyond its outermost voxel centres; the template's box may not hold
    the whole head) get 0, for labels and images alike.

The native grid is the input scan's, as the entry's sidecar records it (``inputs``):
its header is read (the affine mriprep chose between qform and sform, as the pipeline
did) and its SHA-256 compared with the recorded one, so that a prediction never lands on
another file's grid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import nibabel as nib
import numpy as np

from mriprep.cache import Cache, IndexEntry
from mriprep.core.errors import CacheError, InputError
from mriprep.outputs.images import native_like
from mriprep.outputs.predictions import as_prediction, split_batch
from mriprep.outputs.sampling import sample_at
from mriprep.outputs.select import entry_for
from mriprep.qc.views import index_map

KINDS = ("label", "image")
# Per kind, the interpolations it allows; the first is the default.
INTERPOLATIONS = {"label": ("nearest", "per-label"), "image": ("linear", "nearest")}


@dataclass(frozen=True)
class CacheGrid:
    """An entry's grid, and how its world relates to the native scan's."""

    entry: IndexEntry
    shape: tuple[int, int, int]
    affine: np.ndarray
    # Template RAS+ mm -> subject RAS+ mm for a registered entry; None: the same world.
    template_to_subject: np.ndarray | None = None

    @classmethod
    def of(cls, entry: IndexEntry) -> "CacheGrid":
        """The grid the index records for ``entry``.

        Raises
        ------
        CacheError
            The entry records no shape or affine, or a transform that is no finite 4x4.
        """
        shape, affine = entry.shape, entry.affine
        if shape is None or affine is None or len(shape) != 3:
            raise CacheError(
                f"entry {entry.finding_name} records no 3D shape and affine of its grid; "
                "rebuild it with `mriprep run --force`"
            )
        doc = entry.to_json()
        transform = doc.get("template_to_subject")
        if transform is None and doc.get("transform_file"):
            raise CacheError(
                f"entry {entry.finding_name} was registered ({doc['transform_file']}) but "
                "records no template_to_subject; rebuild it with `mriprep run --force`"
            )
        if transform is not None:
            transform = np.asarray(transform, dtype=np.float64)
            if transform.shape != (4, 4) or not np.isfinite(transform).all():
                raise CacheError(
                    f"entry {entry.finding_name} records template_to_subject "
                    f"{doc['template_to_subject']}, not a finite 4x4 matrix; rebuild it "
                    "with `mriprep run --force`"
                )
        return cls(entry, tuple(int(n) for n in shape), affine, transform)


@dataclass(frozen=True)
class NativeGrid:
    """The native scan's grid: its file, shape, affine (as mriprep reads it) and NIfTI
    header (None for another format), whose qform and sform the outputs copy."""

    path: Path
    shape: tuple[int, int, int]
    affine: np.ndarray
    header: Any = None


def native_grid(entry: IndexEntry, native_path: str | os.PathLike | None = None,
                verify: bool = True) -> NativeGrid:
    """The grid of the scan ``entry`` was made from, read from its header.

    ``native_path`` replaces the recorded path (the cohort moved); with ``verify`` the
    file's SHA-256 must still be the recorded one.

    Raises
    ------
    InputError
        The entry records no input image, the file is gone (the message names it), or it
        is not the file the entry was made from.
    ImageReadError, HeaderError
        The file cannot be read as an image (see :func:`mriprep.inputs.readers.read_header`).
    """
    from mriprep.core.hashing import sha256_file
    from mriprep.inputs.formats import image_suffix
    from mriprep.inputs.readers import read_header

    inputs = entry.inputs
    recorded = inputs.get("image") if isinstance(inputs, dict) else None
    if not isinstance(recorded, dict) or not recorded.get("path"):
        raise InputError(
            f"entry {entry.finding_name} records no input image (inputs: {inputs}); its "
            "native grid is unknown"
        )
    path = Path(native_path if native_path is not None else recorded["path"])
    if not path.is_file():
        how = ("the path given" if native_path is not None
               else "the native scan its sidecar records")
        raise InputError(
            f"{path} ({how} for {entry.finding_name}) does not exist; restore it, or pass "
            "where it is now (native_path=PATH)"
        )
    if verify and recorded.get("sha256"):
        found = sha256_file(path)
        if found != recorded["sha256"]:
            raise InputError(
                f"{path} is not the scan {entry.finding_name} was cached from: its SHA-256 "
                f"is {found[:16]}..., the entry records {recorded['sha256'][:16]}...; "
                "restore that file, or rerun `mriprep run` so the entry matches it"
            )
    header = read_header(path, header=entry.header)  # the form the entry was made with
    nifti = None
    if image_suffix(path) in (".nii", ".nii.gz"):
        nifti = nib.load(str(path)).header  # the header only: no voxel is read
    return NativeGrid(path, tuple(int(n) for n in header.shape), header.affine, nifti)


def native_to_cache(cache_grid: CacheGrid, native: NativeGrid) -> np.ndarray:
    """The 4x4 map from a native voxel index to the continuous cache voxel index that
    holds the same anatomy (see the module docstring)."""
    change = (None if cache_grid.template_to_subject is None
              else np.linalg.inv(cache_grid.template_to_subject))
    return index_map(cache_grid.affine, change) @ native.affine


def map_to_native(prediction: np.ndarray, cache_grid: CacheGrid, native: NativeGrid,
                  interpolation: str) -> np.ndarray:
    """A checked prediction (:func:`~mriprep.outputs.predictions.as_prediction`) read at
    every voxel of the native grid: labels keep their dtype, images are float32, 0
    outside the cache grid. No file is touched."""
    return sample_at(prediction, native_to_cache(cache_grid, native), native.shape,
                     interpolation)


def to_native(cache: Cache | str | os.PathLike, subject_id: str, prediction: Any,
              session_id: str | None = None, kind: str = "label",
              interpolation: str | None = None,
              native_path: str | os.PathLike | None = None) -> nib.Nifti1Image:
    """One prediction on the cache grid, mapped onto the subject's native scan.

    Parameters
    ----------
    cache : Cache or path
    subject_id : str
    prediction : array, torch tensor or nibabel image
        ``[X, Y, Z]`` (or ``[1, X, Y, Z]``) on the entry's cache grid: a label map
        (integers) or an image (any real values). A nibabel image must carry the cache
        grid's affine.
    session_id : str, optional
        Needed when the subject has several sessions in the cache (``""``: none).
    kind : {"label", "image"}
    interpolation : {"nearest", "per-label", "linear"}, optional
        Labels: ``nearest`` (default) or ``per-label``; images: ``linear`` (default) or
        ``nearest``. See the module docstring.
    native_path : path, optional
        Where the native scan is now, if it moved (its SHA-256 must match).

    Returns
    -------
    nibabel.Nifti1Image
        On the native grid, with the native scan's qform and sform: int16 labels (int32
        when they do not fit) or float32 values; 0 where a native voxel falls outside
        the cache grid.

    Raises
    ------
    CacheError
        The subject or session is not in the cache (naming those that are).
    InputError
        A prediction off the cache grid (naming both shapes, or both affines), an
        interpolation the kind does not allow, a native scan that is gone or changed.

    Examples
    --------
    >>> img = to_native("cache/", "sub-01", logits.argmax(0))  # doctest: +SKIP
    >>> img.to_filename("sub-01_pred.nii.gz")  # doctest: +SKIP
    """
    return to_native_batch(cache, [subject_id], [prediction],
                           None if session_id is None else [session_id], kind=kind,
                           interpolation=interpolation, native_path=native_path)[0]


def to_native_batch(cache: Cache | str | os.PathLike, subject_ids: str | Sequence[str],
                    predictions: Any, session_ids: str | Sequence[str] | None = None,
                    kind: str = "label", interpolation: str | None = None,
                    native_path: str | os.PathLike | None = None) -> list[nib.Nifti1Image]:
    """A batch of predictions mapped onto their subjects' native scans.

    ``predictions`` is ``[B, X, Y, Z]`` or ``[B, 1, X, Y, Z]`` (array or tensor) or a
    list of volumes; ``subject_ids`` and ``session_ids`` give one id per prediction, or
    one for all (several predictions of one subject). An
    :class:`~mriprep.training.MRIDataset` volume-mode batch gives them as they are::

        images = to_native_batch("cache/", batch["subject_id"], logits.argmax(1),
                                 batch["session_id"])

    Each subject's grids are read once per call. ``native_path`` (one subject only)
    and everything else as :func:`to_native`; returns one image per prediction, in order.
    """
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    method = _interpolation(kind, interpolation)
    cache = cache if isinstance(cache, Cache) else Cache(cache)
    ids = [subject_ids] if isinstance(subject_ids, str) else list(subject_ids)
    items = split_batch(predictions, None if len(ids) == 1 else len(ids))
    ids = ids * len(items) if len(ids) == 1 else ids
    if session_ids is None or isinstance(session_ids, str):
        sessions: list[str | None] = [session_ids] * len(items)
    else:
        sessions = list(session_ids)
        if len(sessions) != len(items):
            raise InputError(
                f"{len(sessions)} session id(s) for {len(items)} prediction(s); give one "
                "per prediction, or one for all"
            )
    if native_path is not None and len(set(ids)) > 1:
        raise InputError("native_path names one scan, but the batch holds several "
                         f"subjects ({', '.join(sorted(set(ids)))}); map them one by one")
    grids: dict[tuple[str, str | None], tuple[CacheGrid, NativeGrid]] = {}
    out = []
    for i, (sid, ses, item) in enumerate(zip(ids, sessions, items)):
        if (sid, ses) not in grids:
            entry = entry_for(cache, sid, ses)
            grids[(sid, ses)] = (CacheGrid.of(entry), native_grid(entry, native_path))
        cache_grid, native = grids[(sid, ses)]
        what = (f"the prediction for {cache_grid.entry.finding_name}" if len(items) == 1
                else f"prediction {i} of the batch ({cache_grid.entry.finding_name})")
        what += _file_of(item)
        array = as_prediction(item, cache_grid.shape, cache_grid.affine, kind, what)
        data = map_to_native(array, cache_grid, native, method)
        out.append(native_like(data, native.affine, native.header))
    return out


def _file_of(item: Any) -> str:
    """`` (FILE)`` for a prediction read from a file (a nibabel image, a memory-mapped
    .npy), so that messages name it; else ``""``."""
    name = item.get_filename() if hasattr(item, "get_filename") else getattr(item, "filename",
                                                                              None)
    return f" ({name})" if isinstance(name, (str, os.PathLike)) else ""


def _interpolation(kind: str, interpolation: str | None) -> str:
    allowed = INTERPOLATIONS[kind]
    if interpolation is None:
        return allowed[0]
    if interpolation not in allowed:
        why = {("label", "linear"): "linear interpolation would invent values between "
                                    "labels (use per-label: each label's indicator "
                                    "linearly, then the most likely)",
               ("image", "per-label"): "per-label is for label maps"}.get(
                   (kind, interpolation), f"{interpolation!r} is no interpolation")
        raise InputError(
            f"a {kind} cannot be mapped with {interpolation!r}: {why}; choose "
            f"{' or '.join(allowed)}"
        )
    return interpolation
