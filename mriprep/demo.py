"""The demo cohort: real anatomy (MNI152 from nilearn), known transforms, planted defects.

Every subject is the MNI152 2009 1 mm T1 moved by a known random rigid transform (up to
±10° and ±10 mm), sampled onto its own grid (1 mm isotropic or thick-slice anisotropic),
with a smooth multiplicative bias field and Rician noise, plus a CSF/GM/WM label map from
nilearn's tissue maps. Some subjects carry planted defects that real scanners produce.
``ground_truth.json`` records, for every subject, its transform and each defect's exact
location, so every stage downstream can be scored against the truth instead of eyeballed.

The cohort is fully determined by ``seed``: the same call writes the same bytes.

Ground truth format (``ground_truth.json``)::

    {"template": "mni152", "seed": 0,
     "subjects": {"sub-01": {
         "image": "images/sub-01_T1w.nii.gz", "label": "labels/sub-01_dseg.nii.gz",
         "split": "train", "spacing": [1, 1, 3], "shape": [...], "affine": 4x4,
         "template_to_subject": 4x4,   # template RAS mm -> subject RAS mm
         "defects": [{"kind": "nan_blob", ...}, ...],
         "expected": "cached" | "fail"}}}

Defect kinds; voxel indices refer to the image file as written:
``nan_blob`` {center_ijk, n_voxels}; ``extreme_values`` {values, ijk} (file stored as
float64 so that 1e308 survives); ``zero_slab`` {axis, slices}; ``spike_slice`` and
``dropout_slice`` {axis, index, factor}; ``dead_volume`` (constant image);
``truncated_file`` (gzip stream cut in half); ``leak`` {copy_of} (the same bytes as another
subject, under a new id, in another split).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from scipy import ndimage

# Subject recipes, in order. A cohort of n subjects takes the first n (cycling through
# the clean recipes past the end), so that small test cohorts still hold the defects
# that matter most. "fail" marks a subject that must be reported, never cached.
_RECIPES: list[dict[str, Any]] = [
    {"spacing": (1.0, 1.0, 1.0), "split": "train", "defects": []},
    {"spacing": (1.0, 1.0, 3.0), "split": "train", "defects": ["nan_blob"]},
    {"spacing": (1.0, 1.0, 1.0), "split": "train", "defects": ["extreme_values"]},
    {"spacing": (1.0, 1.0, 3.0), "split": "train", "defects": ["spike_slice", "dropout_slice"]},
    {"spacing": (1.0, 1.0, 1.0), "split": "train", "defects": ["zero_slab"]},
    {"spacing": (0.9, 0.9, 5.0), "split": "val", "defects": []},
    {"spacing": (1.0, 1.0, 1.0), "split": "val", "defects": ["flipped_storage"]},
    {"spacing": (0.9, 0.9, 5.0), "split": "test", "defects": ["dropout_slice"]},
    {"spacing": (1.0, 1.0, 1.0), "split": "train", "defects": ["dead_volume"]},
    {"spacing": (1.0, 1.0, 3.0), "split": "train", "defects": ["truncated_file"]},
    {"spacing": (1.0, 1.0, 1.0), "split": "test", "defects": ["leak"]},
    {"spacing": (1.0, 1.0, 3.0), "split": "test", "defects": ["spike_slice"]},
]
_CLEAN_SPACINGS = [(1.0, 1.0, 1.0), (1.0, 1.0, 3.0), (0.9, 0.9, 5.0)]
_FAILING = {"dead_volume", "truncated_file"}

MAX_ROTATION_DEG = 10.0
MAX_TRANSLATION_MM = 10.0
WM_INTENSITY = 1000.0  # template intensities are scaled so that white matter is ~1000
NOISE_SIGMA = 15.0  # Rician noise: SNR ~ 65 in white matter, typical of a 3T T1
BIAS_AMPLITUDE = 0.15  # multiplicative field within about ±15%


@dataclass(frozen=True)
class DemoCohort:
    """A built demo cohort: its folder, manifest path and ground truth."""

    root: Path
    manifest: Path
    truth: dict[str, Any]

    @property
    def subjects(self) -> dict[str, dict[str, Any]]:
        return self.truth["subjects"]

    def image_path(self, subject_id: str) -> Path:
        return self.root / self.subjects[subject_id]["image"]


def load_demo_cohort(root: str | Path) -> DemoCohort:
    """Open a cohort previously written by :func:`build_demo_cohort`."""
    root = Path(root)
    truth = json.loads((root / "ground_truth.json").read_text())
    return DemoCohort(root=root, manifest=root / "cohort.csv", truth=truth)


def build_demo_cohort(root: str | Path, n_subjects: int = 12, seed: int = 0) -> DemoCohort:
    """Write a demo cohort of ``n_subjects`` into ``root`` and return it.

    Writes ``images/``, ``labels/``, ``cohort.csv`` (the manifest) and
    ``ground_truth.json``. Deterministic in ``seed``.
    """
    if n_subjects < 1:
        raise ValueError(f"n_subjects must be at least 1, got {n_subjects}")
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "labels").mkdir(parents=True, exist_ok=True)
    anatomy = _template_anatomy()
    width = max(2, len(str(n_subjects)))

    subjects: dict[str, dict[str, Any]] = {}
    written: dict[str, tuple[Path, Path]] = {}
    for index in range(n_subjects):
        recipe = _recipe(index)
        subject_id = f"sub-{index + 1:0{width}d}"
        # Each subject draws from its own stream so that adding defects to one recipe
        # does not move every later subject's transform.
        sub_rng = np.random.default_rng([seed, index])
        subjects[subject_id] = _write_subject(
            root, subject_id, recipe, anatomy, sub_rng, written, subjects
        )

    truth_doc = {"template": "mni152", "seed": seed, "subjects": subjects}
    (root / "ground_truth.json").write_text(json.dumps(truth_doc, indent=1))
    manifest = root / "cohort.csv"
    with open(manifest, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["subject_id", "image", "label", "split", "session_id"])
        for subject_id, t in subjects.items():
            writer.writerow([subject_id, t["image"], t["label"], t["split"], ""])
    return DemoCohort(root=root, manifest=manifest, truth=truth_doc)


def _recipe(index: int) -> dict[str, Any]:
    if index < len(_RECIPES):
        return _RECIPES[index]
    spacing = _CLEAN_SPACINGS[index % len(_CLEAN_SPACINGS)]
    split = ("train", "train", "train", "val", "test")[index % 5]
    return {"spacing": spacing, "split": split, "defects": []}


@dataclass(frozen=True)
class _Anatomy:
    t1: np.ndarray  # float32, WM ~ WM_INTENSITY
    labels: np.ndarray  # uint8: 0 background, 1 CSF, 2 GM, 3 WM
    affine: np.ndarray


def _template_anatomy() -> _Anatomy:
    from nilearn.datasets import load_mni152_brain_mask

    from mriprep.templates import load_mni152_tissue, load_template

    template = load_template("mni152")
    tissue = load_mni152_tissue()
    brain = np.asarray(load_mni152_brain_mask(resolution=1).get_fdata()) > 0.5
    gm, wm = tissue["gm"], tissue["wm"]
    labels = np.zeros(template.shape, dtype=np.uint8)
    labels[brain] = 1
    labels[brain & (gm >= 0.5) & (gm >= wm)] = 2
    labels[brain & (wm >= 0.5) & (wm > gm)] = 3
    wm_level = float(np.median(template.data[labels == 3]))
    t1 = (template.data * (WM_INTENSITY / wm_level)).astype(np.float32)
    return _Anatomy(t1=t1, labels=labels, affine=template.affine)


def random_rigid(rng: np.random.Generator) -> np.ndarray:
    """A random rigid 4x4 (RAS mm): rotations within ±10°, translations within ±10 mm."""
    from mriprep.registration.geometry import rigid_matrix

    angles = rng.uniform(-MAX_ROTATION_DEG, MAX_ROTATION_DEG, size=3)
    translation = rng.uniform(-MAX_TRANSLATION_MM, MAX_TRANSLATION_MM, size=3)
    return rigid_matrix(angles, translation)


def _subject_grid(anatomy: _Anatomy, template_to_subject: np.ndarray, spacing) -> tuple:
    """A RAS grid with ``spacing`` that covers the moved template's head."""
    head = np.argwhere(anatomy.t1 > 0.02 * WM_INTENSITY)
    lo, hi = head.min(axis=0) - 4, head.max(axis=0) + 4
    corners = np.array([[x, y, z, 1.0] for x in (lo[0], hi[0]) for y in (lo[1], hi[1])
                        for z in (lo[2], hi[2])])
    world = (template_to_subject @ anatomy.affine @ corners.T).T[:, :3]
    spacing = np.asarray(spacing, dtype=float)
    start, stop = world.min(axis=0), world.max(axis=0)
    shape = np.ceil((stop - start) / spacing).astype(int) + 1
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = start
    return tuple(int(s) for s in shape), affine


def _sample(array, anatomy: _Anatomy, template_to_subject, shape, affine, order) -> np.ndarray:
    """Sample a template-grid array on a subject grid (pull-back through the transform)."""
    subject_vox_to_template_vox = (
        np.linalg.inv(anatomy.affine) @ np.linalg.inv(template_to_subject) @ affine
    )
    return ndimage.affine_transform(
        array,
        subject_vox_to_template_vox[:3, :3],
        offset=subject_vox_to_template_vox[:3, 3],
        output_shape=shape,
        order=order,
        mode="constant",
        cval=0.0,
    )


def _bias_field(shape, rng: np.random.Generator) -> np.ndarray:
    """A smooth multiplicative field: exp of a random quadratic in normalised coordinates."""
    axes = [np.linspace(-1, 1, n, dtype=np.float32) for n in shape]
    x, y, z = np.meshgrid(*axes, indexing="ij", sparse=True)
    c = rng.uniform(-1, 1, size=9).astype(np.float32) * (BIAS_AMPLITUDE / 3)
    log_field = c[0] * x + c[1] * y + c[2] * z + c[3] * x * y + c[4] * y * z + c[5] * x * z
    log_field = log_field + c[6] * x**2 + c[7] * y**2 + c[8] * z**2
    return np.exp(log_field).astype(np.float32)


def _rician(clean: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    real = clean + rng.normal(0.0, NOISE_SIGMA, clean.shape).astype(np.float32)
    imag = rng.normal(0.0, NOISE_SIGMA, clean.shape).astype(np.float32)
    return np.sqrt(real * real + imag * imag)


def _brain_point(labels: np.ndarray, rng: np.random.Generator, margin: int) -> np.ndarray:
    """A random voxel deep inside the brain (at least ``margin`` voxels from its edge)."""
    deep = ndimage.binary_erosion(labels >= 2, iterations=margin)
    candidates = np.argwhere(deep if deep.any() else labels >= 2)
    return candidates[rng.integers(len(candidates))]


def _brain_slices(labels: np.ndarray, axis: int) -> np.ndarray:
    """Indices of slices along ``axis`` whose brain content is substantial (middle 60%)."""
    brain_per_slice = (labels >= 2).sum(axis=tuple(a for a in range(3) if a != axis))
    inside = np.flatnonzero(brain_per_slice > 0)
    lo, hi = inside.min(), inside.max()
    span = hi - lo
    return np.arange(lo + int(0.2 * span), hi - int(0.2 * span) + 1)


def _write_subject(root, subject_id, recipe, anatomy, rng, written, done) -> dict[str, Any]:
    """Write one subject's image and label; return its ground truth.

    ``written`` maps already written subjects to their files and ``done`` to their truth,
    so that a leak can copy an earlier subject byte for byte.
    """
    template_to_subject = random_rigid(rng)
    shape, affine = _subject_grid(anatomy, template_to_subject, recipe["spacing"])
    clean = _sample(anatomy.t1, anatomy, template_to_subject, shape, affine, order=1)
    labels = _sample(anatomy.labels, anatomy, template_to_subject, shape, affine, order=0)
    data = _rician(clean * _bias_field(shape, rng), rng).astype(np.float32)
    labels = labels.astype(np.int16)

    defects: list[dict[str, Any]] = []
    storage_dtype = np.float32
    thick_axis = int(np.argmax(recipe["spacing"]))
    used_slices: set[int] = set()
    for kind in recipe["defects"]:
        if kind == "nan_blob":
            center = _brain_point(labels, rng, margin=6)
            ball = _ball_mask(shape, center, radius_mm=7.0, spacing=recipe["spacing"])
            data[ball] = np.nan
            defects.append({"kind": kind, "center_ijk": center.tolist(),
                            "n_voxels": int(ball.sum())})
        elif kind == "extreme_values":
            values = [1e30, 1e308, -1e30, 1e30, 1e308]
            ijk = [_brain_point(labels, rng, margin=3).tolist() for _ in values]
            storage_dtype = np.float64  # 1e308 does not fit float32
            data = data.astype(np.float64)
            for v, (i, j, k) in zip(values, ijk):
                data[i, j, k] = v
            defects.append({"kind": kind, "values": values, "ijk": ijk})
        elif kind == "zero_slab":
            candidates = _brain_slices(labels, thick_axis)
            start = int(candidates[len(candidates) * 2 // 3])
            slices = list(range(start, start + 6))
            _slab(data, thick_axis, slices)[...] = 0.0
            defects.append({"kind": kind, "axis": thick_axis, "slices": slices})
        elif kind in ("spike_slice", "dropout_slice"):
            factor = 4.0 if kind == "spike_slice" else 0.5
            candidates = [int(c) for c in _brain_slices(labels, thick_axis)
                          if all(abs(int(c) - u) > 2 for u in used_slices)]
            index = candidates[int(rng.integers(len(candidates)))]
            used_slices.add(index)
            _slab(data, thick_axis, [index])[...] *= factor
            defects.append({"kind": kind, "axis": thick_axis, "index": index,
                            "factor": factor})
        elif kind == "dead_volume":
            data = np.full(shape, 100.0, dtype=np.float32)
            defects.append({"kind": kind})
        elif kind in ("truncated_file", "leak", "flipped_storage"):
            defects.append({"kind": kind})
        else:  # pragma: no cover - recipes are defined above
            raise ValueError(f"unknown defect kind {kind!r}")

    if "flipped_storage" in recipe["defects"]:
        # Stored left-right flipped (LAS): the same anatomy, a non-canonical file.
        flip = np.diag([-1.0, 1.0, 1.0, 1.0])
        flip[0, 3] = shape[0] - 1
        data, labels = data[::-1].copy(), labels[::-1].copy()
        affine = affine @ flip

    image_rel = f"images/{subject_id}_T1w.nii.gz"
    label_rel = f"labels/{subject_id}_dseg.nii.gz"
    leak = next((d for d in defects if d["kind"] == "leak"), None)
    if leak is not None:
        original = next(iter(written))  # the first subject's files, byte for byte
        leak["copy_of"] = original
        source_image, source_label = written[original]
        (root / image_rel).write_bytes(source_image.read_bytes())
        (root / label_rel).write_bytes(source_label.read_bytes())
        truth = json.loads(json.dumps(done[original]))
        truth.update(split=recipe["split"], image=image_rel, label=label_rel,
                     defects=defects, expected="cached")
        return truth

    _save(data.astype(storage_dtype, copy=False), affine, root / image_rel)
    _save(labels, affine, root / label_rel)
    if any(d["kind"] == "truncated_file" for d in defects):
        path = root / image_rel
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
    written[subject_id] = (root / image_rel, root / label_rel)

    truth = {
        "image": image_rel,
        "label": label_rel,
        "split": recipe["split"],
        "spacing": [float(s) for s in recipe["spacing"]],
        "shape": list(shape),
        "affine": affine.tolist(),
        "template_to_subject": template_to_subject.tolist(),
        "defects": defects,
        "expected": "fail" if set(recipe["defects"]) & _FAILING else "cached",
    }
    return truth


def _slab(data: np.ndarray, axis: int, indices) -> np.ndarray:
    index = [slice(None)] * 3
    index[axis] = slice(min(indices), max(indices) + 1)
    return data[tuple(index)]


def _ball_mask(shape, center, radius_mm: float, spacing) -> np.ndarray:
    grids = np.ogrid[tuple(slice(0, n) for n in shape)]
    dist2 = sum(((g - c) * s) ** 2 for g, c, s in zip(grids, center, spacing))
    return dist2 <= radius_mm**2


def _save(array: np.ndarray, affine: np.ndarray, path: Path) -> None:
    img = nib.Nifti1Image(array, affine)
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    if np.issubdtype(array.dtype, np.integer):
        img.set_data_dtype(np.int16)
    nib.save(img, path)
