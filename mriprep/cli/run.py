"""``mriprep run MANIFEST -o CACHE``: preprocess a cohort into the tensor cache, here or
on Slurm jobs (``--scheduler slurm``, :mod:`mriprep.run.slurm`).

Exit status: 0 every subject is cached (or already was), 1 some subjects failed (listed
at the end with their stage and reason), 2 usage or configuration error (bad pipeline,
unreadable manifest, unreachable scheduler, a Slurm job Slurm refuses, a cache that
indexes another pipeline without --replace-pipeline), 130 interrupted (Ctrl-C: what
finished is indexed, every Slurm job cancelled, and one line says how many subjects are
kept and that the same command resumes).
"""

from __future__ import annotations

import argparse
import json
import sys

from mriprep.core.errors import SchedulerError
from mriprep.core.exit_codes import ExitCode
from mriprep.core.progress import ProgressBar
from mriprep.pipelines import DEFAULT_PIPELINE, available_pipelines, load_pipeline
from mriprep.run.cohort import run_cohort, cohort_rows
from mriprep.run.interrupt import RunInterrupted
from mriprep.run.progress import ProgressReporter
from mriprep.run.reports import summary_json, summary_text
from mriprep.run.scheduling import SCHEDULERS
from mriprep.run.slurm.profile import (DEFAULT_JOB_MEMORY, DEFAULT_MAX_JOBS, DEFAULT_RETRIES,
                                       DEFAULT_WALLTIME, SlurmProfile, load_slurm_profile)


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
              "e.g. tcp://10.0.0.1:8786 (default: processes). slurm submits Slurm jobs "
              "of one worker each from this machine (a login node): see the Slurm "
              "options below"),
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
    slurm = p.add_argument_group(
        "Slurm (--scheduler slurm)",
        "Each job runs one single-threaded dask worker with the settings of a local run; "
        "the run submits min(--jobs, subjects left) jobs, replaces jobs that die, "
        "resubmits their subjects up to --retries times and cancels every job when it "
        "ends, fails or is interrupted. Job logs: CACHE/reports/slurm-jobs. Inputs, the "
        "cache and this Python must be on a file system the nodes see.")
    slurm.add_argument("--slurm-profile", metavar="YAML",
                       help="a file of the options below (keys partition, account, qos, "
                            "walltime, memory, jobs, sbatch, setup, python, interface, "
                            "retries); options given here win")
    slurm.add_argument("--partition", help="Slurm partition (sbatch -p)")
    slurm.add_argument("--account", help="Slurm account (sbatch -A)")
    slurm.add_argument("--walltime", metavar="HH:MM:SS",
                       help=f"each job's time limit (default: {DEFAULT_WALLTIME}); workers "
                            "leave 5 min before it and fresh jobs take over")
    slurm.add_argument("--job-memory", metavar="SIZE",
                       help=f"memory per job, e.g. 8GB (default: {DEFAULT_JOB_MEMORY})")
    slurm.add_argument("--jobs", type=_positive_int, metavar="N",
                       help=f"most jobs at once (default: {DEFAULT_MAX_JOBS})")
    slurm.add_argument("--sbatch", action="append", metavar="OPTION",
                       help="an extra #SBATCH line, as an sbatch option (repeatable), "
                            "e.g. --sbatch=--constraint=cascade")
    slurm.add_argument("--setup", action="append", metavar="LINE",
                       help="a shell line each job runs before its worker (repeatable), "
                            "e.g. --setup 'module load python/3.11'")
    slurm.add_argument("--retries", type=int, metavar="N",
                       help=f"times a subject is resubmitted when its job dies (default: "
                            f"{DEFAULT_RETRIES}); then it is reported failed with the "
                            "jobs' fates")
    p.set_defaults(func=run)


SLURM_OPTIONS = {"partition": "partition", "account": "account", "walltime": "walltime",
                 "job_memory": "memory", "jobs": "jobs", "retries": "retries"}


def slurm_profile(args: argparse.Namespace) -> SlurmProfile | None:
    """The Slurm profile of the options (None unless --scheduler slurm); Slurm options
    with another scheduler are an error rather than silently ignored."""
    given = {field: getattr(args, option) for option, field in SLURM_OPTIONS.items()
             if getattr(args, option) is not None}
    if args.sbatch:
        given["sbatch"] = tuple(args.sbatch)
    if args.setup:
        given["setup"] = tuple(args.setup)
    if args.scheduler != "slurm":
        if given or args.slurm_profile:
            options = sorted(["--" + o.replace("_", "-") for o in SLURM_OPTIONS
                              if getattr(args, o) is not None]
                             + [f"--{o}" for o in ("sbatch", "setup") if getattr(args, o)])
            raise SchedulerError(
                f"{', '.join(options) or '--slurm-profile'} only apply with --scheduler "
                f"slurm (this run's scheduler is {args.scheduler})")
        return None
    base = load_slurm_profile(args.slurm_profile) if args.slurm_profile else SlurmProfile()
    return base.with_options(**given)


def run(args: argparse.Namespace) -> int:
    # Everything that can be wrong with the configuration fails here, before any subject.
    pipeline = load_pipeline(args.pipeline)
    rows = cohort_rows(args.manifest)
    slurm = slurm_profile(args)
    if args.workers and ("://" in args.scheduler or args.scheduler == "slurm"):
        print(f"mriprep run: --workers is ignored with a scheduler address; the cluster at "
              f"{args.scheduler} decides", file=sys.stderr)
    print(
        f"mriprep run: {len(rows)} subjects, pipeline {pipeline.name} "
        f"({pipeline.hash[:12]}, {pipeline.source}), cache {args.output}, "
        f"scheduler {args.scheduler}",
        file=sys.stderr, flush=True,
    )
    if slurm is not None:
        where = " ".join(filter(None, [f"partition {slurm.partition}" if slurm.partition else "",
                                       f"account {slurm.account}" if slurm.account else ""]))
        print(f"mriprep run: Slurm jobs of 1 worker ({args.threads_per_worker} CPU), "
              f"{slurm.memory}, {slurm.walltime}, at most {slurm.jobs} at once"
              f"{', ' + where if where else ''}; {slurm.retries} retries per subject",
              file=sys.stderr, flush=True)
    progress = ProgressReporter(total=len(rows))
    report_bar = ProgressBar("QC report", "subject")
    try:
        result = run_cohort(
            rows, args.output, pipeline,
            scheduler=args.scheduler, workers=args.workers, force=args.force,
            threads_per_worker=args.threads_per_worker, on_result=progress,
            manifest=args.manifest, report=not args.no_report,
            replace_pipeline=args.replace_pipeline,
            slurm=slurm, on_jobs=progress.jobs, on_report=report_bar.update_to,
        )
    except RunInterrupted as stop:
        progress.close()
        print(f"mriprep run: {stop.message}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    finally:
        progress.close()
        report_bar.close()
    if result.index_note:
        print(f"mriprep run: {result.index_note}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary_json(result), indent=1))
    else:
        print(summary_text(result))
    return result.exit_code
