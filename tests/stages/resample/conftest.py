"""Volumes the resample tests share: the MNI152 head at 2 mm with labels, an analytic
field on thick slices, and the 1 mm head on a conformed-like odd grid."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.volume import Volume
from mriprep.inputs.templates import load_mni152_tissue, load_template
from mriprep.stages import get_stage
from tests.stages.resample.reference import analytic, world_of


@pytest.fixture(scope="package")
def head() -> Volume:
    """The MNI152 head at 2 mm with its tissue labels (0 background, 1 GM, 2 WM) and a
    few invalid voxels, as the stages before resample leave it."""
    template = load_template("mni152")
    tissue = load_mni152_tissue()
    data = template.data[::2, ::2, ::2] * 1000.0
    label = np.zeros(data.shape, dtype=np.int16)
    label[tissue["gm"][::2, ::2, ::2] > 0.5] = 1
    label[tissue["wm"][::2, ::2, ::2] > 0.5] = 2
    affine = template.affine @ np.diag([2.0, 2.0, 2.0, 1.0])
    valid = np.ones(data.shape, dtype=bool)
    valid[40:44, 50:52, 45] = False
    return Volume(data=data, affine=affine, valid=valid, label=label, subject_id="head")


@pytest.fixture(scope="package")
def thick_field() -> Volume:
    """The analytic field sampled on a 1 x 1 x 5 mm grid."""
    affine = np.diag([1.0, 1.0, 5.0, 1.0])
    affine[:3, 3] = (-30.0, -35.0, -40.0)
    shape = (60, 70, 17)
    values = analytic(world_of(shape, affine)).astype(np.float32)
    return Volume.from_array(values, affine, subject_id="field")


@pytest.fixture(scope="package")
def conformed_1mm() -> Volume:
    """The 1 mm MNI152 head cropped to an odd shape (every axis of the other parity than
    256), in FastSurfer's LIA order as the reorient stage leaves it, with labels and a
    block of invalid voxels."""
    template = load_template("mni152")
    box = (slice(20, 171), slice(30, 211), slice(10, 181))  # 151 x 181 x 171
    data = template.data[box] * 1000.0
    label = (load_mni152_tissue()["wm"][box] > 0.5).astype(np.int16) * 2
    affine = template.affine.copy()
    affine[:3, 3] += [b.start for b in box]
    valid = np.ones(data.shape, dtype=bool)
    valid[70:75, 80:83, 60] = False
    volume = Volume(data=data, affine=affine, valid=valid, label=label, subject_id="conf")
    return get_stage("reorient")(volume, orientation="LIA")
