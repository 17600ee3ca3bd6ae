"""Small conformed-like caches with FreeSurfer-numbered labels for the FastSurfer tests.

Subjects come from the MNI152 template at 3 mm (tissue from nilearn's GM/WM maps, split
into FreeSurfer numbers by :mod:`mriprep.demo.freesurfer_labels`), turned into LIA voxel
order as ``conform_1mm`` stores them, padded to a cube, with uint8 intensities. Each
subject differs by a shift and a gain, so that no two are equal.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np

from mriprep.cache import Cache, entry_key
from mriprep.demo.freesurfer_labels import freesurfer_labels
from mriprep.inputs.templates import load_template
from nibabel.affines import apply_affine

STEP = 3
SIZE = 72


def _to_lia_cube(ras: np.ndarray, size: int = SIZE) -> np.ndarray:
    lia = np.flip(ras, (0, 2)).transpose(0, 2, 1)
    out = np.zeros((size,) * 3, dtype=ras.dtype)
    sl = tuple(slice(0, min(n, size)) for n in lia.shape)
    out[sl] = lia[sl]
    return out


@functools.lru_cache(maxsize=1)
def _base() -> tuple[np.ndarray, np.ndarray]:
    template = load_template("mni152")
    sub = (slice(None, None, STEP),) * 3
    data = template.data[sub]
    affine = template.affine.copy()
    affine[:3, :3] *= STEP
    # Tissue by intensity inside an ellipsoid around the brain: nilearn's tissue maps
    # would cost seconds to load, and the test needs FreeSurfer numbers, not anatomy.
    xyz = apply_affine(affine, np.indices(data.shape).reshape(3, -1).T).reshape(
        data.shape + (3,))
    inside = (((xyz - (0, -18, 15)) / (70, 90, 72)) ** 2).sum(-1) < 1
    rel = data / data.max()
    t = np.zeros(data.shape, dtype=np.uint8)
    t[inside & (rel > 0.3)] = 1
    t[inside & (rel > 0.55)] = 2
    t[inside & (rel > 0.78)] = 3
    labels = freesurfer_labels(t, affine)
    image = np.clip(data / data.max() * 230, 0, 255)
    return _to_lia_cube(image.astype(np.float32)), _to_lia_cube(labels)


def subject(index: int) -> dict[str, np.ndarray]:
    image, labels = _base()
    shift = (index % 3, (index // 3) % 2, 0)
    image = np.roll(image * (1 + 0.04 * index), shift, axis=(0, 1, 2))
    labels = np.roll(labels, shift, axis=(0, 1, 2))
    return {"image": np.clip(np.rint(image), 0, 255).astype(np.uint8),
            "valid": np.ones(image.shape, dtype=bool),
            "label": labels.astype(np.int16)}


def finer(tensors: dict[str, np.ndarray], zoom: float) -> dict[str, np.ndarray]:
    """A subject's tensors on a grid ``zoom`` times finer (a sub-millimetre scan as
    ``conform_min`` caches it: a larger cube of smaller voxels)."""
    from scipy.ndimage import zoom as rescale

    return {"image": rescale(tensors["image"], zoom, order=1),
            "valid": rescale(tensors["valid"], zoom, order=0),
            "label": rescale(tensors["label"], zoom, order=0)}


def write_cache(root: Path, count: int = 3, split: str = "train",
                edit=None, spacing=None) -> Path:
    """A cache of ``count`` subjects; ``edit(index, tensors)`` may change one's tensors;
    ``spacing(index)`` gives a subject's voxel size (default 1 mm): a finer one is
    cached on a larger cube (:func:`finer`), as ``conform_min`` caches it."""
    cache = Cache(root, create=True)
    entries = []
    for i in range(count):
        tensors = subject(i)
        size = 1.0 if spacing is None else spacing(i)
        if size != 1.0:
            tensors = finer(tensors, 1.0 / size)
        if edit is not None:
            edit(i, tensors)
        sid = f"sub-{i:02d}"
        affine = np.diag([-1.0, 1, 1, 1])[[0, 2, 1, 3]]
        affine[:3, :3] *= size
        meta = {"subject_id": sid, "session_id": "", "pipeline_name": "conform_1mm",
                "pipeline_hash": "f" * 64,
                "inputs": {"t1w": {"path": f"{sid}.nii.gz", "sha256": f"{i:064x}"}},
                "affine": affine.tolist(), "spacing": [size] * 3,
                "shape": list(tensors["image"].shape), "provenance": []}
        key = entry_key(sid, "", {"t1w": f"{i:064x}"}, "f" * 64)
        entries.append(cache.write_entry(key, tensors, meta).with_split(split))
    cache.update_index(entries)
    return Path(root)


@functools.lru_cache(maxsize=1)
def shared_cache() -> Path:
    """One cache for every test module of a process (read only: do not change it),
    deleted when the process ends."""
    folder = Path(tempfile.mkdtemp(prefix="fs-cache-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return write_cache(folder / "c")
