"""The label checks on synthetic people (issue 45): each clean map passes; a mirrored map,
swapped hemispheres and one swapped structure are each named as such
(``label-side-swap``); a map moved by 1, 2 or 4 mm, and another person's map, do not fit
(``label-misfit``); a blob of labels in the background is found, and skull-stripping or
defacing the image is not (``label-off-anatomy``); 5% of a structure scattered as specks
is found (``label-islands``); in a cohort of six, a structure at
twice its volume and a missing cerebellum are named (``label-volume``,
``label-structure-missing``).
The people are scanned on their own 1 mm grids in random poses: seconds each, so the
calibration tier (``make test-calibration``)."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.check.label_anatomy import read_anatomy
from mriprep.check.label_fit import read_fit
from mriprep.check.label_islands import read_islands
from mriprep.check.label_sides import read_sides, side_pairs
from mriprep.check.label_table import class_counts
from mriprep.check.label_volumes import judge_volumes
from mriprep.demo.freesurfer_cohort import scanned_person
from mriprep.demo.label_defects import (
    blob_in_scalp,
    grown,
    hemispheres_swapped,
    removed,
    scattered,
    values_swapped,
)
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
    swapped = hemispheres_swapped(labels)
    assert "(1xxx, 2xxx) are swapped" in read_sides(swapped, affine, pairs).verdict()
    one = values_swapped(labels, 18, 54)          # the amygdalae
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
    # A blob in the scalp: head in the image, but off the brain.
    scalp = blob_in_scalp(image, labels, 6, 17, np.random.default_rng(index))
    assert "from the brain's labelled mass" in read_anatomy(image, scalp, voxel).verdict()


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_person_has_no_scattered_structure_until_one_is_scattered(index):
    _, labels, affine = scanned_person(11, index, medial_unknown=True)
    spacing = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
    assert read_islands(labels, spacing).verdict() is None
    rng = np.random.default_rng(index)
    for value, name in ((17, "Left-Hippocampus"), (1028, "ctx-lh-superiorfrontal")):
        planted = read_islands(scattered(labels, value, 0.05, rng), spacing,
                               {value: name})
        assert name in planted.verdict()


# A structure grown to twice its volume in each of three people, in turn.
GROWN = {0: 17, 1: 51, 2: 10}   # Left-Hippocampus, Right-Putamen, Left-Thalamus
CEREBELLUM = (7, 8, 46, 47)


def test_volumes_of_six_people_and_each_planted_defect_named():
    table = dkt_table()
    names = table.class_names("axial")

    def volumes(labels, affine):
        counts, _ = class_counts(table, table.prepare(labels))
        return counts["axial"] * float(abs(np.linalg.det(affine[:3, :3])))

    people = [scanned_person(11, i, medial_unknown=True) for i in range(6)]
    clean = {i: volumes(labels, affine) for i, (_, labels, affine) in enumerate(people)}
    judged = judge_volumes(clean, names)
    assert judged.judged
    assert not any(judged.flags.values()) and not any(judged.missing.values())
    for i, value in GROWN.items():
        _, labels, affine = people[i]
        flags = judge_volumes({**clean, i: volumes(grown(labels, value), affine)},
                              names).flags[i]
        assert table.lut.names[list(table.lut.ids).index(value)] in {
            f.structure for f in flags}
        cut = judge_volumes({**clean, i: volumes(removed(labels, CEREBELLUM), affine)},
                            names)
        assert {m.structure for m in cut.missing[i]} >= {
            "Left-Cerebellum-Cortex", "Right-Cerebellum-Cortex",
            "Left-Cerebellum-White-Matter", "Right-Cerebellum-White-Matter"}
