"""validate: a good output passes unchanged; each broken invariant is named with its value.

Volumes are a block of the MNI152 brain, normalised, with a CSF/GM/WM label map from
nilearn's tissue maps.
"""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.errors import PipelineConfigError, StageError
from mriprep.core.volume import PendingTransform, Volume
from mriprep.inputs.templates import load_mni152_tissue, load_template
from mriprep.stages import get_stage
from mriprep.stages.normalize import normalize
from mriprep.stages.validate import ValidateParams, find_violations, validate

BLOCK = (slice(60, 140), slice(70, 170), slice(50, 130))  # 80x100x80 mm of brain


@pytest.fixture(scope="module")
def output() -> Volume:
    """A normalised block of the template with labels 0 background, 1 CSF, 2 GM, 3 WM."""
    template = load_template("mni152")
    tissue = load_mni152_tissue()
    data = np.ascontiguousarray(template.data[BLOCK])
    gm, wm = tissue["gm"][BLOCK], tissue["wm"][BLOCK]
    label = np.where(data > 0.05, 1, 0).astype(np.int16)
    label[(gm >= 0.5) & (gm >= wm)] = 2
    label[(wm >= 0.5) & (wm > gm)] = 3
    affine = template.affine.copy()
    affine[:3, 3] += [s.start for s in BLOCK]
    volume = Volume.from_array(data, affine, label=label, subject_id="block")
    return normalize(volume)


PARAMS = dict(expected_shape=(80, 100, 80), expected_spacing=(1.0, 1.0, 1.0),
              allowed_labels=(0, 1, 2, 3))


def _broken(output: Volume, **params) -> str:
    with pytest.raises(StageError) as info:
        validate(output, **{**PARAMS, **params})
    assert info.value.stage == "validate" and info.value.subject == "block"
    return info.value.reason


def test_a_good_output_passes_unchanged(output):
    out = validate(output, **PARAMS)
    assert out.data is output.data and out.valid is output.valid
    metrics = out.record_of("validate").metrics
    assert metrics["label_values"] == [0, 1, 2, 3]
    assert metrics["shape"] == [80, 100, 80] and metrics["valid_fraction"] == 1.0
    assert validate(output, output_dtype="float16").record_of("validate") is not None


def test_a_nan_voxel_is_named_with_its_position(output):
    data = output.data.copy()
    data[3, 4, 5] = np.nan
    data[7, 8, 9] = -np.inf
    reason = _broken(output.replace(data=data))
    assert "finite: 2 voxel(s) are NaN or infinite (first at (3, 4, 5): nan)" in reason


def test_float16_range_is_checked_for_a_float16_cache(output):
    data = output.data.copy()
    data[1, 1, 1] = 70000.0
    volume = output.replace(data=data)
    validate(volume, **PARAMS)  # fine in float32
    reason = _broken(volume, output_dtype="float16")
    assert "float16 range: largest magnitude 70000 exceeds 65504" in reason


def test_shape_and_spacing_must_be_the_promised_ones(output):
    assert "shape: (80, 100, 80), expected (96, 100, 80)" in _broken(
        output, expected_shape=(96, 100, 80)
    )
    reason = _broken(output, expected_spacing=(1.0, 1.0, 1.2))
    assert "spacing: (1.0, 1.0, 1.0) mm, expected (1.0, 1.0, 1.2) within 0.001 mm" in reason
    validate(output, expected_spacing=(1.0, 1.0, 1.0004))  # within tolerance


def test_label_values_must_be_allowed(output):
    label = output.label.copy()
    label[0, 0, 0] = 7
    label[0, 0, 1] = -1
    reason = _broken(output.replace(label=label))
    assert "label values: [-1, 7] not in the allowed set [0, 1, 2, 3]" in reason
    validate(output.replace(label=label), allowed_labels=None)


def test_the_valid_mask_must_hold_enough_valid_voxels(output):
    empty = output.replace(valid=np.zeros(output.shape, dtype=bool))
    assert "valid fraction: no voxel is valid" in _broken(empty)
    half = output.valid.copy()
    half[:40] = False
    reason = _broken(output.replace(valid=half), min_valid_fraction=0.6)
    assert "50.000% of voxels are valid, below min_valid_fraction=0.6" in reason


def test_a_pending_transform_means_resample_never_ran(output):
    pending = PendingTransform(np.eye(4), output.shape, output.affine)
    assert "add a resample step after register" in _broken(output.replace(pending=pending))


def test_corrupted_arrays_are_caught_even_past_the_volume_checks(output):
    """Volume normally enforces these; a stage that bypasses it must still be caught."""
    volume = output.replace()
    object.__setattr__(volume, "data", output.data.astype(np.float64))
    object.__setattr__(volume, "valid", output.valid[:-1])
    reasons = find_violations(volume, ValidateParams())
    assert "dtype: data is float64, expected float32" in reasons
    assert any(r.startswith("valid mask: bool (79, 100, 80), expected bool") for r in reasons)


def test_a_singular_affine_is_refused(output):
    affine = output.affine.copy()
    affine[2, :3] = 0.0
    assert "affine: not finite or singular" in _broken(output.replace(affine=affine))


def test_every_broken_invariant_is_reported_at_once(output):
    data = output.data.copy()
    data[0, 0, 0] = np.nan
    reason = _broken(output.replace(data=data), expected_shape=(1, 1, 1))
    assert reason.startswith("2 invariant(s) broken: ")
    assert "finite:" in reason and "shape:" in reason


@pytest.mark.parametrize("values", [(0, 1, 2, 3), (0, 3), (-2, 5, 7), (0, 17, 2035)])
def test_label_values_are_np_unique(output, values):
    from mriprep.stages.intensity import label_values

    rng = np.random.default_rng(len(values))
    label = np.asarray(values, dtype=np.int16)[rng.integers(0, len(values), output.shape)]
    assert label_values(label) == np.unique(label).tolist()
    out = validate(output.replace(label=label))
    assert out.record_of("validate").metrics["label_values"] == sorted(set(values))


def test_invalid_parameters_are_refused():
    with pytest.raises(PipelineConfigError, match="expected_spacing must be positive"):
        ValidateParams(expected_spacing=(1.0, 0.0, 1.0))
    with pytest.raises(PipelineConfigError, match="min_valid_fraction must lie in"):
        ValidateParams(min_valid_fraction=2.0)


def test_registered_under_its_pipeline_name():
    assert get_stage("validate") is validate


def test_a_sheared_grid_is_refused_even_when_its_columns_are_1_mm(output):
    """A sheared input header, resampled without axis_aligned, leaves a sheared grid;
    its columns' lengths look like 1 mm voxels, and they are not."""
    sheared = output.affine.copy()
    sheared[:3, 1] = [np.sin(np.radians(5.0)), np.cos(np.radians(5.0)), 0.0]
    volume = output.replace(affine=sheared)
    np.testing.assert_allclose(volume.spacing, (1.0, 1.0, 1.0))
    problems = find_violations(volume, ValidateParams(**PARAMS))
    assert problems == [next(p for p in problems if p.startswith("affine: the voxel axes "
                                                                 "meet 5.000 degrees"))]


def test_head_coverage_is_measured_and_can_be_made_a_warning(output):
    metrics = validate(output, **PARAMS).record_of("validate").metrics
    assert metrics["head_coverage"] > 0.9  # a block cut from inside the brain
    # The block on a 240^3 grid, the rest outside the scan (invalid): 4.4% of the grid.
    padded = np.zeros((240, 240, 240), np.float32)
    padded[:80, :100, :80] = output.data
    inside = np.zeros(padded.shape, bool)
    inside[:80, :100, :80] = True
    big = Volume.from_array(padded, output.affine, subject_id="block").replace(valid=inside)
    with pytest.raises(StageError, match=r"head coverage: the head covers \d\.\d%"):
        validate(big)
    warned = validate(big, warn=("head_coverage",)).record_of("validate")
    assert warned.warnings and warned.warnings[0].startswith("head coverage")
    with pytest.raises(PipelineConfigError, match="only 'head_coverage' may warn"):
        ValidateParams(warn=("finite",))
