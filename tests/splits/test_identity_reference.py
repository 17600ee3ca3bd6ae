"""The shipped identity reference population (mriprep/splits/identity_reference.npz) is
the one recorded, made by mriprep.demo.identity_reference's recipe, and fits the grid and
descriptors the check makes."""

from __future__ import annotations

import numpy as np

from mriprep.check.tensors import FINGERPRINT_BLOCKS
from mriprep.inputs.templates import load_template
from mriprep.pipelines import load_pipeline
from mriprep.splits.identity import core_mask
from mriprep.splits.reference import (
    REFERENCE_PATH,
    REFERENCE_SHA256,
    load_reference,
    reference_from_arrays,
    reference_sha256,
)
from mriprep.demo.identity_reference import REFERENCE_PEOPLE, REFERENCE_PIPELINE, REFERENCE_SEED


def test_shipped_reference_is_the_recorded_file():
    # A changed file is a changed threshold calibration: rebuild it with
    # `python -m mriprep.demo.identity_reference`, rerun `make bench` (identity) and
    # record both its new SHA-256 and the measured distributions.
    assert reference_sha256() == REFERENCE_SHA256, REFERENCE_PATH


def test_shipped_reference_follows_its_recipe():
    with np.load(REFERENCE_PATH, allow_pickle=False) as arrays:
        arrays = dict(arrays)
    assert arrays["seed"].tolist() == [REFERENCE_SEED, REFERENCE_PEOPLE]
    assert arrays["pipeline"][0] == REFERENCE_PIPELINE
    assert arrays["pipeline"][1] == load_pipeline(REFERENCE_PIPELINE).hash, (
        "t1w_mni_rigid changed since the reference was built: rebuild it")
    descriptors = arrays["descriptors"]
    assert len(descriptors) >= 0.9 * REFERENCE_PEOPLE and np.isfinite(descriptors).all()
    assert descriptors.shape[1] == core_mask((FINGERPRINT_BLOCKS,) * 3).sum()
    assert len(set(arrays["people"].tolist())) == len(descriptors)
    reference = load_reference()
    again = reference_from_arrays(arrays)
    assert np.array_equal(reference.centre, again.centre)
    assert np.array_equal(reference.scale, again.scale) and (reference.scale > 0).all()
    template = load_template("mni152")
    assert reference.fits(template.shape, template.affine)
    shifted = template.affine.copy()
    shifted[:3, 3] += 2.0
    assert not reference.fits(template.shape, shifted)
    assert not reference.fits((256, 256, 256), template.affine)
