"""Caches built from the MNI152 template for the training tests.

:func:`build_template_cache` writes them with the cache API directly, from the template
downsampled to 4 mm and tissue labels thresholded from nilearn's GM/WM maps;
:func:`adopt_entry` copies an entry of one such cache into another. The fixture that
builds the shared cache is ``cache_dir`` in ``conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mriprep.cache import Cache, entry_key
from mriprep.inputs.templates import load_mni152_tissue, load_template

STEP = 4  # 197x233x189 at 1 mm -> 50x59x48 at 4 mm


def template_subject(index: int, step: int = STEP) -> dict[str, np.ndarray]:
    """One subject from the template: image, valid mask, tissue labels (0 bg, 1 GM, 2 WM).

    Subjects differ by an intensity gain and noise; each has one zero-filled, masked axial
    slice (its index depends on the subject) and a few scattered invalid voxels, as the
    sanitize and mask-slices stages leave them.
    """
    template = load_template("mni152")
    tissue = load_mni152_tissue()
    sub = (slice(None, None, step),) * 3
    rng = np.random.default_rng(index)
    image = template.data[sub] * (1 + 0.05 * index) + rng.normal(0, 2, template.data[sub].shape)
    label = np.zeros(image.shape, dtype=np.int16)
    label[tissue["gm"][sub] > 0.5] = 1
    label[tissue["wm"][sub] > 0.5] = 2
    valid = np.ones(image.shape, dtype=bool)
    masked = image.shape[2] // 3 + index
    valid[:, :, masked] = False
    image[:, :, masked] = 0
    specks = tuple(rng.integers(0, n, 40) for n in image.shape)
    valid[specks] = False
    affine = template.affine.copy()
    affine[:3, :3] *= step
    return {
        "image": np.ascontiguousarray(image, dtype=np.float32),
        "valid": np.ascontiguousarray(valid),
        "label": np.ascontiguousarray(label),
        "affine": affine,
    }


def build_template_cache(
    root: Path,
    splits: dict[str, int] = {"train": 4, "val": 2},
    pipeline_hash: str = "a" * 64,
    labels: bool = True,
    step: int = STEP,
    first: int = 0,
    session: str = "",
    image_dtype: str = "float32",
    compression: str | dict[str, str] = "none",
) -> Path:
    """A cache of template-derived subjects, ``n`` per split, written with the cache API.

    Subjects are numbered from ``first`` (``sub-00``, ``sub-01``, ...) across the splits,
    each with session ``session``; images are stored as ``image_dtype``, every tensor with
    ``compression``.
    """
    cache = Cache(root, create=True)
    entries = []
    number = first
    for split, count in splits.items():
        for _ in range(count):
            subject = template_subject(number, step)
            sid = f"sub-{number:02d}"
            meta = {
                "subject_id": sid,
                "session_id": session,
                "pipeline_name": "test",
                "pipeline_hash": pipeline_hash,
                "inputs": {"t1w": {"path": f"{sid}.nii.gz", "sha256": f"{number:064x}"}},
                "affine": subject["affine"].tolist(),
                "spacing": [float(step)] * 3,
                "shape": list(subject["image"].shape),
                "provenance": [],
            }
            names = ("image", "valid", "label") if labels else ("image", "valid")
            tensors = {k: subject[k] for k in names}
            tensors["image"] = tensors["image"].astype(image_dtype)
            key = entry_key(sid, session, {"t1w": f"{number:064x}"}, pipeline_hash)
            entries.append(cache.write_entry(key, tensors, meta, compression=compression)
                           .with_split(split))
            number += 1
    cache.update_index(entries)
    return Path(root)


def adopt_entry(source: Path, target: Path) -> None:
    """Copy the first entry of ``source`` into ``target`` and index it, as a stray rerun would."""
    src, dst = Cache(source), Cache(target)
    ref = src.entries()[0]
    dst.entry_dir(ref.key).mkdir()
    for f in src.entry_dir(ref.key).iterdir():
        (dst.entry_dir(ref.key) / f.name).write_bytes(f.read_bytes())
    dst.update_index([ref])
