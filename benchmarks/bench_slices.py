"""Slice masking scored against the demo cohort's planted defects.

Every subject that is expected to be cached is loaded, reoriented if it is not stored in
canonical RAS+ order, sanitised and passed through ``mask_slices`` with default
parameters; the flagged slices are compared with ``ground_truth.json``:

* planted incomplete slices (``zero_slab``) found / missed;
* planted artifact slices (``spike_slice``, ``dropout_slice``) found / missed;
* false positives: flagged slices of clean subjects, and flagged slices of defect
  subjects that were not planted.

A planted slice counts as found when it is flagged along its planted axis. The acceptance
targets (issue 4): every incomplete slice found, at least 90% of artifact slices found,
no false positive on a clean subject.

Run: ``python benchmarks/bench_slices.py [COHORT_DIR] [--json]``; without COHORT_DIR a
12-subject demo cohort is built in a temporary folder first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import nibabel as nib  # noqa: E402
import numpy as np  # noqa: E402

from mriprep.demo import build_demo_cohort, load_demo_cohort  # noqa: E402
from mriprep.io import load_volume  # noqa: E402
from mriprep.stages import get_stage  # noqa: E402
from mriprep.volume import Volume  # noqa: E402

INCOMPLETE_KINDS = ("zero_slab",)
ARTIFACT_KINDS = ("spike_slice", "dropout_slice")
# Defects that change voxel values; a subject with none of them is clean.
VOXEL_DEFECTS = ("nan_blob", "extreme_values", "dead_volume", *INCOMPLETE_KINDS,
                 *ARTIFACT_KINDS)


def planted_slices(defects: list[dict[str, Any]]) -> tuple[set, set]:
    """(axis, index) pairs of the planted incomplete and artifact slices."""
    incomplete, artifact = set(), set()
    for defect in defects:
        if defect["kind"] in INCOMPLETE_KINDS:
            incomplete |= {(int(defect["axis"]), int(i)) for i in defect["slices"]}
        elif defect["kind"] in ARTIFACT_KINDS:
            artifact.add((int(defect["axis"]), int(defect["index"])))
    return incomplete, artifact


def load_canonical(path: Path, subject_id: str) -> Volume:
    """The subject's image as a Volume in canonical RAS+ voxel order.

    Ground-truth indices refer to files as written, and every demo file with planted
    slices is canonical; a non-canonical file is reoriented so that masking sees the
    same slices a pipeline would.
    """
    volume = load_volume(path, subject_id=subject_id)
    if nib.aff2axcodes(volume.affine) == ("R", "A", "S"):
        return volume
    if importlib.util.find_spec("mriprep.stages.reorient") is not None:
        return get_stage("reorient")(volume)
    # No reorient stage in this checkout yet: nibabel's exact axis permutation and flip.
    ornt = nib.orientations.io_orientation(volume.affine)
    data = nib.orientations.apply_orientation(volume.data, ornt)
    affine = volume.affine @ nib.orientations.inv_ornt_aff(ornt, volume.shape)
    return Volume.from_array(np.ascontiguousarray(data), affine, subject_id=subject_id)


def flagged_slices(volume: Volume) -> set[tuple[int, int]]:
    """(axis, index) of every slice mask_slices flagged on ``volume``."""
    metrics = volume.record_of("mask_slices").metrics
    return {(axis, int(i)) for axis in range(3) for i in metrics[f"axis_{axis}"]["flagged"]}


def score_subject(path: Path, subject_id: str, truth: dict[str, Any]) -> dict[str, Any]:
    """Mask one subject's slices and compare them with its planted defects."""
    start = time.perf_counter()
    volume = load_canonical(path, subject_id)
    masked = get_stage("mask_slices")(get_stage("sanitize")(volume))
    flagged = flagged_slices(masked)
    incomplete, artifact = planted_slices(truth["defects"])
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
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mriprep-bench-slices-") as scratch:
        cohort_dir = args.cohort
        if cohort_dir is None:
            print("building the demo cohort ...", file=sys.stderr)
            cohort_dir = build_demo_cohort(Path(scratch) / "demo").root
        result = run(cohort_dir)
    print(json.dumps(result, indent=1) if args.json else format_report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
