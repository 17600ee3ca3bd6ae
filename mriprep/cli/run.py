"""``mriprep run MANIFEST -o CACHE``: preprocess a cohort into the tensor cache.

Exit status: 0 every subject is cached (or already was), 1 some subjects failed (listed
at the end with their stage and reason), 2 usage or configuration error (bad pipeline,
unreadable manifest, unreachable scheduler).
"""

from __future__ import annotations

import argparse
import json
import sys

from mriprep.pipelines import DEFAULT_PIPELINE, available_pipelines, load_pipeline
from mriprep.run.cohort import run_cohort, cohort_rows
from mriprep.run.progress import ProgressReporter
from mriprep.run.reports import summary_json, summary_text
from mriprep.run.scheduling import SCHEDULERS


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more, got {text!r}")
    return value


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="preprocess a cohort manifest into a checksummed tensor cache",
        description=(
            "Run a pipeline over every subject of a manifest, one dask task per subject, "
            "and write NaN-free tensors to a content-addressed cache. A rerun skips subjects "
            "whose entry exists and verifies; a changed input or parameter recomputes only "
            "what it affects. Broken scans are reported with their stage and reason in "
            "CACHE/reports/latest.json and .csv; the other subjects complete. Exit 0 when "
            "all subjects succeed, 1 when some failed, 2 for a usage or config error."
        ),
    )
    p.add_argument("manifest", help="cohort manifest (CSV: subject_id,image,label,split,...)")
    p.add_argument("-o", "--output", required=True, metavar="CACHE",
                   help="cache folder (created when new)")
    p.add_argument(
        "-p", "--pipeline", default=DEFAULT_PIPELINE, metavar="PIPELINE",
        help=(f"pipeline name ({', '.join(available_pipelines())}) or a YAML file "
              f"(default: {DEFAULT_PIPELINE})"),
    )
    p.add_argument("--workers", type=_positive_int, metavar="N",
                   help="local worker processes or threads (default: one per core)")
    p.add_argument(
        "--scheduler", default="processes", metavar="SCHEDULER",
        help=(f"{'|'.join(SCHEDULERS)} or the address of a running dask scheduler, "
              "e.g. tcp://10.0.0.1:8786 (default: processes)"),
    )
    p.add_argument("--threads-per-worker", type=_positive_int, default=1, metavar="N",
                   help="ITK/BLAS threads inside each worker (default: 1)")
    p.add_argument("--force", action="store_true",
                   help="recompute every subject even when its entry is already cached")
    p.add_argument("--no-report", action="store_true",
                   help="make no QC pictures or HTML report (`mriprep report CACHE` makes "
                        "them later, from the cache)")
    p.add_argument("--replace-pipeline", action="store_true",
                   help="let this pipeline take over a cache that indexes another "
                        "pipeline's entries (they leave the index; `mriprep cache prune` "
                        "deletes them); without it such a cache is refused")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout (progress stays on stderr)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Everything that can be wrong with the configuration fails here, before any subject.
    pipeline = load_pipeline(args.pipeline)
    rows = cohort_rows(args.manifest)
    if args.workers and "://" in args.scheduler:
        print(f"mriprep run: --workers is ignored with a scheduler address; the cluster at "
              f"{args.scheduler} decides", file=sys.stderr)
    print(
        f"mriprep run: {len(rows)} subjects, pipeline {pipeline.name} "
        f"({pipeline.hash[:12]}, {pipeline.source}), cache {args.output}, "
        f"scheduler {args.scheduler}",
        file=sys.stderr, flush=True,
    )
    progress = ProgressReporter(total=len(rows))
    try:
        result = run_cohort(
            rows, args.output, pipeline,
            scheduler=args.scheduler, workers=args.workers, force=args.force,
            threads_per_worker=args.threads_per_worker, on_result=progress,
            manifest=args.manifest, report=not args.no_report,
            replace_pipeline=args.replace_pipeline,
        )
    finally:
        progress.close()
    if result.index_note:
        print(f"mriprep run: {result.index_note}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary_json(result), indent=1))
    else:
        print(summary_text(result))
    return result.exit_code
