"""``mriprep demo DIR``: build the demo cohort, preprocess it, check it, score it.

The demo is the whole product on anatomy that is not the template, with known truth: a
cohort of synthetic people in known poses, with planted defects and scans that must be
refused (see :mod:`mriprep.demo.cohort`), ``mriprep run`` over it, ``mriprep check`` on
the cache, and a verdict per expectation against the ground truth. Exit 0 exactly when
every defect and failure was handled as designed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mriprep.core.exit_codes import ExitCode
from mriprep.demo import DEFAULT_SUBJECTS, build_demo_cohort, load_demo_cohort


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="build a demo cohort with known truth (and optionally run and check it)",
        description=(
            "Build a demo cohort of synthetic people (offline): the MNI152 template "
            "shipped with nilearn warped nonlinearly by several mm, rescaled, with its "
            "own tissue contrast, scalp, skull and neck, scanned in known random poses on "
            "1 mm, thick-slice, oblique and backwards-stored grids with bias field and "
            "Rician noise; CSF/GM/WM labels; planted defects (NaN blob, 1e30/1e308 "
            "values, zero-filled slab, artifact slices, dead volume, truncated file, a "
            "subject leaked into another split); scans registration must refuse (a "
            "header turned by 90 degrees, a T2 contrast, a 40 mm slab); and one person "
            "scanned twice. DIR receives images/, labels/, cohort.csv and "
            "ground_truth.json. With --run the default pipeline preprocesses it into "
            "DIR/cache; with --check the cache is checked; then every expectation is "
            "scored against the ground truth."
        ),
        epilog="Example: mriprep demo demo_out --run --check   (what `make demo` runs)",
    )
    p.add_argument("directory", metavar="DIR", help="folder for the cohort (created)")
    p.add_argument("--subjects", type=int, default=DEFAULT_SUBJECTS,
                   help=f"number of scans (default {DEFAULT_SUBJECTS}: every planted "
                        "defect and failure)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--run", action="store_true",
                   help="preprocess the cohort with `mriprep run` into DIR/cache")
    p.add_argument("--check", action="store_true",
                   help="run `mriprep check` on DIR/cache (implies the cache exists)")
    p.add_argument("-p", "--pipeline", default=None,
                   help="pipeline for --run (default: the default pipeline)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes for --run (default: one per core)")
    p.set_defaults(func=run)


def _cohort(directory: Path, subjects: int, seed: int):
    """Reuse a cohort built earlier with the same size and seed; else build it."""
    truth_file = directory / "ground_truth.json"
    if truth_file.exists():
        cohort = load_demo_cohort(directory)
        if cohort.truth.get("seed") == seed and len(cohort.subjects) == subjects:
            print(f"demo: reusing the cohort in {directory}", flush=True)
            return cohort
    print(f"demo: building {subjects} subjects in {directory} ...", flush=True)
    start = time.perf_counter()
    cohort = build_demo_cohort(directory, n_subjects=subjects, seed=seed)
    print(f"demo: cohort built in {time.perf_counter() - start:.0f} s", flush=True)
    return cohort


def run(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    cohort = _cohort(directory, args.subjects, args.seed)
    if not (args.run or args.check):
        print(f"demo: manifest {cohort.manifest}; preprocess it with\n"
              f"  mriprep run {cohort.manifest} -o {directory / 'cache'}")
        return ExitCode.OK

    cache_dir = directory / "cache"
    results = None
    if args.run:
        results = _run(cohort, cache_dir, args.pipeline, args.workers)
    findings = _check(cohort, cache_dir) if args.check else None
    if results is None:
        from mriprep.cache.run_report import latest_report_path, read_latest_run_report

        report = read_latest_run_report(cache_dir)
        if report is None:
            print(f"demo: no run report at {latest_report_path(cache_dir)}; use --run",
                  file=sys.stderr)
            return ExitCode.USAGE
        results = list(report.results)

    from mriprep.demo.verify import format_verdicts, verify_demo_run

    verdicts = verify_demo_run(cohort.truth, results, findings)
    print("\n== demo: planted defects and failures against the ground truth")
    print(format_verdicts(verdicts))
    ok = all(v.ok for v in verdicts)
    print("demo: every planted defect was handled as designed" if ok
          else "demo: some planted defects were NOT handled as designed (see FAIL above)")
    from mriprep.qc.report import REPORT_INDEX
    from mriprep.qc.store import qc_root

    report_index = qc_root(cache_dir) / REPORT_INDEX
    if report_index.exists():
        print(f"demo: QC report {report_index.resolve()} (open it in a browser)")
        print(_where_to_look(cohort.subjects))
    return ExitCode.OK if ok else ExitCode.PROBLEMS


def _drawn() -> dict[str, str]:
    """Planted defect kind -> how the report draws it (mriprep.qc.causes)."""
    from mriprep.qc.causes import cause_table

    colour = {cause.name: cause.colour_name for cause in cause_table().values()}
    return {"nan_blob": f"filled NaN blob, {colour['filled']}",
            "extreme_values": f"filled extreme values, {colour['filled']}",
            "zero_slab": f"masked zero slab, {colour['incomplete slice']}",
            "spike_slice": f"masked spike slice, {colour['artifact slice']}",
            "dropout_slice": f"masked dropout slice, {colour['artifact slice']}"}


def _where_to_look(subjects: dict) -> str:
    lines = ["  where to look:"]
    how = _drawn()
    for name, truth in sorted(subjects.items()):
        drawn = [how[d["kind"]] for d in truth.get("defects", []) if d["kind"] in how]
        if drawn and truth.get("expected") == "cached":
            lines.append(f"    {name}: {'; '.join(drawn)}")
    refused = sorted(n for n, t in subjects.items() if t.get("expected") == "fail")
    if refused:
        lines.append(f"    refused, with their stage and reason: {', '.join(refused)}")
    return "\n".join(lines)


def _run(cohort, cache_dir: Path, pipeline_name: str | None, workers: int | None):
    from mriprep.pipelines import DEFAULT_PIPELINE, load_pipeline
    from mriprep.run.progress import ProgressReporter
    from mriprep.run.reports import summary_text
    from mriprep.run.cohort import run_cohort, cohort_rows

    pipeline = load_pipeline(pipeline_name or DEFAULT_PIPELINE)
    rows = cohort_rows(cohort.manifest)
    print(f"\n== mriprep run {cohort.manifest} -o {cache_dir} -p {pipeline.name}", flush=True)
    progress = ProgressReporter(total=len(rows))
    try:
        result = run_cohort(rows, cache_dir, pipeline, workers=workers,
                            on_result=progress, manifest=cohort.manifest)
    finally:
        progress.close()
    print(summary_text(result))
    return result.results


def _check(cohort, cache_dir: Path):
    from mriprep.check import check_cache
    from mriprep.check.render import render_report

    print(f"\n== mriprep check {cache_dir} --manifest {cohort.manifest}", flush=True)
    report = check_cache(cache_dir, manifest=cohort.manifest)
    print(render_report(report))
    print("(the check is expected to fail on this cohort: it holds a planted leak, and "
          "rows that must fail preprocessing)")
    return report.findings
