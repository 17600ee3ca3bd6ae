"""``mriprep manifest``: validate a cohort manifest, or build one from a BIDS folder or a
FreeSurfer/FastSurfer SUBJECTS_DIR."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

from mriprep.core.errors import InputError, ManifestError, cli_words
from mriprep.core.exit_codes import ExitCode

DESCRIPTION = """\
Check a cohort manifest before a run, or write one from a BIDS dataset or a
FreeSurfer/FastSurfer SUBJECTS_DIR.

A manifest is a CSV or TSV with columns subject_id, image and optionally label, split
(train/val/test) and session_id; other columns are kept as metadata. Paths are relative
to the manifest's folder unless absolute. See data_manifests/README.md for the schema.
"""

EPILOG = """\
examples:
  mriprep manifest validate data_manifests/example.csv
  mriprep manifest validate cohort.tsv --headers      # also check every image header
  mriprep manifest from-bids /data/ds000001 -o cohort.csv
  mriprep manifest from-bids /data/ds000001 -o cohort.csv --labels fmriprep
  mriprep manifest from-bids /data/ds000001 -o cohort.csv --labels fastsurfer --force
  mriprep manifest from-freesurfer $SUBJECTS_DIR -o cohort.csv
  mriprep manifest from-freesurfer $SUBJECTS_DIR -o cohort.csv --seg aparc+aseg

exit status: 0 no problems, 1 problems found (each printed with its line), 2 usage error
"""

FREESURFER_DESCRIPTION = """\
Write a manifest listing every subject folder of a FreeSurfer/FastSurfer SUBJECTS_DIR
(<id>/mri/orig.mgz), sorted, with paths relative to the manifest: image =
<id>/mri/orig.mgz, label = the segmentation --seg chooses in the same mri/ folder (both
lie on the conformed grid), subject_id = the folder's name. The chosen file's name is
written in a `segmentation` column. The split column is left empty: assign splits with
`mriprep splits`.

which segmentation (--seg), per subject:
  auto (default)       aparc.DKTatlas+aseg.deep.mgz (FastSurfer's), else
                       aparc.DKTatlas+aseg.mgz, else aparc+aseg.mgz (FreeSurfer's default,
                       Desikan: its 3 extra parcels per hemisphere are mapped to DKT at
                       training); never aseg.mgz, which has no cortical parcels (all
                       cortex is 3/42: a DKT table would lose it)
  aparc.DKTatlas+aseg  the .deep file when there is one, else the plain one
  aparc+aseg           aparc+aseg.mgz
  aseg                 aseg.mgz; train it with an aseg table
                       (mriprep export --processing aseg --lut TABLE)
  FILE                 that file of mri/, e.g. aparc.a2009s+aseg.mgz or mylabels.mgz

refusals: a subject with only aseg.mgz (under auto), without the file an explicit --seg
names, or with a segmentation but no mri/orig.mgz gets no row; the others are written
and each refusal is printed as a warning with its reason and fix (exit 0). No usable
subject at all is an error (exit 2).

not subjects: fsaverage*, lh.EC_average, rh.EC_average and FreeSurfer's other templates,
hidden folders and folders without mri/orig.mgz are skipped, and named in the summary.
Longitudinal folders (tp1, the template bert, tp1.long.bert) stay one row each but share
one subject_id (the template's), with the folder name as session_id, so that one person
never lands in two splits.
"""

FREESURFER_EPILOG = """\
examples:
  mriprep manifest from-freesurfer $SUBJECTS_DIR -o cohort.csv
  mriprep manifest from-freesurfer /data/fastsurfer -o cohort.csv --seg aparc.DKTatlas+aseg
  mriprep manifest from-freesurfer $SUBJECTS_DIR -o aseg.csv --seg aseg
  mriprep manifest from-freesurfer $SUBJECTS_DIR -o cohort.csv --seg aparc.a2009s+aseg.mgz

exit status: 0 written (refused subjects are warned), 1 the written manifest has
problems (each printed with its line), 2 usage error or no usable subject
"""
# --seg's help, shared by from-bids and from-freesurfer.
SEG_HELP = (
    "which segmentation of a subject's mri/ is the label: auto (default: "
    "aparc.DKTatlas+aseg.deep.mgz, else aparc.DKTatlas+aseg.mgz, else aparc+aseg.mgz; "
    "never aseg.mgz, which has no cortical parcels), aparc.DKTatlas+aseg, aparc+aseg, "
    "aseg, or a file name in mri/ (aparc.a2009s+aseg.mgz); a subject without it is "
    "refused, with the reason"
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "manifest",
        help="validate a cohort manifest, or build one from a BIDS folder or SUBJECTS_DIR",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    validate = actions.add_parser(
        "validate",
        help="report every problem of a manifest at once",
        description=(
            "Report every problem of a manifest at once, each with its line number:\n"
            "missing columns or files, duplicate rows, empty or unsafe ids, unknown splits."
        ),
        epilog="example:\n  mriprep manifest validate data_manifests/example.csv --headers",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    validate.add_argument("manifest", type=Path, help="the manifest (.csv or .tsv)")
    validate.add_argument(
        "--no-check-files",
        dest="check_files",
        action="store_false",
        help="do not require the image and label files to exist (check the table only)",
    )
    validate.add_argument(
        "--headers",
        action="store_true",
        help=(
            "also read every image and label header (no voxel data): dimensions, affine, "
            "voxel-count limit, label grid equal to its image's"
        ),
    )

    from_bids = actions.add_parser(
        "from-bids",
        help="write a manifest listing every T1w image of a BIDS dataset",
        description=(
            "Write a manifest listing every sub-*/[ses-*/]anat/*_T1w.nii[.gz] of a BIDS\n"
            "dataset, sorted, with paths relative to the manifest. The split column is\n"
            "left empty: assign splits by subject afterwards. Several T1w images in one\n"
            "session get session ids made of their entities (ses-1_run-2). The columns\n"
            "of participants.tsv (n/a written as an empty cell) and the entities (ses,\n"
            "acq, run, ...) are kept as metadata columns, for `mriprep splits --stratify`."
        ),
        epilog=(
            "examples:\n"
            "  mriprep manifest from-bids /data/ds000001 -o cohort.csv\n"
            "  # BIDS derivatives: derivatives/fmriprep/sub-01/anat/sub-01_desc-aseg_dseg.nii.gz\n"
            "  mriprep manifest from-bids /data/ds000001 -o cohort.csv --labels fmriprep\n"
            "  # FastSurfer: derivatives/fastsurfer/sub-01/mri/aparc.DKTatlas+aseg.deep.mgz,\n"
            "  # paired with the mri/orig.mgz it lies on (the T1w is on another grid)\n"
            "  mriprep manifest from-bids /data/ds000001 -o cohort.csv --labels fastsurfer"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from_bids.add_argument("bids_dir", type=Path, help="the BIDS dataset folder")
    from_bids.add_argument(
        "-o", "--output", type=Path, required=True, help="manifest to write (.csv or .tsv)"
    )
    from_bids.add_argument(
        "--labels",
        metavar="NAME",
        help=(
            "pair each T1w with a label map under derivatives/NAME/: a BIDS "
            "<same folder>/<entities>[_desc-D]_dseg.nii[.gz], else a FastSurfer/FreeSurfer "
            "<sub>[_<ses>]/mri/ segmentation (which one: --seg), whose row then takes "
            "mri/orig.mgz (the label's grid) as its image"
        ),
    )
    from_bids.add_argument(
        "--labels-desc",
        metavar="DESC",
        help=(
            "take the dseg with desc-DESC ('' for the one without desc-); default: the "
            "only dseg of the image, else desc-aseg, else an error listing them"
        ),
    )
    from_bids.add_argument(
        "--seg",
        metavar="SEG",
        help=SEG_HELP + " (FastSurfer/FreeSurfer subject folders only, not BIDS dseg files)",
    )
    from_bids.add_argument(
        "--force", action="store_true", help="overwrite OUTPUT if it already exists"
    )

    from_freesurfer = actions.add_parser(
        "from-freesurfer",
        help="write a manifest listing every subject of a FreeSurfer/FastSurfer SUBJECTS_DIR",
        description=FREESURFER_DESCRIPTION,
        epilog=FREESURFER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from_freesurfer.add_argument(
        "subjects_dir", type=Path, metavar="SUBJECTS_DIR",
        help="the folder holding one folder per subject (<id>/mri/orig.mgz)",
    )
    from_freesurfer.add_argument(
        "-o", "--output", type=Path, required=True, help="manifest to write (.csv or .tsv)"
    )
    from_freesurfer.add_argument("--seg", metavar="SEG", default="auto", help=SEG_HELP)
    from_freesurfer.add_argument(
        "--force", action="store_true", help="overwrite OUTPUT if it already exists"
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    if args.action == "validate":
        return _validate(args.manifest, args.check_files, args.headers)
    if args.action == "from-freesurfer":
        return _from_freesurfer(args.subjects_dir, args.output, args.seg, args.force)
    return _from_bids(
        args.bids_dir, args.output, args.labels, args.labels_desc, args.seg, args.force
    )


def _validate(path: Path, check_files: bool, headers: bool) -> int:
    from mriprep.inputs.manifest import read_manifest

    try:
        manifest = read_manifest(path, check_files=check_files)
        problems = _header_problems(manifest) if headers else []
    except ManifestError as exc:
        problems = exc.problems
    if problems:
        print(f"manifest {path}: {len(problems)} problem(s)")
        for problem in problems:
            print(f"  - {problem}")
        return ExitCode.PROBLEMS
    print(f"manifest {path}: {_summary(manifest)}; no problems found")
    return ExitCode.OK


def _header_problems(manifest) -> list[str]:
    from mriprep.inputs.labels import check_same_grid
    from mriprep.inputs.readers import read_header

    problems = []
    for row in manifest:
        try:
            # The form the row chooses; the pipeline's is not known here (auto).
            header = row.header or "auto"
            image = read_header(row.image, header=header)
            if row.label is not None:
                check_same_grid(read_header(row.label, header=header, fallback=True), image)
        except InputError as exc:
            problems.append(f"line {row.row} ({row.name}): {exc}")
    return problems


def _summary(manifest) -> str:
    groups = manifest.by_split()
    counts = ", ".join(f"{split or 'unassigned'} {len(rows)}" for split, rows in groups.items())
    n_subjects = len(manifest.subjects())
    # The split counts are of rows (scans), so they follow the row count, not the subjects'.
    return f"{len(manifest)} row(s) ({counts}), {n_subjects} subject(s)"


def _from_bids(
    bids_dir: Path,
    output: Path,
    labels: str | None,
    labels_desc: str | None,
    seg: str | None,
    force: bool,
) -> int:
    from mriprep.inputs.bids import manifest_from_bids
    from mriprep.inputs.freesurfer import (
        CONFORMED_IMAGE,
        SEGMENTATION_COLUMN,
        describe_segmentations,
    )

    if not _may_write(output, force):
        return ExitCode.USAGE
    with _printed_warnings():
        rows = manifest_from_bids(bids_dir, labels=labels, labels_desc=labels_desc, seg=seg)
    manifest = _write_checked(rows, output)
    if manifest is None:
        return ExitCode.PROBLEMS
    n_labels = sum(row.label is not None for row in manifest)
    print(
        f"wrote {output}: {_summary(manifest)}; {n_labels} row(s) with a label map; "
        "splits are unassigned"
    )
    conformed = sum(row.image.name == CONFORMED_IMAGE for row in manifest)
    if conformed:
        print(
            f"{conformed} row(s) take FastSurfer/FreeSurfer's mri/{CONFORMED_IMAGE} as image: "
            "their label map lies on that conformed grid, not on the T1w's"
        )
    if SEGMENTATION_COLUMN in manifest.metadata_columns():
        print(f"FastSurfer/FreeSurfer labels: {describe_segmentations(manifest)}")
    return ExitCode.OK


def _from_freesurfer(subjects_dir: Path, output: Path, seg: str, force: bool) -> int:
    from mriprep.inputs.freesurfer import manifest_from_freesurfer

    if not _may_write(output, force):
        return ExitCode.USAGE
    with _printed_warnings():
        result = manifest_from_freesurfer(subjects_dir, seg=seg)
    manifest = _write_checked(result.rows, output)
    if manifest is None:
        return ExitCode.PROBLEMS
    print(f"wrote {output}: {_summary(manifest)}; splits are unassigned")
    for line in result.summary():
        print(line)
    return ExitCode.OK


def _may_write(output: Path, force: bool) -> bool:
    if output.exists() and not force:
        print(
            f"mriprep manifest: error: {output} already exists; pass --force to overwrite it",
            file=sys.stderr,
        )
        return False
    return True


@contextlib.contextmanager
def _printed_warnings():
    """The library warns (refused subjects, images without a label map, subjects
    participants.tsv lacks); here they become one plain line each instead of Python's
    file:line form."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            yield
        finally:
            for warning in caught:
                if issubclass(warning.category, UserWarning):
                    print(f"mriprep manifest: warning: {cli_words(warning.message)}",
                          file=sys.stderr)


def _write_checked(rows, output: Path):
    """Write the rows, read them back: the Manifest, or None after printing its problems."""
    from mriprep.inputs.manifest import read_manifest, write_manifest

    write_manifest(rows, output)
    try:
        return read_manifest(output)
    except ManifestError as exc:
        print(f"wrote {output}, but it has problems:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return None
