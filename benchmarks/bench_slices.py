"""Slice masking: false positives and recall on the calibration set, then the demo.

Two parts, both with default parameters after reorient and sanitize, as the default
pipeline runs them:

* **Calibration set** (:mod:`mriprep.demo.calibration`'s anatomies: synthetic people and,
  where installed, the real Colin27 scans), each scanned at 3 and 5 mm in axial, coronal
  and sagittal slicing, straight and tilted by 20 degrees, with the field of view cut at
  the vertex, at the neck or at 180 mm. False positives: slices flagged on these clean
  scans. Recall: in each scan, one spike (x2.5-4), one dropout (x0.4-0.6), one
  zero-filled and one half zero-filled slice planted in the bulk of the head (cross-
  section at least half the largest), at least 4 slices apart; each must be flagged.
  Goals (issue 12): no false positive, at least 95% of each kind found.
* **Demo cohort**: the planted defects of ``ground_truth.json`` found / missed, and
  flagged slices that were not planted.

Run: ``python benchmarks/bench_slices.py [COHORT_DIR] [--people N] [--json]``; without
COHORT_DIR a demo cohort is built in a temporary folder first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mriprep.core.volume import Volume  # noqa: E402
from mriprep.demo import build_demo_cohort, load_demo_cohort  # noqa: E402
from mriprep.demo.verify import as_reoriented  # noqa: E402
from mriprep.inputs.readers import load_volume  # noqa: E402
from mriprep.stages import get_stage  # noqa: E402

INCOMPLETE_KINDS = ("zero_slab",)
ARTIFACT_KINDS = ("spike_slice", "dropout_slice")
# Defects that change voxel values; a subject with none of them is clean.
VOXEL_DEFECTS = ("nan_blob", "extreme_values", "dead_volume", *INCOMPLETE_KINDS,
                 *ARTIFACT_KINDS)


def planted_slices(truth: dict[str, Any]) -> tuple[set, set]:
    """(axis, index) pairs of the planted incomplete and artifact slices, as the
    reoriented (RAS+) volume has them."""
    incomplete, artifact = set(), set()
    for defect in truth["defects"]:
        if defect["kind"] in INCOMPLETE_KINDS:
            axis, slices = as_reoriented(truth, defect["axis"], defect["slices"])
            incomplete |= {(axis, i) for i in slices}
        elif defect["kind"] in ARTIFACT_KINDS:
            axis, (index,) = as_reoriented(truth, defect["axis"], [defect["index"]])
            artifact.add((axis, index))
    return incomplete, artifact


def flagged_slices(volume: Volume) -> set[tuple[int, int]]:
    """(axis, index) of every slice mask_slices flagged on ``volume``."""
    metrics = volume.record_of("mask_slices").metrics
    return {(axis, int(i)) for axis in range(3) for i in metrics[f"axis_{axis}"]["flagged"]}


def score_subject(path: Path, subject_id: str, truth: dict[str, Any]) -> dict[str, Any]:
    """Mask one subject's slices and compare them with its planted defects."""
    start = time.perf_counter()
    volume = get_stage("reorient")(load_volume(path, subject_id=subject_id))
    masked = get_stage("mask_slices")(get_stage("sanitize")(volume))
    flagged = flagged_slices(masked)
    incomplete, artifact = planted_slices(truth)
    clean = not any(d["kind"] in VOXEL_DEFECTS for d in truth["defects"])
    return {
        "clean": clean,
        "flagged": sorted(flagged),
        "incomplete_found": sorted(incomplete & flagged),
        "incomplete_missed": sorted(incomplete - flagged),
        "artifact_found": sorted(artifact & flagged),
        "artifact_missed": sorted(artifact - flagged),
        "false_positives": sorted(flagged - incomplete - artifact),
        "slices_checked": int(sum(volume.shape)),
        "seconds": round(time.perf_counter() - start, 3),
    }


def run(cohort_dir: str | os.PathLike) -> dict[str, Any]:
    """Score slice masking on the demo cohort in ``cohort_dir``.

    Returns
    -------
    dict
        ``subjects`` (per-subject results, see :func:`score_subject`), ``skipped``
        (subjects expected to fail, with their defects), and the confusion counts:
        ``incomplete`` and ``artifact`` ({planted, found, missed}), ``false_positives``
        ({clean_subjects, defect_subjects}) and ``clean_slices_checked``.
    """
    cohort = load_demo_cohort(cohort_dir)
    subjects, skipped = {}, {}
    for subject_id, truth in cohort.subjects.items():
        if truth["expected"] != "cached":
            skipped[subject_id] = [d["kind"] for d in truth["defects"]]
            continue
        subjects[subject_id] = score_subject(cohort.image_path(subject_id), subject_id, truth)

    def total(key: str, clean: bool | None = None) -> int:
        return sum(len(r[key]) for r in subjects.values() if clean is None or r["clean"] == clean)

    return {
        "subjects": subjects,
        "skipped": skipped,
        "incomplete": {
            "planted": total("incomplete_found") + total("incomplete_missed"),
            "found": total("incomplete_found"),
            "missed": total("incomplete_missed"),
        },
        "artifact": {
            "planted": total("artifact_found") + total("artifact_missed"),
            "found": total("artifact_found"),
            "missed": total("artifact_missed"),
        },
        "false_positives": {
            "clean_subjects": total("false_positives", clean=True),
            "defect_subjects": total("false_positives", clean=False),
        },
        "clean_slices_checked": sum(
            r["slices_checked"] for r in subjects.values() if r["clean"]
        ),
    }


PLANTED_KINDS = ("spike", "dropout", "zero", "partial")
SLICE_THICKNESSES_MM = (3.0, 5.0)
SLICINGS = ("axial", "coronal", "sagittal")
TILTS_DEG = (0.0, 20.0)


def calibration_scans(people: int = 4, seed: int = 0):
    """(name, Volume after reorient) of every clean thick-slice calibration scan."""
    from mriprep.demo.calibration import person, real_head
    from mriprep.demo.real_scans import real_scan
    from mriprep.demo.scanner import Acquisition, acquire, random_pose

    anatomies = [(f"person-{i}", lambda i=i: person(seed * 100 + i)) for i in range(people)]
    anatomies += [(name, lambda name=name: real_head(name))
                  for name in ("colin27", "colin27_brain", "colin27_05mm")
                  if real_scan(name) is not None]
    grids = list(itertools.product(SLICE_THICKNESSES_MM, SLICINGS, TILTS_DEG))
    for a_index, (name, anatomy) in enumerate(anatomies):
        for g_index, (thick, slicing, tilt) in enumerate(grids):
            rng = np.random.default_rng([seed, a_index, g_index, 5])
            in_plane = 0.9 if thick == 5.0 else 1.0
            # Fields of view: the whole head to the neck, cut 4 mm into the vertex,
            # and 180 mm down from just above the vertex.
            acquisition = Acquisition(
                (in_plane, in_plane, thick), slicing, tilt_deg=tilt,
                coverage_mm=None if g_index % 3 else 180.0,
                vertex_margin_mm=(6.0, -4.0, 0.0)[g_index % 3])
            scan = acquire(anatomy(), random_pose(rng, 15.0, 15.0), acquisition, rng)
            volume = Volume.from_array(scan.data, scan.affine, subject_id=name)
            label = f"{name} {thick:g}mm {slicing} tilt {tilt:g}"
            yield label, get_stage("reorient")(volume), [seed, a_index, g_index, 9]


def _plant(volume: Volume, rng_seed) -> tuple[Volume, int, dict[str, int]]:
    """The four planted kinds in the bulk of the head, along the thickest axis."""
    rng = np.random.default_rng(rng_seed)
    axis = int(np.argmax(volume.spacing))
    data = volume.data.copy()
    slices = np.moveaxis(data, axis, 0)
    head = np.moveaxis(volume.data > 0.1 * np.percentile(volume.data, 99), axis, 0)
    area = head.sum(axis=(1, 2))
    bulk = np.flatnonzero(area > 0.5 * area.max())
    candidates = np.arange(bulk[0], bulk[-1] + 1)
    picks: dict[str, int] = {}
    for kind in PLANTED_KINDS:
        free = [i for i in candidates if all(abs(i - p) > 3 for p in picks.values())]
        index = int(rng.choice(free))
        picks[kind] = index
        if kind == "spike":
            slices[index] *= rng.uniform(2.5, 4.0)
        elif kind == "dropout":
            slices[index] *= rng.uniform(0.4, 0.6)
        elif kind == "zero":
            slices[index] = 0.0
        else:  # half of the head's extent zero-filled (a partial slice)
            columns = np.flatnonzero(head[index].any(axis=0))
            middle = (columns[0] + columns[-1]) // 2
            if rng.random() < 0.5:
                slices[index][:, :middle] = 0.0
            else:
                slices[index][:, middle:] = 0.0
    return volume.replace(data=data), axis, picks


def run_calibration(people: int = 4, seed: int = 0) -> dict[str, Any]:
    """False positives on the clean calibration scans and recall of planted slices."""
    false_positives, slices_checked, scans = [], 0, 0
    found = dict.fromkeys(PLANTED_KINDS, 0)
    misses, planted_extra = [], []
    start = time.perf_counter()
    for label, volume, plant_seed in calibration_scans(people, seed):
        scans += 1
        clean = get_stage("mask_slices")(get_stage("sanitize")(volume))
        flagged = flagged_slices(clean)
        slices_checked += int(sum(volume.shape))
        false_positives += [(label, axis, index) for axis, index in sorted(flagged)]
        damaged, axis, picks = _plant(volume, plant_seed)
        flagged = flagged_slices(get_stage("mask_slices")(get_stage("sanitize")(damaged)))
        for kind, index in picks.items():
            if (axis, index) in flagged:
                found[kind] += 1
            else:
                misses.append((label, kind, index))
        planted_extra += [(label, a, i) for a, i in sorted(flagged)
                          if (a, i) not in {(axis, p) for p in picks.values()}]
    return {
        "scans": scans,
        "slices_checked": slices_checked,
        "false_positives": false_positives,
        "recall": {kind: [found[kind], scans] for kind in PLANTED_KINDS},
        "missed": misses,
        "extra_flags_in_damaged_scans": planted_extra,
        "seconds": round(time.perf_counter() - start, 1),
    }


def format_calibration(result: dict[str, Any]) -> str:
    recall = result["recall"]
    lines = [
        f"calibration set: {result['scans']} thick-slice scans "
        f"({', '.join(f'{t:g}' for t in SLICE_THICKNESSES_MM)} mm; {', '.join(SLICINGS)}; "
        f"tilt {', '.join(f'{t:g}' for t in TILTS_DEG)} deg), {result['seconds']:.0f} s",
        f"  false positives: {len(result['false_positives'])} in "
        f"{result['slices_checked']} clean slices   (goal: 0)",
        "  recall:          " + ", ".join(
            f"{kind} {n}/{total} ({n / max(total, 1):.0%})" for kind, (n, total) in recall.items())
        + "   (goal: >= 95% each)",
        f"  other slices flagged in the damaged scans: "
        f"{len(result['extra_flags_in_damaged_scans'])}",
    ]
    lines += [f"    false positive: {label}, axis {axis}, slice {index}"
              for label, axis, index in result["false_positives"]]
    lines += [f"    missed: {label}: {kind} at slice {index}"
              for label, kind, index in result["missed"]]
    return "\n".join(lines)


def calibration_goals_met(result: dict[str, Any]) -> bool:
    return not result["false_positives"] and all(
        n >= 0.95 * total for n, total in result["recall"].values())


def format_report(result: dict[str, Any]) -> str:
    """The confusion counts and a line per subject, for people."""
    inc, art, fp = result["incomplete"], result["artifact"], result["false_positives"]
    lines = [
        f"incomplete slices: {inc['found']}/{inc['planted']} found, {inc['missed']} missed",
        f"artifact slices:   {art['found']}/{art['planted']} found, {art['missed']} missed",
        f"false positives:   {fp['clean_subjects']} on clean subjects "
        f"({result['clean_slices_checked']} slices checked), {fp['defect_subjects']} on "
        "non-planted slices of defect subjects",
    ]
    for subject_id, r in result["subjects"].items():
        lines.append(
            f"  {subject_id:<8} {'clean ' if r['clean'] else 'defect'} "
            f"flagged={len(r['flagged']):<3} missed="
            f"{r['incomplete_missed'] + r['artifact_missed']} "
            f"false_positives={r['false_positives']} ({r['seconds']:.1f} s)"
        )
    for subject_id, kinds in result["skipped"].items():
        lines.append(f"  {subject_id:<8} skipped (expected to fail: {', '.join(kinds)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cohort", nargs="?", help="demo cohort folder (default: build one)")
    parser.add_argument("--people", type=int, default=4,
                        help="synthetic people of the calibration set (default 4; the real "
                             "Colin27 scans join them where mricron-data is installed)")
    parser.add_argument("--no-calibration", action="store_true",
                        help="score the demo cohort only")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {}
    if not args.no_calibration:
        from mriprep.demo.real_scans import HOW_TO_GET, real_scans_folder

        if real_scans_folder() is None:
            print(f"(real scans not installed: synthetic people only. {HOW_TO_GET})")
        report["calibration"] = run_calibration(args.people)
        if not args.json:
            print(format_calibration(report["calibration"]), flush=True)
            print("  goals met" if calibration_goals_met(report["calibration"])
                  else "  GOALS NOT MET")
    with tempfile.TemporaryDirectory(prefix="mriprep-bench-slices-") as scratch:
        cohort_dir = args.cohort
        if cohort_dir is None:
            print("building the demo cohort ...", file=sys.stderr)
            cohort_dir = build_demo_cohort(Path(scratch) / "demo").root
        report["demo"] = run(cohort_dir)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print("demo cohort:")
        print(format_report(report["demo"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
