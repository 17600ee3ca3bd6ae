"""The check keeps its findings in the cache (CACHE/check/findings.json), and the readers
of that record (exclude_flagged=, the QC report) refuse a record older than an entry.

The cache (tests/check/flagged_cache.py): sub-01 with left and right hippocampus swapped
(label-side-swap, an error), sub-02's map moved two voxels against its image
(label-misfit, a warning), sub-00 clean.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from mriprep import check as chk
from mriprep.cache import Cache, entry_key
from mriprep.cache.check_record import (CheckRecord, exclude_flagged, read_check_record,
                                        record_path)
from mriprep.cli import main as cli_main
from mriprep.core.errors import CacheError, cli_words
from mriprep.training.labels import dkt_table
from tests.check.flagged_cache import flagged_cache, rebuild
from tests.training.fastsurfer_cache import subject


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """A checked copy of the cache, and the report (read only: copy it to change it)."""
    root = flagged_cache(tmp_path_factory.mktemp("kept") / "c")
    report = chk.check_cache(root, label_table=dkt_table(), workers=1)
    return root, report


def copy_of(checked, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(checked[0], root)
    return root


def test_the_check_keeps_its_findings_per_entry_with_its_options(checked):
    root, report = checked
    assert report.record == {"kept": True, "path": str(record_path(root))}
    record = read_check_record(root)
    assert isinstance(record, CheckRecord) and record.ok == report.ok is False
    names = {e.key: e.subject_id for e in Cache(root).entries()}
    keys = {sid: key for key, sid in names.items()}
    assert set(record.entries) == set(names)
    # which entries carry which codes, at which severity
    assert [(f.code, f.severity) for f in record.flags(keys["sub-01"])] == [
        ("label-side-swap", "error")]
    assert [(f.code, f.severity) for f in record.flags(keys["sub-02"])] == [
        ("label-misfit", "warning")]
    assert record.flags(keys["sub-02"], "error") == []
    assert record.flags(keys["sub-00"]) == []
    assert "Hippocampus" in record.flags(keys["sub-01"])[0].message
    # every finding, as the report has it (JSON form)
    assert [f.to_json() for f in record.findings] == [f.to_json() for f in report.findings]
    # the options: the table by its source and hash, and the command that checks again
    table = record.options["label_table"]
    assert table["sha256"] == dkt_table().hash() and table["source"].endswith(
        "fastsurfer_dkt.tsv")
    assert record.options["dtype"] == "float16"
    assert record.again(root) == f"mriprep check {root} --lut dkt"
    # the state judged: each entry's checksums, as the index has them now
    entry = Cache(root).entries()[0]
    assert record.entries[entry.key]["files"] == {
        n: r.xxh3_128 for n, r in entry.files.items()}
    assert record.stale(Cache(root).entries()) == {}
    # the label voxels the check counted, and the table's names of the values
    counts = record.label_voxels(keys["sub-00"])
    label = np.asarray(Cache(root).load_tensor(keys["sub-00"], "label"))
    assert counts == {int(v): int(c) for v, c in zip(*np.unique(label, return_counts=True))}
    assert record.label_names[17] == "Left-Hippocampus"
    assert record.label_names[0] == "Background" and set(record.label_names) <= set(
        v for key in keys.values() for v in record.label_voxels(key))
    # a timestamp in UTC
    assert record.made.endswith("+00:00")
    doc = json.loads(record_path(root).read_text())
    assert doc["format"] == "mriprep-check-findings" and doc["version"] == 1


def test_the_cli_says_where_it_kept_the_findings(checked, tmp_path, capsys):
    root = copy_of(checked, tmp_path)
    record_path(root).unlink()
    assert cli_main(["check", str(root), "--lut", "dkt"]) == 1
    err = capsys.readouterr().err
    assert f"mriprep check: findings kept in {record_path(root)}" in err
    assert read_check_record(root) is not None


def _unwritable(root) -> None:
    """Make CACHE/check unwritable: a read-only cache folder, or (as root, who writes
    into read-only folders) a file where the folder would be."""
    shutil.rmtree(root / "check")
    if os.geteuid() == 0:
        (root / "check").write_text("not a folder")
    else:
        os.chmod(root, 0o555)


def test_a_cache_that_cannot_be_written_is_checked_and_says_nothing_was_kept(
        checked, tmp_path, capsys):
    root = copy_of(checked, tmp_path)
    _unwritable(root)
    try:
        assert cli_main(["check", str(root), "--lut", "dkt"]) == 1
        captured = capsys.readouterr()
        report = chk.check_cache(root, label_table=dkt_table(), workers=1)
    finally:
        os.chmod(root, 0o755)
    assert "ERROR   label-side-swap" in captured.out  # the findings stand
    assert f"mriprep check: warning: cannot write {record_path(root)} (" in captured.err
    assert "leaving out flagged entries (--exclude-flagged)" in captured.err
    assert "exclude_flagged=" not in captured.err
    assert report.record["kept"] is False and "cannot write" in report.record["reason"]
    assert report.to_json()["record"] == report.record
    assert not record_path(root).exists()


def test_exclusion_leaves_out_what_the_check_flagged_and_says_which(checked):
    root, _ = checked
    entries = Cache(root).entries()
    kept, exclusion = exclude_flagged(root, entries, True)
    assert [e.subject_id for e in kept] == ["sub-00"]
    assert [name.split()[0] for name, _ in exclusion.excluded.values()] == [
        "sub-01", "sub-02"]
    assert exclusion.summary().startswith(
        "left out 2 of 3 entries that the check of ")
    assert "flagged with warnings or errors about the entry alone (exclude_flagged=" \
        in exclusion.summary()
    lines = exclusion.lines()
    assert lines[0].startswith("sub-01 [") and "label-side-swap (error): sub-01" in lines[0]
    assert lines[1].startswith("sub-02 [") and "label-misfit (warning)" in lines[1]
    # errors only: the misfit stays
    kept, exclusion = exclude_flagged(root, entries, "error")
    assert [e.subject_id for e in kept] == ["sub-00", "sub-02"]
    assert "(sub-01 [" not in exclusion.named() and "label-side-swap" in exclusion.named()
    assert exclude_flagged(root, entries, False) == (entries, None)
    with pytest.raises(ValueError, match=r"exclude_flagged='info': choose True"):
        exclude_flagged(root, entries, "info")


def test_no_record_is_refused_naming_the_check_to_run(tmp_path):
    root = flagged_cache(tmp_path / "c")
    with pytest.raises(CacheError) as caught:
        exclude_flagged(root, Cache(root).entries(), True)
    text = str(caught.value)
    assert "(exclude_flagged=): no check has kept its findings" in text
    assert f"`mriprep check {root} --lut dkt`" in text
    assert "(--exclude-flagged): no check" in cli_words(text)


def test_a_record_older_than_a_rebuilt_entry_is_refused_as_stale(checked, tmp_path):
    root = copy_of(checked, tmp_path)
    rebuild(root, 1)  # the swap fixed: same key, new label checksum
    entries = Cache(root).entries()
    record = read_check_record(root)
    stale = record.stale(entries)
    assert list(stale.values()) == ["rebuilt since the check: its files changed"]
    with pytest.raises(CacheError) as caught:
        exclude_flagged(root, entries, True)
    text = str(caught.value)
    assert "is stale for 1 of the 3 chosen entries: sub-01 [" in text
    assert "(rebuilt since the check: its files changed)" in text
    assert text.endswith(f"check the cache again: `mriprep check {root} --lut dkt`")
    # checked again: the record speaks for the cache again, and sub-01 is clean
    chk.check_cache(root, label_table=dkt_table(), workers=1)
    kept, _ = exclude_flagged(root, Cache(root).entries(), True)
    assert [e.subject_id for e in kept] == ["sub-00", "sub-01"]


def test_an_entry_made_after_the_check_is_not_judged(checked, tmp_path):
    root = copy_of(checked, tmp_path)
    cache = Cache(root)
    meta = {k: v for k, v in cache.read_meta(cache.entries()[0].key).items()
            if k not in ("files", "key", "format_version")}
    meta["subject_id"] = "sub-09"
    key = entry_key("sub-09", "", {"t1w": "9" * 64}, "f" * 64)
    cache.update_index([cache.write_entry(key, subject(4), meta).with_split("train")])
    with pytest.raises(CacheError, match=r"sub-09 \[[0-9a-f]+\] \(not judged: made after "
                                         r"the check\)"):
        exclude_flagged(root, Cache(root).entries(), "error")


def test_an_unreadable_record_is_refused_naming_the_fix(checked, tmp_path):
    root = copy_of(checked, tmp_path)
    record_path(root).write_text("{not json")
    with pytest.raises(CacheError, match=r"cannot read the check record .*findings.json: "
                                         r".*run `mriprep check .*` again"):
        read_check_record(root)


def test_the_check_to_run_again_is_the_same_check():
    from mriprep.check.kept import _SHIPPED_DKT, again_flags

    rules = {"processing": "aparc", "cortex": "fuse", "unknown": "error"}
    same = again_flags({"label_table": {"source": str(_SHIPPED_DKT), **rules},
                        "manifest": "/data/cohort.csv", "near_duplicate_threshold": 0.5,
                        "dtype": "float16"})
    assert same == "--manifest /data/cohort.csv --lut dkt --near-threshold 0.5"
    # An edited copy of the shipped table is named by its own path, not as the shipped one
    copy = "/home/me/mriprep/mriprep/training/labels/fastsurfer_dkt.tsv"
    assert f"--lut {copy}" in again_flags({"label_table": {"source": copy, **rules}})
    # A table made in Python has no file: the user names theirs
    assert again_flags({"label_table": {"source": "(in memory)", **rules}}) == "--lut TABLE"
