"""``label-side-swap`` and ``label-misfit`` on three synthetic people (issue 45): each clean
map passes; a mirrored map, swapped hemispheres and one swapped structure are each named
as such; a map moved by 1, 2 or 4 mm, and another person's map, do not fit; a blob of
labels in the background is found, and skull-stripping or defacing the image is not.
The people are scanned on their own 1 mm grids in random poses: seconds each, so the
calibration tier (``make test-calibration``)."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.check.label_anatomy import read_anatomy
from mriprep.check.label_fit import read_fit
from mriprep.check.label_sides import read_sides, side_pairs
from mriprep.demo.freesurfer_cohort import scanned_person
from mriprep.training.labels import dkt_table

pytestmark = pytest.mark.calibration


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_person_clean_and_swapped(index):
    _, labels, affine = scanned_person(11, index, medial_unknown=True)
    table = dkt_table()
    pairs = side_pairs(table.ids, table.names, np.unique(labels))
    clean = read_sides(labels, affine, pairs)
    assert len(clean.offsets) >= 40 and clean.verdict() is None
    assert min(clean.offsets.values()) > 5  # mm: every pair well on its own side
    lr = int(np.argmax(np.abs(affine[0, :3])))
    assert "mirrored" in read_sides(np.flip(labels, lr), affine, pairs).verdict()
    hemispheres = labels.copy()
    hemispheres[(labels > 1000) & (labels < 2000)] += 1000
    hemispheres[labels > 2000] -= 1000
    assert "(1xxx, 2xxx) are swapped" in read_sides(hemispheres, affine, pairs).verdict()
    one = labels.copy()
    one[labels == 18], one[labels == 54] = 54, 18          # the amygdalae
    verdict = read_sides(one, affine, pairs).verdict()
    assert verdict.startswith("1 left/right pair(s)") and "Amygdala" in verdict


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_person_fits_its_image_and_moved_maps_do_not(index):
    image, labels, _ = scanned_person(11, index, medial_unknown=True)
    assert read_fit(image, labels).verdict() is None
    for mm, axis in ((1, 0), (2, 1), (4, 2)):
        moved = read_fit(image, np.roll(labels, mm, axis=axis))
        assert "does not lie on its image" in moved.verdict()
    _, theirs, _ = scanned_person(11, index + 3, medial_unknown=True)
    foreign = np.zeros_like(labels)
    box = tuple(slice(0, min(a, b)) for a, b in zip(labels.shape, theirs.shape))
    foreign[box] = theirs[box]
    assert read_fit(image, foreign).verdict() is not None


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_person_labels_lie_in_the_head_stripped_or_defaced(index):
    from scipy import ndimage

    image, labels, affine = scanned_person(11, index, medial_unknown=True)
    voxel = float(abs(np.linalg.det(affine[:3, :3])))
    assert read_anatomy(image, labels, voxel).verdict() is None
    brain = ndimage.binary_dilation(labels > 0, iterations=1)
    assert read_anatomy(image * brain, labels, voxel).verdict() is None
    faceless = image.copy()
    faceless[:, int(image.shape[1] * 0.75):, :int(image.shape[2] * 0.4)] = 0
    assert read_anatomy(faceless, labels, voxel).verdict() is None
    planted = labels.copy()
    planted[4:14, 4:14, 4:14] = 17
    assert "where the image shows no head" in read_anatomy(image, planted, voxel).verdict()
    # A z-scored image (t1w_mni_rigid's): air negative, cortex near 0.
    brain_values = image[labels > 0].astype(np.float64)
    zscored = (image - brain_values.mean()) / brain_values.std()
    assert read_anatomy(zscored, labels, voxel).verdict() is None
    assert read_anatomy(zscored, planted, voxel).verdict() is not None
