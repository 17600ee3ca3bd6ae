"""mask_slices' scoring lattice: every second voxel of a 1 mm scan finds what the full
grid finds, with the same scores."""

from __future__ import annotations

import pytest

from mriprep.core.volume import Volume
from mriprep.stages.mask_slices import mask_slices
from mriprep.stages.sanitize import sanitize
from tests.stages.mask_slices.planting import ARTIFACTS, flagged_slices, plant


@pytest.fixture(scope="module")
def iso_1mm(head_builder) -> Volume:
    return head_builder((1.0, 1.0, 1.0), seed=2)


def test_a_2mm_scoring_lattice_finds_what_the_full_1mm_grid_finds(iso_1mm):
    planted = plant(plant(iso_1mm, 0, 95, ARTIFACTS["spike"][0]),
                       1, 110, ARTIFACTS["motion"][0])
    sanitized = sanitize(planted)
    lattice = mask_slices(sanitized)  # default score_spacing_mm=2: every 2nd voxel
    full = mask_slices(sanitized, score_spacing_mm=0.0)
    for out in (lattice, full):
        found = flagged_slices(out)
        assert list(found[0]["artifact"]) == [95] and list(found[1]["artifact"]) == [110]
        assert not found[2]["artifact"]
    metrics = {name: out.record_of("mask_slices").metrics for name, out in
               (("lattice", lattice), ("full", full))}
    assert metrics["lattice"]["axis_0"]["score_lattice_step"] == [2, 2]
    assert metrics["full"]["axis_0"]["score_lattice_step"] == [1, 1]
    spike = {name: m["axis_0"]["artifact"]["95"]["log_ratio"] for name, m in metrics.items()}
    assert spike["lattice"] == pytest.approx(spike["full"], abs=0.01)
    for axis in (0, 1, 2):
        clean = [m[f"axis_{axis}"]["max_unflagged_abs_log_ratio"] for m in metrics.values()]
        assert abs(clean[0] - clean[1]) < 0.01  # the clean slices score alike too
