"""``mriprep splits MANIFEST``: check a manifest's splits, or assign them by subject.

The checks, the assignment and both forms of the result are :mod:`mriprep.splits`'s
(:mod:`mriprep.splits.summary`); this module parses the options, refuses bad
combinations, writes the assigned manifest and chooses the exit status: 0 the splits are
sound (or were assigned and written), 1 a problem was found (nothing is written), 2
usage error (no such manifest, bad option, output exists).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mriprep.core.errors import ManifestError, cli_words
from mriprep.core.exit_codes import ExitCode
from mriprep.splits import check_manifest_splits, parse_fractions
from mriprep.splits.summary import (
    SplitsSummary,
    assign_and_check,
    assigned_rows,
    default_folds_of,
)


EPILOG = """\
examples:
  mriprep splits cohort.csv
  mriprep splits cohort.csv --assign train=0.8,val=0.1,test=0.1 --seed 7 -o cohort-split.csv
  mriprep splits cohort.csv --assign train=0.7,val=0.15,test=0.15 --stratify site -o out.csv
  mriprep splits cohort.csv --assign train=0.8,test=0.2 --folds 5 --stratify site -o out.csv

Splits are assigned per subject, in counts within one subject of the fractions (in each
--stratify value too), none empty unless its fraction is 0; the order subjects are drawn
in comes from a hash of the id and the seed, so the same seed and cohort give the same
splits. Subjects that already have a split keep it unless --reassign is given: to grow a
cohort, add rows without a split to the assigned manifest and assign again; the new
subjects fill the quotas of the grown cohort. --folds K adds a 'fold' column (1..K) for
K-fold cross-validation among the subjects of --folds-of (default: train when the
manifest has splits, every subject when it has none, as nnU-Net does), by subject and
stratified like the splits; existing folds are kept the same way.
  mriprep splits cohort.csv --folds 5 -o folds.csv      # no splits: 5 folds of everyone

exit status: 0 sound (or assigned and written), 1 problems found, 2 usage error
"""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "splits",
        help="check a manifest's train/val/test splits, or assign them by subject",
        description=(
            "Check the splits of a manifest before any preprocessing: every scan has a "
            "split, all sessions of a subject share one, and no image file appears under "
            "two subject ids or in two splits. With --assign, write a manifest with splits "
            "assigned per subject."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("manifest", type=Path, help="the manifest (.csv or .tsv)")
    p.add_argument(
        "--assign",
        metavar="SPEC",
        help="assign splits with these fractions of subjects, e.g. train=0.8,val=0.1,test=0.1",
    )
    p.add_argument("--seed", default="0", help="seed of the assignment (default 0)")
    p.add_argument(
        "--stratify", metavar="COLUMN", help="balance the splits within each value of this column"
    )
    p.add_argument(
        "--reassign", action="store_true", help="draw every subject again, ignoring existing splits"
    )
    p.add_argument("--folds", type=int, metavar="K",
                   help="add a 'fold' column (1..K): K-fold cross-validation by subject")
    p.add_argument("--folds-of", metavar="SPLIT", default=None,
                   help="the split whose subjects are dealt into folds ('all': every "
                        "subject; default: train, or all when no row has a split)")
    p.add_argument("-o", "--output", type=Path,
                   help="manifest to write (with --assign or --folds)")
    p.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")
    p.add_argument(
        "--no-hash",
        dest="hash_files",
        action="store_false",
        help="do not compare image contents (no file is read; missing files are allowed)",
    )
    p.add_argument("--workers", type=int, default=None, metavar="N", help="threads hashing files")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def _usage(message: str) -> int:
    print(f"mriprep splits: error: {message}", file=sys.stderr)
    return ExitCode.USAGE


def run(args: argparse.Namespace) -> int:
    from mriprep.inputs.manifest import read_manifest, write_manifest

    if not args.manifest.is_file():
        return _usage(f"manifest {args.manifest} does not exist or is not a file")
    writing = args.assign is not None or args.folds is not None
    if not writing and (args.output or args.stratify or args.reassign):
        return _usage("-o, --stratify and --reassign only apply with --assign or --folds")
    fractions = None
    if args.assign is not None:
        try:
            fractions = parse_fractions(args.assign)
        except ValueError as exc:
            return _usage(f"--assign {args.assign!r}: {exc}")
    if writing:
        if args.output is None:
            given = "--assign" if args.assign is not None else "--folds"
            return _usage(f"{given} needs -o OUTPUT, the manifest to write")
        if args.output.exists() and not args.force:
            return _usage(f"{args.output} already exists; pass --force to overwrite it")
    try:
        manifest = read_manifest(args.manifest, check_files=args.hash_files)
    except ManifestError as exc:
        print(f"manifest {args.manifest}: {len(exc.problems)} problem(s)")
        for problem in exc.problems:
            print(f"  - {problem}")
        return ExitCode.PROBLEMS

    if not writing:
        summary = SplitsSummary(check_manifest_splits(manifest, args.hash_files, args.workers))
        return _emit(args, summary)

    folds_of = args.folds_of
    if args.folds is not None and folds_of is None:
        folds_of = default_folds_of(manifest.rows, fractions is not None)
    if args.folds is not None and folds_of != "all" and fractions is None:
        subjects = {r.subject_id for r in manifest.rows if r.split == folds_of}
        if len(subjects) < args.folds:
            splits_given = sorted({r.split for r in manifest.rows if r.split})
            have = ", ".join(f"{s!r}" for s in splits_given) or "none"
            return _usage(
                f"--folds {args.folds} --folds-of {folds_of}: split "
                f"{folds_of!r} of {args.manifest} has {len(subjects)} subject(s), fewer "
                f"than the {args.folds} folds (its splits: {have}); pass --folds-of with "
                "a split that has enough subjects, --folds-of all for folds over every "
                "subject, or assign splits first with --assign train=0.8,test=0.2")
    if args.stratify and args.stratify not in manifest.metadata_columns():
        columns = ", ".join(manifest.metadata_columns()) or "none"
        return _usage(
            f"--stratify {args.stratify!r} is not a column of {args.manifest} "
            f"(extra columns: {columns})"
        )
    try:
        summary = assign_and_check(
            manifest, fractions=fractions, seed=args.seed, stratify=args.stratify,
            reassign=args.reassign, folds=args.folds, folds_of=folds_of,
            hash_files=args.hash_files, workers=args.workers, output=args.output)
    except ValueError as exc:
        print(f"mriprep splits: cannot assign: {cli_words(exc)}", file=sys.stderr)
        return ExitCode.PROBLEMS
    if summary.report.ok:
        summary.written = write_manifest(assigned_rows(summary), args.output)
    return _emit(args, summary)


def _emit(args: argparse.Namespace, summary: SplitsSummary) -> int:
    print(json.dumps(summary.to_json(), indent=2) if args.json else summary.render())
    return ExitCode.OK if summary.report.ok else ExitCode.PROBLEMS
