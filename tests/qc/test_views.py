"""Display geometry: tiles are world-aligned whatever the voxel order, obliquity and slice
thickness, so the native scan, the output and the template line up."""

from __future__ import annotations

import numpy as np
import pytest
from nibabel.affines import from_matvec
from scipy.spatial.transform import Rotation

from mriprep.qc.views import PLANES, View, index_map, sample, view_of


def _head(shape=(60, 70, 50), spacing=(2.0, 2.0, 2.0)):
    """An off-centre ellipsoid with a bright marker in its right-anterior-superior part,
    on an RAS grid."""
    ijk = np.indices(shape).astype(float)
    centre = np.array(shape) / 2
    r = sum(((ijk[a] - centre[a]) / (0.35 * shape[a])) ** 2 for a in range(3))
    data = np.where(r < 1, 100.0, 0.0).astype(np.float32)
    marker = tuple(slice(int(0.6 * s), int(0.7 * s)) for s in shape)
    data[marker] = 300.0
    affine = from_matvec(np.diag(spacing), -np.array(shape) * np.array(spacing) / 2)
    return data, affine


def _tiles(data, affine, view, order=0):
    to_index = index_map(affine)
    return {p: [sample(data, to_index, pts, order, np.nan) for pts in view.all_points()[p]]
            for p in PLANES}


def test_storage_order_does_not_change_the_picture():
    data, affine = _head()
    # The same scan stored backwards along i and k (an LAI file): its affine says so.
    flipped = data[::-1, :, ::-1].copy()
    flip = np.eye(4)
    flip[0, 0], flip[0, 3] = -1, data.shape[0] - 1
    flip[2, 2], flip[2, 3] = -1, data.shape[2] - 1
    view = view_of(data > 0, affine)
    a = _tiles(data, affine, view)
    b = _tiles(flipped, affine @ flip, view)
    for plane in PLANES:
        for ta, tb in zip(a[plane], b[plane]):
            np.testing.assert_array_equal(ta, tb)


def test_neurological_orientation_puts_right_on_the_right_and_superior_up():
    data, affine = _head()
    view = view_of(data > 0, affine, focus=[tuple(affine[:3, :3] @ [39, 45, 32] + affine[:3, 3])])
    tiles = _tiles(data, affine, view)
    for plane in PLANES:
        marked = [t for t in tiles[plane] if np.nanmax(t) == 300.0]
        assert marked, f"the focus point must put a {plane} tile through the marker"
        rows, cols = np.nonzero(marked[0] == 300.0)
        height, width = marked[0].shape
        if plane in ("axial", "coronal"):  # columns run left -> right: the marker is right
            assert cols.mean() > width / 2
        if plane in ("coronal", "sagittal"):  # rows run superior -> inferior: it is up
            assert rows.mean() < height / 2
        if plane == "axial":  # anterior up
            assert rows.mean() < height / 2
        if plane == "sagittal":  # anterior to the right
            assert cols.mean() > width / 2


def test_oblique_thick_grid_shows_the_same_anatomy():
    data, affine = _head()
    world_to_index = index_map(affine)
    # Resample the head onto an oblique 2x2x6 mm grid (nearest), as a tilted thick scan.
    rotation = Rotation.from_euler("xz", [20, 10], degrees=True).as_matrix()
    oblique = from_matvec(rotation @ np.diag([2.0, 2.0, 6.0]), [-70.0, -80.0, -60.0])
    shape = (75, 85, 25)
    ijk = np.indices(shape).reshape(3, -1).T
    world = ijk @ oblique[:3, :3].T + oblique[:3, 3]
    thick = sample(data, world_to_index, world, 0, 0.0).reshape(shape)
    view = view_of(data > 0, affine)
    a = _tiles(data, affine, view)
    b = _tiles(thick, oblique, view)
    for plane in PLANES:
        compared = 0
        for ta, tb in zip(a[plane], b[plane]):
            if not ((ta > 0) | (tb > 0)).any():
                continue
            # Thick slices blur the boundary by up to half a slice; the bulk agrees.
            assert np.mean((ta > 0) == (tb > 0)) > 0.9, plane
            compared += 1
        assert compared >= 3, (plane, compared)


def test_focus_moves_the_nearest_slice_onto_the_point():
    view = View((0.0, 0.0, 0.0), (100.0, 100.0, 100.0), slices=6, focus=((11.0, 53.0, 97.0),))
    assert 53.0 in view.positions("coronal")
    assert 97.0 in view.positions("axial")
    assert 11.0 in view.positions("sagittal")
    assert len(set(view.positions("axial"))) == 6


def test_boolean_sampling_stays_boolean_and_outside_reads_fill():
    mask = np.zeros((4, 4, 4), bool)
    mask[1:3, 1:3, 1:3] = True
    points = np.array([[1.2, 1.8, 2.1], [10.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out = sample(mask, np.eye(4), points, 0, True)
    assert out.dtype == bool and out.tolist() == [True, True, False]


def test_each_defect_gets_its_own_tile():
    from mriprep.qc.capture import CauseLayer
    from mriprep.qc.causes import cause_codes
    from mriprep.qc.subject import _focus

    FILLED, ARTIFACT = cause_codes()["filled"], cause_codes()["artifact slice"]
    causes = np.zeros((60, 60, 60), np.uint8)
    causes[:, :, 10] = ARTIFACT  # two artifact slices 40 mm apart
    causes[:, :, 50] = ARTIFACT
    causes[30:33, 30:33, 30:33] = FILLED  # and a small blob
    centres = _focus([CauseLayer(causes, np.eye(4))])
    assert len(centres) == 3
    assert centres[0] == pytest.approx((31.0, 31.0, 31.0))  # the smallest first
    assert sorted(round(c[2]) for c in centres[1:]) == [10, 50]
    view = View((0.0, 0.0, 0.0), (59.0, 59.0, 59.0), focus=tuple(centres))
    assert {10.0, 31.0, 50.0} <= {round(p, 1) for p in view.positions("axial")}


def test_a_defect_in_the_air_beyond_the_head_gets_no_tile_of_air():
    # A head that ends at z = 40 and a masked slice at z = 52, in the air above it (inside
    # the field of view and the box's margin): the axial plane through it holds no head.
    head = np.zeros((60, 60, 60), bool)
    head[10:50, 10:50, 5:40] = True
    view = view_of(head, np.eye(4), focus=((30.0, 30.0, 52.0), (20.0, 25.0, 20.0)),
                   margin_mm=14.0)
    axial = view.positions("axial")
    assert 52.0 not in axial and 20.0 in axial and len(set(axial)) == 6
    assert 30.0 in view.positions("sagittal")  # the planes across it still show it
    assert 25.0 in view.positions("coronal")
