"""Shared by the tests of mriprep.inputs' readers and writers: a real brain to save and load.

Every file is built in tmp_path from a cropped piece of the MNI152 template, so the tests
run on real anatomy in a few seconds.
"""

from __future__ import annotations

import gzip
import io
import warnings

import nibabel as nib
import numpy as np
import pytest

from mriprep.core.volume import Volume
from mriprep.inputs.readers import load_volume
from mriprep.inputs.templates import load_template

# A 40x48x36 block through the middle of the brain.
CROP = (slice(80, 120), slice(100, 148), slice(70, 106))


def template_block(start: int, size: int) -> Volume:
    """A ``size``^3 cube of MNI152 anatomy from voxel ``start`` on each axis, on its place
    in the template's world, with a 3-class label map (different starts, different scans)."""
    template = load_template("mni152")
    box = tuple(slice(start, start + size) for _ in range(3))
    data = np.ascontiguousarray(template.data[box])
    shift = np.eye(4)
    shift[:3, 3] = start
    label = np.digitize(data, [0.5, 0.8]).astype(np.int16)
    return Volume.from_array(data, template.affine @ shift, label=label)


def _rotation_z(degrees: float) -> np.ndarray:
    t = np.deg2rad(degrees)
    r = np.eye(4)
    r[:2, :2] = [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]
    return r


@pytest.fixture(scope="module")
def brain() -> Volume:
    """Cropped MNI152 anatomy on an oblique, anisotropic grid (a realistic scanner header)."""
    template = load_template("mni152")
    data = np.ascontiguousarray(template.data[CROP])
    shift = np.eye(4)
    shift[:3, 3] = [s.start for s in CROP]
    affine = _rotation_z(12.0) @ template.affine @ shift @ np.diag([1.0, 1.0, 1.5, 1.0])
    label = np.digitize(data, [0.5, 0.8]).astype(np.int16)  # dark / grey / bright
    return Volume.from_array(data, affine, label=label, subject_id="crop", source="mni152")


def _nifti(data, affine, dtype=None) -> nib.Nifti1Image:
    img = nib.Nifti1Image(np.asarray(data), affine, dtype=dtype)
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    return img


def _file_bytes(path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def _raw_header(path) -> nib.Nifti1Header:
    """The header as stored (nib.load moves scl_slope/scl_inter out of img.header)."""
    return nib.Nifti1Header.from_fileobj(io.BytesIO(_file_bytes(path)[:348]))


def _patch_header(path, **fields):
    """Set raw header fields in a saved NIfTI (nibabel's save would recompute scaling)."""
    raw = bytearray(_file_bytes(path))
    hdr = _raw_header(path)
    for name, value in fields.items():
        hdr[name] = value
    buffer = io.BytesIO()
    hdr.write_to(buffer)
    stored = buffer.getvalue()  # 348 header bytes + the 4-byte extension flag
    raw[: len(stored)] = stored
    path.write_bytes(gzip.compress(bytes(raw)) if path.suffix == ".gz" else bytes(raw))
    return path


def _load_quietly(path, **kwargs):
    """load_volume with every Python warning turned into an error (none may leak)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_volume(path, **kwargs)
