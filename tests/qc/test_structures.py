"""The QC report's per-structure table and the check's findings on its pages: the table's
values on small labelled caches (tests/check/flagged_cache.py), computed from the check's
record and from the label maps alike."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from mriprep import check as chk
from mriprep.cache import Cache
from mriprep.cache.check_record import record_path
from mriprep.qc.check_flags import cohort_check
from mriprep.qc.report import write_report
from mriprep.qc.structures import (cohort_medians, label_counts, structure_rows,
                                   volumes)
from mriprep.training.labels import dkt_table
from tests.check.flagged_cache import flagged_cache, rebuild


def test_rows_give_volumes_shares_and_the_structures_a_subject_lacks():
    cohort = [{17: 100, 53: 90, 8: 50}, {17: 120, 53: 110, 8: 60}, {17: 80, 53: 70}]
    medians = cohort_medians(volumes(c, 2.0) for c in cohort)
    assert medians == {17: 200.0, 53: 180.0, 8: 100.0}  # a lacking subject counts 0
    rows = structure_rows({0: 999, 17: 150, 53: 90, 77: 3}, 2.0, medians,
                          {17: "Left-Hippocampus"})
    assert [(r.value, r.name, r.voxels, r.mm3) for r in rows] == [
        (8, "label 8", 0, 0.0), (17, "Left-Hippocampus", 150, 300.0),
        (53, "label 53", 90, 180.0), (77, "label 77", 3, 6.0)]
    assert [r.share for r in rows] == [0.0, 1.5, 1.0, None]
    assert [r.missing for r in rows] == [True, False, False, False]
    labels = np.array([[0, 0, 17], [17, -1, 53]], dtype=np.int16)
    assert label_counts(labels) == {-1: 1, 0: 2, 17: 2, 53: 1}
    assert label_counts(labels[labels >= 0]) == {0: 2, 17: 2, 53: 1}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    return flagged_cache(tmp_path_factory.mktemp("qc") / "c", check=True)


def _expected(root, subject_id: str) -> dict[int, float]:
    cache = Cache(root)
    entry = next(e for e in cache.entries() if e.subject_id == subject_id)
    label = np.asarray(cache.load_tensor(entry.key, "label"))
    values, counts = np.unique(label[label != 0], return_counts=True)
    return {int(v): float(c) * float(np.prod(entry.spacing)) for v, c in zip(values, counts)}


def test_the_table_holds_each_structures_volume_and_the_checks_findings(checked, tmp_path):
    check = cohort_check(checked)
    keys = {e.subject_id: e.key for e in Cache(checked).entries()}
    every = [_expected(checked, s) for s in ("sub-00", "sub-01", "sub-02")]
    for subject_id, expected in zip(("sub-00", "sub-01", "sub-02"), every):
        rows = check.subjects[keys[subject_id]].structures
        assert {r.value: r.mm3 for r in rows} == expected
        for r in rows:
            median = float(np.median([e.get(r.value, 0.0) for e in every]))
            assert r.share == pytest.approx(r.mm3 / median)
    rows = {r.name: r for r in check.subjects[keys["sub-01"]].structures}
    assert rows["Left-Hippocampus"].voxels == rows["Left-Hippocampus"].mm3  # 1 mm voxels
    assert check.subjects[keys["sub-01"]].codes == ["label-side-swap"]
    assert check.subjects[keys["sub-02"]].codes == ["label-misfit"]
    assert check.subjects[keys["sub-00"]].codes == [] and check.flagged == 2
    # counted from the maps when there is no record: the same table
    copy = tmp_path / "c"
    shutil.copytree(checked, copy)
    record_path(copy).unlink()
    bare = cohort_check(copy)
    for key in keys.values():
        assert [(r.value, r.voxels, r.share) for r in bare.subjects[key].structures] == [
            (r.value, r.voxels, r.share) for r in check.subjects[key].structures]
    assert bare.made is None and "no check has kept its findings" in bare.note
    assert bare.flagged == 0


def test_a_missing_structure_is_a_row_of_zero_voxels(tmp_path):
    root = flagged_cache(tmp_path / "c")

    def no_cerebellum(labels):
        labels[np.isin(labels, (7, 8, 46, 47))] = 0
    rebuild(root, 0, no_cerebellum)
    check = cohort_check(root)
    key = next(e.key for e in Cache(root).entries() if e.subject_id == "sub-00")
    rows = {r.name: r for r in check.subjects[key].structures}
    assert rows["Left-Cerebellum-Cortex"].voxels == 0 and rows["Left-Cerebellum-Cortex"].missing
    assert rows["Left-Cerebellum-Cortex"].share == 0.0


def test_a_stale_record_is_said_on_the_page_not_shown_as_findings(checked, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(checked, root)
    rebuild(root, 1)  # the swap fixed since the check
    check = cohort_check(root)
    key = next(e.key for e in Cache(root).entries() if e.subject_id == "sub-01")
    assert check.subjects[key].findings == []
    assert "is stale for this entry (rebuilt since the check" in check.subjects[key].note
    assert f"`mriprep check {root} --lut dkt` judges it again" in check.subjects[key].note
    rows = {r.name: r for r in check.subjects[key].structures}  # from the map now
    assert rows["Left-Hippocampus"].mm3 == _expected(root, "sub-01")[17]
    index = write_report(root)
    page = next((index.parent / "subjects").glob("sub-01-*.html")).read_text()
    assert "is stale for this entry" in page and 'id="check-findings"' not in page
    chk.check_cache(root, label_table=dkt_table(), workers=1)
    assert cohort_check(root).subjects[key].note == ""
