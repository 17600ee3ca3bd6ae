"""The demo cohort is the ground truth every other test scores against: test it first."""

from __future__ import annotations

import csv
import gzip
import zlib

import nibabel as nib
import numpy as np
import pytest

from mriprep.demo import build_demo_cohort, load_demo_cohort
from mriprep.templates import load_template


def _centroid_world(mask: np.ndarray, affine: np.ndarray) -> np.ndarray:
    ijk = np.argwhere(mask).mean(axis=0)
    return affine[:3, :3] @ ijk + affine[:3, 3]


def test_same_seed_writes_the_same_bytes(tmp_path):
    a = build_demo_cohort(tmp_path / "a", n_subjects=2, seed=3)
    b = build_demo_cohort(tmp_path / "b", n_subjects=2, seed=3)
    c = build_demo_cohort(tmp_path / "c", n_subjects=2, seed=4)
    for sid in a.subjects:
        assert a.image_path(sid).read_bytes() == b.image_path(sid).read_bytes()
        assert a.image_path(sid).read_bytes() != c.image_path(sid).read_bytes()
    assert load_demo_cohort(tmp_path / "a").truth == a.truth


def test_manifest_lists_every_subject_with_its_split(demo_cohort):
    with open(demo_cohort.manifest) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["subject_id"] for r in rows] == list(demo_cohort.subjects)
    for row in rows:
        truth = demo_cohort.subjects[row["subject_id"]]
        assert row["split"] == truth["split"]
        assert (demo_cohort.root / row["image"]).is_file()
    assert {r["split"] for r in rows} == {"train", "val", "test"}


def test_ground_truth_transform_moves_the_anatomy_where_the_image_has_it(demo_cohort):
    """The label map's WM centroid, mapped by the true transform, lands within 1 mm."""
    template = load_template("mni152")
    from mriprep.demo import _template_anatomy

    anatomy = _template_anatomy()
    wm_template = _centroid_world(anatomy.labels == 3, template.affine)
    for sid, truth in demo_cohort.subjects.items():
        label = nib.load(demo_cohort.root / truth["label"])
        wm_subject = _centroid_world(np.asarray(label.dataobj) == 3, label.affine)
        moved = np.asarray(truth["template_to_subject"]) @ [*wm_template, 1.0]
        assert np.linalg.norm(moved[:3] - wm_subject) < 1.0, sid


def test_planted_defects_are_where_the_truth_says(demo_cohort):
    kinds = {}
    for sid, truth in demo_cohort.subjects.items():
        for defect in truth["defects"]:
            kinds.setdefault(defect["kind"], []).append(sid)
        path = demo_cohort.image_path(sid)
        if any(d["kind"] == "truncated_file" for d in truth["defects"]):
            with pytest.raises((EOFError, OSError, zlib.error)):
                with gzip.open(path) as fh:
                    fh.read()
            continue
        data = np.asarray(nib.load(path).dataobj)
        for defect in truth["defects"]:
            if defect["kind"] == "nan_blob":
                assert np.isnan(data).sum() == defect["n_voxels"] > 100
            elif defect["kind"] == "extreme_values":
                assert data.dtype == np.float64
                found = sorted(float(data[tuple(ijk)]) for ijk in defect["ijk"])
                assert found == sorted(defect["values"])
                assert np.abs(data).max() == 1e308
            elif defect["kind"] == "zero_slab":
                slab = np.take(data, defect["slices"], axis=defect["axis"])
                assert not slab.any()
            elif defect["kind"] == "dead_volume":
                assert data.min() == data.max()
    assert set(kinds) >= {
        "nan_blob", "extreme_values", "zero_slab", "spike_slice", "dropout_slice",
        "dead_volume", "truncated_file", "leak", "flipped_storage",
    }
    leak = next(d for d in demo_cohort.subjects[kinds["leak"][0]]["defects"])
    original, copy = leak["copy_of"], kinds["leak"][0]
    assert demo_cohort.image_path(original).read_bytes() == demo_cohort.image_path(copy).read_bytes()
    assert demo_cohort.subjects[original]["split"] != demo_cohort.subjects[copy]["split"]
