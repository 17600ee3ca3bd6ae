"""mask_slices' incomplete slices: non-finite, zero-filled and cut-off slices are found;
air beyond the head and a skull-stripped background are not defects."""

from __future__ import annotations

import numpy as np

from mriprep.stages.mask_slices import mask_slices
from mriprep.stages.sanitize import sanitize
from tests.stages.mask_slices.planting import flagged_slices, head_rows, plant


def test_non_finite_slice_is_found_after_sanitize(iso):
    volume = plant(iso, 1, 70, lambda s: np.full_like(s, np.nan))
    cleaned = sanitize(volume, strategy="local")
    assert np.isfinite(cleaned.data).all()
    found = flagged_slices(mask_slices(cleaned))
    assert found[1]["incomplete"] == {70: "invalid"}
    assert found[1]["artifact"] == {}


def test_a_zero_slab_is_flagged_slice_by_slice_without_its_neighbours(iso):
    data = iso.data.copy()
    data[40:46] = 0.0
    found = flagged_slices(mask_slices(sanitize(iso.replace(data=data))))
    assert found[0]["incomplete"] == {i: "zero" for i in range(40, 46)}
    assert found[0]["artifact"] == {}


def test_zero_padding_that_cuts_the_head_off_is_flagged(iso):
    top = head_rows(iso, 2)[-1]
    cut = top - 12  # 24 mm below the vertex: the head is cut where the zeros begin
    data = iso.data.copy()
    data[:, :, cut:] = 0.0
    found = flagged_slices(mask_slices(sanitize(iso.replace(data=data))))
    assert found[2]["incomplete"] == {i: "outside_fov" for i in range(cut, iso.shape[2])}


def test_empty_air_beyond_the_head_is_not_a_defect(iso):
    """Zeroed slices above the vertex are air a scanner stored as zeros."""
    top = head_rows(iso, 2)[-1]
    assert top + 3 < iso.shape[2], "the test head needs air above its vertex"
    data = iso.data.copy()
    data[:, :, top + 2:] = 0.0
    out = mask_slices(sanitize(iso.replace(data=data)))
    assert out.valid.all()


def test_a_skull_stripped_scan_keeps_its_empty_background_slices(head_builder):
    """Zero background is background: its empty border slices are not missing data."""
    stripped = head_builder((2.0, 2.0, 2.0), skull_stripped=True)
    assert (stripped.data[:, :, 0] == 0).all()
    out = mask_slices(sanitize(stripped))
    assert out.valid.all()
    middle = int(np.median(head_rows(stripped, 2)))
    spike = plant(stripped, 2, middle, lambda s: s * np.float32(4.0))
    assert list(flagged_slices(mask_slices(sanitize(spike)))[2]["artifact"]) == [middle]


def test_a_dead_volume_is_all_constant_slices_and_a_warning(iso):
    # Straight from the loader: sanitize would refuse it (see test_sanitize).
    dead = iso.replace(data=np.full(iso.shape, 100.0, dtype=np.float32))
    out = mask_slices(dead)
    assert not out.valid.any()
    assert flagged_slices(out)[1]["incomplete"][60] == "constant"
    assert any("check the scan" in w for w in out.record_of("mask_slices").warnings)
