"""Label tables, class mapping per view, weight maps and thick slices (issue 29).

The rules are compared voxel for voxel with the independent referee
(:mod:`mriprep.demo.fastsurfer_referee`) on FreeSurfer-numbered demo labels.
"""

from __future__ import annotations

import os
import sys
from importlib import resources

import numpy as np
import pytest

from mriprep.core.errors import InputError
from mriprep.demo.fastsurfer_referee import referee_subject, weight_mask
from mriprep.training.labels import LabelTable, dkt_table, read_lut
from mriprep.training.labels.aparc import (
    fill_unknown_parcel,
    prepare_labels,
    rewritten_values,
)
from mriprep.training.labels.slices import kept_slices, thick_slices
from mriprep.training.labels.subject import derive, slices_of
from mriprep.training.labels.weights import (
    WeightOptions,
    class_weights,
    edge_mask,
    weight_map,
)
from tests.training.fastsurfer_cache import subject

DKT = str(resources.files("mriprep.training.labels") / "fastsurfer_dkt.tsv")

FREESURFER_TXT = """\
#No. Label Name:                            R   G   B   A

0   Unknown                                 0   0   0   0
2   Left-Cerebral-White-Matter              245 245 245 0
# a comment between rows
41  Right-Cerebral-White-Matter             245 245 245 0
17  Left-Hippocampus                        220 216 20  0
53  Right-Hippocampus                       220 216 20  0
16  Brain-Stem                              119 159 176 0
"""


@pytest.fixture(scope="module")
def person():
    return subject(1)


def test_reads_freesurfer_text_and_fastsurfer_tsv(tmp_path):
    txt = tmp_path / "lut.txt"
    txt.write_text(FREESURFER_TXT)
    lut = read_lut(txt)
    assert lut.ids.tolist() == [0, 2, 41, 17, 53, 16]
    assert lut.names[3] == "Left-Hippocampus" and lut.rgba[3].tolist() == [220, 216, 20, 0]
    tsv = read_lut(DKT)
    assert len(tsv) == 79 and tsv.names[0] == "Background" and tsv.ids[-1] == 2028


@pytest.mark.parametrize("body, says", [
    ("0 Unknown 0 0 0\n", "needs 6"),
    ("0 Unknown 0 0 x 0\n", "non-number"),
    ("0 A 0 0 0 0\n0 B 0 0 0 0\n", "more than once"),
    ("# only a comment\n", "no labels"),
])
def test_bad_lut_rows_are_named(tmp_path, body, says):
    path = tmp_path / "bad.txt"
    path.write_text(body)
    with pytest.raises(InputError, match=says) as err:
        read_lut(path)
    assert str(path) in str(err.value)


def test_dkt_table_classes_and_sagittal_merge():
    t = dkt_table()
    assert t.num_classes("axial") == t.num_classes("coronal") == 79
    assert t.num_classes("sagittal") == 51
    sag = t.class_names("sagittal")
    assert not any(n.startswith(("Left-", "ctx-rh")) for n in sag)
    # Left-X takes Right-X's sagittal class, ctx-rh-X ctx-lh-X's.
    for left, right in [("Left-Hippocampus", "Right-Hippocampus"),
                        ("ctx-rh-cuneus", "ctx-lh-cuneus")]:
        assert t.class_of_name(left, "sagittal") == t.class_of_name(right, "sagittal")
    labels = np.array([17, 53, 2005, 1005, 16]).reshape(1, 1, 5)
    sag_classes = t.map(labels, "sagittal").classes.ravel()
    assert sag_classes[0] == sag_classes[1] and sag_classes[2] == sag_classes[3]
    assert t.class_ids("sagittal")[sag_classes].tolist() == [53, 53, 1005, 1005, 16]


def test_unknown_values_error_names_them_or_become_background():
    labels = np.array([0, 2, 5001, 5001, 1004]).reshape(1, 1, 5)
    with pytest.raises(InputError, match=r"sub-07: label values \[1004, 5001\] \(3 voxels\)"
                       r".*LabelTable\(\.\.\., unknown='background'\)"):
        dkt_table().map(labels, subject="sub-07")
    mapped = dkt_table(unknown="background").map(labels)
    assert mapped.classes.ravel().tolist() == [0, 1, 0, 0, 0]
    assert mapped.unknown_voxels == 3 and mapped.unknown_values == (1004, 5001)


def test_table_without_sagittal_partner_is_refused(tmp_path):
    path = tmp_path / "lut.tsv"
    path.write_text("ID\tLabelName\tR\tG\tB\tA\n0\tBackground\t0\t0\t0\t0\n"
                    "17\tLeft-Hippocampus\t1\t1\t1\t0\n")
    with pytest.raises(InputError, match="Left-Hippocampus.*Right-Hippocampus"):
        LabelTable(path)


def test_lr_swap_mirrors_lateral_classes_and_fixes_midline():
    t = dkt_table()
    perm = t.lr_swap()
    assert perm.dtype == np.int64 and sorted(perm.tolist()) == list(range(79))
    assert (perm[perm] == np.arange(79)).all()
    name = t.class_names()
    assert name[perm[name.index("Left-Hippocampus")]] == "Right-Hippocampus"
    assert name[perm[name.index("ctx-lh-cuneus")]] == "ctx-rh-cuneus"
    for midline in ("Background", "Brain-Stem", "3rd-Ventricle", "ctx-lh-fusiform"):
        # ctx-lh-fusiform stands for both hemispheres once fused: its own mirror.
        assert perm[name.index(midline)] == name.index(midline)
    assert (t.lr_swap("sagittal") == np.arange(51)).all()


def test_to_freesurfer_inverts_the_mapping(person):
    t = dkt_table()
    mapped = t.map(person["label"], "axial").classes
    back = t.to_freesurfer(mapped)
    again = t.map(back, "axial").classes
    np.testing.assert_array_equal(again, mapped)
    assert set(np.unique(back)) <= set(t.ids.tolist())


def test_aparc_rules_fill_unknown_and_fuse_right_parcels():
    labels = np.zeros((12, 12, 12), dtype=np.int32)
    labels[:, :6] = 1005
    labels[:, 6:] = 1007
    labels[:2, :2, :2] = 1000          # unknown, surrounded by 1005
    labels[0, 0, 11] = 30              # left vessel -> left WM
    prepared = prepare_labels(labels)
    out = prepared.labels
    assert (out[:2, :2, :2] == 1005).all() and out[0, 0, 11] == 2
    assert prepared.moved == {"30 Left-vessel -> 2": 1,
                              "1000 ctx-lh-unknown -> nearest parcel": 8}
    right = np.array([2005, 2007, 3, 42]).reshape(1, 1, 4)
    # 2005 is a medial parcel FastSurfer keeps; 2007 joins 1007; cortex 3/42 -> 0.
    assert prepare_labels(right).labels.ravel().tolist() == [2005, 1007, 0, 0]
    assert prepare_labels(right, cortex="split").labels.ravel().tolist() == [2005, 2007, 0, 0]


def _planted_unknown(person, seed):
    """The person's labels with patches of cortex made unknown (1000/2000), as
    FreeSurfer leaves them along the medial wall: scattered, in many places."""
    labels = person["label"].astype(np.int32)
    rng = np.random.default_rng(seed)
    for lo, count in ((1000, 6), (2000, 4)):
        cortex = np.argwhere((labels > lo) & (labels < lo + 1000))
        for c in cortex[rng.choice(len(cortex), count, replace=False)]:
            box = labels[tuple(slice(max(0, v - 2), v + 3) for v in c)]
            box[(box > lo) & (box < lo + 1000)] = lo
    return labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fill_of_unknown_parcels_equals_the_whole_volume_blur(person, seed):
    from mriprep.demo.fastsurfer_referee import _fill

    labels = _planted_unknown(person, seed)
    assert (labels == 1000).sum() > 50 and (labels == 2000).sum() > 20
    ours, whole = labels.copy(), labels.copy()
    for unknown in (1000, 2000):
        assert fill_unknown_parcel(ours, unknown, unknown + 1000)[0] > 0
        # The referee blurs every touching parcel over the whole volume, as FastSurfer.
        whole = _fill(whole, unknown, unknown + 1000)
    np.testing.assert_array_equal(ours, whole)


@pytest.mark.parametrize("offset", [(0, 0, 0), (7, 30, 3)])
def test_the_rules_in_the_labelled_box_equal_the_referee_on_a_larger_grid(person, offset):
    """prepare_labels runs in the labelled box and the fill's reach; on a map placed in a
    larger grid, off the fill's 16-voxel blocks, it equals the referee, which blurs the
    whole volume."""
    from mriprep.demo.fastsurfer_referee import _fill

    labels = _planted_unknown(person, 3)
    grid = np.zeros(tuple(n + 60 for n in labels.shape), dtype=np.int32)
    place = tuple(slice(o + 25, o + 25 + n) for o, n in zip(offset, labels.shape))
    grid[place] = labels
    ours = prepare_labels(grid, "aparc", "split").labels
    whole = grid.copy()
    for value in (3, 42):
        whole[whole == value] = 0
    for unknown in (1000, 2000):
        whole = _fill(whole, unknown, unknown + 1000)
    np.testing.assert_array_equal(ours, whole)
    assert not ours[tuple(slice(0, o + 25) for o in offset)].any()


def test_the_rules_in_the_labelled_box_equal_the_referee_where_labels_touch_the_grid(
        person):
    """The labelled box clipped by the grid on every face (the map cut through its
    labelled mass), and unknown cortex beyond the blur's reach of every parcel (it takes
    the lowest touching parcel, FastSurfer's argmax): still the referee's whole-volume
    rules, voxel for voxel."""
    from mriprep.demo.fastsurfer_referee import aparc_processing

    planted = _planted_unknown(person, 5)
    found = np.argwhere(planted > 0)
    lo, hi = found.min(axis=0), found.max(axis=0)
    cut = planted[tuple(slice(int(a) + 4, int(b) - 3) for a, b in zip(lo, hi))].copy()
    for axis in range(3):  # labels on both faces of every axis
        assert np.moveaxis(cut, axis, 0)[0].any() and np.moveaxis(cut, axis, 0)[-1].any()
    np.testing.assert_array_equal(prepare_labels(cut).labels, aparc_processing(cut.copy()))
    # a strip of unknown cortex reaching 30 voxels from its parcel, in a padded grid
    grid = np.zeros((90, 40, 40), dtype=np.int32)
    grid[5:10, 10:30, 10:30] = 1005
    grid[10:40, 18:22, 18:22] = 1000
    grid[60:70, 10:30, 10:30] = 2   # white matter far off: the box spans both
    prepared = prepare_labels(grid)
    np.testing.assert_array_equal(prepared.labels, aparc_processing(grid.copy()))
    assert any("beyond the fill's reach" in rule for rule in prepared.moved)


def test_fuse_keeps_fastsurfers_side_rule_and_counts_it(person):
    from mriprep.demo.fastsurfer_referee import aparc_processing

    labels = np.zeros((8, 8, 8), dtype=np.int32)
    labels[:, :4], labels[:, 4:] = 2005, 2007   # 2005 (cuneus) stays lateralised
    labels[:2, :2, :2] = 2000
    fused = prepare_labels(labels)
    assert (fused.labels[:2, :2, :2] == 1005).all()   # FastSurfer's: a left class
    assert fused.moved["2000 filled with a kept right parcel -> its left class "
                       "(FastSurfer's rule)"] == 8
    after = prepare_labels(labels, cortex="fuse_after_fill").labels
    assert (after[:2, :2, :2] == 2005).all()
    # The whole rule set equals the referee's restatement on a map with unknown cortex.
    planted = _planted_unknown(person, 4)
    np.testing.assert_array_equal(prepare_labels(planted).labels,
                                  aparc_processing(planted.copy()))


def test_fill_equals_fastsurfers_own_function(person):
    checkout = os.environ.get("MRIPREP_FASTSURFER")
    if not checkout:
        pytest.skip("set MRIPREP_FASTSURFER to a FastSurfer checkout (.ci/run does) to "
                    "compare with FastSurfer's own fill_unknown_labels_per_hemi")
    sys.path.insert(0, checkout)
    try:
        from FastSurferCNN.data_loader.data_utils import fill_unknown_labels_per_hemi
    finally:
        sys.path.remove(checkout)
    labels = _planted_unknown(person, 3)
    ours = labels.copy()
    for unknown in (1000, 2000):
        fill_unknown_parcel(ours, unknown, unknown + 1000)
        labels = fill_unknown_labels_per_hemi(labels, unknown, unknown + 1000)
    np.testing.assert_array_equal(ours, labels)


def test_desikan_parcels_join_their_dkt_neighbours_and_are_counted():
    labels = np.zeros((20, 20, 20), dtype=np.int32)
    labels[:, :10] = 1030              # superiortemporal
    labels[:, 10:] = 1015              # middletemporal
    labels[8:12, 6:10, 8:12] = 1001    # bankssts between them, on the 1030 side
    labels[0:3, 0:3, 0:3] = 2033       # temporalpole, right, inside nothing of its side
    labels[0:3, 3:6, 0:3] = 2030
    mapped = dkt_table(cortex="split", unknown="background").map(labels)
    prepared = prepare_labels(labels, cortex="split", known=dkt_table().ids)
    out = prepared.labels
    assert not np.isin(out, (1001, 2033)).any()
    assert (out[8:12, 6:10, 8:12] == 1030).all() and (out[0:3, 0:3, 0:3] == 2030).all()
    assert prepared.moved["1001 Desikan-only parcel -> nearest DKT parcel"] == 64
    assert prepared.moved["2033 Desikan-only parcel -> nearest DKT parcel"] == 27
    assert mapped.moved == prepared.moved
    # A table that lists a Desikan parcel keeps it.
    kept = prepare_labels(labels, cortex="split", known=[*dkt_table().ids, 1001]).labels
    assert (kept[8:12, 6:10, 8:12] == 1001).all()


def test_corpus_callosum_takes_the_nearer_white_matter():
    labels = np.zeros((10, 10, 10), dtype=np.int32)
    labels[:, :, :4] = 2
    labels[:, :, 6:] = 41
    labels[2:8, 2:8, 4] = 251
    labels[2:8, 2:8, 5] = 253
    prepared = prepare_labels(labels)
    out = prepared.labels
    assert (out[2:8, 2:8, 4] == 2).all() and (out[2:8, 2:8, 5] == 41).all()
    assert prepared.moved == {"251-255 corpus callosum -> nearer white matter (2/41)": 72}


@pytest.mark.parametrize("processing", ["aparc", "aseg", "none"])
def test_rewritten_values_are_the_values_the_rules_leave_none_of(processing):
    table = dkt_table()
    rewritten = rewritten_values(processing, table.ids)
    candidates = sorted(rewritten | {2, 17, 41, 1002, 1005, 2002, 2005, 251, 1000, 2000,
                                     3, 42, 30, 1001, 2032})
    labels = np.zeros((len(candidates) * 4 + 8, 12, 12), dtype=np.int32)
    for i, value in enumerate(candidates):  # a slab each, parcels among them to fill from
        labels[4 + 4 * i:8 + 4 * i, 2:10, 2:10] = value
    labels[:, 0:2, 0:2] = 1002  # a left and a right parcel along the whole map
    labels[:, 10:12, 10:12] = 2005
    labels[:, 0:2, 10:12] = 2     # white matter beside the callosum
    labels[:, 10:12, 0:2] = 41
    after = set(np.unique(prepare_labels(labels, processing, "split", table.ids).labels)
                .tolist())
    assert not after & rewritten
    # every other value of the map is still there: the set is not larger than the rules
    assert set(candidates) - rewritten <= after
    assert {1000, 2000} <= rewritten if processing != "none" else rewritten == frozenset()
    assert table.rewritten_values() == rewritten_values("aparc", table.ids)


def test_cortex_without_parcels_is_refused_not_sent_to_background():
    aseg = np.zeros((6, 6, 6), dtype=np.int32)
    aseg[:3], aseg[3:] = 3, 42
    aseg[2:4, 2:4, 2:4] = 2
    with pytest.raises(InputError, match=r"sub-03: .*left and right cerebral cortex.*"
                       r"no cortical parcel.*aparc\+aseg"):
        dkt_table().map(aseg, subject="sub-03")
    # The aseg rules keep it, for a table of aseg's structures.
    assert prepare_labels(aseg, processing="aseg").labels.tolist() == aseg.tolist()


@pytest.mark.parametrize("view", ["axial", "coronal", "sagittal"])
def test_equals_referee_voxel_for_voxel(person, view):
    derived = derive(person["label"], dkt_table(), view)
    got = slices_of(person["image"], derived, [1.0, 1.0, 1.0], view)
    # The synthetic people lack some classes of the table: weights by class, as
    # FastSurfer's rule means them (by position they are FastSurfer's fault; below).
    orig, aseg, weight, zoom = referee_subject(person["image"], person["label"],
                                               (1.0, 1.0, 1.0), DKT, view,
                                               weights_by="class")
    np.testing.assert_array_equal(got.classes, aseg)
    np.testing.assert_array_equal(got.orig, orig)
    np.testing.assert_allclose(got.weights, weight, rtol=1e-12, atol=0)
    assert tuple(got.zoom) == tuple(zoom)
    assert got.classes.max() < dkt_table().num_classes(view)


@pytest.mark.parametrize("options", [
    WeightOptions(),
    WeightOptions(hires_weight=3, cortex_mask=True, region_weights={"Brain-Stem": 1.5}),
    WeightOptions(gradient=False, region_weights={"Left-Cerebellum-Cortex": 1.3}),
], ids=["fastsurfer-defaults", "hires", "no-gradient"])
@pytest.mark.parametrize("view", ["coronal", "sagittal"])
def test_slice_weights_equal_the_whole_volume_weights(person, options, view):
    from mriprep.training.labels.slices import as_view
    from mriprep.training.labels.weights import (class_weights, cortex_threshold,
                                                 region_factors_for, slab_weights)

    table = dkt_table()
    classes = np.ascontiguousarray(as_view(table.map(person["label"], view).classes, view))
    n = table.num_classes(view)
    keys = dict(ctx_thresh=cortex_threshold(table, view),
                region_factors=region_factors_for(table, view, options.region_weights))
    whole = weight_map(classes, n, options, **keys)
    cw = class_weights(classes, n, options.max_weight)
    for k in (0, 1, 20, len(classes) // 2, len(classes) - 2, len(classes) - 1):
        np.testing.assert_array_equal(slab_weights(classes, k, cw, options, **keys), whole[k])


def test_class_weights_by_class_when_classes_are_absent():
    # Classes 0, 2 and 5 of 6: FastSurfer's positional indexing has three weights for
    # them and fails on class 5; here each class gets its own.
    classes = np.array([0] * 6 + [2] * 3 + [5] * 1)
    w = class_weights(classes, 6, max_weight=5)
    median = np.median([6, 3, 1])
    np.testing.assert_allclose(w[[0, 2, 5]], [median / 6, median / 3, min(median, 5)])
    assert w[[1, 3, 4]].tolist() == [0, 0, 0]
    np.testing.assert_allclose(weight_mask(classes.reshape(1, 1, -1), gradient=False,
                                           by="class").ravel(), w[classes])
    # FastSurfer's own lookup, by position among the classes present: class 5 is past
    # the three weights, an IndexError, as FastSurfer's create_weight_mask raises.
    with pytest.raises(IndexError):
        weight_mask(classes.reshape(1, 1, -1), gradient=False)
    # ... and on a map holding every class, both lookups agree.
    full = np.array([0] * 6 + [1] * 3 + [2] * 1).reshape(1, 1, -1)
    np.testing.assert_array_equal(weight_mask(full, gradient=False),
                                  weight_mask(full, gradient=False, by="class"))


def test_edges_equal_numpy_gradient():
    rng = np.random.default_rng(0)
    classes = rng.integers(0, 3, (9, 8, 7)).astype(np.uint8)
    grads = np.gradient(classes.astype(np.int64))
    expected = np.sqrt(sum(g ** 2 for g in grads)) > 0
    np.testing.assert_array_equal(edge_mask(classes), expected)


def test_hires_weights_mark_sulcus_and_region_factor_scales():
    classes = np.zeros((9, 9, 9), dtype=np.uint8)
    classes[2:7, 2:7, 2:7] = 40          # "cortex" (> ctx_thresh 33)
    classes[4, 2:7, 4] = 1               # a one-voxel sulcus through it
    base = weight_map(classes, 41, WeightOptions(gradient=False))
    hires = weight_map(classes, 41, WeightOptions(gradient=False, hires_weight=3))
    np.testing.assert_allclose((hires - base)[4, 3:6, 4], 3.0)  # closing fills the sulcus
    assert (hires - base)[0, 0, 0] == 0
    scaled = weight_map(classes, 41, WeightOptions(), region_factors={1: 1.3})
    plain = weight_map(classes, 41, WeightOptions())
    np.testing.assert_allclose(scaled[classes == 1], 1.3 * plain[classes == 1])
    np.testing.assert_array_equal(scaled[classes != 1], plain[classes != 1])
    assert np.isfinite(hires).all() and (hires >= 0).all()


def test_max_weight_caps_rare_classes():
    classes = np.zeros((20, 20, 20), dtype=np.uint8)
    classes[0, 0, 0] = 1
    w = class_weights(classes, 2, max_weight=5)
    assert w[1] == 5 and w[0] == pytest.approx(np.median([7999, 1]) / 7999)


def test_thick_slices_pad_with_edge_and_blank_filter_sums_classes():
    image = np.arange(5, dtype=np.uint8)[:, None, None] * np.ones((5, 2, 2), np.uint8)
    thick = thick_slices(image, np.array([0, 4]), thickness=2)
    assert thick.shape == (2, 2, 2, 5)
    assert thick[0, 0, 0].tolist() == [0, 0, 0, 1, 2]   # edge slice repeated
    assert thick[1, 0, 0].tolist() == [2, 3, 4, 4, 4]
    classes = np.zeros((3, 4, 4), dtype=np.uint8)
    classes[1, :2, :2] = 13     # sum 52 > 50 with 4 voxels
    classes[2, :, :3] = 1       # 12 voxels, sum 12: blank
    assert kept_slices(classes, 50).tolist() == [1]


def test_demo_labels_use_freesurfer_numbers_by_hemisphere(person):
    from mriprep.demo.freesurfer_labels import freesurfer_labels

    tissue = np.zeros((40, 40, 40), dtype=np.uint8)
    tissue[5:35, 5:35, 5:35] = 2
    tissue[12:28, 12:28, 12:28] = 3
    affine = np.diag([4.0, 4.0, 4.0, 1.0])
    affine[:3, 3] = -80
    labels = freesurfer_labels(tissue, affine)
    values = set(np.unique(labels).tolist())
    assert dkt_table().map(labels).unknown_values == ()  # every value has a class
    x = (np.arange(40) * 4 - 80)[:, None, None] * np.ones((1, 40, 40))
    left, right = labels[(x < -4) & (labels > 0)], labels[(x > 4) & (labels > 0)]
    assert set(left.tolist()) & {41, 2002, 2028} == set()
    assert set(right.tolist()) & {2, 1002, 1028} == set()
    assert {2, 41} <= values and any(v > 2000 for v in values)
    # The shared test subjects map into the table without unknown values.
    assert dkt_table().map(person["label"]).unknown_values == ()
