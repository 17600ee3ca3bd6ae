"""``mriprep splits MANIFEST``: check a manifest's splits, or assign them by subject.

Exit status: 0 the splits are sound (or were assigned and written), 1 a problem was found
(nothing is written), 2 usage error (no such manifest, bad option, output exists).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mriprep.core.errors import ManifestError, cli_words
from mriprep.core.exit_codes import ExitCode
from mriprep.core.findings import Severity
from mriprep.splits import (
    Assignment,
    FoldAssignment,
    SplitsReport,
    assign_folds,
    assign_splits,
    check_manifest_splits,
    parse_fractions,
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
    from mriprep.inputs.manifest import Manifest, read_manifest, write_manifest

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
        report = check_manifest_splits(manifest, args.hash_files, args.workers)
        _emit(args, report)
        return ExitCode.OK if report.ok else ExitCode.PROBLEMS

    splits_given = sorted({r.split for r in manifest.rows if r.split})
    if args.folds is not None and args.folds_of is None:
        # nnU-Net's habit: a manifest without splits is cross-validated as a whole.
        args.folds_of = "train" if splits_given or fractions is not None else "all"
    if args.folds is not None and args.folds_of != "all" and fractions is None:
        subjects = {r.subject_id for r in manifest.rows if r.split == args.folds_of}
        if len(subjects) < args.folds:
            have = ", ".join(f"{s!r}" for s in splits_given) or "none"
            return _usage(
                f"--folds {args.folds} --folds-of {args.folds_of}: split "
                f"{args.folds_of!r} of {args.manifest} has {len(subjects)} subject(s), fewer "
                f"than the {args.folds} folds (its splits: {have}); pass --folds-of with "
                "a split that has enough subjects, --folds-of all for folds over every "
                "subject, or assign splits first with --assign train=0.8,test=0.2")

    if args.stratify and args.stratify not in manifest.metadata_columns():
        columns = ", ".join(manifest.metadata_columns()) or "none"
        return _usage(
            f"--stratify {args.stratify!r} is not a column of {args.manifest} "
            f"(extra columns: {columns})"
        )
    assignment = folds = None
    rows = list(manifest.rows)
    try:
        if fractions is not None:
            assignment = assign_splits(rows, fractions, args.seed, args.stratify,
                                       args.reassign)
            rows = assignment.rows
        if args.folds is not None:
            within = None if args.folds_of == "all" else args.folds_of
            folds = assign_folds(rows, args.folds, args.seed, args.stratify, within,
                                 args.reassign)
            rows = folds.rows
    except ValueError as exc:
        print(f"mriprep splits: cannot assign: {cli_words(exc)}", file=sys.stderr)
        return ExitCode.PROBLEMS
    assigned = Manifest(path=args.output, rows=tuple(rows))
    # Folds over a manifest without any split stand in for the splits (fold k validates).
    folds_only = folds is not None and args.folds_of == "all" and not any(
        r.split for r in rows)
    report = check_manifest_splits(assigned, args.hash_files, args.workers,
                                   require_splits=not folds_only)
    report.manifest = str(args.manifest)
    written = None
    if report.ok:
        written = write_manifest(rows, args.output)
    _emit(args, report, assignment, written, folds)
    return ExitCode.OK if report.ok else ExitCode.PROBLEMS


def _emit(
    args: argparse.Namespace,
    report: SplitsReport,
    assignment: Assignment | None = None,
    written: Path | None = None,
    folds: FoldAssignment | None = None,
) -> None:
    if args.json:
        doc = report.to_json()
        if assignment is not None:
            doc["assignment"] = {
                "fractions": parse_fractions(args.assign),
                "seed": args.seed,
                "stratify": args.stratify,
                "targets": assignment.targets,
                "assigned_subjects": assignment.assigned,
                "kept_subjects": assignment.kept,
                "strata": assignment.strata,
                "notes": assignment.notes,
            }
        if folds is not None:
            doc["folds"] = {"k": folds.folds, "of": args.folds_of, "sizes": folds.sizes,
                            "assigned_subjects": folds.assigned, "kept_subjects": folds.kept,
                            "strata": folds.strata, "notes": folds.notes}
        if assignment is not None or folds is not None:
            doc["output"] = str(written) if written else None
        print(json.dumps(doc, indent=2))
        return
    print(render(report, assignment, args, written, folds))


def render(
    report: SplitsReport,
    assignment: Assignment | None,
    args: argparse.Namespace,
    written: Path | None,
    folds: FoldAssignment | None = None,
) -> str:
    """The result as text for people: counts per split, findings, verdict."""
    subjects = sum(c["subjects"] for c in report.splits.values())
    lines = [f"manifest {report.manifest}: {report.rows} row(s), {subjects} subject(s)"]
    if report.files_hashed:
        lines.append(
            f"  {report.files_hashed} image file(s) of equal size hashed for identical content"
        )
    if assignment is not None:
        lines.append(
            f"  assigned {assignment.assigned} subject(s) in the order of their hash "
            f"(seed {args.seed}), kept the split of {assignment.kept}"
        )
    targets = assignment.targets if assignment is not None else {}
    lines += ["", f"{'split':<12}{'subjects':>9}{'scans':>8}"
                  + (f"{'asked':>8}" if targets else "")]
    for split, counts in report.splits.items():
        asked = f"{targets[split]:>8}" if split in targets else ""
        lines.append(f"{split or '(none)':<12}{counts['subjects']:>9}{counts['scans']:>8}"
                     + asked)
    if assignment is not None and assignment.strata:
        names = list(parse_fractions(args.assign))
        lines += ["", f"{args.stratify:<16}" + "".join(f"{n:>8}" for n in names)]
        for value, counts in assignment.strata.items():
            lines.append(f"{value:<16}" + "".join(f"{counts[n]:>8}" for n in names))
    if folds is not None:
        lines += ["", f"{folds.folds} folds of {args.folds_of} (column 'fold'): "
                      f"assigned {folds.assigned} subject(s), kept {folds.kept}",
                  f"{'fold':<16}" + "".join(f"{f:>6}" for f in folds.sizes),
                  f"{'subjects':<16}" + "".join(f"{n:>6}" for n in folds.sizes.values())]
        for value, counts in folds.strata.items():
            lines.append(f"{value:<16}" + "".join(f"{n:>6}" for n in counts.values()))
    notes = (assignment.notes if assignment else []) + (folds.notes if folds else [])
    for note in notes:
        lines.append(f"WARNING {note}")
    if report.findings:
        lines.append("")
    for finding in sorted(report.findings, key=lambda f: (f.severity != Severity.ERROR, f.code)):
        lines.append(f"{finding.severity.upper():<8}{finding.code:<20}{finding.message}")
    verdict = "OK" if report.ok else "FAILED"
    # The summary counts every WARNING line above: the findings' and the assignment's.
    warned = len(report.warnings) + len(notes)
    lines += ["", f"{verdict}: {len(report.errors)} error(s), {warned} warning(s)"]
    if assignment is not None or folds is not None:
        lines.append(
            f"wrote {written}" if written else "nothing written: fix the errors above first"
        )
    return "\n".join(lines)
