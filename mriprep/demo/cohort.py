"""The demo cohort: people who are not the template, scanned with known truth.

Every subject is a synthetic person (:mod:`mriprep.demo.anatomy`: MNI152 warped
nonlinearly by several mm, rescaled, with its own tissue contrast and a synthesized
scalp, skull and neck) scanned by :mod:`mriprep.demo.scanner` in a known random pose, on
its own grid (1 mm, thick axial, coronal or sagittal slices, oblique, stored backwards),
with a bias field and Rician noise, plus a CSF/GM/WM label map. No subject is a copy of
the registration template, so every figure the demo scores holds for other people.

Some subjects carry planted defects that real scanners produce; some are failures the
pipeline must refuse, with the cause it must name; one person is scanned twice, so that
registration is scored as consistency across the known motion between the sessions, as
well as against the known rigid part of each person's warp. ``ground_truth.json``
records all of it.

The cohort is fully determined by ``seed``: the same call writes the same bytes.

Ground truth format (``ground_truth.json``)::

    {"template": "mni152", "seed": 0,
     "subjects": {"sub-01": {
         "subject_id": "sub-01", "session_id": "", "person": "person-1001",
         "image": "images/sub-01_T1w.nii.gz", "label": "labels/sub-01_dseg.nii.gz",
         "split": "train", "spacing": [1, 1, 3], "slicing": "axial", "tilt_deg": 0,
         "shape": [...], "affine": 4x4,
         "template_to_subject": 4x4,   # template RAS mm -> subject RAS mm (or null)
         "defects": [{"kind": "nan_blob", ...}, ...],
         "expected": "cached" | "fail", "expected_causes": [...]}}}

The keys of ``subjects`` are scan names (``sub-01``, ``sub-01_ses-2``); each entry says
its manifest subject and session. Defect kinds; voxel indices refer to the image file as
written: ``nan_blob`` {center_ijk, n_voxels}; ``extreme_values`` {values, ijk} (file
stored as float64 so that 1e308 survives); ``zero_slab`` {axis, slices}; ``spike_slice``
and ``dropout_slice`` {axis, index, factor}; ``flipped_storage`` (voxels stored in a
non-RAS order); ``dead_volume`` (constant image); ``truncated_file`` (gzip stream cut in
half); ``leak`` {copy_of} (the same bytes as another subject, under a new id, in another
split); ``rescan`` {of} (the same person as another scan, in another pose and grid);
``header_rotated`` {degrees, about} (the affine turned about the image centre);
``not_t1`` (a T2-like contrast); ``partial_fov`` {thickness_mm} (a slab of the head).
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from scipy import ndimage

from mriprep.demo.calibration import HEADER_ERRORS, person, slab_of, wrong_header
from mriprep.demo.scanner import Acquisition, acquire, random_pose
from mriprep.run.worker_setup import configure_worker

_ISO = Acquisition()
_AX3 = Acquisition((1.0, 1.0, 3.0), "axial")
_AX5_OBLIQUE = Acquisition((0.9, 0.9, 5.0), "axial", tilt_deg=20.0)
_COR3 = Acquisition((1.0, 1.0, 3.0), "coronal")
_COR5_LPS = Acquisition((0.9, 0.9, 5.0), "coronal", flips=(True, False, True))
_SAG1 = Acquisition((1.0, 1.0, 1.0), "sagittal")
_SAG3_VERTEX = Acquisition((1.0, 1.0, 3.0), "sagittal", vertex_margin_mm=-4.0)
_LAS = Acquisition(flips=(True, False, False))
_AX3_TILT = Acquisition((1.0, 1.0, 3.0), "axial", tilt_deg=15.0, coverage_mm=200.0)


@dataclass(frozen=True)
class _Recipe:
    """One scan of the cohort: who, how, into which split, with what planted."""

    person: int  # scans with the same number show the same person
    acquisition: Acquisition
    split: str
    defects: tuple[str, ...] = ()
    session: str = ""
    contrast: str = "t1"


# Subject recipes, in order. A cohort of n scans takes the first n (cycling through the
# clean recipes past the end), so that small test cohorts still hold the defects that
# matter most. Failures are "fail": they must be reported with their cause, never cached.
_RECIPES: list[_Recipe] = [
    _Recipe(1, _ISO, "train"),
    _Recipe(2, _AX3, "train", ("nan_blob",)),
    _Recipe(3, _SAG1, "train", ("extreme_values",)),
    _Recipe(4, _COR3, "train", ("spike_slice", "dropout_slice")),
    _Recipe(5, _ISO, "train", ("zero_slab",)),
    _Recipe(6, _AX5_OBLIQUE, "val"),
    _Recipe(7, _LAS, "val", ("flipped_storage",)),
    _Recipe(8, _COR5_LPS, "test", ("dropout_slice",)),
    _Recipe(9, _ISO, "train", ("dead_volume",)),
    _Recipe(10, _AX3, "train", ("truncated_file",)),
    _Recipe(1, _ISO, "test", ("leak",)),
    _Recipe(12, _SAG3_VERTEX, "test", ("spike_slice",)),
    _Recipe(1, _AX3_TILT, "train", ("rescan",), session="ses-2"),
    _Recipe(14, _ISO, "train", ("header_rotated",)),
    _Recipe(15, _COR3, "train", ("not_t1",), contrast="t2"),
    _Recipe(16, _ISO, "val", ("partial_fov",)),
]
_CLEAN_ACQUISITIONS = [_ISO, _AX3, _AX5_OBLIQUE, _COR3, _SAG3_VERTEX]
DEFAULT_SUBJECTS = len(_RECIPES)

# Defects that make a scan unservable, and the refusal causes that name them correctly:
# what the failing stage declares its refusals name (registration's checks, or the input
# plausibility checks, which a slab meets first), whichever stage refuses.
_FAILING: dict[str, tuple[str, ...]] = {
    "dead_volume": (),
    "truncated_file": (),
    "header_rotated": ("orientation",),
    "not_t1": ("not_t1", "no_brain"),
    "partial_fov": ("head_size", "field_of_view"),
}

MAX_ROTATION_DEG = 10.0
MAX_TRANSLATION_MM = 10.0
# The header error of "header_rotated": a quarter turn about left-right, the error a
# converter makes when it takes a sagittal series for an axial one.
HEADER_ERROR = "rot90_lr"
PARTIAL_FOV_MM = 40.0


@dataclass(frozen=True)
class DemoCohort:
    """A built demo cohort: its folder, manifest path and ground truth."""

    root: Path
    manifest: Path
    truth: dict[str, Any]

    @property
    def subjects(self) -> dict[str, dict[str, Any]]:
        """Ground truth per scan name (``sub-01``, ``sub-01_ses-2``)."""
        return self.truth["subjects"]

    def image_path(self, name: str) -> Path:
        return self.root / self.subjects[name]["image"]


def load_demo_cohort(root: str | Path) -> DemoCohort:
    """Open a cohort previously written by :func:`build_demo_cohort`."""
    root = Path(root)
    truth = json.loads((root / "ground_truth.json").read_text())
    return DemoCohort(root=root, manifest=root / "cohort.csv", truth=truth)


def build_demo_cohort(root: str | Path, n_subjects: int = DEFAULT_SUBJECTS,
                      seed: int = 0, workers: int | None = None) -> DemoCohort:
    """Write a demo cohort of ``n_subjects`` scans into ``root`` and return it.

    Writes ``images/``, ``labels/``, ``cohort.csv`` (the manifest) and
    ``ground_truth.json``. Deterministic in ``seed``, whatever ``workers``. Each person
    takes seconds to build (a nonlinear warp of the 1 mm template; docs/benchmarks.md,
    "Demo data"), so scans are written by ``workers`` processes (default: one per core,
    at most 4).
    """
    if n_subjects < 1:
        raise ValueError(f"n_subjects must be at least 1, got {n_subjects}")
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "labels").mkdir(parents=True, exist_ok=True)
    width = max(2, len(str(n_subjects)))

    # Names first: a rescan joins its person's first subject, a leak copies its files.
    plan: list[tuple[str, str, _Recipe, str | None]] = []
    first_scan: dict[int, tuple[str, str]] = {}  # person -> (scan name, subject id)
    for index in range(n_subjects):
        recipe = _recipe(index)
        if "rescan" in recipe.defects and recipe.person in first_scan:
            subject_id = first_scan[recipe.person][1]
        else:
            subject_id = f"sub-{index + 1:0{width}d}"
        name = f"{subject_id}_{recipe.session}" if recipe.session else subject_id
        plan.append((name, subject_id, recipe, first_scan.get(recipe.person, (None,))[0]))
        if "leak" not in recipe.defects:
            first_scan.setdefault(recipe.person, (name, subject_id))

    # One job per person, so that a person scanned twice is built once.
    jobs: dict[tuple[int, str], list] = {}
    for index, (name, subject_id, recipe, original) in enumerate(plan):
        if "leak" not in recipe.defects:
            jobs.setdefault((recipe.person, recipe.contrast), []).append(
                (root, name, subject_id, recipe, seed, index, original))
    workers = min(4, os.cpu_count() or 1) if workers is None else workers
    if workers > 1 and len(jobs) > 1:
        # Spawned, not forked: the caller may hold threads (torch, dask) a fork would copy.
        # Set up as the run's workers are: a person allocates dozens of head-sized arrays,
        # and freed memory handed back to the kernel is faulted in again page by page.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context,
                                 initializer=configure_worker) as pool:
            done = list(pool.map(_write_person, jobs.values()))
    else:
        done = [_write_person(scans) for scans in jobs.values()]
    written = {name: truth for person_scans in done for name, truth in person_scans.items()}
    scans: dict[str, dict[str, Any]] = {}
    for name, subject_id, recipe, original in plan:
        scans[name] = (written[name] if "leak" not in recipe.defects else
                       _copy_scan(root, name, subject_id, recipe, scans[original], original))

    truth_doc = {"template": "mni152", "seed": seed, "subjects": scans}
    (root / "ground_truth.json").write_text(json.dumps(truth_doc, indent=1))
    manifest = root / "cohort.csv"
    with open(manifest, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["subject_id", "image", "label", "split", "session_id"])
        for t in scans.values():
            writer.writerow([t["subject_id"], t["image"], t["label"], t["split"],
                             t["session_id"]])
    return DemoCohort(root=root, manifest=manifest, truth=truth_doc)


def _write_person(scans: list) -> dict[str, dict[str, Any]]:
    """Build one person and write each of their scans; ground truth per scan name."""
    anatomy = None
    written = {}
    for root, name, subject_id, recipe, seed, index, original in scans:
        if anatomy is None:
            anatomy = _person_of(seed, recipe)
        # Each scan draws from its own stream so that adding defects to one recipe does
        # not move every later scan's pose.
        rng = np.random.default_rng([seed, index])
        written[name] = _write_scan(root, name, subject_id, recipe, anatomy, rng,
                                    first_scan=original)
    return written


def _recipe(index: int) -> _Recipe:
    if index < len(_RECIPES):
        return _RECIPES[index]
    acquisition = _CLEAN_ACQUISITIONS[index % len(_CLEAN_ACQUISITIONS)]
    split = ("train", "train", "train", "val", "test")[index % 5]
    return _Recipe(100 + index, acquisition, split)


def _person_of(seed: int, recipe: _Recipe):
    # Person seeds are apart from the calibration set's (seed * 100 + i) and from the
    # stage tests' person, so the demo never scores what calibration tuned on.
    return person(10_000 * (seed + 1) + recipe.person, recipe.contrast)


def _write_scan(root, name, subject_id, recipe: _Recipe, anatomy, rng, first_scan) -> dict:
    """Scan one person, plant the recipe's defects, write image and label files."""
    pose = random_pose(rng, MAX_ROTATION_DEG, MAX_TRANSLATION_MM)
    scan = acquire(anatomy, pose, recipe.acquisition, rng)
    defects: list[dict[str, Any]] = []
    if "header_rotated" in recipe.defects:
        scan = wrong_header(lambda: scan, HEADER_ERRORS[HEADER_ERROR])
        defects.append({"kind": "header_rotated", "degrees": 90, "about": "left-right"})
    if "partial_fov" in recipe.defects:
        scan = slab_of(lambda: scan, 0.5, PARTIAL_FOV_MM)
        defects.append({"kind": "partial_fov", "thickness_mm": PARTIAL_FOV_MM})
    if "rescan" in recipe.defects:
        defects.append({"kind": "rescan", "of": first_scan})
    data, storage_dtype = scan.data, np.float32
    labels = scan.labels
    slice_axis = 2  # the scanner stores slices along the last axis
    used_slices: set[int] = set()
    for kind in recipe.defects:
        if kind == "nan_blob":
            (center,) = _brain_points(labels, rng, margin=6, count=1)
            ball = _ball_mask(data.shape, center, 7.0, recipe.acquisition.spacing)
            data[ball] = np.nan
            defects.append({"kind": kind, "center_ijk": center.tolist(),
                            "n_voxels": int(ball.sum())})
        elif kind == "extreme_values":
            values = [1e30, 1e308, -1e30, 1e30, 1e308]
            ijk = [p.tolist() for p in _brain_points(labels, rng, margin=3,
                                                     count=len(values))]
            storage_dtype = np.float64  # 1e308 does not fit float32
            data = data.astype(np.float64)
            for v, (i, j, k) in zip(values, ijk):
                data[i, j, k] = v
            defects.append({"kind": kind, "values": values, "ijk": ijk})
        elif kind == "zero_slab":
            candidates = _bulk_slices(labels, slice_axis)
            start = int(candidates[len(candidates) * 2 // 3])
            slices = list(range(start, start + 6))
            data[:, :, start:start + 6] = 0.0
            defects.append({"kind": kind, "axis": slice_axis, "slices": slices})
        elif kind in ("spike_slice", "dropout_slice"):
            factor = 4.0 if kind == "spike_slice" else 0.5
            candidates = [int(c) for c in _bulk_slices(labels, slice_axis)
                          if all(abs(int(c) - u) > 2 for u in used_slices)]
            index = candidates[int(rng.integers(len(candidates)))]
            used_slices.add(index)
            data[:, :, index] *= factor
            defects.append({"kind": kind, "axis": slice_axis, "index": index,
                            "factor": factor})
        elif kind == "dead_volume":
            data = np.full(data.shape, 100.0, dtype=np.float32)
            defects.append({"kind": kind})
        elif kind in ("truncated_file", "flipped_storage", "not_t1"):
            defects.append({"kind": kind})

    image_rel = f"images/{name}_T1w.nii.gz"
    label_rel = f"labels/{name}_dseg.nii.gz"
    _save(data.astype(storage_dtype, copy=False), scan.affine, root / image_rel)
    _save(labels, scan.affine, root / label_rel)
    if "truncated_file" in recipe.defects:
        path = root / image_rel
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])

    causes = sorted({c for d in recipe.defects for c in _FAILING.get(d, ())})
    acq = recipe.acquisition
    return {
        "subject_id": subject_id,
        "session_id": recipe.session,
        "person": anatomy.name,
        "image": image_rel,
        "label": label_rel,
        "split": recipe.split,
        "spacing": [float(s) for s in acq.spacing],
        "slicing": acq.slicing,
        "tilt_deg": float(acq.tilt_deg),
        "shape": list(data.shape),
        "affine": scan.affine.tolist(),
        # Null where the header lies: no transform from the file's frame is right.
        "template_to_subject": (None if scan.template_to_subject is None
                                else scan.template_to_subject.tolist()),
        "defects": defects,
        "expected": "fail" if set(recipe.defects) & set(_FAILING) else "cached",
        "expected_causes": causes,
    }


def _copy_scan(root, name, subject_id, recipe: _Recipe, original: dict, original_name) -> dict:
    """A leak: the original scan's files byte for byte, under a new id and split."""
    image_rel = f"images/{name}_T1w.nii.gz"
    label_rel = f"labels/{name}_dseg.nii.gz"
    (root / image_rel).write_bytes((root / original["image"]).read_bytes())
    (root / label_rel).write_bytes((root / original["label"]).read_bytes())
    truth = json.loads(json.dumps(original))
    truth.update(subject_id=subject_id, session_id=recipe.session, split=recipe.split,
                 image=image_rel, label=label_rel, expected="cached", expected_causes=[],
                 defects=[{"kind": "leak", "copy_of": original_name}])
    return truth


def _brain_points(labels: np.ndarray, rng: np.random.Generator, margin: int,
                  count: int) -> list[np.ndarray]:
    """``count`` random voxels deep inside the brain (at least ``margin`` voxels from its
    edge), drawn independently."""
    deep = ndimage.binary_erosion(labels >= 2, iterations=margin)
    candidates = np.argwhere(deep if deep.any() else labels >= 2)
    return [candidates[rng.integers(len(candidates))] for _ in range(count)]


def _bulk_slices(labels: np.ndarray, axis: int) -> np.ndarray:
    """Indices of slices along ``axis`` through the bulk of the brain: the middle half
    of the slices that hold brain (where a defect is certain to matter)."""
    brain_per_slice = (labels >= 2).sum(axis=tuple(a for a in range(3) if a != axis))
    inside = np.flatnonzero(brain_per_slice > 0)
    lo, hi = inside.min(), inside.max()
    span = hi - lo
    return np.arange(lo + int(0.25 * span), hi - int(0.25 * span) + 1)


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

