"""``mriprep report CACHE [-o DIR]``: the visual QC report (see :mod:`mriprep.qc.report`).

Exit status: 0 the report was written (failed or damaged subjects are shown in it, not
errors of this command), 2 usage error (no such cache folder, not a cache).
"""

from __future__ import annotations

import argparse

from mriprep.cli.cache_folder import require_cache_folder
from mriprep.core.errors import CacheError
from mriprep.core.exit_codes import ExitCode
from mriprep.core.progress import ProgressBar


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="write the visual QC report of a cache (HTML, opens from disk)",
        description=(
            "Write a static HTML report of a cache: an index page with the cohort's "
            "quality metrics per split, robust-z outlier flags and a sortable table of "
            "every cached and failed subject, and one page per subject with mosaics of "
            "its native scan and of its output (invalid voxels coloured by cause, the "
            "template's brain outline, the label map), its metrics and what each stage "
            "did. `mriprep run` writes it at the end of every run (unless --no-report); "
            "this command re-makes it, and makes the pictures of entries cached without "
            "them from the cache. Open DIR/index.html in any browser; no server needed."
        ),
    )
    p.add_argument("cache", help="cache folder (as given to `mriprep run -o`)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="report folder (default: CACHE/qc, beside the pictures)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mriprep.qc.report import write_report

    require_cache_folder(args.cache, "report")
    bar = ProgressBar("report", unit="subject")
    try:
        path = write_report(args.cache, args.output, progress=bar.update_to)
    except OSError as exc:  # an unwritable or full output folder: a usage problem
        raise CacheError(f"cannot write the report: {exc}; choose a writable folder with "
                         "-o") from exc
    finally:
        bar.close()
    print(f"QC report: {path}")
    return ExitCode.OK
