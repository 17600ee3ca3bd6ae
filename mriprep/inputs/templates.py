"""Registration templates: the MNI152 2009 T1 shipped inside nilearn's wheel, or a file.

Templates are read-only reference data, loaded once per process and cached: this is the
one place a stage's inputs come from disk, and it never writes.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import nibabel as nib
import numpy as np

from mriprep.core.hashing import sha256_hex
from mriprep.core.volume import Volume

BUILTIN_TEMPLATES = ("mni152",)


def is_builtin(name: str) -> bool:
    return name in BUILTIN_TEMPLATES


# The file inside nilearn's wheel that nilearn.datasets.load_mni152_template(resolution=1)
# reads. Importing nilearn.datasets (scikit-learn and every atlas fetcher) takes a second,
# and every worker process would pay it before its first subject; finding the file
# costs nothing.
_MNI152_T1 = ("datasets", "data", "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz")
# The grey- and white-matter maps that load_mni152_gm_template / _wm_template read.
_MNI152_TISSUE = {
    "gm": ("datasets", "data", "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz"),
    "wm": ("datasets", "data", "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz"),
}


@functools.lru_cache(maxsize=4)
def load_template(name_or_path: str) -> Volume:
    """The template as a Volume (float32, canonical RAS orientation, all voxels valid).

    ``"mni152"`` is nilearn's MNI152 2009 1 mm T1 (197x233x189), available offline, with
    exactly the voxels ``nilearn.datasets.load_mni152_template(resolution=1)`` gives.
    Anything else is read as an image file with :func:`mriprep.inputs.readers.load_volume`.
    """
    if name_or_path == "mni152":
        path = _nilearn_file(_MNI152_T1)
        if path is None:  # a nilearn that keeps its data elsewhere: ask it
            from nilearn.datasets import load_mni152_template

            img = load_mni152_template(resolution=1)
            data = np.asarray(img.get_fdata(dtype=np.float32))
        else:
            img, data = _read_as_nilearn_does(path)
        return Volume.from_array(data, img.affine, subject_id="mni152", source="mni152")
    from mriprep.inputs.readers import load_volume

    return load_volume(Path(name_or_path))


def _nilearn_file(parts: tuple[str, ...]) -> Path | None:
    """A data file of the installed nilearn package, found without importing it."""
    spec = importlib.util.find_spec("nilearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder).joinpath(*parts)
        if path.is_file():
            return path
    return None


def _read_as_nilearn_does(path: Path) -> tuple[nib.Nifti1Image, np.ndarray]:
    """The image and the voxels nilearn's MNI152 loaders give at 1 mm: the stored values
    in float32, scaled to a maximum of 1."""
    img = nib.load(path)
    data = np.asanyarray(img.dataobj).astype(np.float32)
    data /= data.max()
    return img, data


@functools.lru_cache(maxsize=4)
def load_mni152_tissue() -> dict[str, np.ndarray]:
    """nilearn's MNI152 GM and WM probability maps on the 1 mm template grid, with the
    voxels ``load_mni152_gm_template`` and ``load_mni152_wm_template`` give (found, like
    the template, without importing nilearn.datasets)."""
    paths = {kind: _nilearn_file(parts) for kind, parts in _MNI152_TISSUE.items()}
    if None in paths.values():  # a nilearn that keeps its data elsewhere: ask it
        from nilearn.datasets import load_mni152_gm_template, load_mni152_wm_template

        images = {"gm": load_mni152_gm_template(resolution=1),
                  "wm": load_mni152_wm_template(resolution=1)}
        return {kind: np.asarray(img.get_fdata(dtype=np.float32))
                for kind, img in images.items()}
    return {kind: _read_as_nilearn_does(path)[1] for kind, path in paths.items()}


def template_digest(name_or_path: str) -> str:
    """SHA-256 of the template's voxels and affine: part of the pipeline hash."""
    vol = load_template(name_or_path)
    return sha256_hex(np.ascontiguousarray(vol.data), np.ascontiguousarray(vol.affine))
