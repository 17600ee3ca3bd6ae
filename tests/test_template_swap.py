"""Swapping the registration template is one line: a copy of the default pipeline with
only ``template:`` changed runs to the new template's grid, and validate checks that
grid without being told it."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from mriprep.demo.calibration import person
from mriprep.demo.scanner import Acquisition, acquire
from mriprep.errors import StageError
from mriprep.pipeline import DEFAULT_PIPELINE, load_pipeline, pipelines_dir
from mriprep.registration.geometry import rigid_matrix
from mriprep.stages import get_stage
from mriprep.templates import load_template
from mriprep.volume import Volume

SWAP_PERSON = 43


@pytest.fixture(scope="module")
def coarse_template(tmp_path_factory) -> Path:
    """MNI152 on a 2 mm grid, written as a user's template file would be."""
    mni = load_template("mni152")
    data = ndimage.zoom(mni.data, 0.5, order=1).astype(np.float32)
    affine = mni.affine.copy()
    affine[:3, :3] *= 2.0
    path = tmp_path_factory.mktemp("templates") / "mni152_2mm.nii.gz"
    nib.save(nib.Nifti1Image(data, affine), path)
    return path


def _swapped(tmp_path: Path, template: Path) -> Path:
    default = pipelines_dir() / f"{DEFAULT_PIPELINE}.yaml"
    text = default.read_text()
    assert text.count("template: mni152") == 1
    copy = tmp_path / "my_pipeline.yaml"
    copy.write_text(text.replace("template: mni152", f"template: {template}"))
    return copy


def _subject() -> Volume:
    scan = acquire(person(SWAP_PERSON), rigid_matrix((5.0, -4.0, 3.0), (4.0, -3.0, 2.0)),
                   Acquisition((1.0, 1.0, 3.0)), np.random.default_rng(0))
    return Volume.from_array(scan.data, scan.affine, subject_id="swap")


def test_changing_only_the_template_runs_to_the_new_templates_grid(tmp_path, coarse_template):
    pipeline = load_pipeline(_swapped(tmp_path, coarse_template))
    volume = _subject()
    for step in pipeline.steps:
        volume = get_stage(step.name)(volume, step.params)
    template = load_template(str(coarse_template))
    assert volume.shape == template.shape
    np.testing.assert_allclose(volume.spacing, (2.0, 2.0, 2.0))
    checked = volume.record_of("validate").metrics
    assert checked["shape"] == list(template.shape)


def test_validate_names_the_template_whose_grid_it_expected(coarse_template):
    registered = get_stage("register")(
        get_stage("sanitize")(get_stage("reorient")(_subject())), template="mni152")
    resampled = get_stage("resample")(registered)
    # A volume that claims MNI152 as its target but sits on another grid is refused.
    moved = resampled.replace(data=resampled.data[:-1].copy(), valid=resampled.valid[:-1].copy())
    with pytest.raises(StageError, match=r"the grid of registration template 'mni152'"):
        get_stage("validate")(moved)
