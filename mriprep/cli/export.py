"""``mriprep export CACHE -o DIR``: cache entries as NIfTI/MGZ files with their provenance
(see :mod:`mriprep.outputs.export`).

Exit status: 0 every chosen entry was written, 1 some entries could not be (damaged:
named on stderr; the others were written), 2 usage error (no such cache, a subject or
split not in it, an output folder that holds other files).
"""

from __future__ import annotations

import argparse
import sys

from mriprep.cli.cache_folder import require_cache_folder
from mriprep.core.errors import CacheError
from mriprep.core.exit_codes import ExitCode
from mriprep.core.progress import ProgressBar
from mriprep.cli.export_fastsurfer import (add_fastsurfer_options, leave_out_flagged,
                                           run_fastsurfer)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write cache entries as NIfTI or MGZ images with their provenance",
        description=(
            "Write each chosen entry of a cache as DIR/<subject>[_<session>]/ with "
            "image, valid (uint8) and label images on the cache grid (its affine in the "
            "header, the cached values exactly), the registration's transform.tfm when "
            "there is one, and provenance.json (key, pipeline name and hash, inputs with "
            "their SHA-256, template_to_subject, every stage's record). Tensors are "
            "checked against their checksums first; files are written atomically."
        ),
    )
    p.add_argument("cache", help="cache folder (as given to `mriprep run -o`)")
    p.add_argument("-o", "--output", metavar="DIR", required=True,
                   help="folder to write into: new, empty, or an earlier export (which is "
                        "updated)")
    p.add_argument("--subject", metavar="ID", nargs="+", default=[],
                   help="export only these subjects (all their sessions); default: every "
                        "entry")
    p.add_argument("--split", metavar="S",
                   help="export only the entries of this split (e.g. test)")
    p.add_argument("--exclude-flagged", nargs="?", const="warning", default=None,
                   choices=("warning", "error"), metavar="SEVERITY",
                   help="leave out the entries the last `mriprep check` flagged: by a "
                        "warning or an error about the entry alone (warning, the default "
                        "without a value), or by an error only (error); each is named on "
                        "stderr with its findings. Needs a check of the cache as it is "
                        "now (`mriprep check CACHE --lut TABLE` keeps its findings)")
    p.add_argument("--format", choices=("nifti", "mgz", "fastsurfer-hdf5"), default="nifti",
                   help="nifti writes .nii.gz files, mgz FreeSurfer's .mgz (default: "
                        "nifti); fastsurfer-hdf5 writes FastSurfer's training HDF5 to the "
                        "FILE given with -o (options below)")
    add_fastsurfer_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.format == "fastsurfer-hdf5":
        return run_fastsurfer(args)
    from mriprep.cache import Cache
    from mriprep.outputs import entries_for, export_entries
    from mriprep.outputs.export import check_export_folder

    require_cache_folder(args.cache, "export")
    cache = Cache(args.cache)
    entries = leave_out_flagged(cache, entries_for(cache, args.subject, args.split), args)
    check_export_folder(args.output)  # refused before the first entry is read
    bar = ProgressBar("export", unit="entry", total=len(entries))
    try:
        result = export_entries(cache, entries, args.output, args.format,
                                progress=bar.update_to)
    except OSError as exc:  # an unwritable or full output folder: a usage problem
        raise CacheError(f"cannot write the export: {exc}; choose a writable folder with "
                         "-o") from exc
    finally:
        bar.close()
    for problem in result.problems:
        print(f"mriprep export: {problem}", file=sys.stderr)
    print(f"exported {len(result.folders)} of {len(entries)} entries to {args.output}")
    return ExitCode.PROBLEMS if result.problems else ExitCode.OK
