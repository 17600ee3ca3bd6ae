"""``mriprep to-native CACHE SUBJECT PREDICTION -o OUT``: a prediction on the cache grid
mapped onto the subject's native scan (see :mod:`mriprep.outputs.native`); with
``--classes TABLE``, a network's classes written back as FreeSurfer's label numbers.

Exit status: 0 the image was written, 2 usage error (no such cache or subject, a
prediction off the cache grid, a native scan that is gone or changed, OUT exists).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mriprep.cli.cache_folder import require_cache_folder
from mriprep.core.errors import InputError
from mriprep.core.exit_codes import ExitCode


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "to-native",
        help="map a prediction on the cache grid back onto the subject's native scan",
        description=(
            "Map a label map or an image on an entry's cache grid onto the native scan "
            "the entry was made from, in one interpolation through the recorded "
            "geometry (and the registration, when there was one). The output has the "
            "native scan's shape, affine, qform and sform, so it overlays the scan in "
            "any viewer; native voxels outside the cache grid get 0."
        ),
    )
    p.add_argument("cache", help="cache folder (as given to `mriprep run -o`)")
    p.add_argument("subject", help="subject id of the entry the prediction was made on")
    p.add_argument("prediction",
                   help="the prediction on the cache grid: a .npy array [X, Y, Z], or a "
                        "NIfTI/MGZ image whose affine is the cache grid's")
    p.add_argument("-o", "--output", metavar="OUT", required=True,
                   help="image to write (.nii.gz, .nii or .mgz: the suffix picks the format)")
    p.add_argument("--session", metavar="S",
                   help="the entry's session, when the subject has several in the cache")
    p.add_argument("--kind", choices=("label", "image"), default="label",
                   help="label: an integer label map (default); image: real values "
                        "(intensities, one class's probability)")
    p.add_argument("--interpolation", choices=("nearest", "per-label", "linear"),
                   help="labels: nearest (default) or per-label (each label's indicator "
                        "linearly, then the most likely: smoother boundaries); images: "
                        "linear (default) or nearest")
    p.add_argument("--native", metavar="PATH",
                   help="where the native scan is now, if it moved since it was cached "
                        "(it must be the same file: its SHA-256 is checked)")
    p.add_argument("--classes", metavar="TABLE",
                   help="the prediction holds a network's classes 0..C-1 of this lookup "
                        "table (FreeSurfer LUT .txt, FastSurfer ColorLUT .tsv, 'dkt' for "
                        "the shipped FastSurfer DKT table, or the .hdf5 the network was "
                        "trained on: its recorded table and view, hash checked): write "
                        "FreeSurfer's label numbers instead (labels only)")
    p.add_argument("--view", choices=("axial", "coronal", "sagittal"),
                   help="with --classes: the view whose class list the network predicts "
                        "(default: axial, or the .hdf5's own; sagittal classes stand for "
                        "the right-hemisphere or left-cortex label of a merged pair)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mriprep.cache import Cache
    from mriprep.inputs.formats import image_suffix
    from mriprep.outputs import save_image, to_native
    from mriprep.outputs.images import MGH_SUFFIXES, NIFTI_SUFFIXES

    out = Path(args.output)
    if image_suffix(out) not in NIFTI_SUFFIXES + MGH_SUFFIXES:
        raise InputError(f"cannot write {out}: name it *.nii.gz, *.nii or *.mgz (the "
                         "suffix picks the format)")
    if out.exists() and not args.force:
        raise InputError(f"{out} exists; pass --force to overwrite it, or choose another -o")
    require_cache_folder(args.cache, "to-native")
    if args.classes is not None and args.kind != "label":
        raise InputError("--classes maps a label map's classes; drop it with --kind image")
    cache = Cache(args.cache)
    prediction = read_prediction(Path(args.prediction))
    if args.classes is not None:
        prediction = as_freesurfer_labels(prediction, args.classes, args.view,
                                          Path(args.prediction))
    img = to_native(cache, args.subject, prediction, session_id=args.session, kind=args.kind,
                    interpolation=args.interpolation, native_path=args.native)
    try:
        save_image(img, out)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc}; choose a writable place for -o") from exc
    print(f"{args.kind} on the native grid {img.shape}: {out}")
    return ExitCode.OK


def as_freesurfer_labels(prediction, table_name: str, view: str | None, path: Path):
    """A prediction of classes (array or nibabel image) with FreeSurfer's numbers."""
    import nibabel as nib
    import numpy as np

    from mriprep.training.labels import dkt_table, load_table

    if Path(table_name).suffix.lower() in (".hdf5", ".h5"):
        from mriprep.outputs.fastsurfer_hdf5 import read_recorded_table

        table, recorded_view = read_recorded_table(table_name)
        if view is not None and view != recorded_view:
            raise InputError(f"--view {view}, but {table_name} holds the {recorded_view} "
                             f"view; drop --view or pass --view {recorded_view}")
        view = recorded_view
    else:
        table = dkt_table() if table_name == "dkt" else load_table(table_name)
        view = view or "axial"
    image = isinstance(prediction, nib.spatialimages.SpatialImage)
    classes = np.asarray(prediction.dataobj if image else prediction)
    if not np.issubdtype(classes.dtype, np.integer):
        if not (np.isfinite(classes).all() and np.array_equal(classes, np.round(classes))):
            raise InputError(f"prediction {path} holds non-integer values; --classes needs "
                             "the predicted class of each voxel (argmax of the logits)")
    try:
        labels = table.to_freesurfer(classes.astype(np.int64), view)
    except ValueError as exc:
        raise InputError(f"prediction {path}: {exc} of table {table_name!r}; give the "
                         "table and --view the network was trained with") from exc
    return nib.Nifti1Image(labels, prediction.affine) if image else labels


def read_prediction(path: Path):
    """A .npy array (never unpickled) or a nibabel image (its affine is checked against
    the cache grid's by :func:`~mriprep.outputs.to_native`)."""
    import nibabel as nib
    import numpy as np

    from mriprep.inputs.formats import image_suffix

    if not path.is_file():
        raise InputError(f"prediction {path} does not exist; check the path")
    try:
        if path.suffix.lower() == ".npy":
            return np.load(path, mmap_mode="r", allow_pickle=False)
        if image_suffix(path) in (".nii", ".nii.gz", ".mgz", ".mgh"):
            return nib.load(str(path))
    except (OSError, ValueError, nib.filebasedimages.ImageFileError) as exc:
        raise InputError(f"cannot read the prediction {path}: {exc}") from exc
    raise InputError(f"prediction {path} is neither .npy nor NIfTI/MGZ; save it as one of "
                     "those (np.save, or nibabel with the cache grid's affine)")
