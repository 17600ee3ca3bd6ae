"""The plausibility measures on the calibration set: their ranges on good scans and on
failures, where the limits sit, and what each case ends as.

Every case of :func:`mriprep.demo.calibration.calibration_cases` (good scans of four
synthetic people and the real Colin27 scans in five acquisitions, and the registration
failures) and of :func:`~mriprep.demo.calibration.plausibility_cases` (sheared sforms,
voxel sizes in the wrong unit, a blank volume, a 64 mm crop) is sanitised and measured
by the plausibility stage; the conform pipeline's quality stages and resample then put
it on FastSurfer's 256^3 grid, where validate's ``head_coverage`` is measured (the
largest grid mriprep ships: on the default pipeline's MNI152 grid, 8.7 L against 16.8,
each head covers about twice the share). Nothing is asserted; the table is printed.

Run: ``python benchmarks/bench_plausibility.py [--people 4] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mriprep.core.errors import StageError  # noqa: E402
from mriprep.core.volume import Volume  # noqa: E402
from mriprep.demo.calibration import (  # noqa: E402
    calibration_cases,
    expected_checks,
    plausibility_cases,
)
from mriprep.pipelines import load_pipeline  # noqa: E402
from mriprep.stages import get_stage  # noqa: E402
from mriprep.stages.plausibility import PlausibilityParams, broken_checks, measure  # noqa: E402
from mriprep.stages.validate import ValidateParams, head_coverage  # noqa: E402

# Measure -> (how to read it from a row, the limit(s) it is held to).
_DEFAULTS, _VALIDATE = PlausibilityParams(), ValidateParams()
MEASURES = {
    "smallest voxel side (mm)": (lambda r: min(r["voxel_size_mm"]),
                                 f">= {_DEFAULTS.min_voxel_mm:g}"),
    "largest voxel side (mm)": (lambda r: max(r["voxel_size_mm"]),
                                f"<= {_DEFAULTS.max_voxel_mm:g}"),
    "shear (deg)": (lambda r: r["shear_deg"], f"<= {_DEFAULTS.max_shear_deg:g}"),
    "large_scale_share": (lambda r: r["large_scale_share"],
                          f">= {_DEFAULTS.min_large_scale_share:g}"),
    "background_share": (lambda r: r["background_share"],
                         f">= {_DEFAULTS.min_background_share:g}"),
    "head length (mm)": (lambda r: r["head_length_mm"],
                         f"{_DEFAULTS.min_head_length_mm:g}-{_DEFAULTS.max_head_length_mm:g}"),
    "head width (mm)": (lambda r: None if r["head_extents_mm"] is None
                        else r["head_extents_mm"][-1], f">= {_DEFAULTS.min_head_width_mm:g}"),
    "head coverage, 256^3": (lambda r: r.get("head_coverage"),
                             f">= {_VALIDATE.min_head_coverage:g}"),
}


def _conform_coverage(volume: Volume) -> float | None:
    """The head's share of FastSurfer's grid after the conform pipeline's stages (all
    but the checks)."""
    for step in load_pipeline("conform_1mm").steps:
        if step.name in ("sanitize", "plausibility", "validate"):
            continue
        try:
            volume = get_stage(step.name)(volume, step.params)
        except StageError:
            return None
    return head_coverage(volume)


def run(people: int = 4) -> list[dict[str, Any]]:
    rows = []
    for case in calibration_cases(people=people) + plausibility_cases():
        start = time.perf_counter()
        scan = case.build()
        raw = Volume.from_array(scan.data, scan.affine, subject_id=case.name)
        row: dict[str, Any] = {"case": case.name, "kind": case.kind,
                               "expected": sorted(expected_checks(case))}
        try:
            volume = get_stage("sanitize")(raw)
        except StageError as exc:
            # A blank volume: sanitize refuses it before plausibility sees it; the stage
            # must still refuse it alone, so it is measured on the raw volume too.
            row["sanitize"] = exc.reason
            volume = raw
        row.update(measure(volume))
        row["broken"] = sorted(broken_checks(row, PlausibilityParams()))
        row["head_coverage"] = _conform_coverage(volume) if "sanitize" not in row else 0.0
        if row["head_coverage"] is not None and row["head_coverage"] < \
                _VALIDATE.min_head_coverage:
            row["broken"].append("head_coverage")
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(f"  {case.name:34s} {', '.join(row['broken']) or 'passes':28s} "
              f"({row['seconds']} s)", flush=True)
    return rows


def _range(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    low, high = min(values), max(values)
    text = (lambda v: f"{v:.3g}") if max(abs(low), abs(high)) < 1000 else (lambda v: f"{v:.0f}")
    return text(low) if low == high else f"{text(low)} - {text(high)}"


def format_table(rows: list[dict[str, Any]]) -> str:
    good = [r for r in rows if r["kind"] == "good"]
    failures = [r for r in rows if r["expected"]]
    plausible = [r for r in rows if r["kind"] != "good" and not r["expected"]]
    lines = [f"{'measure':26s} {'limit':10s} {'good scans (n=' + str(len(good)) + ')':22s} "
             f"failures by kind: range"]
    for name, (read, limit) in MEASURES.items():
        worst = []
        for kind in sorted({r["kind"] if r["kind"] != "no_brain" else "noise"
                            for r in failures}):
            of_kind = [read(r) for r in failures
                       if (r["kind"] if r["kind"] != "no_brain" else "noise") == kind]
            worst.append(f"{kind} {_range(of_kind)}")
        lines.append(f"{name:26s} {limit:10s} {_range(read(r) for r in good):22s} "
                     + "; ".join(worst))
    refused_good = [r["case"] for r in good if r["broken"]]
    missed = [r["case"] for r in failures if not set(r["broken"]) & set(r["expected"])]
    wrongly = [r["case"] for r in plausible if r["broken"]]
    lines.append(f"good scans refused: {len(refused_good)}/{len(good)} {refused_good or ''}")
    lines.append(f"failures refused by an expected check: {len(failures) - len(missed)}/"
                 f"{len(failures)} {missed or ''}")
    lines.append(f"plausible inputs for register to judge (wrong headers, phantom, T2) "
                 f"refused here: {len(wrongly)}/{len(plausible)} {wrongly or ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from mriprep.demo.real_scans import HOW_TO_GET, real_scans_folder

    if real_scans_folder() is None:
        print(f"(real scans not installed: synthetic people only. {HOW_TO_GET})")
    rows = run(args.people)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
