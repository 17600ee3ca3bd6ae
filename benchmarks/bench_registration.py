"""Rigid registration: mriprep's two backends against ANTs' defaults, side by side.

For each demo subject (preprocessed by reorient, sanitize and mask_slices, untimed), in
one process and with the same ITK thread count:

* ``mriprep sitk`` and ``mriprep ants``: the register stage's default settings;
* ``ANTs Rigid`` and ``ANTs QuickRigid``: ``ants.registration(template, subject,
  type_of_transform=...)`` with ANTsPy's defaults, full-resolution images, no masks.

Each method's registration is timed (mriprep's template pyramid is built once before, as
a worker does it once per process) and scored by its target registration error (TRE)
against the cohort's known transform, over the template's brain voxels. The machine is
shared, so the useful figure is the time ratio to ANTs' default Rigid on the same subject
(median over subjects; the issue's goal is at most 0.15). Nothing is asserted.

Run: ``python benchmarks/bench_registration.py [--cohort DIR] [--subjects 3]
[--threads 2] [--methods ...] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mriprep.registration.ants_backend import ITK_THREADS_VARIABLE

METHODS = ("mriprep sitk", "mriprep ants", "ANTs Rigid", "ANTs QuickRigid")
ANCHOR = "ANTs Rigid"


def pick_subjects(truth: dict[str, Any], n: int) -> list[str]:
    """Up to ``n`` registrable subjects, alternating between the cohort's spacings so that
    a small run still holds isotropic and thick-slice scans. Leaked copies are skipped."""
    by_spacing: dict[tuple, list[str]] = defaultdict(list)
    for subject_id, t in truth["subjects"].items():
        kinds = {d["kind"] for d in t["defects"]}
        if t["expected"] == "cached" and "leak" not in kinds:
            by_spacing[tuple(t["spacing"])].append(subject_id)
    queues = list(by_spacing.values())
    picked: list[str] = []
    while len(picked) < n and any(queues):
        for queue in queues:
            if queue and len(picked) < n:
                picked.append(queue.pop(0))
    return picked


def _preprocess(cohort, subject_id: str):
    from mriprep.io import load_volume
    from mriprep.stages import get_stage

    volume = load_volume(cohort.image_path(subject_id), subject_id=subject_id)
    for name in ("reorient", "sanitize", "mask_slices"):
        volume = get_stage(name)(volume)
    return volume


def _ants_default(type_of_transform: str) -> Callable:
    """A method running ANTsPy's registration with its defaults on full-resolution
    images; returns template_to_subject (RAS)."""

    def register(volume, template) -> np.ndarray:
        import ants

        from mriprep.registration.geometry import ants_image, matrix_from_ants

        fixed = ants_image(template.data, template.affine)
        moving = ants_image(volume.data, volume.affine)
        result = ants.registration(fixed, moving, type_of_transform=type_of_transform)
        matrix = matrix_from_ants(ants.read_transform(result["fwdtransforms"][0]))
        for path in set(result["fwdtransforms"]) | set(result["invtransforms"]):
            Path(path).unlink(missing_ok=True)
        return matrix

    return register


def _mriprep(backend: str, threads: int) -> Callable:
    def register(volume, template) -> np.ndarray:
        from mriprep.stages.register import RegisterParams, register_volume

        return register_volume(volume, RegisterParams(backend=backend, threads=threads)
                               ).template_to_subject

    return register


def run(cohort_dir, n: int = 3, threads: int = 2, methods=METHODS) -> list[dict[str, Any]]:
    """Time and score every method on ``n`` subjects of the cohort in ``cohort_dir``.

    Returns one row per (subject, method): ``subject``, ``spacing``, ``defects``,
    ``method``, ``seconds``, ``tre_mean_mm``, ``tre_max_mm``, ``threads`` (SimpleITK)
    and ``ants_threads`` (the count ANTs was loaded with).
    """
    if "ants" not in sys.modules:
        # ANTs' ITK reads its thread count once, when the library loads.
        os.environ.setdefault(ITK_THREADS_VARIABLE, str(threads))
    import SimpleITK as sitk

    from mriprep.demo import load_demo_cohort
    from mriprep.registration.geometry import target_registration_error
    from mriprep.registration.template import template_brain_points
    from mriprep.stages.register import RegisterParams, prepare_template
    from mriprep.templates import load_template

    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(threads)
    ants_threads = int(os.environ.get(ITK_THREADS_VARIABLE, threads))
    if ants_threads != threads:
        print(f"note: ANTs was loaded with {ants_threads} thread(s), not {threads}",
              flush=True)
    cohort = load_demo_cohort(cohort_dir)
    template = load_template(cohort.truth["template"])
    points = template_brain_points(cohort.truth["template"])
    prepare_template(RegisterParams())
    runners = {
        "mriprep sitk": _mriprep("sitk", threads),
        "mriprep ants": _mriprep("ants", threads),
        "ANTs Rigid": _ants_default("Rigid"),
        "ANTs QuickRigid": _ants_default("QuickRigid"),
    }
    rows = []
    for subject_id in pick_subjects(cohort.truth, n):
        truth = cohort.subjects[subject_id]
        volume = _preprocess(cohort, subject_id)
        for method in methods:
            start = time.perf_counter()
            estimated = runners[method](volume, template)
            seconds = time.perf_counter() - start
            mean, worst = target_registration_error(
                estimated, np.asarray(truth["template_to_subject"]), points
            )
            rows.append({
                "subject": subject_id,
                "spacing": truth["spacing"],
                "defects": [d["kind"] for d in truth["defects"]],
                "method": method,
                "seconds": seconds,
                "tre_mean_mm": mean,
                "tre_max_mm": worst,
                "threads": threads,
                "ants_threads": ants_threads,
            })
            print(f"  {subject_id} {method:16s} {seconds:6.2f} s  TRE {mean:.3f} / "
                  f"{worst:.3f} mm", flush=True)
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method: median seconds, mean and max TRE, median per-subject time ratio to
    ANTs' default Rigid."""
    anchor = {r["subject"]: r["seconds"] for r in rows if r["method"] == ANCHOR}
    summary = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        ratios = [r["seconds"] / anchor[r["subject"]] for r in mine if r["subject"] in anchor]
        summary.append({
            "method": method,
            "subjects": len(mine),
            "median_seconds": statistics.median(r["seconds"] for r in mine),
            "tre_mean_mm": float(np.mean([r["tre_mean_mm"] for r in mine])),
            "tre_max_mm": max(r["tre_max_mm"] for r in mine),
            "ratio_to_ants_rigid": statistics.median(ratios) if ratios else None,
        })
    return summary


def format_table(summary: list[dict[str, Any]]) -> str:
    lines = [f"{'method':18s} {'n':>3s} {'median s':>9s} {'mean TRE':>9s} {'max TRE':>8s} "
             f"{'x ANTs Rigid':>12s}"]
    for s in summary:
        ratio = "-" if s["ratio_to_ants_rigid"] is None else f"{s['ratio_to_ants_rigid']:.3f}"
        lines.append(f"{s['method']:18s} {s['subjects']:3d} {s['median_seconds']:9.2f} "
                     f"{s['tre_mean_mm']:9.3f} {s['tre_max_mm']:8.3f} {ratio:>12s}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cohort", help="a demo cohort folder (default: build one)")
    parser.add_argument("--subjects", type=int, default=3,
                        help="subjects to register (default 3: ANTs' Rigid takes ~30 s each)")
    parser.add_argument("--threads", type=int, default=2, help="ITK threads, every method")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.subjects < 1:
        parser.error("--subjects must be at least 1")

    with tempfile.TemporaryDirectory(prefix="mriprep-bench-reg-") as scratch:
        cohort_dir = args.cohort
        if cohort_dir is None:
            from mriprep.demo import build_demo_cohort

            cohort_dir = Path(scratch) / "cohort"
            print(f"building the demo cohort in {cohort_dir} ...", flush=True)
            build_demo_cohort(cohort_dir, n_subjects=12, seed=0)
        rows = run(cohort_dir, args.subjects, args.threads, tuple(args.methods))
    summary = summarise(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    else:
        print(f"\nrigid registration to MNI152, {args.threads} ITK thread(s), "
              f"TRE over template brain voxels")
        print(format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
