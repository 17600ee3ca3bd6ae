"""``mriprep export CACHE -o FILE.hdf5 --format fastsurfer-hdf5``: FastSurfer's training
HDF5 (see :mod:`mriprep.outputs.fastsurfer_hdf5`).

Exit status: 0 every chosen subject was written, 1 some could not be (each named on
stderr with its reason; the others were written; with none left, no file is written),
2 usage error.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from mriprep.cli.cache_folder import require_cache_folder
from mriprep.core.errors import CacheError, cli_words
from mriprep.core.exit_codes import ExitCode
from mriprep.core.progress import ProgressBar


def add_fastsurfer_options(p) -> None:
    g = p.add_argument_group("fastsurfer-hdf5 (defaults are FastSurfer generate_hdf5's)")
    g.add_argument("--view", choices=("axial", "coronal", "sagittal"), default="coronal",
                   help="the view whose slices the file holds (default: coronal)")
    g.add_argument("--thickness", type=int, default=3,
                   help="neighbours each side of a slice: 2t+1 channels (default: 3)")
    g.add_argument("--lut", metavar="TABLE",
                   help="FreeSurfer LUT (.txt) or FastSurfer ColorLUT (.tsv); default: the "
                        "shipped FastSurfer DKT table (79 classes, 51 sagittal)")
    g.add_argument("--unknown", choices=("error", "background"), default="error",
                   help="a label value not in the table: error (the subject is left out "
                        "and named) or background (class 0, counted)")
    g.add_argument("--processing", choices=("aparc", "aseg", "none"), default="aparc",
                   help="FastSurfer's label rewrites before the lookup (default: aparc)")
    g.add_argument("--cortex", choices=("fuse", "fuse_after_fill", "split"), default="fuse",
                   help="fuse right cortex parcels into the left ones but the medial ones, "
                        "as FastSurfer does (fuse); the same, but a right voxel filled from "
                        "a medial parcel keeps its side (fuse_after_fill); or keep both "
                        "hemispheres (split) (default: fuse)")
    g.add_argument("--max-weight", type=float, default=5.0,
                   help="cap of the median-frequency class weights (default: 5)")
    g.add_argument("--edge-weight", type=float, default=5.0,
                   help="added on label edges (default: 5)")
    g.add_argument("--no-gradient", action="store_true", help="no edge weights")
    g.add_argument("--hires-weight", type=int, default=None,
                   help="added on deep sulci and white-matter strands (default: none)")
    g.add_argument("--cortex-border", action="store_true",
                   help="with --hires-weight: also half of it on the outer cortex border")
    g.add_argument("--region-weight", metavar="NAME=FACTOR", action="append", default=[],
                   help="multiply the weights of a region by FACTOR, e.g. "
                        "Left-Cerebellum-White-Matter=1.3 (repeatable)")
    g.add_argument("--blank-slice-threshold", type=float, default=50,
                   help="drop slices whose class sum is at most this (default: 50)")
    g.add_argument("--absent-classes", choices=("error", "allow"), default="error",
                   help="a class of the table that no exported subject holds: error "
                        "(nothing is written; the classes are named) or allow (default: "
                        "error)")
    g.add_argument("--derived-dir", metavar="DIR", default=None,
                   help="where the classes derived from the label maps are kept and "
                        "reused by later exports and by MRIDataset (default: "
                        "CACHE/derived; give another folder for a read-only cache)")
    g.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: up to 4, one core left free)")


def leave_out_flagged(cache, entries: list, args: argparse.Namespace) -> list:
    """``entries`` without those the last check flagged (``--exclude-flagged``), each
    left-out entry named on stderr with its findings."""
    from mriprep.cache.check_record import exclude_flagged

    kept, exclusion = exclude_flagged(cache.root, entries,
                                      getattr(args, "exclude_flagged", None))
    if exclusion is not None:
        print(f"mriprep export: {cli_words(exclusion.summary())}", file=sys.stderr)
        for line in exclusion.lines():
            print(f"  left out {line}", file=sys.stderr)
    return kept


def _region_weights(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            raise CacheError(f"--region-weight {item!r}: give NAME=FACTOR, e.g. "
                             "Left-Cerebellum-Cortex=1.3") from None
        if not sep or not name:
            raise CacheError(f"--region-weight {item!r}: give NAME=FACTOR")
    return out


def run_fastsurfer(args: argparse.Namespace) -> int:
    from mriprep.cache import Cache
    from mriprep.core.errors import InputError
    from mriprep.outputs import entries_for
    from mriprep.core.machine import default_process_workers
    from mriprep.outputs.fastsurfer_hdf5 import (EmptyExportError, HDF5Options,
                                                 export_fastsurfer_hdf5)
    from mriprep.training.labels import LabelTable
    from mriprep.training.labels.weights import WeightOptions

    require_cache_folder(args.cache, "export")
    out = Path(args.output)
    if out.is_dir():
        raise CacheError(f"{out} is a folder; --format fastsurfer-hdf5 writes one file, "
                         "e.g. -o train_coronal.hdf5")
    if args.thickness < 0:
        raise CacheError(f"--thickness {args.thickness}: give 0 or more")
    try:
        table = LabelTable(args.lut, processing=args.processing, cortex=args.cortex,
                           unknown=args.unknown)
        weights = WeightOptions(args.max_weight, args.edge_weight, args.hires_weight,
                                args.cortex_border, not args.no_gradient,
                                _region_weights(args.region_weight))
        from mriprep.training.labels.weights import region_factors_for
        region_factors_for(table, args.view, weights.region_weights)  # names checked now
    except InputError as exc:
        raise CacheError(str(exc)) from None
    cache = Cache(args.cache)
    entries = leave_out_flagged(cache, entries_for(cache, args.subject, args.split), args)
    options = HDF5Options(args.view, args.thickness, args.blank_slice_threshold, weights,
                          args.absent_classes)
    derive_bar = ProgressBar("derive labels", unit="subject")
    bar = ProgressBar("export", unit="subject")

    def deriving(done, total):
        derive_bar.update_to(done, total)

    def writing(done, total):
        derive_bar.close()
        bar.update_to(done, total)

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            result = export_fastsurfer_hdf5(cache, entries, out, table, options,
                                            args.workers or default_process_workers(),
                                            progress=writing, derived_dir=args.derived_dir,
                                            derive_progress=deriving)
        for warning in caught:  # accepted absent classes: a line, not Python's form
            print(f"mriprep export: warning: {cli_words(warning.message)}", file=sys.stderr)
    except EmptyExportError as exc:
        for problem in exc.problems:
            print(f"mriprep export: {problem}", file=sys.stderr)
        print(f"mriprep export: no slice to write; {out} was not written", file=sys.stderr)
        return ExitCode.PROBLEMS if exc.problems else ExitCode.USAGE
    except OSError as exc:
        raise CacheError(f"cannot write {out}: {exc}; choose a writable path with -o") from exc
    finally:
        derive_bar.close()
        bar.close()
    for problem in result.problems:
        print(f"mriprep export: {problem}", file=sys.stderr)
    extra = (f"; {result.unknown_voxels} voxels of values not in the table mapped to "
             "background" if result.unknown_voxels else "")
    print(f"wrote {result.slices} {args.view} slices of {len(result.subjects)} of "
          f"{len(entries)} subjects to {out}{extra}")
    for rule, voxels in result.moved.items():
        print(f"  rewritten before the lookup: {rule}: {voxels} voxels")
    return ExitCode.PROBLEMS if result.problems else ExitCode.OK
