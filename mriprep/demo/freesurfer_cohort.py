"""A small clean cohort whose label maps are numbered as FreeSurfer numbers them.

For FastSurfer-style training data (``mriprep export --format fastsurfer-hdf5``): each
subject is a synthetic person (:func:`mriprep.demo.calibration.person`, the template
warped), labelled by :func:`mriprep.demo.freesurfer_labels.freesurfer_labels` in the
person's own anatomy space, then scanned in a known random pose on a 1 mm grid (the
labels move with the person, nearest-neighbour). No planted defects: the cohort is for
the label path, the main demo cohort (:mod:`mriprep.demo.cohort`) for the defects.

Writes ``images/``, ``labels/`` and ``cohort.csv`` (a manifest ``mriprep run`` reads).
Each person takes seconds to build (docs/benchmarks.md, "Demo data").
"""

from __future__ import annotations

import csv
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

from mriprep.demo.calibration import person
from mriprep.demo.freesurfer_labels import freesurfer_labels
from mriprep.demo.scanner import Acquisition, acquire, random_pose

SPLITS = ("train", "train", "val", "test")


def scanned_person(seed: int, index: int, medial_unknown: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image, FreeSurfer labels, affine) of person ``index`` scanned in a random pose."""
    # Seeds apart from the main demo's and the calibration's people.
    anatomy = person(50_000 + 100 * seed + index)
    rng = np.random.default_rng([seed, index, 29])
    pose = random_pose(rng, 8.0, 8.0)
    # Scanned with its tissue labels (the scanner sets its intensities from them),
    # then the FreeSurfer labels pulled onto the scan's grid the way it pulls labels.
    scan = acquire(anatomy, pose, Acquisition(), rng)
    numbered = freesurfer_labels(anatomy.labels, anatomy.affine, medial_unknown)
    to_anatomy = np.linalg.inv(anatomy.affine) @ np.linalg.inv(pose) @ scan.affine
    labels = ndimage.affine_transform(numbered, to_anatomy[:3, :3], to_anatomy[:3, 3],
                                      output_shape=scan.data.shape, order=0,
                                      mode="constant", cval=0)
    return scan.data, labels, scan.affine


def build_freesurfer_cohort(root: str | Path, n_subjects: int = 4, seed: int = 0) -> Path:
    """Write the cohort into ``root``; return its manifest's path."""
    root = Path(root)
    for sub in ("images", "labels"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n_subjects):
        data, labels, affine = scanned_person(seed, i)
        sid = f"sub-fs{i + 1:02d}"
        image, label = f"images/{sid}_T1w.nii.gz", f"labels/{sid}_dseg.nii.gz"
        nib.save(nib.Nifti1Image(data.astype(np.float32), affine), root / image)
        nib.save(nib.Nifti1Image(labels.astype(np.int16), affine), root / label)
        rows.append([sid, image, label, SPLITS[i % len(SPLITS)], ""])
    manifest = root / "cohort.csv"
    with open(manifest, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["subject_id", "image", "label", "split", "session_id"])
        writer.writerows(rows)
    return manifest
