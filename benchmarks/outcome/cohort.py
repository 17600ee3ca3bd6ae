"""The outcome bench's cohort: FreeSurfer-numbered people, a clean copy and a dirty one.

People are synthetic (:func:`mriprep.demo.calibration.person`, the template warped, each
a different anatomy) labelled by :func:`mriprep.demo.freesurfer_labels.freesurfer_labels`
in their own space, the cortical parcels joined into cortex as FreeSurfer's ``aseg.mgz``
holds them (:func:`aseg_of`), and scanned in a random pose, as :mod:`mriprep.demo.freesurfer_cohort`
does. The split is by subject: :data:`TRAIN` people train, :data:`VAL` validate,
:data:`TEST` measure the model. The test scans stay clean.

The dirty copy of the training and validation scans carries the defects of real cohorts,
one recipe per scan (:data:`DEFECTS`, printed by the bench):

* a metal-like cluster of 1e308 voxels (stored float64: float32 cannot hold it) in one
  scan of 7, and 1e30 clusters in two;
* NaN blobs in two scans of 7;
* zero-filled slices (a slab of 4) in one scan, and missing slices (NaN, as a scanner
  that wrote nothing leaves them) in one;
* 1x1x2 and 1x1x3 mm anisotropic acquisitions, one scan each;
* a wrong-orientation header (anterior and posterior swapped, image and labels alike) in
  one scan;
* posterior-fossa susceptibility artifacts over the cerebellum (signal loss with a bright
  fringe) in two of the 6 training scans, the third reported for real cohorts;
* one person under two ids: training person 5, whose scan every arm can use (it carries
  no defect), is scanned again, clean, and joins the test split as ``sub-test-leak``.

The defects are the image's: every label map is the true anatomy sampled on its own
scan's grid (nearest neighbour), so a thick scan's map is stair-stepped, as a map made on
that scan would be.
"""

from __future__ import annotations

import csv
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

from mriprep.demo.calibration import person
from mriprep.demo.freesurfer_labels import freesurfer_labels
from mriprep.demo.scanner import Acquisition, acquire, random_pose

TRAIN, VAL, TEST = 6, 1, 3
LEAKED = "sub-train05"  # the training person scanned again into the test split
LEAK_ID = "sub-test-leak"
SEED_BASE = 61_000  # apart from the demo's, the calibration's and the label cohorts' people

# Defects of the dirty copy, per scan: what a reader sees in the bench's table.
DEFECTS = {
    "sub-train00": ("extreme(1e308)", "posterior_fossa"),
    "sub-train01": ("extreme(1e30)", "thick(1x1x3)"),
    "sub-train02": ("nan_blobs", "posterior_fossa"),
    "sub-train03": ("zero_slab", "thick(1x1x2)"),
    "sub-train04": ("wrong_orientation", "missing_slices"),
    "sub-val00": ("nan_blobs", "extreme(1e30)"),
}
THICK = {"thick(1x1x2)": (1.0, 1.0, 2.0), "thick(1x1x3)": (1.0, 1.0, 3.0)}
# FreeSurfer numbers of the cerebellum (the posterior fossa artifact's target).
CEREBELLUM = (7, 8, 46, 47)


@dataclass(frozen=True)
class Subject:
    subject_id: str
    split: str
    image: Path
    label: Path
    defects: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cohort:
    """Both copies: ``clean`` and ``dirty`` list the same subjects (the test ones alike)."""

    root: Path
    clean: list[Subject]
    dirty: list[Subject]

    def subjects(self, copy: str) -> list[Subject]:
        return {"clean": self.clean, "dirty": self.dirty}[copy]


def subject_ids() -> list[tuple[str, str, int]]:
    """(id, split, person seed) of every subject; the leak reuses a training person."""
    out = [(f"sub-train{i:02d}", "train", SEED_BASE + i) for i in range(TRAIN)]
    out += [(f"sub-val{i:02d}", "val", SEED_BASE + 100 + i) for i in range(VAL)]
    out += [(f"sub-test{i:02d}", "test", SEED_BASE + 200 + i) for i in range(TEST)]
    out.append((LEAK_ID, "test", SEED_BASE + int(LEAKED[-2:])))
    return out


def build_cohort(root: str | Path, progress=print, workers: int = 2) -> Cohort:
    """Write both copies under ``root`` (``clean/``, ``dirty/``), or read them back when a
    previous run left them complete (``cohort.csv`` is written last). People are built in
    ``workers`` processes, a few seconds each."""
    root = Path(root)
    if (root / "cohort.csv").exists():
        return _read(root)
    for copy in ("clean", "dirty"):
        (root / copy).mkdir(parents=True, exist_ok=True)
    todo = subject_ids()
    rows = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        jobs = [pool.submit(_build_subject, root, sid, seed) for sid, _, seed in todo]
        for n, ((sid, split, _), job) in enumerate(zip(todo, jobs)):
            defects = job.result()
            rows.append((sid, split, "|".join(defects)))
            progress(f"  cohort: {sid} ({split}) {n + 1}/{len(todo)}"
                     + (f", dirty copy: {', '.join(defects)}" if defects else ""), flush=True)
    with open(root / "cohort.csv.tmp", "w", newline="") as f:
        csv.writer(f).writerows([("subject_id", "split", "defects"), *rows])
    (root / "cohort.csv.tmp").rename(root / "cohort.csv")
    return _read(root)


def _build_subject(root: Path, sid: str, seed: int) -> tuple[str, ...]:
    anatomy = person(seed)
    numbered = aseg_of(freesurfer_labels(anatomy.labels, anatomy.affine))
    # The leak is a second session: another pose and other noise.
    session = 1 if sid == LEAK_ID else 0
    rng = np.random.default_rng([seed, session, 31])
    pose = random_pose(rng, 8.0, 8.0)
    clean = _scan(anatomy, numbered, pose, Acquisition(), rng)
    _save_pair(root / "clean", sid, *clean)
    defects = DEFECTS.get(sid, ())
    thick = [THICK[d] for d in defects if d in THICK]
    dirty = _scan(anatomy, numbered, pose, Acquisition(spacing=thick[0]), rng) if thick else clean
    dirty = plant(*dirty, defects, np.random.default_rng([seed, 37]))
    _save_pair(root / "dirty", sid, *dirty)
    return defects


def aseg_of(aparc: np.ndarray) -> np.ndarray:
    """FreeSurfer's ``aseg`` from its ``aparc+aseg``: every cortical parcel back to the
    hemisphere's cortex (3, 42), as ``aseg.mgz`` holds it."""
    aseg = aparc.copy()
    aseg[(aparc >= 1000) & (aparc < 2000)] = 3
    aseg[aparc >= 2000] = 42
    return aseg


def _scan(anatomy, numbered, pose, acquisition, rng):
    scan = acquire(anatomy, pose, acquisition, rng)
    to_anatomy = np.linalg.inv(anatomy.affine) @ np.linalg.inv(pose) @ scan.affine
    labels = ndimage.affine_transform(numbered, to_anatomy[:3, :3], to_anatomy[:3, 3],
                                      output_shape=scan.data.shape, order=0,
                                      mode="constant", cval=0).astype(np.int16)
    return scan.data.astype(np.float32), labels, scan.affine


def plant(image: np.ndarray, labels: np.ndarray, affine: np.ndarray,
          defects: tuple[str, ...], rng: np.random.Generator):
    """The image (and for a lying header, the affine) with ``defects``; labels as given."""
    image = image.astype(np.float64 if "extreme(1e308)" in defects else np.float32)
    brain = labels > 0
    points = np.argwhere(brain)
    # The artifact first: it scales intensities, and a planted 1e308 must stay 1e308.
    for defect in sorted(defects, key=lambda d: d != "posterior_fossa"):
        if defect.startswith("extreme("):
            value = float(defect[len("extreme("):-1])
            for centre in points[rng.choice(len(points), 3)]:
                image[tuple(slice(c - 1, c + 2) for c in centre)] = value
        elif defect == "nan_blobs":
            for centre in points[rng.choice(len(points), 3)]:
                image[_ball(image.shape, centre, 6.0)] = np.nan
        elif defect in ("zero_slab", "missing_slices"):
            occupied = np.flatnonzero(brain.any(axis=(0, 1)))
            start = int(rng.integers(occupied[len(occupied) // 3],
                                     occupied[2 * len(occupied) // 3]))
            image[..., start:start + 4] = 0.0 if defect == "zero_slab" else np.nan
        elif defect == "posterior_fossa":
            image = _posterior_fossa(image, labels, rng)
        elif defect == "wrong_orientation":
            affine = _swap_front_back(affine)
        elif defect not in THICK:  # a thick scan is acquired so, not planted
            raise ValueError(f"unknown defect {defect!r}; the known ones are in DEFECTS")
    return image, labels, affine


def _ball(shape, centre, radius: float) -> np.ndarray:
    grid = np.ogrid[tuple(slice(0, n) for n in shape)]
    return sum((g - c) ** 2 for g, c in zip(grid, centre)) <= radius ** 2


def _posterior_fossa(image: np.ndarray, labels: np.ndarray, rng) -> np.ndarray:
    """Susceptibility over the cerebellum: a ball of signal loss (to 20-40%) around a
    point of the cerebellum, with a fringe 2-3x as bright, as air-bone interfaces leave."""
    cerebellum = np.argwhere(np.isin(labels, CEREBELLUM))
    centre = cerebellum[rng.integers(len(cerebellum))]
    radius = float(rng.uniform(14.0, 20.0))
    grid = np.ogrid[tuple(slice(0, n) for n in image.shape)]
    distance = np.sqrt(sum((g - c) ** 2 for g, c in zip(grid, centre)))
    loss = float(rng.uniform(0.2, 0.4))
    factor = np.where(distance <= radius, loss, 1.0)
    fringe = (distance > radius) & (distance <= radius + 3.0)
    factor = np.where(fringe, float(rng.uniform(2.0, 3.0)), factor)
    return (image * factor).astype(image.dtype)


def _swap_front_back(affine: np.ndarray) -> np.ndarray:
    """The header of a scan whose anterior-posterior direction was written reversed."""
    return np.diag([1.0, -1.0, 1.0, 1.0]) @ affine


def _save_pair(folder: Path, sid: str, image, labels, affine) -> None:
    # Uncompressed: gzip of a noisy float image costs more than building it.
    nib.save(nib.Nifti1Image(image, affine), folder / f"{sid}_T1w.nii")
    nib.save(nib.Nifti1Image(labels.astype(np.int16), affine), folder / f"{sid}_dseg.nii.gz")


def _read(root: Path) -> Cohort:
    with open(root / "cohort.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    copies = {}
    for copy in ("clean", "dirty"):
        copies[copy] = [
            Subject(r["subject_id"], r["split"], root / copy / f"{r['subject_id']}_T1w.nii",
                    root / copy / f"{r['subject_id']}_dseg.nii.gz",
                    tuple(d for d in r["defects"].split("|") if d) if copy == "dirty" else ())
            for r in rows]
    return Cohort(root, copies["clean"], copies["dirty"])
