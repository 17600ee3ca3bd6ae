"""What the cache tests share: a small real brain and the entries made from it."""

from __future__ import annotations


import numpy as np
import pytest
from scipy import ndimage

from mriprep.cache import entry_key
from mriprep.inputs.templates import load_template


@pytest.fixture(scope="module")
def brain():
    """The MNI152 template at 4 mm: real anatomy, small enough for many entries."""
    mni = load_template("mni152")
    data = ndimage.zoom(mni.data, 0.25, order=1).astype(np.float32)
    affine = mni.affine.copy()
    affine[:3, :3] *= 4
    return data, affine


def tensors_of(data):
    return {
        "image": (data - data.mean()) / data.std(),
        "valid": data > 0,
        "label": np.digitize(data, [1, 4000, 7000]).astype(np.int16),
    }


def meta_of(subject, data, affine, session=""):
    return {
        "subject_id": subject,
        "session_id": session,
        "pipeline_name": "test",
        "pipeline_hash": "p" * 64,
        "inputs": {"image": {"path": f"/data/{subject}.nii.gz", "sha256": "0" * 64}},
        "affine": affine,
        "spacing": [4.0, 4.0, 4.0],
        "shape": list(data.shape),
        "provenance": [{"stage": "load", "params": {}, "metrics": {}}],
    }


def key_of(subject, version=0):
    return entry_key(subject, "", {"image": f"{version:064d}"}, "p" * 64)
