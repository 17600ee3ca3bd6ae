"""Rebuild the identity reference population shipped as ``identity_reference.npz``.

The identity search (:mod:`mriprep.splits.identity`) measures how a person deviates from
an average person. That average must not be the cohort being checked (a person who makes
up most of a small cohort would be the average, and so have no deviation left), so it is
a fixed population, built here once and shipped as package data:

* :data:`REFERENCE_PEOPLE` synthetic people (:func:`mriprep.demo.calibration.person`,
  seeds from :data:`REFERENCE_SEED`: apart from the demo's 10_000+, the calibration
  set's 0-99 and ``benchmarks/bench_identity.py``'s 70_000+, so that no person the
  thresholds were measured on is in the reference);
* each scanned once in a random pose, cycling through a 1 mm, a 1x1x3 mm axial and a
  0.9x0.9x5 mm coronal acquisition, so that the average holds what slice thickness does
  to the blocks;
* through ``t1w_mni_rigid``, fingerprinted by the check's own tensor pass.

The file holds every person's descriptor, their mean and per-block spread, the grid
they were made on, and the pipeline. Run ``python -m mriprep.demo.identity_reference``
(about 10 minutes on 2 cores) to rebuild it; ``tests/splits/test_identity_reference.py``
checks that the shipped file is the one recorded (its SHA-256) and fits this recipe.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REFERENCE_SEED = 90_000
REFERENCE_PEOPLE = 16
REFERENCE_PIPELINE = "t1w_mni_rigid"
# (spacing, slicing, flips) cycled over the people
ACQUISITIONS = (((1.0, 1.0, 1.0), "axial", (False, False, False)),
                ((1.0, 1.0, 3.0), "axial", (False, False, False)),
                ((0.9, 0.9, 5.0), "coronal", (True, False, True)))


def _scan_one(job: tuple[str, int]) -> str:
    import nibabel as nib

    from mriprep.core.atomic import atomic_path
    from mriprep.demo.calibration import person
    from mriprep.demo.scanner import Acquisition, acquire, random_pose

    folder, i = job
    path = Path(folder) / f"ref-{i:02d}.nii.gz"
    if path.exists():
        return str(path)
    spacing, slicing, flips = ACQUISITIONS[i % len(ACQUISITIONS)]
    rng = np.random.default_rng([REFERENCE_SEED, i])
    scan = acquire(person(REFERENCE_SEED + i), random_pose(rng, 10.0, 10.0),
                   Acquisition(spacing, slicing, flips=flips), rng)
    img = nib.Nifti1Image(scan.data.astype(np.float32), scan.affine)
    img.set_qform(scan.affine, code=1)
    img.set_sform(scan.affine, code=1)
    with atomic_path(path, suffix=".nii.gz") as partial:  # a killed build leaves no half file
        nib.save(img, partial)
    return str(path)


def build_reference(work: Path, people: int = REFERENCE_PEOPLE, workers: int = 2) -> dict:
    """Scan, preprocess and fingerprint the reference people in ``work`` (reused when
    there); return the arrays of ``identity_reference.npz``."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from mriprep.cache import Cache
    from mriprep.check.tensors import scan_tensor_file
    from mriprep.inputs.manifest import ManifestRow, write_manifest
    from mriprep.pipelines import load_pipeline
    from mriprep.run.cohort import cohort_rows, run_cohort
    from mriprep.run.worker_setup import configure_worker

    images = work / "images"
    images.mkdir(parents=True, exist_ok=True)
    # Set up as the demo cohort's builders are (mriprep.demo.cohort).
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=configure_worker) as pool:
        paths = list(pool.map(_scan_one, [(str(images), i) for i in range(people)]))
    manifest = write_manifest([ManifestRow(0, f"ref-{i:02d}", "", Path(p), split="train")
                               for i, p in enumerate(paths)], work / "reference.csv")
    pipeline = load_pipeline(REFERENCE_PIPELINE)
    run_cohort(cohort_rows(manifest), work / "cache", pipeline, scheduler="processes",
               workers=workers, report=False)
    cache = Cache(work / "cache")
    entries = sorted(cache.entries(), key=lambda e: e.subject_id)
    prints = [scan_tensor_file(cache.tensor_path(e.key, "image"), "image").fingerprint
              for e in entries]
    kept = [(e, p) for e, p in zip(entries, prints) if p is not None]
    if len(kept) < people * 0.9:
        raise RuntimeError(f"only {len(kept)} of {people} reference people were cached in "
                           f"{work / 'cache'}; look at its run report and rebuild")
    descriptors = np.stack([p for _, p in kept]).astype(np.float32)
    first = kept[0][0]
    return {
        "descriptors": descriptors,
        "people": np.array([e.subject_id for e, _ in kept]),
        "shape": np.array(first.shape, dtype=np.int64),
        "affine": np.asarray(first.affine, dtype=np.float64),
        "pipeline": np.array([REFERENCE_PIPELINE, first.pipeline_hash]),
        "seed": np.array([REFERENCE_SEED, people], dtype=np.int64),
    }


def main(argv: list[str] | None = None) -> int:
    from mriprep.splits.reference import REFERENCE_PATH

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", help="build (or reuse) the scans and cache here")
    parser.add_argument("-o", "--output", default=str(REFERENCE_PATH))
    parser.add_argument("--people", type=int, default=REFERENCE_PEOPLE)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mriprep-reference-") as scratch:
        arrays = build_reference(Path(args.work_dir or scratch), args.people)
    np.savez_compressed(args.output, **arrays)
    print(f"{args.output}: {len(arrays['descriptors'])} people; record its SHA-256 in "
          "mriprep/splits/reference.py (REFERENCE_SHA256)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
