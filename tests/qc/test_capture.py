"""The capture tells apart what the cache merges: filled voxels and masked slices, on the
demo's planted defects (synthetic people, not the template)."""

from __future__ import annotations

import nibabel as nib
import numpy as np

from mriprep.inputs.readers import load_volume
from mriprep.pipelines import pipeline_from_dict
from mriprep.pipelines.execute import run_stages
from mriprep.qc.capture import Capture
from mriprep.qc.causes import cause_codes

# The codes of the causes sanitize and mask_slices declare.
CODES = cause_codes()
FILLED, INCOMPLETE, ARTIFACT = (CODES["filled"], CODES["incomplete slice"],
                                CODES["artifact slice"])

SAME_GRID = pipeline_from_dict({"name": "qc_capture", "output_dtype": "float32", "stages": [
    {"reorient": {"orientation": "RAS"}}, "sanitize", {"mask_slices": {"fill": "neighbours"}},
]})


def _captured(cohort, name):
    volume = load_volume(cohort.image_path(name))
    capture = Capture(loaded=volume)
    final = run_stages(volume, SAME_GRID, observe=capture)
    assert len(capture.layers) == 1
    return capture, final


def _world_of_layer(layer, code):
    ijk = np.argwhere(layer.causes == code)
    return ijk @ layer.affine[:3, :3].T + layer.affine[:3, 3]


def test_nan_blob_is_filled_where_the_file_holds_nan(demo_cohort):
    capture, final = _captured(demo_cohort, "sub-02")
    img = nib.load(demo_cohort.image_path("sub-02"))
    nan_ijk = np.argwhere(np.isnan(np.asanyarray(img.dataobj)))
    layer = capture.layers[0]
    filled = _world_of_layer(layer, FILLED)
    assert len(filled) == len(nan_ijk) > 0
    nan_world = nan_ijk @ img.affine[:3, :3].T + img.affine[:3, 3]
    np.testing.assert_allclose(filled.mean(0), nan_world.mean(0), atol=1e-3)
    # The reorient step changed the voxel order, not the world: the layer is on the grid
    # the stages ran on.
    assert layer.affine is not img.affine
    np.testing.assert_allclose(layer.affine, final.affine)


def test_zero_slab_is_incomplete_and_nothing_else(demo_cohort):
    capture, _ = _captured(demo_cohort, "sub-05")
    truth = demo_cohort.subjects["sub-05"]["defects"][0]
    layer = capture.layers[0]
    codes = set(np.unique(layer.causes)) - {0}
    assert codes == {INCOMPLETE}
    # Every planted slice, in file voxels, is incomplete in the layer.
    img = nib.load(demo_cohort.image_path("sub-05"))
    index = np.zeros(3, int)
    index[truth["axis"]] = truth["slices"][0]
    world = img.affine[:3, :3] @ index + img.affine[:3, 3]
    incomplete = _world_of_layer(layer, INCOMPLETE)
    axis_world = np.argmax(np.abs(img.affine[:3, truth["axis"]]))
    assert np.min(np.abs(incomplete[:, axis_world] - world[axis_world])) < 0.5


def test_spike_and_dropout_slices_are_artifacts(demo_cohort):
    capture, _ = _captured(demo_cohort, "sub-04")
    layer = capture.layers[0]
    assert set(np.unique(layer.causes)) - {0} == {ARTIFACT}
    # Each planted slice, in file voxels, is an artifact in the layer.
    img = nib.load(demo_cohort.image_path("sub-04"))
    artifact = _world_of_layer(layer, ARTIFACT)
    planted = [d for d in demo_cohort.subjects["sub-04"]["defects"]
               if d["kind"] in ("spike_slice", "dropout_slice")]
    assert len(planted) == 2
    for defect in planted:
        index = np.zeros(3, int)
        index[defect["axis"]] = defect["index"]
        world = img.affine[:3, :3] @ index + img.affine[:3, 3]
        axis_world = np.argmax(np.abs(img.affine[:3, defect["axis"]]))
        assert np.min(np.abs(artifact[:, axis_world] - world[axis_world])) < 0.5, defect


def test_a_clean_scan_records_no_layer(demo_cohort):
    volume = load_volume(demo_cohort.image_path("sub-01"))
    capture = Capture(loaded=volume)
    run_stages(volume, SAME_GRID, observe=capture)
    assert capture.layers == []
