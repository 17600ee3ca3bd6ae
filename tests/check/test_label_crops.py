"""The label checks' shortcuts give what the whole-grid computations give: the boxes from
one pass, the fit's reads bounded by the labelled box, the holes filled by one
cut, the head grown around its candidates only, the specks measured one by one or through
one tree, and every structure cut into pieces at once."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import ndimage

from mriprep.check import label_islands
from mriprep.check.label_anatomy import (
    ENVELOPE_MM,
    _beyond,
    _fill_holes,
    _off_brain,
    anatomy_and_where,
)
from mriprep.check.label_boxes import labelled_box, structure_boxes
from mriprep.check.label_fit import read_fit
from mriprep.check.label_pieces import cut, face_surface, first_reached
from mriprep.check.label_sides import read_sides
from mriprep.core.boxes import nonzero_box


def _blobs(seed: int, shape=(40, 44, 36)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = np.zeros(shape, dtype=np.int16)
    for value in (2, 3, 41, 42, 17, 1005):
        centre = rng.integers(10, 26, size=3)
        size = rng.integers(3, 8, size=3)
        labels[tuple(slice(c, c + s) for c, s in zip(centre, size))] = value
    return labels


@pytest.mark.parametrize("seed", range(4))
def test_structure_boxes_are_find_objects_and_the_union_is_the_labelled_box(seed):
    labels = _blobs(seed)
    labels[0, 0, 0] = -3  # negative: background to find_objects, and to the boxes
    assert structure_boxes(labels) == ndimage.find_objects(labels)
    found = np.argwhere(labels > 0)
    assert labelled_box(structure_boxes(labels)) == tuple(
        slice(int(lo), int(hi) + 1) for lo, hi in zip(found.min(0), found.max(0)))
    assert structure_boxes(np.zeros((4, 4, 4), np.int16)) == []
    assert labelled_box([]) is None


@pytest.mark.parametrize("seed", range(3))
def test_the_fit_bounded_by_the_labelled_box_is_the_fit_of_the_whole_grid(seed):
    rng = np.random.default_rng(seed)
    shape = (60, 64, 58)
    labels = np.zeros(shape, dtype=np.int16)
    labels[14:45, 12:50, 10 + seed:44] = 2          # white matter
    labels[20:36, 20:40, 18:36] = 3                 # cortex inside it
    labels[16:20, 14:48, 12:40] = 1010              # a parcel
    image = rng.normal(0, 1, shape) + 4.0 * (labels == 2) + 2.0 * (labels == 3)
    for moved in (labels, np.roll(labels, 1 + seed, axis=seed)):
        whole = read_fit(image, moved)
        bounded = read_fit(image, moved, labelled_box(structure_boxes(moved)))
        assert whole is not None and bounded == whole  # the same sums, bit for bit


@pytest.mark.parametrize("seed", range(5))
def test_holes_are_filled_as_scipy_fills_them(seed):
    rng = np.random.default_rng(seed)
    mask = ndimage.binary_opening(rng.random((30, 34, 28)) > 0.35)
    mask[5:25, 5:25, 5:20] |= True
    mask[10:14, 10:14, 8:12] = False  # a hole
    assert np.array_equal(_fill_holes(mask), ndimage.binary_fill_holes(mask))


@pytest.mark.parametrize("seed", range(5))
def test_candidates_beyond_the_grown_region_are_those_of_a_whole_grid_dilation(seed):
    rng = np.random.default_rng(seed)
    region = np.zeros((30, 30, 30), dtype=bool)
    region[8:22, 8:22, 8:22] = True
    candidates = (rng.random(region.shape) > 0.97) & ~region
    expected = candidates & ~ndimage.binary_dilation(region, iterations=2)
    assert np.array_equal(_beyond(candidates, region, 2), expected)
    none = np.zeros_like(region)
    assert not _beyond(none, region, 2).any()


def test_specks_measured_one_by_one_or_through_one_tree_agree(monkeypatch):
    labels = np.zeros((70, 70, 70), dtype=np.int16)
    labels[25:45, 25:45, 25:45] = 17
    rng = np.random.default_rng(4)
    for i, j, k in rng.integers(1, 68, size=(60, 3)):
        labels[i, j, k] = 17  # specks near the body and far from it
    monkeypatch.setattr(label_islands, "_ONE_BY_ONE_SHARE", math.inf)
    one_by_one = label_islands.read_islands(labels)
    monkeypatch.setattr(label_islands, "_ONE_BY_ONE_SHARE", 0.0)
    by_tree = label_islands.read_islands(labels)
    assert one_by_one.scattered == by_tree.scattered
    assert 0 < one_by_one.scattered[17] < 1
    # a speck exactly FAR_MM from the body is far, as the k-d tree counts it
    edge = np.zeros((40, 40, 40), dtype=np.int16)
    edge[5:20, 5:20, 5:20] = 17
    edge[19 + int(label_islands.FAR_MM), 10, 10] = 17
    edge[19 + int(label_islands.FAR_MM) - 1, 30, 30] = 17  # farther than 10 mm too
    monkeypatch.setattr(label_islands, "_ONE_BY_ONE_SHARE", math.inf)
    few = label_islands.read_islands(edge, names={17: "x"})
    monkeypatch.setattr(label_islands, "_ONE_BY_ONE_SHARE", 0.0)
    tree = label_islands.read_islands(edge, names={17: "x"})
    assert few.scattered == tree.scattered
    assert few.scattered[17] * int((edge == 17).sum()) == pytest.approx(2)


@pytest.mark.parametrize("seed", range(4))
def test_one_cut_gives_each_value_the_pieces_scipy_gives_it_alone(seed):
    rng = np.random.default_rng(seed)
    labels = np.where(rng.random((30, 28, 26)) < 0.35,
                      rng.choice([2, 17, 41, 1005], size=(30, 28, 26)), 0).astype(np.int16)
    labels[0, 0, 0] = -4  # negative: background, as to scipy's boxes
    pieces = cut(labels)
    for value in (2, 17, 41, 1005):
        alone, count = ndimage.label(labels == value, structure=np.ones((3, 3, 3)))
        mine = np.unique(pieces.numbers[labels == value])
        assert len(mine) == count and set(pieces.value[mine]) == {value}
        # the same partition: each scipy piece is one of the cut's, of the same size
        pairs = np.unique(np.stack([alone[labels == value],
                                    pieces.numbers[labels == value]]), axis=1)
        assert pairs.shape[1] == count
        assert sorted(pieces.size[mine]) == sorted(np.bincount(alone.ravel())[1:])
    assert pieces.numbers[0, 0, 0] == 0 and pieces.size[0] == 0
    # a map as read from a big-endian file (.mgz), and one in floats, cut the same
    for other in (labels.astype(">i2"), labels.astype(np.float32)):
        again = cut(other)
        assert np.array_equal(again.numbers, pieces.numbers)
        assert np.array_equal(again.value, pieces.value)


def test_the_largest_piece_ties_to_the_one_reached_first_in_c_order():
    mask = np.zeros((12, 12, 12), dtype=bool)
    mask[8:10, 0:2, 0:2] = True   # reached later in C order ...
    mask[0:2, 8:10, 8:10] = True  # ... than this one, of the same size
    pieces = cut(mask)
    assert pieces.numbers[pieces.numbers == pieces.largest()].size == 8
    assert pieces.numbers[0, 8, 8] == pieces.largest()
    assert first_reached(pieces.numbers, [pieces.numbers[8, 0, 0],
                                          pieces.numbers[0, 8, 8]]) == pieces.numbers[0, 8, 8]


@pytest.mark.parametrize("seed", range(4))
def test_the_face_surface_is_what_an_erosion_leaves(seed):
    mask = ndimage.binary_opening(np.random.default_rng(seed).random((25, 21, 2 + seed * 7))
                                  > 0.3)
    expected = np.argwhere(mask & ~ndimage.binary_erosion(mask))
    assert np.array_equal(face_surface(mask), expected)


@pytest.mark.parametrize("seed", range(4))
def test_off_brain_by_the_surface_tree_is_the_distance_transforms(seed):
    rng = np.random.default_rng(seed)
    labelled = np.zeros((50, 50, 50), dtype=bool)
    labelled[10:35, 12:38, 8:30] = True  # the brain's mass
    for i, j, k in rng.integers(0, 48, size=(25, 3)):
        labelled[i:i + 2, j:j + 2, k:k + 1] = True  # blobs near it and far from it
    box = nonzero_box(labelled)
    parts, _ = ndimage.label(labelled[box], structure=np.ones((3, 3, 3)))
    brain = parts == np.argmax(np.bincount(parts.ravel())[1:]) + 1
    expected = np.zeros_like(labelled)
    expected[box] = labelled[box] & (ndimage.distance_transform_edt(~brain) * 2.0
                                     > ENVELOPE_MM)
    found = _off_brain(labelled, 2.0)
    assert expected.any() and np.array_equal(found, expected)


@pytest.mark.parametrize("seed", range(4))
def test_the_voxels_of_marked_pieces_from_the_runs_are_a_flat_search(seed):
    rng = np.random.default_rng(seed)
    labels = np.where(rng.random((20, 18, 17)) < 0.4,
                      rng.choice([2, 17, 41], size=(20, 18, 17)), 0).astype(np.int16)
    pieces = cut(labels)
    marked = rng.random(len(pieces.size)) < 0.3
    marked[0] = seed % 2 == 0  # the background's runs too
    flat, numbers = pieces.voxels_of(marked)
    expected = np.flatnonzero(marked[pieces.numbers])
    assert np.array_equal(flat, expected)
    assert np.array_equal(numbers, pieces.numbers.reshape(-1)[expected])
    assert pieces.voxels_of(np.zeros_like(marked))[0].size == 0


@pytest.mark.parametrize("spacing", [(1.0, 1.0, 1.0), (1.0, 1.0, 3.0), (0.7, 0.7, 0.7),
                                     (2.0, 2.0, 2.0), (0.5, 1.2, 4.0)])
def test_the_near_box_holds_only_points_nearer_than_far_mm(spacing):
    near = label_islands._near_half_width(np.asarray(spacing))
    assert np.sqrt(np.sum((near * np.asarray(spacing)) ** 2)) < label_islands.FAR_MM
    assert (near >= 1).all()  # wide enough to settle a speck next to its body


def _white_matter_and_a_parcel(shape=(48, 50, 46)) -> np.ndarray:
    """A map with enough white matter and cortex on every third voxel to judge a fit."""
    labels = np.zeros(shape, dtype=np.int16)
    labels[10:38, 10:40, 8:36] = 2
    labels[16:34, 14:38, 12:32] = 1010
    return labels


def test_the_fit_of_a_uint8_image_through_its_histogram_is_the_float_fit():
    rng = np.random.default_rng(7)
    labels = _white_matter_and_a_parcel()
    shape = labels.shape
    labels[12:14, 12:38, 10:34] = 42
    labels[0:3, 0:3, 0:3] = -7      # negative: no tissue
    labels[40:44, 40:44, 40:44] = 5001  # above every tissue value
    image = np.clip(rng.normal(80, 12, shape) + 60 * (labels == 2), 0, 255).astype(np.uint8)
    valid = rng.random(shape) > 0.05
    for moved in (labels, np.roll(labels, 2, axis=1)):
        as_integers = read_fit(image, moved, None, valid)
        as_floats = read_fit(image.astype(np.float64), moved, None, valid)
        assert as_integers is not None and as_integers == as_floats
        assert read_fit(image, moved.astype(np.int32), None, valid) == as_integers


def test_the_sides_read_in_the_labelled_box_are_those_of_the_whole_grid():
    labels = np.zeros((41, 40, 39), dtype=np.int16)
    labels[7:20, 9:30, 5:33] = 17    # Left-Hippocampus, low x
    labels[21:34, 11:31, 6:32] = 53  # Right-Hippocampus
    affine = np.diag([1.0, 1.0, 1.0, 1.0])
    affine[:3, 3] = (-20.5, -18.0, -17.0)
    pairs = {"Hippocampus": (17, 53)}
    box = labelled_box(structure_boxes(labels))
    assert box[0].start % 2 == 1  # the sampled grid's first even index is inside it
    assert read_sides(labels, affine, pairs, box) == read_sides(labels, affine, pairs)


def test_the_head_of_a_uint8_image_is_the_head_of_its_floats():
    rng = np.random.default_rng(3)
    shape = (60, 62, 58)
    labels = np.zeros(shape, dtype=np.int16)
    labels[15:45, 14:48, 12:44] = 2
    labels[2:6, 2:6, 2:6] = 17  # labels in the air
    image = np.clip(rng.normal(8, 3, shape), 0, 255)
    image[10:50, 10:52, 8:48] += 90
    image = image.astype(np.uint8)
    valid = np.ones(shape, dtype=bool)
    valid[:, :, 50:] = False
    for v in (None, valid):
        assert (anatomy_and_where(image, labels, 1.0, v)[0]
                == anatomy_and_where(image.astype(np.float32), labels, 1.0, v)[0])


def test_a_speck_at_far_mm_on_a_spacing_binary_does_not_hold_is_judged_alike_both_ways(
        monkeypatch):
    # (10, 6, 3) voxels of 0.8 x 0.8 x 1.2 mm: 10 mm exactly in real numbers, each way's
    # float rounding its own before the measures shared their arithmetic.
    spacing = (0.8, 0.8, 1.2)
    for shift in range(0, 30, 3):
        labels = np.zeros((60, 50, 40), dtype=np.int16)
        corner = np.array([5 + shift, 5 + shift // 2, 5 + shift // 3])
        labels[tuple(slice(c - 6, c + 1) for c in corner)] = 17
        labels[tuple(corner + (10, 6, 3))] = 17
        labels[0, 0, 0] = 2  # the labelled box, where the measures work, starts at 0
        readings = []
        for share in (math.inf, 0.0):
            monkeypatch.setattr(label_islands, "_ONE_BY_ONE_SHARE", share)
            readings.append(label_islands.read_islands(labels, spacing).scattered)
        assert readings[0] == readings[1]


def test_a_valid_mask_of_any_type_reads_as_its_truth_values():
    rng = np.random.default_rng(5)
    labels = _white_matter_and_a_parcel()
    shape = labels.shape
    image = (rng.normal(80, 12, shape) + 60 * (labels == 2)).astype(np.float32)
    valid = rng.random(shape) > 0.1
    expected = read_fit(image, labels, None, valid)
    assert expected is not None
    for as_type in (valid.astype(np.uint8) * 255, valid * 0.5, valid.astype(np.int32) * 256):
        assert read_fit(image, labels, None, as_type) == expected
