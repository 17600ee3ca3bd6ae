"""Items in the shapes MONAI and TorchIO take: item affines, MetaTensor items,
:func:`to_torchio_subject` and :func:`torchio_subjects`.

Every item carries the affine of its own voxel grid, so a library that reads geometry
(MONAI's ``Orientationd``, TorchIO's samplers, a NIfTI writer) sees where the voxels are:

* volume items: the entry's affine;
* patch items: the entry's affine moved to the patch's first voxel;
* slice items: a 3D affine of the slice as a one-voxel-thick volume, its axes in the
  order of the item's (the two in-plane axes, then the slice normal), so voxel
  ``(i, j, 0)`` of the item lies where the cache's voxel does.

MONAI and TorchIO are imported only when used: ``pip install monai torchio`` (the
``interop`` extra).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import torch

from mriprep.cache.formats import read_tensor

_TENSORS = ("image", "valid", "label")


class CachedSplit(Protocol):
    """What :func:`torchio_subjects` reads of a dataset: an
    :class:`~mriprep.training.dataset.MRIDataset` (a protocol, so that the dataset, which
    uses this module, is not imported by it)."""

    cache: Any
    entries: Sequence[Any]
    affines: Sequence[Any]
    shapes: Sequence[tuple[int, ...]]
    labels: bool


def patch_affine(affine: np.ndarray, start) -> np.ndarray:
    """The affine of a patch whose first voxel is voxel ``start`` of the volume."""
    moved = np.array(affine, dtype=np.float64)
    moved[:3, 3] = affine[:3, 3] + affine[:3, :3] @ np.asarray(start, dtype=np.float64)
    return moved


def slice_affine(affine: np.ndarray, axis: int, index: int) -> np.ndarray:
    """The affine of slice ``index`` along ``axis``, in-plane axes first."""
    in_plane = [a for a in range(3) if a != axis]
    moved = np.eye(4)
    moved[:3, :3] = affine[:3, [*in_plane, axis]]
    moved[:3, 3] = affine[:3, 3] + affine[:3, axis] * index
    return moved


def require_monai():
    try:
        import monai.data
    except ImportError as error:
        raise ImportError(
            "MRIDataset(meta_tensor=True) needs MONAI: pip install monai (or mriprep's "
            "'interop' extra)"
        ) from error
    return monai.data


def as_meta_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """The item with ``image``, ``valid`` and ``label`` as MetaTensors (sharing memory)
    carrying its affine, subject and session."""
    MetaTensor = require_monai().MetaTensor
    affine = torch.as_tensor(np.asarray(item["affine"]), dtype=torch.float64)
    subject, session = item["subject_id"], item["session_id"]
    meta = {"subject_id": subject, "session_id": session,
            "filename_or_obj": f"{subject}/{session}" if session else subject}
    out = dict(item)
    for name in _TENSORS:
        if name in out:
            out[name] = MetaTensor(out[name], affine=affine.clone(), meta=dict(meta))
    return out


def holds_meta_tensors(item: Mapping[str, Any]) -> bool:
    # No MetaTensor can exist unless MONAI was imported: no import for plain items.
    module = sys.modules.get("monai.data.meta_tensor")
    return module is not None and any(isinstance(v, module.MetaTensor) for v in item.values())


def to_torchio_subject(item: Mapping[str, Any]):
    """A ``torchio.Subject`` of an :class:`~mriprep.training.dataset.MRIDataset` item.

    ``image`` becomes a ``ScalarImage``, ``valid`` and ``label`` ``LabelMap`` s (channel
    first, as TorchIO wants), all with the item's affine; a slice item becomes a
    one-voxel-thick volume. ``subject_id``, ``session_id`` and ``slice_index`` are kept;
    a patch item's ``location`` is not (its affine holds it, and TorchIO's samplers
    write their own ``location``).

    For TorchIO's ``Queue``, which needs a ``SubjectsDataset``, use
    :func:`torchio_subjects` instead.
    """
    tio = _require_torchio("to_torchio_subject")
    if "affine" not in item:
        raise ValueError(
            f"to_torchio_subject: the item of subject {item.get('subject_id')!r} has no "
            "affine; give an item of MRIDataset, not a collated batch"
        )
    affine = np.asarray(item["affine"], dtype=np.float64)
    image = _plain(item["image"])
    if image.dim() not in (3, 4):
        raise ValueError(
            f"to_torchio_subject: image of shape {tuple(image.shape)} is neither a volume "
            "[C, X, Y, Z] nor a slice [C, H, W]; give one item, not a batch"
        )
    slice_item = image.dim() == 3
    spatial = image.shape[1:]

    def volume(tensor: torch.Tensor) -> torch.Tensor:
        tensor = _plain(tensor)
        if tensor.shape == spatial:
            tensor = tensor[None]
        return tensor[..., None] if slice_item else tensor

    images = {"image": tio.ScalarImage(tensor=volume(image), affine=affine)}
    for name in ("valid", "label"):
        if name in item:
            images[name] = tio.LabelMap(tensor=volume(item[name]), affine=affine)
    kept = {k: item[k] for k in ("subject_id", "session_id", "slice_index") if k in item}
    return tio.Subject(**images, **kept)


def _plain(tensor) -> torch.Tensor:
    tensor = torch.as_tensor(tensor)
    as_tensor = getattr(tensor, "as_tensor", None)  # a MetaTensor's plain tensor
    return as_tensor() if as_tensor is not None else tensor


def torchio_subjects(dataset: CachedSplit, transform=None):
    """The dataset's entries as a ``torchio.SubjectsDataset`` of lazily read Subjects.

    What ``torchio.Queue`` takes: each Subject holds ``image`` (``ScalarImage``),
    ``valid`` and, when the dataset reads labels, ``label`` (``LabelMap`` s), read from
    the cache's memory-mapped files only when TorchIO loads them, with the entry's
    affine; and ``subject_id`` and ``session_id``. Every entry of the split is one
    Subject whatever the dataset's mode (the Queue's sampler makes the patches)::

        queue = tio.Queue(torchio_subjects(MRIDataset(cache, "train")), max_length=16,
                          samples_per_volume=4, sampler=tio.UniformSampler(64))
        loader = tio.SubjectsLoader(queue, batch_size=4)
    """
    tio = _require_torchio("torchio_subjects")
    kinds = {"image": tio.ScalarImage, "valid": tio.LabelMap, "label": tio.LabelMap}
    names = ("image", "valid", "label") if dataset.labels else ("image", "valid")
    subjects = []
    for entry, affine, shape in zip(dataset.entries, dataset.affines, dataset.shapes):
        reader = functools.partial(read_cached_tensor, affine=np.asarray(affine),
                                   shape=shape)
        images = {name: kinds[name](dataset.cache.entry_file(entry, name), reader=reader)
                  for name in names}
        subjects.append(tio.Subject(**images, subject_id=entry.subject_id,
                                    session_id=entry.session_id))
    return tio.SubjectsDataset(subjects, transform=transform)


def read_cached_tensor(path, affine: np.ndarray, shape: tuple[int, ...]):
    """TorchIO's reader for a cache tensor: ``([1, X, Y, Z] tensor, affine)``."""
    array = read_tensor(path)
    if array.shape != tuple(shape):
        raise ValueError(
            f"{path} has shape {array.shape}, the cache's index says {tuple(shape)}: the "
            "cache is corrupt; run `mriprep check` and rebuild the entry with "
            "`mriprep run --force`"
        )
    if array.dtype == np.bool_:
        array = array.view(np.uint8)  # TorchIO holds masks as integers
    return torch.from_numpy(np.array(array)[None]), affine


def _require_torchio(caller: str):
    try:
        import torchio
    except ImportError as error:
        raise ImportError(
            f"{caller} needs TorchIO: pip install torchio (or mriprep's 'interop' extra)"
        ) from error
    return torchio
