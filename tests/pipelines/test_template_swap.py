"""Swapping the registration template is one line: a copy of the default pipeline with
only ``template:`` changed runs to the new template's grid, and validate checks that
grid without being told it."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from mriprep.core.errors import StageError
from mriprep.core.volume import PendingTransform, Volume
from mriprep.demo.calibration import person
from mriprep.demo.scanner import Acquisition, acquire
from mriprep.inputs.templates import load_template
from mriprep.pipelines import DEFAULT_PIPELINE, load_pipeline, pipelines_dir
from mriprep.stages import get_stage
from mriprep.stages.registration.geometry import rigid_matrix
from tests.stages.conftest import TEST_PERSON

# One xdist worker runs the whole module (make test's --dist loadgroup), so that what it
# builds once per process (module fixtures, cached scans) is built once per run.
pytestmark = pytest.mark.xdist_group("template_swap")


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


def _scan():
    return acquire(person(TEST_PERSON), rigid_matrix((5.0, -4.0, 3.0), (4.0, -3.0, 2.0)),
                   Acquisition((1.0, 1.0, 3.0)), np.random.default_rng(0))


def _subject() -> Volume:
    scan = _scan()
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


def test_validate_names_the_template_whose_grid_it_expected():
    # The register stage's hand-over, made from the scan's known truth: this tests
    # validate, and registration is tested on its own (tests/stages/test_register.py).
    scan, mni = _scan(), load_template("mni152")
    subject = Volume.from_array(scan.data, scan.affine, subject_id="swap")
    registered = get_stage("sanitize")(subject).replace(pending=PendingTransform(
        template_to_subject=scan.template_to_subject, target_shape=mni.shape,
        target_affine=mni.affine, target_name="registration template 'mni152'"))
    resampled = get_stage("resample")(registered)
    get_stage("validate")(resampled)  # on the template's grid: accepted
    # A volume that claims MNI152 as its target but sits on another grid is refused.
    moved = resampled.replace(data=resampled.data[:-1].copy(), valid=resampled.valid[:-1].copy())
    with pytest.raises(StageError, match=r"the grid of registration template 'mni152'"):
        get_stage("validate")(moved)


@pytest.fixture(scope="module")
def coarse_brain_mask(coarse_template) -> Path:
    """MNI152's brain mask on the 2 mm template's grid, as a template's mask ships."""
    from mriprep.stages.registration.template import template_brain_mask

    brain = ndimage.zoom(template_brain_mask("mni152").astype(np.float32), 0.5, order=1)
    path = coarse_template.parent / "mni152_2mm_brain_mask.nii.gz"
    nib.save(nib.Nifti1Image((brain > 0.5).astype(np.uint8),
                             nib.load(coarse_template).affine), path)
    return path


def test_a_template_is_given_with_its_brain_mask_in_one_more_line(
        tmp_path, coarse_template, coarse_brain_mask):
    from mriprep.stages.registration.template import template_brain_mask

    text = _swapped(tmp_path, coarse_template).read_text()
    with_mask = coarse_brain_mask.parent / "with_mask.yaml"  # beside the mask
    with_mask.write_text(text.replace(
        f"template: {coarse_template}",
        f"template: {coarse_template}\n      template_brain_mask: {coarse_brain_mask.name}"))
    pipeline = load_pipeline(with_mask)
    params = pipeline.params_of("register")
    # Relative to the pipeline file's folder, like the template; hashed by content.
    assert params.template_brain_mask == str(coarse_brain_mask)
    assert pipeline.hash != load_pipeline(_swapped(tmp_path, coarse_template)).hash
    given = template_brain_mask(str(coarse_template), str(coarse_brain_mask))
    derived = template_brain_mask(str(coarse_template))
    np.testing.assert_array_equal(given, nib.load(coarse_brain_mask).get_fdata() > 0.5)
    assert np.count_nonzero(given != derived) > 1000  # the stand-in is not the mask
    volume = _subject()
    for step in pipeline.steps:
        volume = get_stage(step.name)(volume, step.params)
    assert volume.shape == load_template(str(coarse_template)).shape
    assert volume.record_of("register").metrics["similarity"] >= 0.4


def test_a_brain_mask_on_another_grid_is_refused_naming_both_grids(coarse_template):
    from mriprep.core.errors import PipelineConfigError
    from mriprep.stages.registration.template import template_brain_mask

    with pytest.raises(PipelineConfigError, match=r"not on the grid of template .*shape"):
        template_brain_mask(str(coarse_template), "mni152")
