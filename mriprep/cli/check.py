"""``mriprep check CACHE``: the gate before training (see :mod:`mriprep.check`).
``mriprep check --explain CODE`` says what a finding code means and how to fix it
(:mod:`mriprep.check.codes`).

``mriprep check CACHE --lut TABLE`` (a LUT file, or ``dkt`` for the shipped table) judges
the label maps with the label table training will use (:mod:`mriprep.check.label_table`)
in place of ``--labels``.

The findings are kept in ``CACHE/check/findings.json`` (:mod:`mriprep.cache.check_record`)
for ``mriprep export --exclude-flagged``, ``MRIDataset(exclude_flagged=...)`` and the QC
report; a cache that cannot be written is checked all the same, and a warning on stderr
says that nothing was kept.

Exit status: 0 the cache is sound (warnings and infos may be listed), or the code was
explained; 1 at least one error was found (or a warning, with ``--strict``); 2 usage
error (no such cache folder, unreadable manifest or label table, bad option, unknown
code).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mriprep.check import check_cache
from mriprep.check.codes import explain, explain_json, unknown
from mriprep.check.manifest import read_exclusions
from mriprep.check.render import render_report
from mriprep.cli.cache_folder import not_a_cache_folder
from mriprep.core.errors import cli_words
from mriprep.core.exit_codes import ExitCode
from mriprep.core.limits import CAST_LIMITS
from mriprep.core.progress import ProgressBar
from mriprep.splits import IDENTITY_ERROR, NEAR_DUPLICATE_THRESHOLD



def parse_labels(text: str) -> list[int]:
    """``"0,2,4-7"`` -> ``[0, 2, 4, 5, 6, 7]``."""
    values: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, sep, last = part.partition("-") if not part.startswith("-") else (part, "", "")
            if sep:
                lo, hi = int(first), int(last)
                if hi < lo:
                    raise ValueError(f"range {part} runs backwards")
                values.update(range(lo, hi + 1))
            else:
                values.add(int(part))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--labels {text!r} is not a list of integers and ranges like 0,2,4-7 ({exc})"
        ) from exc
    if not values:
        raise argparse.ArgumentTypeError("--labels needs at least one value, e.g. 0,1,2,3")
    return sorted(values)


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"--near-threshold must be between 0 and 1, got {text!r}")
    return value


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check",
        help="verify a cache before training (checksums, NaN, pipelines, split leaks)",
        description=(
            "Verify every entry of a cache (files present, checksums, finite values, dtype, "
            "shape, spacing, label values), that one pipeline made all splits, and that no "
            "subject or image leaks between splits. Reports every problem at once. Exit 0 "
            "when sound, 1 when a problem is found, 2 for a usage error. "
            "`mriprep check --explain CODE` explains a finding code."
        ),
    )
    p.add_argument("cache", nargs="?", help="cache folder written by `mriprep run -o`")
    p.add_argument(
        "--explain",
        metavar="CODE",
        help="say what a finding code (e.g. identity-leak) means and how to fix it, and "
        "check nothing",
    )
    p.add_argument("--json", action="store_true",
                   help="print the report (or the --explain entry) as JSON (for CI)")
    p.add_argument(
        "--manifest",
        metavar="M",
        help="also check that every row of this manifest is cached: a row that failed "
        "or is missing is an error (exit 1), named with its stage and reason",
    )
    p.add_argument(
        "--exclude",
        metavar="FILE",
        help="rows known not to be cached, accepted with a warning: a text file with one "
        "subject (or subject/session) per line, # for comments",
    )
    p.add_argument(
        "--labels",
        type=parse_labels,
        metavar="VALUES",
        help="allowed label values, e.g. 0,2,4-7 (default: the set each entry records)",
    )
    p.add_argument(
        "--near-threshold",
        type=_threshold,
        default=NEAR_DUPLICATE_THRESHOLD,
        metavar="R",
        help=f"identity correlation (fingerprints of registered images, centred on a "
        f"fixed reference population) "
        f"from which two subjects' images are reported as one person: a warning, an "
        f"identity-leak error in two splits from max(R, {IDENTITY_ERROR}) "
        f"(default {NEAR_DUPLICATE_THRESHOLD})",
    )
    p.add_argument(
        "--dtype",
        choices=list(CAST_LIMITS),
        default="float16",
        help="the dtype training casts images to under mixed precision (AMP): an image "
        "value that overflows to Inf in it is an error, an image scaled so small that its "
        "values fall below the dtype's smallest normal number a warning; float32 checks "
        "no cast (default float16, the AMP dtype of a T4, which has no bfloat16)",
    )
    g = p.add_argument_group(
        "label table (--lut; the options as `mriprep export --format fastsurfer-hdf5` "
        "takes them)")
    g.add_argument(
        "--lut",
        metavar="TABLE",
        help="judge every label map with the class table training will use: a FreeSurfer "
        "LUT (.txt), a FastSurfer ColorLUT (.tsv), or dkt for the shipped FastSurfer DKT "
        "table. Values the table does not list after its rules, cortex without parcels "
        "(aseg.mgz) and classes absent from a whole split are errors; what the rules "
        "rewrite is listed. Replaces --labels: the table's values are the allowed set",
    )
    g.add_argument("--processing", choices=("aparc", "aseg", "none"), default=None,
                   help="FastSurfer's label rewrites before the lookup (default: aparc)")
    g.add_argument("--cortex", choices=("fuse", "fuse_after_fill", "split"), default=None,
                   help="how training treats right cortex parcels, as mriprep export's "
                        "--cortex (default: fuse, FastSurfer's rule)")
    g.add_argument("--unknown", choices=("error", "background"), default=None,
                   help="a label value not in the table: error, or background (class 0; "
                        "a warning) when training is told so (default: error)")
    g.add_argument("--absent-classes", choices=("error", "allow"), default=None,
                   help="a class of the table that no label map of a split holds: error, "
                        "or allow (a warning) when training is told so (default: error)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="reader threads (with --lut, also the threads judging label maps)")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.set_defaults(func=run)


def _label_table(args: argparse.Namespace):
    """The label table of ``--lut`` (an InputError naming the file when it cannot be
    used: a usage error)."""
    from mriprep.training.labels import LabelTable  # imports torch: only when asked

    return LabelTable(None if args.lut == "dkt" else args.lut,
                      processing=args.processing or "aparc", cortex=args.cortex or "fuse",
                      unknown=args.unknown or "error")


def _usage(message: str) -> int:
    print(f"mriprep check: error: {message}", file=sys.stderr)
    return ExitCode.USAGE


def _say_record(record: dict | None) -> None:
    """Where the findings were kept (for --exclude-flagged and the QC report), or why
    not: on stderr, so that the report on stdout stays the same."""
    if record is None:
        return
    if record["kept"]:
        print(f"mriprep check: findings kept in {record['path']} (for --exclude-flagged "
              "and the QC report)", file=sys.stderr)
    else:
        print(f"mriprep check: warning: {cli_words(record['reason'])}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.explain is not None:
        if args.cache is not None:
            return _usage(f"--explain {args.explain} explains a code and checks no cache; "
                          f"drop {args.cache}, or --explain to check it")
        try:
            print(json.dumps(explain_json(args.explain), indent=1) if args.json
                  else explain(args.explain))
        except KeyError:
            return _usage(unknown(args.explain))
        return ExitCode.OK
    if args.cache is None:
        return _usage("give the cache folder to check (written by `mriprep run -o`), or "
                      "--explain CODE")
    if os.path.isfile(args.cache):
        return _usage(not_a_cache_folder(Path(args.cache), "check"))
    if args.exclude and not args.manifest:
        return _usage("--exclude lists manifest rows; give the manifest too (--manifest M)")
    table_options = {"--processing": args.processing, "--cortex": args.cortex,
                     "--unknown": args.unknown, "--absent-classes": args.absent_classes}
    given = [flag for flag, value in table_options.items() if value is not None]
    if args.lut is None and given:
        return _usage(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} how the "
                      "label table maps the labels; give the table too (--lut TABLE, or "
                      "--lut dkt for the shipped FastSurfer DKT table)")
    if args.lut is not None and args.labels is not None:
        return _usage("--labels and --lut both judge the label values; give one. With "
                      "--lut the table's values after its rules are the allowed set (raw "
                      "values the rules rewrite, such as 1000/2000, 251-255 or 3/42, are "
                      "not refused)")
    table = _label_table(args) if args.lut is not None else None
    # --json keeps stderr quiet too: scripts that parse the output want no bar.
    bar = ProgressBar("checking", "entry", leave=False, terminal=False if args.json else None)
    table_bar = ProgressBar("label table", "label map", leave=False,
                            terminal=False if args.json else None)

    def judging(done: int, total: int) -> None:
        bar.close()
        table_bar.update_to(done, total)

    try:
        report = check_cache(
            args.cache,
            manifest=args.manifest,
            exclusions=read_exclusions(args.exclude) if args.exclude else (),
            allowed_labels=args.labels,
            near_duplicate_threshold=args.near_threshold,
            workers=args.workers,
            progress=bar.update_to,
            dtype=args.dtype,
            label_table=table,
            absent_classes=args.absent_classes or "error",
            label_progress=judging,
        )
    finally:
        bar.close()
        table_bar.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_report(report))
        _say_record(report.record)
    failed = not report.ok or (args.strict and report.warnings)
    return ExitCode.PROBLEMS if failed else ExitCode.OK
