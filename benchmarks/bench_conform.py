"""The conform pipeline against FastSurfer's conform, voxel by voxel.

FastSurfer's conform (``FastSurferCNN/data_loader/conform.py``) is restated by
:mod:`mriprep.demo.fastsurfer_conform` (FastSurfer is not on PyPI). For each scan both
give a uint8 256^3 LIA image (mriprep: ``conform_1mm`` with ``output_dtype: uint8``);
the table compares them at equal world positions over the voxels non-zero in either:
the share equal, the share within one grey level, the mean and largest difference, the
offset between the grids (FastSurfer moves an odd-sized 1 mm scan by whole voxels to
avoid interpolating; mriprep by half a voxel, see ``resample``), and both times.

Scans: the demo cohort's images (straight 1 mm, thick and oblique; those with planted
defects are listed apart: there FastSurfer's conform is not meant to agree, since a NaN
or 1e308 voxel breaks its range, a spike slice moves its top percentile, and it keeps
the slices mriprep masks and fills) and, where mricron-data is installed, the real
Colin27 scans as stored and tilted by 20 degrees. Nothing is asserted.

Where the two differ on clean scans: next to the clipped brightest 0.1%, because mriprep
clips before it interpolates and FastSurfer after (on Colin27 tilted by 20 degrees, all
5,087 voxels that differ by more than two grey levels lie within two voxels of one at
250 or above).

Then ``conform_min`` against FastSurfer's own conform (``--vox_size min``, threshold
0.98), run from its checkout (:mod:`mriprep.demo.fastsurfer_checkout`), on the real
heads of ``tests/demo/test_conform_min_fidelity.py``: 0.5-1 mm, tilted and thick.

Run: ``python benchmarks/bench_conform.py [COHORT] [--json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mriprep.core.errors import StageError  # noqa: E402
from mriprep.core.volume import Volume  # noqa: E402
from mriprep.demo.fastsurfer_conform import (  # noqa: E402
    agreement,
    fastsurfer_conform,
    header_affine,
)
from mriprep.inputs.readers import load_volume  # noqa: E402
from mriprep.pipelines import load_pipeline, run_stages  # noqa: E402
from mriprep.run.subject import output_tensors  # noqa: E402

# Planted defects that change the image (the rest, a rescan or a leaked copy, do not).
# FastSurfer is not expected to agree there: a NaN or 1e308 voxel breaks its range, a
# spike slice moves its top percentile, and it keeps what mriprep masks and fills.
_UNCHANGED = {"rescan", "leak"}


@functools.lru_cache(maxsize=1)
def _uint8_conform():
    return load_pipeline("conform_1mm", output_dtype="uint8")


def compare(name: str, volume: Volume, data: np.ndarray, affine: np.ndarray,
            group: str) -> dict[str, Any]:
    pipeline = _uint8_conform()
    row: dict[str, Any] = {"scan": name, "group": group}
    start = time.perf_counter()
    try:
        out = run_stages(volume, pipeline)
    except StageError as exc:
        row["refused"] = f"{exc.stage}: {exc.reason[:70]}"
        return row
    ours = output_tensors(out, "uint8")["image"]
    row["mriprep_s"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    with np.errstate(all="ignore"):
        theirs, their_affine = fastsurfer_conform(np.nan_to_num(data, posinf=np.finfo(
            np.float64).max), affine)
    row["fastsurfer_s"] = round(time.perf_counter() - start, 2)
    found = agreement(ours, out.affine, theirs, their_affine)
    row.update(dataclasses.asdict(found))
    row["kernel"] = out.record_of("resample").metrics["kernel"].split(",")[0]
    return row


def _demo_rows(cohort: Path) -> list[dict[str, Any]]:
    truth = json.loads((cohort / "ground_truth.json").read_text())
    rows = []
    for name, scan in truth["subjects"].items():
        if scan["expected"] == "fail":
            continue
        kinds = {d["kind"] for d in scan["defects"]}
        path = cohort / scan["image"]
        img = nib.load(path)
        data = np.asarray(img.dataobj, dtype=np.float64)
        group = "demo, planted defects" if kinds - _UNCHANGED else "demo"
        rows.append(compare(name, load_volume(path, subject_id=name), data,
                            header_affine(img), group))
        print(f"  {name}", flush=True)
    return rows


def _real_rows() -> list[dict[str, Any]]:
    from mriprep.demo.calibration import real_head
    from mriprep.demo.real_scans import real_scan
    from mriprep.demo.scanner import Acquisition, acquire

    rows = []
    for name in ("colin27", "colin27_brain", "colin27_05mm"):
        path = real_scan(name)
        if path is None:
            continue
        img = nib.load(path)
        data = np.asarray(img.dataobj, dtype=np.float64)
        rows.append(compare(f"{name} as stored", load_volume(path, subject_id=name), data,
                            header_affine(img), "real"))
        tilted = acquire(real_head(name), np.eye(4), Acquisition(tilt_deg=20.0),
                         np.random.default_rng(9))
        rows.append(compare(f"{name} tilted 20 deg",
                            Volume.from_array(tilted.data, tilted.affine, subject_id=name),
                            tilted.data.astype(np.float64), tilted.affine, "real"))
        print(f"  {name}", flush=True)
    return rows


def min_rows() -> list[dict[str, Any]]:
    """``conform_min`` against FastSurfer's own conform (``--vox_size min``, threshold
    0.98) from its checkout, on the cases of the fidelity test; [] without one."""
    from mriprep.demo.fastsurfer_checkout import (
        MIN_FIDELITY_CASES,
        compare_with_fastsurfer,
        fastsurfer_module,
        min_fidelity_scan,
    )

    if fastsurfer_module("FastSurferCNN.data_loader.conform") is None:
        return []
    rows = []
    for case in MIN_FIDELITY_CASES:
        found = min_fidelity_scan(case)
        if found is None:
            continue
        data, affine, _ = found
        got = compare_with_fastsurfer(data, affine)
        rows.append({"scan": case, "voxel_mm": round(float(got.volume.spacing[0]), 4),
                     "side": int(got.ours.shape[0]), **dataclasses.asdict(got.agreement),
                     "mriprep_s": got.mriprep_s, "fastsurfer_s": got.fastsurfer_s})
        print(f"  {case}", flush=True)
    return rows


def format_min_table(rows: list[dict[str, Any]]) -> str:
    lines = ["conform_min against FastSurfer's own conform (--vox_size min, threshold 0.98);"
             " equal and <=1 over all the valid voxels, the field of view's edge included;"
             " 'inv>0': voxels held invalid where FastSurfer's image is not 0",
             f"{'scan':30s} {'mm':>6s} {'side':>5s} {'grid':>5s} {'equal':>9s} {'<=1':>8s} "
             f"{'max':>4s} {'inv>0':>6s} {'mriprep_s':>9s} {'fs_s':>6s}"]
    for r in rows:
        lines.append(
            f"{r['scan']:30s} {r['voxel_mm']:6.4g} {r['side']:5d} "
            f"{'same' if r['same_grid'] else 'DIFF':>5s} {r['equal']:9.4%} "
            f"{r['within_one']:8.4%} {r['max_abs']:4d} {r['invalid_nonzero']:6d} "
            f"{r['mriprep_s']:9.2f} {r['fastsurfer_s']:6.2f}")
    if rows:
        lines.append(f"   worst: equal {min(r['equal'] for r in rows):.4%}, within one "
                     f"{min(r['within_one'] for r in rows):.4%}; grids the same in "
                     f"{sum(r['same_grid'] for r in rows)} of {len(rows)}")
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'scan':28s} {'grid':14s} {'offset':14s} {'equal':>8s} {'<=1':>8s} "
             f"{'mean|d|':>8s} {'max':>4s} {'mriprep_s':>9s} {'fs_s':>6s}"]
    for group in ("demo", "real", "demo, planted defects"):
        chosen = [r for r in rows if r["group"] == group]
        if not chosen:
            continue
        lines.append(f"-- {group}")
        for r in chosen:
            if "refused" in r:
                lines.append(f"{r['scan']:28s} refused at {r['refused']}")
                continue
            offset = ",".join(f"{o:.0f}" for o in r["offset_voxels"])
            lines.append(
                f"{r['scan']:28s} {r['kernel'][:14]:14s} {offset:14s} {r['equal']:8.4%} "
                f"{r['within_one']:8.4%} {r['mean_abs']:8.4f} {r['max_abs']:4d} "
                f"{r['mriprep_s']:9.2f} {r['fastsurfer_s']:6.2f}")
        compared = [r for r in chosen if "equal" in r]
        if compared and group != "demo, planted defects":
            lines.append(f"   worst: equal {min(r['equal'] for r in compared):.4%}, within "
                         f"one {min(r['within_one'] for r in compared):.4%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cohort", nargs="?", help="demo cohort folder (default: build one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from mriprep.demo.real_scans import HOW_TO_GET, real_scans_folder

    if args.cohort is None:
        import tempfile

        from mriprep.demo import build_demo_cohort

        with tempfile.TemporaryDirectory(prefix="mriprep-bench-conform-") as scratch:
            rows = _demo_rows(build_demo_cohort(Path(scratch) / "demo").root)
    else:
        rows = _demo_rows(Path(args.cohort))
    if real_scans_folder() is None:
        print(f"(real scans not installed: demo only. {HOW_TO_GET})")
    rows += _real_rows()
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    high_res = min_rows()
    if not high_res:
        from mriprep.demo.fastsurfer_checkout import HOW_TO_ENABLE

        print(f"(conform_min against FastSurfer's own conform: skipped; {HOW_TO_ENABLE})")
    else:
        print(json.dumps(high_res, indent=1) if args.json else format_min_table(high_res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
