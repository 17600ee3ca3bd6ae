"""Tests of `mriprep check --lut TABLE`: the label maps judged as training will map them.

The caches are FreeSurfer-numbered conformed-like subjects (tests/training/
fastsurfer_cache.py, 72^3), each test's defect planted into one subject's label map:
Desikan parcels that the rules map (info, not an error), a value no table lists, an
aseg-only map (cortex without parcels), classes missing from a whole split.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mriprep import check as chk
from mriprep.cache import Cache
from mriprep.check.render import render_report
from mriprep.cli import main as cli_main
from mriprep.core.finding_codes import CODES, Severity
from mriprep.training.labels import LabelTable, dkt_table
from tests.training.fastsurfer_cache import write_cache

LUT_CODES = {"lut-unknown-values", "lut-unknown-background", "lut-cortex-lost",
             "lut-absent-classes", "lut-absent-allowed", "lut-rewrites"}


def desikan(labels: np.ndarray) -> None:
    """Desikan parcels in place of three DKT ones (as FreeSurfer's aparc+aseg has them;
    left parcels whose right ones fuse into them, so that every class stays present)."""
    labels[labels == 1006] = 1001
    labels[labels == 1003] = 1032
    labels[labels == 1009] = 1033


def aseg_only(labels: np.ndarray) -> None:
    """Every cortical parcel back to cerebral cortex 3/42, as aseg.mgz has it."""
    labels[(labels >= 1000) & (labels < 2000)] = 3
    labels[labels >= 2000] = 42


def plant(value: int, voxels: int):
    def edit(labels: np.ndarray) -> None:
        labels.flat[np.flatnonzero(labels == 2)[:voxels]] = value
    return edit


def cache_with(root, edits: dict, split: str = "train", count: int = 2):
    """A cache of ``count`` subjects; ``edits[i]`` changes sub-0i's label map in place."""
    def edit(index, tensors):
        if index in edits:
            edits[index](tensors["label"])
    return write_cache(root, count, split, edit)


def by_code(report, code: str) -> list:
    return [f for f in report.findings if f.code == code]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """sub-00 holds Desikan parcels, sub-01 a value no table lists (5001, 27 voxels)."""
    return cache_with(tmp_path_factory.mktemp("mixed") / "c",
                      {0: desikan, 1: plant(5001, 27)})


@pytest.fixture(scope="module")
def mixed_report(mixed):
    return chk.check_cache(mixed, label_table=dkt_table(), workers=2)


def test_the_lut_codes_are_registered_with_their_severities():
    assert LUT_CODES <= set(CODES)
    assert {c for c in LUT_CODES if CODES[c].severity is Severity.ERROR} == {
        "lut-unknown-values", "lut-cortex-lost", "lut-absent-classes"}
    assert CODES["lut-rewrites"].severity is Severity.INFO
    assert CODES["lut-unknown-background"].severity is Severity.WARNING


def test_desikan_parcels_are_reported_as_mapped_not_as_errors(mixed_report):
    rewrites = {f.message.split(":")[0]: f for f in by_code(mixed_report, "lut-rewrites")}
    for value in (1001, 1032, 1033):
        finding = rewrites[f"{value} Desikan-only parcel -> nearest DKT parcel"]
        assert finding.severity == "info" and finding.subjects == ("sub-00",)
        assert "voxels in 1 of 2 label maps (most: sub-00" in finding.message
    # the raw values the rules rewrite are not judged as raw values
    assert not {"label-values", "labels-unchecked"} & mixed_report.codes()
    assert all("sub-00" not in f.subjects for f in mixed_report.errors)
    assert sum(mixed_report.label_table["rewrites"].values()) == sum(
        int(f.message.split(": ")[1].split()[0]) for f in rewrites.values())
    # nor by the islands check, which counts what it left out
    left_out = mixed_report.label_table["islands_not_judged"]
    assert {"1001", "1032", "1033"} <= {name.split()[0] for name in left_out}


def test_a_value_no_table_lists_is_an_error_naming_the_subject_and_the_fix(mixed_report):
    (unknown,) = by_code(mixed_report, "lut-unknown-values")
    assert unknown.severity == "error" and unknown.subjects == ("sub-01",)
    assert unknown.message.startswith("sub-01 [")
    assert "label values 5001 (27 voxels) are not in the label table" in unknown.message
    assert "fastsurfer_dkt.tsv after the aparc rules" in unknown.message
    assert "--unknown background" in unknown.message
    assert "LabelTable(unknown='background')" in unknown.message
    assert not mixed_report.ok


def test_unknown_values_counted_as_background_are_a_warning(mixed):
    report = chk.check_cache(mixed, label_table=dkt_table(unknown="background"))
    (warning,) = by_code(report, "lut-unknown-background")
    assert warning.severity == "warning" and warning.subjects == ("sub-01",)
    assert "5001 (27 voxels)" in warning.message and "background (class 0)" in warning.message
    assert report.ok and "lut-unknown-values" not in report.codes()


def test_an_aseg_only_map_is_an_error_naming_the_fix(tmp_path):
    root = cache_with(tmp_path / "c", {1: aseg_only})
    report = chk.check_cache(root, label_table=dkt_table())
    (lost,) = by_code(report, "lut-cortex-lost")
    assert lost.severity == "error" and lost.subjects == ("sub-01",)
    assert "cerebral cortex (3/42) but no cortical parcel" in lost.message
    assert "aparc.DKTatlas+aseg" in lost.message and "processing='aseg'" in lost.message
    # left out of the class count, as the export leaves it out: sub-00 has every class
    assert "lut-absent-classes" not in report.codes() and not report.ok
    # FastSurfer's aseg rules keep the cortex: nothing lost (the table has no 3/42:
    # the values are named instead)
    aseg = chk.check_cache(root, label_table=dkt_table(processing="aseg"))
    assert "lut-cortex-lost" not in aseg.codes()
    assert "3 (" in by_code(aseg, "lut-unknown-values")[0].message


def test_classes_absent_from_a_whole_split_are_named_per_split(tmp_path):
    root = cache_with(tmp_path / "c", {0: no_hippocampus, 1: no_hippocampus}, count=3)
    cache = Cache(root)  # sub-02, complete, to another split: judged on its own
    cache.update_index([e.with_split("val") for e in cache.entries()
                        if e.subject_id == "sub-02"])
    report = chk.check_cache(root, label_table=dkt_table())
    absent = by_code(report, "lut-absent-classes")
    assert [f.severity for f in absent] == ["error"]
    (finding,) = absent
    assert finding.message.startswith("split train: 2 of the 78 classes of the axial and "
                                      "coronal views")
    assert "in none of the split's 2 label maps (sub-00, sub-01)" in finding.message
    assert "Left-Hippocampus, Right-Hippocampus" in finding.message
    assert "sagittal view, where left and right merge, 1 of 50: Right-Hippocampus" \
        in finding.message
    assert "--absent-classes allow" in finding.message
    assert report.label_table["absent"] == {"train": {
        "axial": ["Left-Hippocampus", "Right-Hippocampus"], "sagittal": ["Right-Hippocampus"]}}
    allowed = chk.check_cache(root, label_table=dkt_table(), absent_classes="allow")
    assert [f.code for f in allowed.findings if f.code.startswith("lut-")] == [
        "lut-absent-allowed"]
    assert allowed.ok


def write_lut(path, values) -> None:
    """A FastSurfer ColorLUT (.tsv) of the DKT table's rows for ``values``."""
    dkt = dkt_table()
    rows = ["ID\tLabelName\tR\tG\tB\tA"]
    for row, value in enumerate(dkt.ids.tolist()):
        if value in values:
            rgba = "\t".join(str(int(c)) for c in dkt.lut.rgba[row])
            rows.append(f"{value}\t{dkt.names[row]}\t{rgba}")
    path.write_text("\n".join(rows) + "\n")


def no_hippocampus(labels: np.ndarray) -> None:
    labels[np.isin(labels, (17, 53))] = 2


def test_a_clean_cache_passes_with_its_own_table_and_json_carries_the_findings(
        tmp_path, capsys):
    def edit(labels):
        no_hippocampus(labels)
        plant(251, 5)(labels)  # corpus callosum: rewritten by the rules, an info
    root = cache_with(tmp_path / "c", {0: edit, 1: no_hippocampus})
    lut = tmp_path / "own.tsv"
    write_lut(lut, set(dkt_table().ids.tolist()) - {17, 53})
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    capsys.readouterr()
    assert cli_main(["check", str(root), "--lut", str(lut), "--strict", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["errors"] == doc["warnings"] == 0 and doc["infos"] == 1
    (rewrite,) = doc["findings"]
    assert rewrite["severity"] == "info" and rewrite["code"] == "lut-rewrites"
    names = {e.subject_id: e.finding_name for e in Cache(root).entries()}
    assert rewrite["message"] == ("251-255 corpus callosum -> nearer white matter (2/41): "
                                  f"5 voxels in 1 of 2 label maps (most: "
                                  f"{names['sub-00']} (5))")
    assert rewrite["subjects"] == ["sub-00"]
    table = doc["label_table"]
    assert table["source"] == str(lut) and table["label_maps"] == 2
    assert table["classes"] == {"axial": 77, "coronal": 77, "sagittal": 50}
    assert (table["processing"], table["cortex"], table["unknown"]) == (
        "aparc", "fuse", "error")
    assert table["absent"] == {} and table["without_label_map"] == 0
    assert table["rewrites"] == {"251-255 corpus callosum -> nearer white matter (2/41)": 5}
    # no derived classes: only the check's record of its findings is written
    from pathlib import Path
    written = {p.relative_to(root) for p in root.rglob("*")} - set(before)
    assert written == {Path("check"), Path("check/findings.json")}
    # the shipped table has the hippocampus, which no map holds
    assert cli_main(["check", str(root), "--lut", "dkt"]) == 1
    assert "ERROR   lut-absent-classes      split train: 2 of the 78 classes" in \
        capsys.readouterr().out
    # without --lut the raw values are unchecked (no recorded set): a warning
    assert cli_main(["check", str(root), "--strict"]) == 1
    assert "labels-unchecked" in capsys.readouterr().out


def test_the_cli_exits_1_and_renders_errors_before_infos(mixed, capsys):
    capsys.readouterr()
    assert cli_main(["check", str(mixed), "--lut", "dkt"]) == 1
    out = capsys.readouterr().out
    assert "label table: " in out and "fastsurfer_dkt.tsv (aparc rules, cortex fuse; " \
        "79 classes, 51 sagittal" in out
    codes = [line.split()[1] for line in out.splitlines()
             if line.startswith(("ERROR", "WARNING", "INFO"))]
    assert codes[0] == "lut-unknown-values" and set(codes[1:]) == {"lut-rewrites"}
    assert "INFO    lut-rewrites" in out and out.rstrip().endswith(
        "FAILED: 1 error(s), 0 warning(s), 3 info")


def test_the_cli_takes_unknown_values_as_background_when_told(mixed, capsys):
    capsys.readouterr()
    status = cli_main(["check", str(mixed), "--lut", "dkt", "--unknown", "background",
                       "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert status == 0 and doc["label_table"]["unknown"] == "background"
    assert [f["subjects"] for f in doc["findings"]
            if f["code"] == "lut-unknown-background"] == [["sub-01"]]


def test_lut_and_labels_together_are_refused(mixed, capsys):
    capsys.readouterr()
    assert cli_main(["check", str(mixed), "--lut", "dkt", "--labels", "0-3"]) == 2
    err = capsys.readouterr().err
    assert "--labels and --lut both judge the label values; give one" in err
    assert "1000/2000, 251-255 or 3/42" in err
    with pytest.raises(ValueError, match="allowed_labels= and label_table= .* give one"):
        chk.check_cache(mixed, allowed_labels=[0, 2], label_table=dkt_table())


def test_table_options_without_a_table_and_a_bad_table_are_usage_errors(
        mixed, tmp_path, capsys):
    capsys.readouterr()
    assert cli_main(["check", str(mixed), "--processing", "aseg", "--absent-classes",
                     "allow"]) == 2
    assert "--processing, --absent-classes set how the label table maps the labels; " \
        "give the table too (--lut TABLE" in capsys.readouterr().err
    assert cli_main(["check", str(mixed), "--lut", str(tmp_path / "none.tsv")]) == 2
    err = capsys.readouterr().err
    assert "cannot read lookup table" in err and "none.tsv" in err
    with pytest.raises(ValueError, match="absent_classes='sometimes'"):
        chk.check_cache(mixed, label_table=dkt_table(), absent_classes="sometimes")


def test_a_table_that_refuses_unknown_values_is_not_changed_by_the_check(mixed):
    table = LabelTable(None)
    report = chk.check_cache(mixed, label_table=table)
    assert table.unknown == "error" and "lut-unknown-values" in report.codes()
    assert "label table:" in render_report(report)


def test_class_counts_of_the_distinct_values_equal_a_lookup_of_the_whole_map():
    from mriprep.check.label_table import class_counts
    from tests.training.fastsurfer_cache import subject

    table = dkt_table(unknown="background")
    labels = subject(1)["label"]
    desikan(labels)
    plant(5001, 9)(labels)
    prepared = table.prepare(labels)
    counts, voxels = class_counts(table, prepared)
    for view in ("axial", "sagittal"):
        mapped = table.lookup(prepared, view)
        whole = np.bincount(mapped.classes.ravel(), minlength=table.num_classes(view))
        assert np.array_equal(counts[view], whole)
    assert voxels["unknown"] == [5001] and voxels["count"][5001] == 9


def _swap(a: int, b: int):
    def edit(labels: np.ndarray) -> None:
        first, second = labels == a, labels == b
        labels[first], labels[second] = b, a
    return edit


def _mirrored(labels: np.ndarray) -> None:
    labels[:] = np.flip(labels, 0)  # axis 0 runs left-right in the cache's LIA order


def _hemispheres(labels: np.ndarray) -> None:
    left, right = (labels > 1000) & (labels < 2000), labels > 2000
    labels[left] += 1000
    labels[right] -= 1000


@pytest.mark.parametrize("edit, says", [
    (_mirrored, "the whole map is mirrored"),
    (_hemispheres, "parcel numbers (1xxx, 2xxx) are swapped"),
    (_swap(17, 53), "1 left/right pair(s) lie on the wrong side: Hippocampus"),
], ids=["mirrored", "hemispheres", "one-structure"])
def test_left_and_right_on_the_wrong_side_are_named(tmp_path, edit, says):
    root = cache_with(tmp_path / "c", {1: edit})
    found = by_code(chk.check_cache(root, label_table=dkt_table(), workers=1),
                    "label-side-swap")
    assert len(found) == 1 and "sub-01" in found[0].message and says in found[0].message
    assert found[0].severity == Severity.ERROR


def test_clean_maps_have_every_pair_on_its_side(mixed_report):
    assert not by_code(mixed_report, "label-side-swap")


def _moved(voxels: int):
    def edit(labels: np.ndarray) -> None:
        labels[:] = np.roll(labels, voxels, axis=1)
    return edit


def test_a_map_moved_against_its_image_is_named(tmp_path, mixed_report):
    assert not by_code(mixed_report, "label-misfit")     # the clean maps lie on theirs
    root = cache_with(tmp_path / "c", {1: _moved(2)})
    found = by_code(chk.check_cache(root, label_table=dkt_table(), workers=1),
                    "label-misfit")
    assert len(found) == 1 and "sub-01" in found[0].message
    assert "moved by (+0, -2, +0) voxels" in found[0].message
    assert found[0].severity == Severity.WARNING


def _background_blob(labels: np.ndarray) -> None:
    labels[:8, :8, :8] = 17  # a corner of the field of view, outside the head


def test_labels_in_the_background_are_named(tmp_path, mixed_report):
    assert not by_code(mixed_report, "label-off-anatomy")
    root = cache_with(tmp_path / "c", {0: _background_blob})
    found = by_code(chk.check_cache(root, label_table=dkt_table(), workers=1),
                    "label-off-anatomy")
    assert len(found) == 1 and "sub-00" in found[0].message
    assert "512 mm^3 of its labels lie where the image shows no head" in found[0].message
