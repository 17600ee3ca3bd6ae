"""The label checks on real anatomy (issue 45): Colin27, S1 and ROBEX, labelled from their
own tissue contrast (:mod:`mriprep.demo.real_labels`), give no finding as the check
judges them; a cohort mixing them with synthetic people is not one population for the
volume check (a strict xfail); the defects
planted on the synthetic people, planted on them, are each named by the check meant for
it. The thresholds were chosen on synthetic people only; none is tuned here.

Labelling a head takes a minute or two on one thread the first time (then it is read
back from :func:`~mriprep.demo.real_labels.cache_folder`), so the calibration tier."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from mriprep.check.label_anatomy import read_anatomy
from mriprep.check.label_fit import read_fit
from mriprep.check.label_islands import read_islands
from mriprep.check.label_sides import read_sides, side_pairs
from mriprep.check.label_table import background_twin, class_counts
from mriprep.check.label_volumes import judge_volumes
from mriprep.demo.freesurfer_cohort import scanned_person
from mriprep.demo.label_defects import (
    blob_in_scalp,
    hemispheres_swapped,
    removed,
    scattered,
    values_swapped,
)
from mriprep.demo.real_labels import HEADS, labelled_head, labels_onto, on_1mm_grid
from mriprep.demo.real_scans import HOW_TO_GET, real_scan
from mriprep.training.labels import dkt_table

pytestmark = [
    pytest.mark.calibration,
    # One worker labels the heads (minutes each) and the others would wait or repeat it.
    pytest.mark.xdist_group("real_labels"),
    pytest.mark.skipif(any(real_scan(n) is None for n in HEADS) or any(
        real_scan(s) is None for s in HEADS.values() if s), reason=HOW_TO_GET),
]
NAMES = tuple(HEADS)


@pytest.fixture(scope="module")
def heads():
    return {name: labelled_head(name) for name in NAMES}


def _spacing(affine):
    return np.sqrt((affine[:3, :3] ** 2).sum(axis=0))


def _air_corner(image, side):
    """A cube of ``side`` voxels at the darkest of the grid's corners (ROBEX's grid holds
    the shoulders in one)."""
    boxes = [tuple(slice(4, 4 + side) if c == 0 else slice(n - 4 - side, n - 4)
                   for c, n in zip(corner, image.shape)) for corner in np.ndindex(2, 2, 2)]
    return min(boxes, key=lambda box: float(image[box].mean()))


@pytest.mark.parametrize("name", NAMES)
def test_real_head_clean_and_each_swap_named(heads, name):
    head = heads[name]
    table = dkt_table()
    pairs = side_pairs(table.ids, table.names, np.unique(head.labels))
    clean = read_sides(head.labels, head.affine, pairs)
    assert len(clean.offsets) >= 40 and clean.verdict() is None, clean.offsets
    lr = int(np.argmax(np.abs(head.affine[0, :3])))
    assert "mirrored" in read_sides(np.flip(head.labels, lr), head.affine, pairs).verdict()
    swapped = read_sides(hemispheres_swapped(head.labels), head.affine, pairs)
    assert "(1xxx, 2xxx) are swapped" in swapped.verdict()
    one = read_sides(values_swapped(head.labels, 17, 53), head.affine, pairs).verdict()
    assert one.startswith("1 left/right pair(s)") and "Hippocampus" in one


@pytest.mark.parametrize("name", NAMES)
def test_real_head_fits_its_image_and_moved_or_foreign_maps_do_not(heads, name):
    head = heads[name]
    clean = read_fit(head.image, head.labels)
    assert clean.verdict() is None, (clean.gain, clean.here)
    for voxels, axis in ((1, 0), (2, 1), (4, 2)):
        moved = read_fit(head.image, np.roll(head.labels, voxels, axis=axis))
        assert "does not lie on its image" in moved.verdict(), (voxels, axis, moved.gain)
    other = heads[NAMES[(NAMES.index(name) + 1) % len(NAMES)]]
    foreign = read_fit(head.image, labels_onto(other, head))
    assert foreign.verdict() is not None, (other.name, foreign.gain, foreign.here)


@pytest.mark.parametrize("name", NAMES)
def test_real_head_labels_lie_in_the_head_until_a_blob_is_planted(heads, name):
    head = heads[name]
    image, labels = head.image, head.labels
    voxel = float(np.prod(_spacing(head.affine)))
    clean = read_anatomy(image, labels, voxel)
    assert clean.verdict() is None, (clean.outside_mm3, clean.off_brain_mm3)
    stripped = image * ndimage.binary_dilation(labels > 0)
    assert read_anatomy(stripped, labels, voxel).verdict() is None
    brain_values = image[labels > 0].astype(np.float64)
    zscored = (image - brain_values.mean()) / brain_values.std()
    assert read_anatomy(zscored, labels, voxel).verdict() is None
    planted = labels.copy()
    planted[_air_corner(image, 10)] = 17
    assert "where the image shows no head" in read_anatomy(image, planted, voxel).verdict()
    scalp = blob_in_scalp(image, labels, 6, 17, np.random.default_rng(NAMES.index(name)))
    assert "from the brain's labelled mass" in read_anatomy(image, scalp, voxel).verdict()


# As `check --lut dkt` judges them: without the values the table's rules rewrite. S1's
# medial-wall unknown cortex (1000, cut out of folded cortex by freesurfer_labels' box)
# has about 3% of its voxels as far specks, as FreeSurfer's own unknown cortex lies in
# fragments; no network learns it (docs/benchmarks.md, row 49).
REWRITTEN = dkt_table().rewritten_values()


@pytest.mark.parametrize("name", NAMES)
def test_real_head_has_no_scattered_structure(heads, name):
    # On a 1 mm grid, as the cache holds a 1.5 mm scan (conform_1mm).
    head = on_1mm_grid(heads[name])
    clean = read_islands(head.labels, _spacing(head.affine), skip=REWRITTEN)
    assert clean.verdict() is None, clean.flagged()


@pytest.mark.parametrize("name", NAMES)
def test_real_head_scattered_structure_named(heads, name):
    # At 1.5 mm a planted 2 x 2 x 1 voxel speck is 13.5 mm^3, over the check's speck
    # size (8 mm^3): ROBEX is judged as the cache holds it, at 1 mm.
    head = on_1mm_grid(heads[name])
    spacing = _spacing(head.affine)
    rng = np.random.default_rng(NAMES.index(name))
    for value, structure in ((17, "Left-Hippocampus"), (1028, "ctx-lh-superiorfrontal"),
                             (51, "Right-Putamen")):
        planted = read_islands(scattered(head.labels, value, 0.05, rng), spacing,
                               {value: structure})
        assert structure in (planted.verdict() or ""), planted.scattered[value]


@pytest.mark.parametrize("name", NAMES)
def test_real_head_values_are_all_in_the_dkt_table(heads, name):
    judge = background_twin(dkt_table())
    _, voxels = class_counts(judge, judge.prepare(heads[name].labels))
    assert voxels["unknown"] == []


CEREBELLUM = (7, 8, 46, 47)


@pytest.fixture(scope="module")
def mixed_cohort(heads):
    """Three maps are under the volume check's six: the real heads are judged in one
    cohort with three synthetic people (the tuning set's first; the bench takes six)."""
    table = dkt_table()

    def volumes(labels, affine):
        counts, _ = class_counts(table, table.prepare(labels))
        return counts["axial"] * float(abs(np.linalg.det(affine[:3, :3])))

    cohort = {f"p{i}": volumes(labels, affine) for i, (_, labels, affine) in enumerate(
        scanned_person(7, 40 + i, medial_unknown=True) for i in range(3))}
    cohort.update({n: volumes(h.labels, h.affine) for n, h in heads.items()})
    return cohort, volumes, table.class_names("axial")


# The two labelling sources differ: on a real T1 the thalamus is nearly as bright as
# white matter, so the demo's rule (deep grey matter -> thalamus) finds a third to a
# tenth of the synthetic people's; the cerebellar white matter is larger. A mixed cohort
# flags every real head (docs/benchmarks.md). Not a false alarm on anatomy, but no clean
# reading either: a real cohort needs six real labelled heads, and three are here.
MIXED_SOURCES = pytest.mark.xfail(
    strict=True, raises=AssertionError, reason="a cohort mixing real and synthetic label maps is not one "
    "population (thalamus z -10 to -21); issue 45 awaits six real labelled heads")


def test_the_mixed_cohort_is_judged(mixed_cohort):
    """The precondition of the expected failure below, held apart so that it cannot pass
    as that failure."""
    cohort, _, names = mixed_cohort
    assert judge_volumes(cohort, names).judged


@MIXED_SOURCES
def test_real_heads_volumes_clean_in_a_mixed_cohort(mixed_cohort):
    cohort, _, names = mixed_cohort
    judged = judge_volumes(cohort, names)
    assert not any(judged.flags.get(n) for n in HEADS), {
        n: [(f.structure, round(f.z, 1)) for f in judged.flags.get(n)] for n in HEADS}


@pytest.mark.parametrize("name", NAMES)
def test_real_head_without_cerebellum_named_missing(mixed_cohort, heads, name):
    cohort, volumes, names = mixed_cohort
    head = heads[name]
    cut = judge_volumes({**cohort, name: volumes(removed(head.labels, CEREBELLUM),
                                                 head.affine)}, names)
    assert {m.structure for m in cut.missing[name]} >= {
        "Left-Cerebellum-Cortex", "Right-Cerebellum-Cortex",
        "Left-Cerebellum-White-Matter", "Right-Cerebellum-White-Matter"}
