"""The demo cohort is the ground truth every other test scores against: test it first.

Its people are not the template: each is MNI152 warped nonlinearly, and none of its
images correlates with the template as a copy would.
"""

from __future__ import annotations

import csv
import gzip
import os
import zlib

import nibabel as nib
import numpy as np
import pytest

from mriprep.demo import build_demo_cohort, load_demo_cohort
from mriprep.inputs.templates import load_mni152_tissue, load_template


def _centroid_world(mask: np.ndarray, affine: np.ndarray) -> np.ndarray:
    ijk = np.argwhere(mask).mean(axis=0)
    return affine[:3, :3] @ ijk + affine[:3, 3]


def test_same_seed_writes_the_same_bytes_whatever_the_workers(tmp_path, demo_cohort):
    # The session's cohort (seed 0) was written by one process per core (up to 4); its
    # first person again, by another number of processes, in a cohort of one.
    assert demo_cohort.truth["seed"] == 0
    workers = 1 if (os.cpu_count() or 1) > 1 else 2
    again = build_demo_cohort(tmp_path / "a", n_subjects=1, seed=0, workers=workers)
    for name in again.subjects:
        assert again.image_path(name).read_bytes() == demo_cohort.image_path(name).read_bytes()
        assert again.subjects[name] == demo_cohort.subjects[name]
    assert load_demo_cohort(tmp_path / "a").truth == again.truth


def test_manifest_lists_every_scan_with_its_split(demo_cohort):
    with open(demo_cohort.manifest) as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["subject_id"], r["session_id"]) for r in rows] == [
        (t["subject_id"], t["session_id"]) for t in demo_cohort.subjects.values()]
    for row, truth in zip(rows, demo_cohort.subjects.values()):
        assert row["split"] == truth["split"]
        assert (demo_cohort.root / row["image"]).is_file()
    assert {r["split"] for r in rows} == {"train", "val", "test"}
    # One person scanned twice: one subject, two sessions, one split.
    rescan = [t for t in demo_cohort.subjects.values()
              if any(d["kind"] == "rescan" for d in t["defects"])]
    assert len(rescan) == 1
    first = demo_cohort.subjects[rescan[0]["defects"][0]["of"]]
    assert first["subject_id"] == rescan[0]["subject_id"] and rescan[0]["session_id"]
    assert first["person"] == rescan[0]["person"] and first["split"] == rescan[0]["split"]


def _readable(demo_cohort):
    for name, truth in demo_cohort.subjects.items():
        if not any(d["kind"] in ("truncated_file", "dead_volume") for d in truth["defects"]):
            yield name, truth


def test_ground_truth_transform_moves_the_anatomy_where_the_image_has_it(demo_cohort):
    """The template's WM centroid, mapped by the true transform, lands within 2 mm of
    the scan's own WM centroid (a person's warp moves it by about that much)."""
    template = load_template("mni152")
    tissue = load_mni152_tissue()
    wm_template = _centroid_world(tissue["wm"] > 0.5, template.affine)
    for name, truth in _readable(demo_cohort):
        if truth["template_to_subject"] is None:  # the header lies: no true transform
            continue
        label = nib.load(demo_cohort.root / truth["label"])
        labels = np.asarray(label.dataobj)
        if "partial_fov" in {d["kind"] for d in truth["defects"]}:
            continue
        wm_subject = _centroid_world(labels == 3, label.affine)
        moved = np.asarray(truth["template_to_subject"]) @ [*wm_template, 1.0]
        assert np.linalg.norm(moved[:3] - wm_subject) < 2.0, name


def test_the_people_are_not_the_template(demo_cohort):
    """Registered by their true transform, the demo's heads differ from MNI152 as other
    people's do: correlation over the brain below what a copy scores (0.94-0.99)."""
    from scipy import ndimage

    template = load_template("mni152")
    brain = load_mni152_tissue()["gm"] + load_mni152_tissue()["wm"] > 0.5
    ijk = np.argwhere(brain[::4, ::4, ::4]) * 4
    world = nib.affines.apply_affine(template.affine, ijk)
    people = set()
    for name, truth in _readable(demo_cohort):
        if truth["template_to_subject"] is None or truth["defects"]:
            continue
        image = nib.load(demo_cohort.image_path(name))
        moved = nib.affines.apply_affine(
            np.linalg.inv(image.affine) @ np.asarray(truth["template_to_subject"]), world)
        values = ndimage.map_coordinates(np.asarray(image.dataobj, dtype=np.float32),
                                         moved.T, order=1)
        r = np.corrcoef(values, template.data[tuple(ijk.T)])[0, 1]
        assert 0.3 < r < 0.9, (name, r)
        people.add(truth["person"])
    assert len(people) >= 2


def test_planted_defects_are_where_the_truth_says(demo_cohort):
    kinds = {}
    for name, truth in demo_cohort.subjects.items():
        for defect in truth["defects"]:
            kinds.setdefault(defect["kind"], []).append(name)
        path = demo_cohort.image_path(name)
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
            elif defect["kind"] in ("spike_slice", "dropout_slice"):
                assert defect["axis"] == 2  # the scanner's slice axis
                k = defect["index"]
                planted = data[:, :, k].astype(float)
                neighbours = (data[:, :, k - 1].astype(float) + data[:, :, k + 1]) / 2
                lit = (neighbours > np.nanpercentile(neighbours, 75)) & np.isfinite(planted)
                ratio = float(np.median(planted[lit] / neighbours[lit]))
                assert ratio == pytest.approx(defect["factor"], rel=0.15), (name, defect)
            elif defect["kind"] == "dead_volume":
                assert data.min() == data.max()
            elif defect["kind"] == "flipped_storage":
                assert nib.aff2axcodes(nib.load(path).affine) != ("R", "A", "S")
    assert set(kinds) >= {
        "nan_blob", "extreme_values", "zero_slab", "spike_slice", "dropout_slice",
        "dead_volume", "truncated_file", "leak", "flipped_storage", "rescan",
        "header_rotated", "not_t1", "partial_fov",
    }
    for name, truth in demo_cohort.subjects.items():
        failing = {d["kind"] for d in truth["defects"]} & {
            "header_rotated", "not_t1", "partial_fov", "dead_volume", "truncated_file"}
        assert (truth["expected"] == "fail") == bool(failing), name
        assert bool(truth["expected_causes"]) == bool(failing - {"dead_volume",
                                                                 "truncated_file"}), name
    leak = next(d for d in demo_cohort.subjects[kinds["leak"][0]]["defects"])
    original, copy = leak["copy_of"], kinds["leak"][0]
    assert demo_cohort.image_path(original).read_bytes() == demo_cohort.image_path(copy).read_bytes()
    assert demo_cohort.subjects[original]["split"] != demo_cohort.subjects[copy]["split"]
