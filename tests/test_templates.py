"""Templates: the MNI152 shipped in nilearn's wheel, read without importing nilearn.datasets."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from mriprep.registration.template import template_brain_mask
from mriprep.templates import load_template, template_digest


def test_mni152_has_exactly_nilearns_voxels_and_affine():
    from nilearn.datasets import load_mni152_template

    ours = load_template("mni152")
    theirs = load_mni152_template(resolution=1)
    np.testing.assert_array_equal(ours.data, theirs.get_fdata(dtype=np.float32))
    np.testing.assert_array_equal(ours.affine, theirs.affine)
    assert ours.shape == (197, 233, 189) and ours.data.max() == 1.0
    assert len(template_digest("mni152")) == 64


def test_mni152_brain_mask_is_nilearns():
    from nilearn.datasets import load_mni152_brain_mask

    theirs = np.asarray(load_mni152_brain_mask(resolution=1).get_fdata()) > 0.5
    np.testing.assert_array_equal(template_brain_mask("mni152"), theirs)
    assert 1.5e6 < theirs.sum() < 2.5e6  # a brain's worth of 1 mm voxels


def test_loading_mni152_does_not_import_nilearn_datasets():
    # A worker process loads the template before its first subject: scikit-learn and
    # nilearn's atlas fetchers would add a second to every worker's start.
    script = ("import sys; from mriprep.registration.template import template_brain_mask; "
              "template_brain_mask('mni152'); print('nilearn.datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
