"""Templates: the MNI152 shipped in nilearn's wheel, read without importing nilearn.datasets."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from mriprep.inputs.templates import load_mni152_tissue, load_template, template_digest
from mriprep.stages.registration.template import template_brain_mask


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


def test_mni152_tissue_maps_are_nilearns():
    from nilearn.datasets import load_mni152_gm_template, load_mni152_wm_template

    ours = load_mni152_tissue()
    for kind, load in (("gm", load_mni152_gm_template), ("wm", load_mni152_wm_template)):
        theirs = load(resolution=1)
        np.testing.assert_array_equal(ours[kind], theirs.get_fdata(dtype=np.float32))
        np.testing.assert_array_equal(theirs.affine, load_template("mni152").affine)
        assert ours[kind].max() == 1.0


def test_tissue_maps_come_from_nilearn_itself_where_its_files_are_elsewhere(monkeypatch):
    from mriprep.inputs import templates

    found = load_mni152_tissue()
    load_mni152_tissue.cache_clear()
    monkeypatch.setattr(templates, "_nilearn_file", lambda parts: None)
    try:
        asked = load_mni152_tissue()
    finally:
        load_mni152_tissue.cache_clear()
    assert asked.keys() == found.keys() == {"gm", "wm"}
    for kind in found:
        np.testing.assert_array_equal(asked[kind], found[kind])


def test_loading_mni152_does_not_import_nilearn_datasets():
    # A worker process loads the template before its first subject, and each process
    # that builds a demo person its tissue maps: scikit-learn and nilearn's atlas
    # fetchers would add a second or two to every one of them.
    script = ("import sys; from mriprep.stages.registration.template import template_brain_mask; "
              "from mriprep.inputs.templates import load_mni152_tissue; "
              "template_brain_mask('mni152'); load_mni152_tissue(); "
              "print('nilearn.datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_mask_centroid_matches_scipy_center_of_mass():
    from scipy import ndimage

    from mriprep.stages.registration.template import mask_centroid

    rng = np.random.default_rng(3)
    for shape in [(7, 9, 11), (30, 4, 17)]:
        mask = rng.random(shape) > 0.7
        np.testing.assert_allclose(mask_centroid(mask), ndimage.center_of_mass(mask),
                                   rtol=0, atol=1e-12)
    brain = template_brain_mask("mni152")
    np.testing.assert_allclose(mask_centroid(brain), ndimage.center_of_mass(brain),
                               rtol=0, atol=1e-9)


def test_template_levels_hold_the_brain_and_a_margin_around_it():
    from nibabel.affines import voxel_sizes

    from mriprep.stages.registration.template import template_pyramid

    levels, brains, centre = template_pyramid("mni152", (4.0, 2.0), 10.0, 5.0)
    brain_ml = template_brain_mask("mni152").sum() / 1000.0
    for level, brain in zip(levels, brains):
        voxel_ml = np.prod(voxel_sizes(level.affine)) / 1000.0
        np.testing.assert_allclose(voxel_sizes(level.affine), level.spacing_mm)
        # Each level's brain keeps the 1 mm brain's volume; the metric region holds it
        # and reaches beyond it (a 5 mm margin), yet stays inside the field of view.
        assert abs(brain.sum() * voxel_ml - brain_ml) < 0.03 * brain_ml
        assert level.mask[brain].all() and level.mask.sum() > 1.1 * brain.sum()
        assert not level.mask.all()
        assert np.isfinite(level.data).all() and level.data.dtype == np.float32
    # MNI152's brain centre sits a few mm from the origin of MNI space.
    assert np.linalg.norm(centre) < 30.0


def test_a_template_without_a_head_is_refused(tmp_path):
    import nibabel as nib
    import pytest

    from mriprep.core.errors import PipelineConfigError
    from mriprep.stages.registration.template import template_pyramid

    blank = tmp_path / "blank.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((40, 40, 40), np.float32), np.eye(4)), blank)
    with pytest.raises(PipelineConfigError, match=r"blank\.nii\.gz.*no brain or head.*4\.0 mm"):
        template_pyramid(str(blank), (4.0, 2.0), 10.0, 5.0)
