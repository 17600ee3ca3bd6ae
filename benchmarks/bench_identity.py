"""Identity-level leak detection: rescans of one person against different people.

A rescan of one person (another pose, resolution, noise level, contrast scaling, skull
stripped or not) goes through ``t1w_mni_rigid`` onto the MNI152 grid; so does every
other person. This benchmark builds that calibration set, reads each cached image once
through the check's own tensor pass, and prints, for the old fingerprint (8^3 block
means) and the identity descriptor (:mod:`mriprep.splits.identity`) centred on the
cohort (before issue 30) and on the shipped reference population
(:mod:`mriprep.splits.reference`, what the check does), the similarity of every rescan
pair and every different-people pair, and the detection and false-alarm rates at each
threshold. Then: the reference people's own pairs, each against a reference without the
two; cohorts of 5, 8, 20 and 200 entries, drawn at random and dominated by one person
(60% of the entries: in a 200-entry cohort the dominating person's 4-5 scans repeat, as
copies under new ids), centred both ways (:func:`cohort_sizes`); and the identity search
at 10,000 entries.

The set (nothing is the template's own voxels):

* synthetic people (:func:`mriprep.demo.calibration.person`, seeds apart from the
  demo's and the calibration set's), each scanned 1 mm; 1x1x5 mm axial with 3x the
  noise; 0.9x0.9x3 mm coronal stored backwards, intensities x0.3 and a gamma of 1.2;
  1 mm skull-stripped (brain label dilated by 2 voxels); the first two also at 0.5 mm.
  Every scan in its own random pose (up to 15 degrees, 15 mm);
* Colin27, one real man: ``ch2`` at 1 mm and 1x1x5 mm noisy, ``ch2bet`` (skull-stripped)
  at 1 mm, ``ch2better`` at 0.5 mm;
* the INIA19 macaque brain scaled to human size (x2.3, so that the plausibility stage
  takes it for a human brain), at 1 mm: another species. ``t1w_mni_rigid`` refuses it
  (register: similarity 0.248 < 0.4, ``not_t1``), so it never reaches this cache;
  ``tests/splits/test_identity.py`` places it on the MNI grid by its header instead.

Every scan gets its own subject id; ``identity.json`` in the work folder says whose
anatomy it shows.

Run: ``python benchmarks/bench_identity.py [--work-dir DIR] [--people N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PERSON_SEED = 70_000  # apart from the demo (10_000+) and the calibration set (0-99)


def _acquisitions():
    from mriprep.demo.scanner import Acquisition

    return {
        "1mm": (Acquisition(), {}),
        "ax5_noisy": (Acquisition((1.0, 1.0, 5.0), "axial", noise=0.045), {}),
        "cor3_scaled": (Acquisition((0.9, 0.9, 3.0), "coronal", flips=(True, False, True)),
                        {"scale": 0.3, "gamma": 1.2}),
        "1mm_stripped": (Acquisition(), {"strip": True}),
        "05mm": (Acquisition((0.5, 0.5, 0.5)), {}),
    }


def _plan(people: int) -> list[tuple[str, str, str]]:
    """(scan name, anatomy, acquisition) of every scan of the set."""
    plan = []
    for i in range(people):
        acqs = ["1mm", "ax5_noisy", "cor3_scaled", "1mm_stripped"] + (["05mm"] if i < 2 else [])
        plan += [(f"p{i:02d}-{a}", f"person-{i}", a) for a in acqs]
    from mriprep.demo.real_scans import HOW_TO_GET, real_scans_folder

    if real_scans_folder() is None:
        print(f"no real scans (Colin27, macaque): {HOW_TO_GET}")
        return plan
    plan += [("colin-1mm", "colin27", "1mm"), ("colin-ax5_noisy", "colin27", "ax5_noisy"),
             ("colin-stripped", "colin27_brain", "1mm"),
             ("colin-05mm", "colin27_05mm", "05mm"), ("macaque-x23", "macaque_x23", "1mm")]
    return plan


def _anatomy(name: str):
    from mriprep.demo.anatomy import Anatomy
    from mriprep.demo.calibration import person, real_head

    if name.startswith("person-"):
        return person(PERSON_SEED + int(name.split("-")[1]))
    if name == "macaque_x23":
        monkey = real_head("macaque")
        affine = monkey.affine.copy()
        affine[:3] *= 2.3
        return Anatomy(monkey.image, None, affine, None, name)
    return real_head(name)


def _write_one(job) -> dict:
    import nibabel as nib
    from scipy import ndimage

    from mriprep.core.atomic import atomic_path
    from mriprep.demo.scanner import acquire, random_pose

    root, index, name, anatomy_name, acq_name = job
    path = Path(root) / "images" / f"{name}.nii.gz"
    done = {"name": name, "anatomy": anatomy_name, "acquisition": acq_name, "image": str(path)}
    if path.exists():  # a rerun on the same --work-dir rebuilds only what is missing
        return done
    acquisition, extra = _acquisitions()[acq_name]
    anatomy = _anatomy(anatomy_name)
    if extra.get("strip") and anatomy.labels is not None:
        from mriprep.demo.anatomy import Anatomy

        brain = ndimage.binary_dilation(anatomy.labels > 0, iterations=2)
        anatomy = Anatomy(anatomy.image * brain, anatomy.labels, anatomy.affine,
                          anatomy.template_to_anatomy, anatomy.name)
    rng = np.random.default_rng([PERSON_SEED, index])
    scan = acquire(anatomy, random_pose(rng, 15.0, 15.0), acquisition, rng)
    data = scan.data
    if "gamma" in extra:
        data = extra["scale"] * 1000.0 * (data / 1000.0) ** extra["gamma"]
    img = nib.Nifti1Image(data.astype(np.float32), scan.affine)
    img.set_qform(scan.affine, code=1)
    img.set_sform(scan.affine, code=1)
    with atomic_path(path, suffix=".nii.gz") as partial:  # a killed build leaves no half file
        nib.save(img, partial)
    return done


def build_set(work: Path, people: int, workers: int = 2) -> dict:
    """Scans, manifest and cache of the calibration set in ``work`` (reused when there)."""
    truth_path = work / "identity.json"
    if truth_path.exists():
        truth = json.loads(truth_path.read_text())
        if truth["people"] != people:
            raise SystemExit(f"{work} holds a set of {truth['people']} people, not {people}: "
                             f"give --people {truth['people']} or another --work-dir")
        return truth
    (work / "images").mkdir(parents=True, exist_ok=True)
    plan = _plan(people)
    jobs = [(str(work), i, *p) for i, p in enumerate(plan)]
    start = time.perf_counter()
    import multiprocessing

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        scans = list(pool.map(_write_one, jobs))
    print(f"{len(scans)} scans written in {time.perf_counter() - start:.0f} s", flush=True)
    rng = np.random.default_rng(1)
    from mriprep.inputs.manifest import ManifestRow, write_manifest

    for scan in scans:
        scan["split"] = str(rng.choice(["train", "train", "val", "test"]))
    manifest = write_manifest([ManifestRow(0, s["name"], "", Path(s["image"]), split=s["split"])
                               for s in scans], work / "cohort.csv")
    from mriprep.pipelines import load_pipeline
    from mriprep.run.cohort import cohort_rows, run_cohort

    start = time.perf_counter()
    run = run_cohort(cohort_rows(manifest), work / "cache", load_pipeline("t1w_mni_rigid"),
                     scheduler="processes", workers=workers, report=False)
    failed = [r.subject_id for r in run.results if r.failed]
    print(f"pipeline: {len(scans) - len(failed)} cached, failed: {failed} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    truth = {"people": people, "scans": {s["name"]: s for s in scans
                                         if s["name"] not in failed}}
    truth_path.write_text(json.dumps(truth, indent=1))
    return truth


def _person(anatomy: str) -> str:
    return "colin27" if anatomy.startswith("colin27") else anatomy


def descriptors(work: Path, truth: dict) -> tuple[list[str], np.ndarray, np.ndarray, float]:
    """Scan names, the identity fingerprints (the check's own tensor pass), the old 8x8x8
    block means (restated), and the pass's seconds per entry."""
    from mriprep.cache import Cache
    from mriprep.check.tensors import block_edges, scan_tensor_file

    cache = Cache(work / "cache")
    names, new, old = [], [], []
    seconds = 0.0
    for entry in cache.entries():
        if entry.subject_id not in truth["scans"]:
            continue
        start = time.perf_counter()
        scan = scan_tensor_file(cache.tensor_path(entry.key, "image"), "image")
        seconds += time.perf_counter() - start
        image = np.asarray(cache.load_tensor(entry.key, "image"), dtype=np.float64)
        sums = image
        for axis, n in enumerate(image.shape):
            sums = np.add.reduceat(sums, block_edges(n, 8), axis=axis)
        names.append(entry.subject_id)
        new.append(scan.fingerprint)
        old.append(sums.ravel())
    return names, np.stack(new), np.stack(old), seconds / max(1, len(names))


def correlations(prints: np.ndarray, centre="cohort") -> np.ndarray:
    """Every pair's identity correlation: deviations from the cohort's mean person
    (``"cohort"``, the old search) or from the reference population (``"reference"``,
    or a :class:`~mriprep.splits.reference.Reference`)."""
    from mriprep.splits.identity import _standardiser
    from mriprep.splits.near_duplicates import normalise_fingerprints

    standardise = None if centre == "cohort" else _standardiser(centre)
    vectors, _ = normalise_fingerprints(prints, standardise)
    return vectors.astype(np.float64) @ vectors.T.astype(np.float64)


def pair_sets(names: list[str], truth: dict) -> tuple[np.ndarray, np.ndarray]:
    people = np.array([_person(truth["scans"][n]["anatomy"]) for n in names])
    same = people[:, None] == people[None, :]
    upper = np.triu(np.ones_like(same), 1)
    return same & upper, ~same & upper


def summarise(label: str, corr: np.ndarray, rescans: np.ndarray, others: np.ndarray,
              thresholds=(0.5, 0.6, 0.7, 0.8, 0.95)) -> dict:
    r, o = corr[rescans], corr[others]
    row = {"descriptor": label, "rescan_pairs": int(r.size), "other_pairs": int(o.size),
           "rescans_min": round(float(r.min()), 3),
           "rescans_p5": round(float(np.percentile(r, 5)), 3),
           "rescans_median": round(float(np.median(r)), 3),
           "others_max": round(float(o.max()), 3),
           "others_p99": round(float(np.percentile(o, 99)), 3),
           "others_median": round(float(np.median(o)), 3)}
    print(f"{label}: rescans ({r.size} pairs) min {row['rescans_min']} 5% "
          f"{row['rescans_p5']} median {row['rescans_median']}; different people "
          f"({o.size} pairs) max {row['others_max']} 99% {row['others_p99']} median "
          f"{row['others_median']}")
    for t in thresholds:
        print(f"  >= {t:4}: detected {np.mean(r >= t):6.1%} of rescans, "
              f"false alarms {np.mean(o >= t):6.2%} of different-people pairs")
    return row


def cohort_draws(people: np.ndarray, size: int, dominated: bool, rng) -> np.ndarray:
    """Row indices of one cohort of ``size`` entries: drawn at random, or ``dominated``
    by one person (every scan of a person with 3 or more, then as many of them again as
    make 60% of the cohort, the rest other people). Above the set's size entries repeat:
    a repeat is a copy under another id."""
    n = len(people)
    if not dominated:
        return rng.choice(n, size, replace=size > n)
    counts = {p: int((people == p).sum()) for p in set(people)}
    person = rng.choice(sorted(p for p, c in counts.items() if c >= 3))
    own = np.flatnonzero(people == person)
    others = np.flatnonzero(people != person)
    k = max(len(own), int(round(0.6 * size))) if size > len(own) else size - 2
    mine = np.concatenate([rng.permutation(own), rng.choice(own, max(0, k - len(own)))])[:k]
    rest = rng.choice(others, size - len(mine), replace=size - len(mine) > len(others))
    return np.concatenate([mine, rest])


def cohort_sizes(prints: np.ndarray, people: np.ndarray, sizes=(5, 8, 20, 200),
                 draws: int = 200, reference=None) -> list[dict]:
    """Same-person and different-people pairs in cohorts of ``sizes`` entries, drawn
    at random and dominated by one person, centred on the cohort (the old search) and
    on the reference population: the lowest same-person and highest different-people
    correlation of each cohort, and the share of same-person pairs the check names."""
    from mriprep.splits.identity import IDENTITY_ERROR, IDENTITY_WARNING

    rng = np.random.default_rng(0)
    rows = []
    print(f"cohorts ({draws} draws each; every entry its own id; a pair of two entries "
          "of one person is same-person, whichever scans they are):")
    for size in sizes:
        for dominated in (False, True):
            for centre in ("cohort", reference or "reference"):
                same_all, other_all, worst_same, worst_other, shared = [], [], [], [], []
                for _ in range(draws if size < 200 else draws // 4):
                    pick = cohort_draws(people, size, dominated, rng)
                    corr = correlations(prints[pick], centre)
                    who = people[pick]
                    upper = np.triu(np.ones(corr.shape, dtype=bool), 1)
                    same = (who[:, None] == who[None, :]) & upper
                    other = (who[:, None] != who[None, :]) & upper
                    if same.any():
                        same_all.append(corr[same])
                        worst_same.append(corr[same].min())
                    other_all.append(corr[other])
                    worst_other.append(corr[other].max())
                    shared.append(corr[upper].mean())  # shared_deviation: every id distinct
                s, o = np.concatenate(same_all), np.concatenate(other_all)
                label = "cohort" if centre == "cohort" else "reference"
                row = {"size": size, "dominated": dominated, "centre": label,
                       "same_min": round(float(s.min()), 3),
                       "same_p5": round(float(np.percentile(s, 5)), 3),
                       "same_named": round(float(np.mean(s >= IDENTITY_WARNING)), 4),
                       "same_error": round(float(np.mean(s >= IDENTITY_ERROR)), 4),
                       "other_max": round(float(o.max()), 3),
                       "other_p99": round(float(np.percentile(o, 99)), 3),
                       "other_named": round(float(np.mean(o >= IDENTITY_WARNING)), 5),
                       "shared_min": round(float(np.min(shared)), 3),
                       "shared_max": round(float(np.max(shared)), 3)}
                rows.append(row)
                print(f"  {size:3d} entries {'dominated' if dominated else 'random   '} "
                      f"centred on the {label:9s}: same person min {row['same_min']:6.3f} "
                      f"5% {row['same_p5']:6.3f} named {row['same_named']:7.2%} (error "
                      f"{row['same_error']:7.2%}); different people max {row['other_max']:6.3f}"
                      f" 99% {row['other_p99']:6.3f} named {row['other_named']:7.3%}; shared "
                      f"deviation {row['shared_min']:.2f}-{row['shared_max']:.2f}")
    return rows


def reference_pairs(arrays) -> np.ndarray:
    """Identity correlations of every pair of reference people, each pair scored against
    a reference rebuilt without the two (so that neither is part of its own average)."""
    from mriprep.splits.reference import reference_from_arrays

    descriptors = np.asarray(arrays["descriptors"])
    n = len(descriptors)
    out = []
    for i in range(n):
        for j in range(i + 1, n):
            keep = [k for k in range(n) if k not in (i, j)]
            ref = reference_from_arrays({**arrays, "descriptors": descriptors[keep]})
            out.append(correlations(descriptors[[i, j]], ref)[0, 1])
    return np.array(out)


def synthetic_descriptors(entries: int, seed: int = 0, planted: int = 10
                          ) -> tuple[np.ndarray, set[tuple[int, int]]]:
    """``entries`` synthetic identity descriptors (a shared low-rank part and noise, as
    the cohort-centred descriptors of different people look) and ``planted`` rescans:
    pairs ``(i, entries - 1 - i)`` at correlation about 0.88."""
    from mriprep.check.tensors import FINGERPRINT_BLOCKS
    from mriprep.splits.identity import core_mask

    d = int(core_mask((FINGERPRINT_BLOCKS,) * 3).sum())
    rng = np.random.default_rng(seed)
    modes = rng.standard_normal((40, d)).astype(np.float32)
    prints = (rng.standard_normal((entries, 40)).astype(np.float32) @ modes
              + 4.0 * rng.standard_normal((entries, d)).astype(np.float32))
    pairs = {(i, entries - 1 - i) for i in range(planted)}
    for i, j in pairs:
        prints[j] = prints[i] + 0.55 * prints[i].std() * rng.standard_normal(d)
    return prints, pairs


def search_time(entries: int, seed: int = 0) -> dict:
    """The identity search over ``entries`` synthetic descriptors
    (:func:`synthetic_descriptors`), by LSH."""
    from mriprep.splits.identity import find_identity_matches

    prints, planted = synthetic_descriptors(entries, seed)
    d = prints.shape[1]
    info: dict = {}
    start = time.perf_counter()
    pairs = find_identity_matches(prints, info=info)
    seconds = time.perf_counter() - start
    found = planted <= {(i, j) for i, j, _ in pairs}
    print(f"identity search, {entries} entries of {d} values: {seconds:.2f} s "
          f"({info['method']}, {info.get('bands')} bands x {info.get('bits_per_band')} bits, "
          f"{info.get('lsh_candidates')} candidates, {info['pairs_compared']} correlations "
          f"computed); planted rescans all found: {found}")
    return {"entries": entries, "seconds": round(seconds, 2), "found_planted": found, **info}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", help="build (or reuse) the calibration set here")
    parser.add_argument("--people", type=int, default=49,
                        help="synthetic people (default 49: with Colin27, 200 cached scans, "
                             "so that a random 200-entry cohort holds no copies; about 30 "
                             "minutes on 2 cores, reused from --work-dir)")
    parser.add_argument("--entries", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.work_dir:
        return _run(Path(args.work_dir), args)
    with tempfile.TemporaryDirectory(prefix="mriprep-identity-") as scratch:
        return _run(Path(scratch), args)


def _run(work: Path, args) -> int:
    from mriprep.splits.reference import REFERENCE_PATH, load_reference

    truth = build_set(work, args.people)
    names, new, old, per_entry = descriptors(work, truth)
    rescans, others = pair_sets(names, truth)
    people = np.array([_person(truth["scans"][n]["anatomy"]) for n in names])
    reference = load_reference()
    print(f"{len(names)} cached entries; the check's image pass: {per_entry:.3f} s an entry; "
          f"reference population: {reference.people} people ({REFERENCE_PATH.name})")
    summarise("old fingerprint (8x8x8 block means), centred on the cohort", correlations(old),
              rescans, others)
    summarise("identity fingerprint, centred on the cohort (before issue 30)",
              correlations(new), rescans, others)
    summarise("identity fingerprint, centred on the reference population",
              correlations(new, reference), rescans, others)
    with np.load(REFERENCE_PATH) as arrays:
        held_out = reference_pairs(dict(arrays))
    print(f"reference people, each pair against the other {reference.people - 2} "
          f"({held_out.size} pairs of different people): max {held_out.max():.3f} 99% "
          f"{np.percentile(held_out, 99):.3f} median {np.median(held_out):.3f}")
    cohort_sizes(new, people, reference=reference)
    if args.entries:
        search_time(args.entries)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
