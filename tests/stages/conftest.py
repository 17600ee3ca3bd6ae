"""Fixtures shared by the stage tests: heads built from the MNI152 template."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from mriprep.templates import load_template
from mriprep.volume import Volume


def build_template_head(spacing=(2.0, 2.0, 2.0), noise=15.0, seed=0) -> Volume:
    """The MNI152 brain on a coarser grid (WM ~1000), bias field, Rician noise.

    Parameters
    ----------
    spacing : (float, float, float)
        Voxel size in mm; a thick voxel averages its slab, as a thick acquisition does.
    noise : float
        Rician noise sigma; 0 for a noise-free (skull-stripped looking) background.
    seed : int
        Seed of the bias field and the noise.

    Returns
    -------
    Volume
        float32 data padded by 4 voxels, subject ``template-head``.
    """
    template = load_template("mni152")
    data = template.data
    for axis, step in enumerate(spacing):  # a thick voxel averages its slab
        data = ndimage.uniform_filter1d(data, int(round(step)), axis=axis)
    data = ndimage.zoom(data, 1 / np.asarray(spacing), order=1)
    data = np.pad(data, 4) * (1000 / np.percentile(template.data[template.data > 0], 90))
    rng = np.random.default_rng(seed)
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in data.shape], indexing="ij", sparse=True)
    data = data * np.exp(sum(c * g for c, g in zip(rng.uniform(-0.15, 0.15, 3), grid)))
    if noise:
        data = np.hypot(data + rng.normal(0, noise, data.shape), rng.normal(0, noise, data.shape))
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = template.affine[:3, 3]
    return Volume.from_array(data.astype(np.float32), affine, subject_id="template-head")


@pytest.fixture(scope="session")
def template_head():
    """:func:`build_template_head`, for fixtures and tests that build their own heads."""
    return build_template_head
