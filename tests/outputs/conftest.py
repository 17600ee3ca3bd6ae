"""Fixtures of the outputs tests: a tiny hand-made cache (fast: no pipeline runs) and a
conform_1mm cache of two demo subjects (the default pipeline's is ``demo_cache``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from mriprep.cache import Cache, entry_key
from mriprep.core.hashing import sha256_file
from tests.built_once import built_once

PIPELINE_HASH = "f" * 64


def rotation(axis: int, degrees: float) -> np.ndarray:
    a = np.deg2rad(degrees)
    c, s = np.cos(a), np.sin(a)
    i, j = [k for k in range(3) if k != axis]
    out = np.eye(4)
    out[i, i], out[i, j], out[j, i], out[j, j] = c, -s, s, c
    return out


@dataclass(frozen=True)
class TinySubject:
    subject_id: str
    key: str
    native: Path  # the native scan (NIfTI)
    native_affine: np.ndarray
    native_shape: tuple[int, int, int]
    template_to_subject: np.ndarray | None


@dataclass(frozen=True)
class TinyCache:
    """A cache folder with two registered subjects on one small oblique, permuted grid:
    sub-a (native 1.2 x 1.0 x 2.0 mm, rotated) and sub-b (1 mm, other pose)."""

    root: Path
    cache: Cache
    shape: tuple[int, int, int]
    affine: np.ndarray
    subjects: dict[str, TinySubject]


# The cache grid: 1.5 mm, axes stored L-S-P (flipped and permuted), so that a mix-up of
# axes or of a map's direction cannot pass unnoticed.
TINY_SHAPE = (20, 22, 18)
TINY_AFFINE = np.array([[-1.5, 0.0, 0.0, 14.0],
                        [0.0, 0.0, -1.5, 13.0],
                        [0.0, 1.5, 0.0, -16.0],
                        [0.0, 0.0, 0.0, 1.0]])


def _native(root: Path, name: str, shape, spacing, pose: np.ndarray) -> tuple[Path, np.ndarray]:
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = -np.asarray(spacing) * (np.asarray(shape) - 1) / 2  # centred at 0
    affine = pose @ affine
    rng = np.random.default_rng(len(name))
    data = rng.normal(100, 10, shape).astype(np.float32)
    img = nib.Nifti1Image(data, affine)
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=2)  # codes that differ: the output must copy both
    path = root / f"{name}_T1w.nii.gz"
    nib.save(img, path)
    return path, np.asarray(img.affine)


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> TinyCache:
    from mriprep.stages.registration.geometry import itk_transform_text

    root = tmp_path_factory.mktemp("tiny")
    cache = Cache(root / "cache", create=True)
    rng = np.random.default_rng(0)
    specs = {
        "sub-a": ((24, 28, 16), (1.2, 1.0, 2.0), rotation(2, 10.0), rotation(0, 8.0)),
        "sub-b": ((26, 26, 26), (1.0, 1.0, 1.0), rotation(1, -6.0), rotation(2, 5.0)),
    }
    subjects, indexed = {}, []
    for split, (sid, (shape, spacing, pose, turn)) in zip(("train", "test"), specs.items()):
        path, native_affine = _native(root, sid, shape, spacing, pose)
        t2s = turn.copy()
        if sid == "sub-b":  # registered with `transform: affine`: sizes and a shear
            t2s[:3, :3] = t2s[:3, :3] @ np.array([[1.08, 0.04, 0.0], [0.0, 0.93, -0.03],
                                                  [0.02, 0.0, 0.97]])
        t2s[:3, 3] = [2.0, -3.0, 1.0]
        sha = sha256_file(path)
        key = entry_key(sid, "", {"image": sha}, PIPELINE_HASH)
        image = rng.normal(0, 1, TINY_SHAPE).astype(np.float32)
        valid = np.ones(TINY_SHAPE, dtype=bool)
        valid[:2] = False
        label = rng.integers(0, 4, TINY_SHAPE).astype(np.int16)
        meta = {
            "subject_id": sid, "session_id": "", "pipeline_name": "tiny",
            "pipeline_hash": PIPELINE_HASH,
            "inputs": {"image": {"path": str(path), "sha256": sha}},
            "affine": TINY_AFFINE.tolist(), "spacing": [1.5, 1.5, 1.5],
            "shape": list(TINY_SHAPE),
            "provenance": [{"stage": "register", "params": {"template": "mni152"},
                            "metrics": {}, "warnings": [], "seconds": 0.0}],
            "template_to_subject": t2s.tolist(), "transform_file": "transform.tfm",
        }
        entry = cache.write_entry(key, {"image": image, "valid": valid, "label": label}, meta,
                                  extra_files={"transform.tfm": itk_transform_text(t2s)})
        indexed.append(entry.with_split(split))
        subjects[sid] = TinySubject(sid, key, path, native_affine, shape, t2s)
    cache.update_index(indexed)
    return TinyCache(root / "cache", cache, TINY_SHAPE, TINY_AFFINE, subjects)


@pytest.fixture(scope="session")
def conform_cache(demo_cohort, tmp_path_factory) -> Cache:
    """sub-01 (1 mm) and sub-06 (0.9 x 0.9 x 5 mm, oblique) of the demo cohort through
    ``conform_1mm``: no registration, an axis-aligned 256^3 LIA grid (a few seconds)."""
    from mriprep.pipelines import load_pipeline
    from mriprep.run.cohort import cohort_rows, run_cohort

    def build(folder: Path) -> Path:
        rows = [r for r in cohort_rows(demo_cohort.manifest)
                if r.subject_id in ("sub-01", "sub-06") and not r.session_id]
        run = run_cohort(rows, folder / "cache", load_pipeline("conform_1mm"),
                         scheduler="sync", report=False)
        assert run.count("cached") == 2, run.failed
        return folder / "cache"

    return Cache(built_once(tmp_path_factory, "conform_cache", build))
