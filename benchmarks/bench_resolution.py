"""The acquired-resolution measure on its tuning set and its frozen held-out set, side by
side: the ratio acquired/claimed on the axes of genuine scans and on the falsely fine
axes, the threshold (1.5) and the margin on each side, the marks' strengths against
their thresholds, how many scans are flagged, and the time per volume.

The sets are :mod:`mriprep.demo.resolution_sets` (the thresholds of
:mod:`mriprep.stages.acquired_resolution` were tuned on the tuning set only). Each scan
is built, then measured :data:`ROUNDS` times (the time is the best of them: what one
call costs on an idle core); a 256^3 volume (S1 as stored) is timed beside them. Nothing
is asserted; ``make test-calibration`` holds the held-out set.

Run: ``python benchmarks/bench_resolution.py [--sets tuning heldout] [--cases] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mriprep.demo.real_scans import HOW_TO_GET  # noqa: E402
from mriprep.demo.resolution_sets import SETS, missing_sources, set_cases  # noqa: E402
from mriprep.stages.acquired_resolution import (  # noqa: E402
    CLAIMED_FINER_RATIO,
    CLIFF_DB,
    NOTCH_DB,
    acquired_resolution,
)

ROUNDS = 3


def measure_set(which: str, show_cases: bool = False) -> list[dict[str, Any]]:
    """One row per scan of set ``which``: what it is, what was measured, how long."""
    rows = []
    for case in set_cases(which):
        scan = case.build()
        spacing = tuple(float(s) for s in np.linalg.norm(scan.affine[:3, :3], axis=0))
        seconds = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            result = acquired_resolution(scan.data, spacing)
            seconds.append(time.perf_counter() - start)
        fine = case.row.fine_axes
        row = {"case": case.name, "kind": case.row.kind, "fine_axes": list(fine),
               "shape": list(scan.data.shape), "claimed_mm": list(result.claimed_mm),
               "sizes_mm": list(result.sizes_mm), "ratios": list(result.ratios),
               "marks": list(result.marks), "notch_db": list(result.notch_db),
               "cliff_db": list(result.cliff_db), "segments": list(result.segments),
               "flagged_axes": list(result.falsely_fine_axes()),
               "seconds": min(seconds)}
        row["right"] = row["flagged_axes"] == list(fine)
        rows.append(row)
        if show_cases or not row["right"]:
            print(f"  {which:8s} {case.name:40s} {'ok ' if row['right'] else 'WRONG'} "
                  f"ratios {' '.join(f'{r:.2f}' for r in row['ratios'])} "
                  f"({', '.join(m or '-' for m in row['marks'])}) "
                  f"{1000 * row['seconds']:.0f} ms", flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one set (see the module doc)."""
    genuine_axes, fake_axes = [], []
    for row in rows:
        for axis in range(3):
            (fake_axes if axis in row["fine_axes"] else genuine_axes).append((row, axis))
    genuine = [r["ratios"][a] for r, a in genuine_axes]
    fake = [r["ratios"][a] for r, a in fake_axes]
    # How far a mark is from its threshold (dB): above it on a falsely fine axis (the
    # stronger of the two marks), below it on a genuine one (the nearer of the two).
    above = [max(r["notch_db"][a] - NOTCH_DB, r["cliff_db"][a] - CLIFF_DB)
             for r, a in fake_axes if r["marks"][a] in ("notch", "cliff")]
    below = [min(NOTCH_DB - r["notch_db"][a], CLIFF_DB - r["cliff_db"][a])
             for r, a in genuine_axes]
    nearest = min(genuine_axes, key=lambda ra: min(NOTCH_DB - ra[0]["notch_db"][ra[1]],
                                                   CLIFF_DB - ra[0]["cliff_db"][ra[1]]),
                  default=None)
    genuine_scans = [r for r in rows if r["kind"] == "genuine"]
    fake_scans = [r for r in rows if r["kind"] == "falsely_fine"]
    times = [r["seconds"] for r in rows]
    return {
        "scans": len(rows),
        "genuine_axes": _spread(genuine),
        "genuine_strongest_notch_db": max((r["notch_db"][a] for r, a in genuine_axes),
                                          default=None),
        "genuine_strongest_cliff_db": max((r["cliff_db"][a] for r, a in genuine_axes),
                                          default=None),
        "genuine_least_db_below": min(below, default=None),
        "genuine_nearest": None if nearest is None else nearest[0]["case"],
        "falsely_fine_axes": _spread(fake),
        "falsely_fine_marks": {m: sum(r["marks"][a] == m for r, a in fake_axes)
                               for m in ("notch", "cliff", "empty band", "")},
        "falsely_fine_least_db_above": min(above, default=None),
        "margin_below": CLAIMED_FINER_RATIO / max(genuine) if genuine else None,
        "margin_above": min(fake) / CLAIMED_FINER_RATIO if fake else None,
        "genuine_flagged": [r["case"] for r in genuine_scans if r["flagged_axes"]],
        "genuine_scans": len(genuine_scans),
        "falsely_fine_right": sum(r["right"] for r in fake_scans),
        "falsely_fine_scans": len(fake_scans),
        "falsely_fine_wrong": [r["case"] for r in fake_scans if not r["right"]],
        "ms": _spread([1000 * t for t in times]),
        "megavoxels": _spread([float(np.prod(r["shape"])) / 1e6 for r in rows]),
    }


def _spread(values: list[float]) -> tuple[float, float, float] | None:
    return (min(values), statistics.median(values), max(values)) if values else None


def _text(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return " / ".join(f"{v:.{digits}f}" for v in value)
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_table(figures: dict[str, dict[str, Any]], ms_256: float | None) -> str:
    names = list(figures)
    width = 34
    lines = [f"acquired resolution: ratio acquired/claimed per voxel axis; an axis is "
             f"flagged from {CLAIMED_FINER_RATIO:g} (CLAIMED_FINER_RATIO)",
             f"{'':46s}" + "".join(f"{n + ' (' + str(figures[n]['scans']) + ' scans)':{width}s}"
                                   for n in names)]

    def line(label, cell):
        lines.append(f"{label:46s}" + "".join(f"{cell(figures[n]):{width}s}" for n in names))

    line("genuine axes: ratio min / median / max", lambda f: _text(f["genuine_axes"]))
    line(f"  margin below {CLAIMED_FINER_RATIO:g} (1.5 / max)", lambda f: _text(
        f["margin_below"]) + "x")
    line(f"  deepest notch (dB; a mark from {NOTCH_DB:g})",
         lambda f: _text(f["genuine_strongest_notch_db"], 1))
    line(f"  largest drop (dB; a cliff from {CLIFF_DB:g})",
         lambda f: _text(f["genuine_strongest_cliff_db"], 1))
    line("  nearest a mark: dB below its threshold",
         lambda f: _text(f["genuine_least_db_below"], 1) + f" ({f['genuine_nearest']})")
    line("falsely fine axes: ratio min / median / max",
         lambda f: _text(f["falsely_fine_axes"]))
    line(f"  margin above {CLAIMED_FINER_RATIO:g} (min / 1.5)", lambda f: _text(
        f["margin_above"]) + "x")
    line("  found by notch / cliff / empty band / none", lambda f: " / ".join(
        str(f["falsely_fine_marks"][m]) for m in ("notch", "cliff", "empty band", "")))
    line("  weakest notch or cliff: dB above threshold",
         lambda f: _text(f["falsely_fine_least_db_above"], 1))
    line("genuine scans flagged", lambda f: f"{len(f['genuine_flagged'])} of "
                                            f"{f['genuine_scans']}")
    line("falsely fine scans flagged, right axes", lambda f: f"{f['falsely_fine_right']} of "
                                                             f"{f['falsely_fine_scans']}")
    line("time per volume, ms: min / median / max", lambda f: _text(f["ms"], 0))
    line("megavoxels per volume: min / median / max", lambda f: _text(f["megavoxels"], 1))
    for name in names:
        wrong = figures[name]["genuine_flagged"] + figures[name]["falsely_fine_wrong"]
        if wrong:
            lines.append(f"{name}: wrong: {', '.join(wrong)}")
    if ms_256 is not None:
        lines.append(f"a 256^3 volume (S1 as stored): {ms_256:.0f} ms, best of {ROUNDS}")
    return "\n".join(lines)


def _time_256() -> float | None:
    from mriprep.demo.resolution_sets import build_scan, rows

    row = next((r for r in rows("heldout") if r.case == "s1/native"), None)
    if row is None or missing_sources("heldout"):
        return None
    scan = build_scan(row)
    best = min(_timed(scan) for _ in range(ROUNDS))
    return 1000 * best


def _timed(scan) -> float:
    start = time.perf_counter()
    acquired_resolution(scan.data, (1.0, 1.0, 1.0))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    parser.add_argument("--cases", action="store_true", help="print every scan's line")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    for which in args.sets:
        missing = missing_sources(which)
        if missing:
            print(f"({which}: real scans {', '.join(missing)} not installed, left out. "
                  f"{HOW_TO_GET})")
    rows = {which: measure_set(which, args.cases) for which in args.sets}
    figures = {which: summary(r) for which, r in rows.items() if r}
    if args.json:
        print(json.dumps({"figures": figures, "rows": rows}, indent=1))
    else:
        print(format_table(figures, _time_256()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
