"""The flagged regions of a label map: made from the checks' readings (pure), kept in the
cache beside the check record, refused when missing, another check's, or not kept."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.cache.check_record import read_check_record
from mriprep.cache.check_regions import read_regions, regions_path, write_regions
from mriprep.check import label_regions
from mriprep.check.label_regions import map_regions, region, whole_map
from mriprep.core.errors import CacheError
from tests.check.flagged_cache import flagged_cache


def _labels() -> np.ndarray:
    labels = np.zeros((20, 20, 20), dtype=np.int16)
    labels[5:15, 5:10, 5:15] = 17
    labels[5:15, 10:15, 5:15] = 53
    labels[2, 2, 2] = 2
    return labels


def test_regions_of_each_code():
    labels = _labels()
    found = map_regions(
        labels,
        anatomy={"outside": np.array([[0, 0, 0], [2, 2, 2]]),
                 "off_brain": np.array([[2, 2, 2], [4, 4, 4]])},
        islands={17: np.array([[1, 1, 1]]), 1005: np.array([[3, 3, 3], [3, 3, 4]])},
        swapped=(17, 53), misfit=True)
    assert set(found) == {"label-off-anatomy", "label-islands", "label-side-swap",
                          "label-misfit"}
    off = found["label-off-anatomy"]
    assert off.voxels == 3 and off.points.dtype == np.uint16  # one voxel in both kinds
    assert found["label-islands"].voxels == 3
    swap = found["label-side-swap"]
    assert swap.voxels == int(np.isin(labels, (17, 53)).sum()) and not swap.whole_map
    assert set(map(tuple, swap.points)) == set(map(tuple, np.argwhere(
        np.isin(labels, (17, 53)))))
    misfit = found["label-misfit"]
    assert misfit.whole_map and misfit.voxels == int((labels > 0).sum())
    assert misfit.points.shape == (0, 3)
    assert misfit.to_json() == {"voxels": misfit.voxels, "kept": 0, "whole_map": True}
    mirrored = map_regions(labels, swapped=None, mirrored=True)["label-side-swap"]
    assert mirrored.whole_map
    assert map_regions(labels, anatomy={"outside": np.empty((0, 3))}) == {}


def test_a_large_region_is_thinned_evenly_and_counted_whole(monkeypatch):
    monkeypatch.setattr(label_regions, "MAX_KEPT", 10)
    points = np.argwhere(np.ones((5, 5, 4), dtype=bool))  # 100 voxels
    kept = region("label-islands", points)
    assert kept.voxels == 100 and len(kept.points) == 10
    assert tuple(kept.points[0]) == (0, 0, 0) and tuple(kept.points[-1]) == (4, 4, 3)
    assert kept.to_json() == {"voxels": 100, "kept": 10, "whole_map": False}
    with pytest.raises(ValueError, match="65,535"):
        region("label-islands", np.array([[70_000, 0, 0]]))
    assert whole_map("label-misfit", 7).whole_map


def test_the_archive_round_trips_and_is_refused_when_it_is_not_the_records(tmp_path):
    points = {"k1": {"label-islands": np.array([[1, 2, 3], [4, 5, 6]])},
              "k2": {"label-off-anatomy": np.array([[7, 8, 9]])}}
    path, sha = write_regions(tmp_path, points)
    assert path == regions_path(tmp_path) and path.is_file()
    kept = {"file": path.name, "sha256": sha, "entries": {}}
    found = read_regions(tmp_path, kept)
    assert set(found) == {"k1", "k2"}
    assert found["k1"]["label-islands"].tolist() == [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(CacheError, match="not the file the check record names"):
        read_regions(tmp_path, {**kept, "sha256": "0" * 64})
    with pytest.raises(CacheError, match="written before mriprep kept them"):
        read_regions(tmp_path, {})
    # nothing to keep: no archive, and an older one is removed
    assert write_regions(tmp_path, {}) == (None, None)
    assert not path.exists()
    assert read_regions(tmp_path, {"file": None, "sha256": None, "entries": {}}) == {}
    with pytest.raises(CacheError, match="are missing"):
        read_regions(tmp_path, kept)


def test_the_check_keeps_the_regions_of_its_spatial_findings(tmp_path):
    root = flagged_cache(tmp_path / "c", check=True)
    record = read_check_record(root)
    by_subject = {state["subject_id"]: key for key, state in record.entries.items()}
    swap = record.regions_of(by_subject["sub-01"])
    assert swap["label-side-swap"]["whole_map"] is False
    assert swap["label-side-swap"]["voxels"] == swap["label-side-swap"]["kept"] > 0
    labelled = int((Cache(root).load_tensor(by_subject["sub-02"], "label") > 0).sum())
    assert labelled > 0
    assert record.regions_of(by_subject["sub-02"]) == {
        "label-misfit": {"voxels": labelled, "kept": 0, "whole_map": True}}
    assert record.regions_of(by_subject["sub-00"]) == {}
    points = read_regions(root, record.regions)
    assert set(points) == {by_subject["sub-01"]}  # a whole-map region keeps no voxels

    cache = Cache(root)
    labels = np.asarray(cache.load_tensor(by_subject["sub-01"], "label"))
    drawn = points[by_subject["sub-01"]]["label-side-swap"]
    assert set(labels[tuple(drawn.T)].tolist()) == {17, 53}
    assert len(drawn) == int(np.isin(labels, (17, 53)).sum())
    doc = json.loads((root / "check" / "findings.json").read_text())
    assert doc["regions"]["file"] == "regions.npz"


def _head_with_labels_in_the_air():
    grid = np.indices((40, 40, 40))
    radius = np.sqrt(sum((g - 20.0) ** 2 for g in grid))
    image = np.where(radius < 17, 100.0, 1.0).astype(np.float32)
    labels = np.where(radius < 11, 2, 0).astype(np.int16)
    labels[0:8, 0:8, 0:7] = 17  # 448 voxels in the air, an odd side on the last axis
    return image, labels


def test_an_off_anatomy_region_counts_the_voxels_its_samples_stand_for(monkeypatch):
    """The measure samples every second voxel; its region holds and counts the voxels
    the finding's volume counts, not the samples (an eighth of them)."""
    from mriprep.check.label_anatomy import STEP, anatomy_and_where
    from mriprep.check.label_table import MapJudgement, _regions

    image, labels = _head_with_labels_in_the_air()
    reading, where = anatomy_and_where(image, labels)
    assert reading.outside_mm3 == 512 and reading.verdict() is not None  # 64 samples x 8
    found = _regions(labels, MapJudgement("k", anatomy=reading), {}, where)
    off = found["label-off-anatomy"]
    assert off.voxels == reading.outside_mm3 == len(off.points)
    # the blocks of the samples: the labelled blob and, at the odd side, a layer of air
    assert {tuple(p) for p in np.argwhere(labels == 17)} <= {tuple(p) for p in off.points}
    # at the grid's edge a sample stands for the voxels inside the grid only
    edge = region("label-off-anatomy", np.array([[38, 38, 39]]), STEP, (40, 40, 40))
    assert edge.voxels == 4 and sorted(map(tuple, edge.points.tolist())) == [
        (38, 38, 39), (38, 39, 39), (39, 38, 39), (39, 39, 39)]
    monkeypatch.setattr(label_regions, "MAX_KEPT", 16)  # thinned: counted whole
    thin = region("label-off-anatomy", np.argwhere(np.ones((4, 4, 4), bool)) * 2, 2,
                  (40, 40, 40))
    assert thin.voxels == 512 and len(thin.points) == 16


def test_the_archive_read_is_the_archive_hashed(tmp_path, monkeypatch):
    """Another check replacing the archive between its digest and its load must not
    get its voxels read under this record's digest."""
    from mriprep.cache import check_regions

    _, sha = write_regions(tmp_path, {"k1": {"label-islands": np.array([[1, 2, 3]])}})
    kept = {"file": "regions.npz", "sha256": sha, "entries": {}}
    other = tmp_path / "other"
    write_regions(other, {"k1": {"label-islands": np.array([[9, 9, 9]])}})
    real_load = np.load

    def replaced_then_loaded(source, *args, **kwargs):
        regions_path(tmp_path).write_bytes(regions_path(other).read_bytes())
        return real_load(source, *args, **kwargs)

    monkeypatch.setattr(check_regions.np, "load", replaced_then_loaded)
    found = read_regions(tmp_path, kept)
    assert found["k1"]["label-islands"].tolist() == [[1, 2, 3]]


def test_the_digest_kept_is_of_the_archive_written(tmp_path, monkeypatch):
    """Another check replacing the archive just after this one's write must not have
    its digest kept in this record: the reader then refuses the file."""
    from mriprep.core import atomic

    other = tmp_path / "other"
    write_regions(other, {"k1": {"label-islands": np.array([[9, 9, 9]])}})
    real_fsync_dir = atomic.fsync_dir

    def then_replaced(folder):
        real_fsync_dir(folder)
        if regions_path(tmp_path).is_file():
            regions_path(tmp_path).write_bytes(regions_path(other).read_bytes())

    monkeypatch.setattr(atomic, "fsync_dir", then_replaced)
    _, sha = write_regions(tmp_path, {"k1": {"label-islands": np.array([[1, 2, 3]])}})
    monkeypatch.undo()
    with pytest.raises(CacheError, match="not the file the check record names"):
        read_regions(tmp_path, {"file": "regions.npz", "sha256": sha, "entries": {}})
