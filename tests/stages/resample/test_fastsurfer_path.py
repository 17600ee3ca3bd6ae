"""``arithmetic: fastsurfer``: FastSurfer's float32 grid and scipy's inside rule, on a
scan whose grid meets an edge slice within round-off; mriprep's own rules elsewhere.

The voxel-for-voxel comparison with FastSurfer's code itself is
tests/demo/test_conform_min_fidelity.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.core.errors import PipelineConfigError
from mriprep.core.volume import Volume
from mriprep.stages import get_stage
from mriprep.stages.resample import ResampleParams
from mriprep.stages.resample.fastsurfer_path import fastsurfer_affine, fastsurfer_matrix
from mriprep.stages.resample.grid import world_axes

CONFORM = dict(spacing=0.9, shape=(48, 48, 48), orientation="LIA", axis_aligned=True,
               centre="freesurfer", snap_to_input=False)


def _scan(valid=None, label=None) -> Volume:
    """0.9 mm, RAS; this origin puts one output plane 2.8e-7 voxel beyond the first
    slice of input axis 1 in FastSurfer's float32 arithmetic (found by a search)."""
    affine = np.diag([0.9, 0.9, 0.9, 1.0])
    affine[:3, 3] = (-20.0, 10.11, 7.3 + 20.0 / 3.0)
    data = np.random.default_rng(5).uniform(10, 200, size=(40, 44, 36)).astype(np.float32)
    volume = Volume.from_array(data, affine, subject_id="s")
    if valid is not None or label is not None:
        volume = volume.replace(valid=volume.valid if valid is None else valid, label=label)
    return volume


def test_the_grid_is_fastsurfers_mgh_header():
    out = get_stage("resample")(_scan(), **CONFORM, arithmetic="fastsurfer")
    own = get_stage("resample")(_scan(), **CONFORM)
    # The voxel size as the header's float32 field holds it; the rest within round-off.
    assert np.abs(out.affine[:3, :3]).max() == float(np.float32(0.9))
    assert np.abs(own.affine[:3, :3]).max() == 0.9
    np.testing.assert_allclose(out.affine, own.affine, rtol=0, atol=1e-5)
    assert "FastSurfer's call" in out.record_of("resample").metrics["kernel"]


def test_a_plane_within_round_off_of_the_edge_is_outside_as_scipy_has_it():
    scan = _scan()
    out = get_stage("resample")(scan, **CONFORM, arithmetic="fastsurfer")
    own = get_stage("resample")(scan, **CONFORM)
    differ = out.valid != own.valid
    # One whole face of the field of view, inside by mriprep's 1e-6 voxel tolerance and
    # outside by scipy's rule in FastSurfer's arithmetic, where the position lies beyond
    # the first slice by less than 1e-6 voxel.
    voxels = np.argwhere(differ)
    flat = [axis for axis in range(3) if np.ptp(voxels[:, axis]) == 0]
    assert len(flat) == 1
    plane = own.valid.take(voxels[0, flat[0]], axis=flat[0])
    assert len(voxels) == np.count_nonzero(plane) > 1000
    assert not out.valid[differ].any() and not out.data[differ].any()
    assert own.valid[differ].all() and own.data[differ].all()
    # FastSurfer's matrix, from the header's affine as nibabel returns it (float32).
    grid = fastsurfer_affine(scan.affine, scan.shape, out.shape, out.spacing, world_axes("LIA"))
    np.testing.assert_array_equal(grid, out.affine)
    positions = fastsurfer_matrix(scan.affine, grid) @ np.c_[voxels, np.ones(len(voxels))].T
    assert np.all((positions[1] < 0) & (positions[1] > -1e-6))
    # Elsewhere the same voxels, up to the two grids' float32 difference (1e-5 voxel; the
    # values vary by up to 190 a voxel).
    both = out.valid & own.valid
    np.testing.assert_allclose(out.data[both], own.data[both], rtol=0, atol=2e-3)
    assert out.record_of("resample").metrics["outside_fraction"] > \
        own.record_of("resample").metrics["outside_fraction"]


def test_invalid_voxels_and_labels_follow_mripreps_rules():
    valid = np.ones((40, 44, 36), dtype=bool)
    valid[20, 22, 18] = False
    label = np.zeros((40, 44, 36), dtype=np.int16)
    label[10:30, 10:30, 10:30] = 7
    scan = _scan(valid, label)
    finer = {**CONFORM, "spacing": 0.8}  # off the scan's lattice: no weight near 1e-6
    out = get_stage("resample")(scan, **finer, arithmetic="fastsurfer")
    own = get_stage("resample")(scan, **finer)
    # The data are positive wherever a grid is inside; where both are, the invalid voxel
    # touches the same output voxels.
    both = (out.data != 0) & (own.data != 0)
    np.testing.assert_array_equal(out.valid[both], own.valid[both])
    assert 8 <= np.count_nonzero(~out.valid[both]) <= 27  # 0.9 mm reaches 2-3 of 0.8 mm
    assert set(np.unique(out.label)) == {0, 7}
    assert not out.label[out.data == 0].any()
    assert np.mean(out.label[both] == own.label[both]) > 0.999


@pytest.mark.parametrize("change", [
    dict(snap_to_input=True), dict(centre="field_of_view"), dict(axis_aligned=False),
    dict(interpolation="bspline"), dict(label_interpolation="label_linear"),
])
def test_what_fastsurfers_arithmetic_cannot_reproduce_is_refused(change):
    name = next(iter(change))
    with pytest.raises(PipelineConfigError, match=f"arithmetic fastsurfer.*got {name}"):
        ResampleParams(**{**CONFORM, **change, "arithmetic": "fastsurfer"})
