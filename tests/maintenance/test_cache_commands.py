"""`mriprep cache ls | prune | verify | repair`, the run's own index repair and pipeline
guard, and MRIDataset(manifest=): on small template caches (the bookkeeping does not
depend on the anatomy) and on clones of the demo cache (real run reports)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.cli import main as cli
from mriprep.core.errors import CacheError
from mriprep.inputs.manifest import ManifestRow, write_manifest
from mriprep.maintenance import apply_prune, plan_prune, repair_index
from tests.cache_clone import clone_cache, replace_bytes
from tests.training.template_cache import build_template_cache


@pytest.fixture
def small_cache(tmp_path) -> Path:
    return build_template_cache(tmp_path / "cache", splits={"train": 3, "val": 1}, step=8)


def manifest_of(path: Path, subjects: dict[str, str]) -> Path:
    rows = [ManifestRow(0, sid, "", path.parent / f"{sid}.nii.gz", split=split)
            for sid, split in subjects.items()]
    return write_manifest(rows, path)


def flip_a_byte(cache: Cache, key: str, name: str = "image") -> None:
    path = cache.tensor_path(key, name)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    replace_bytes(path, bytes(data))  # a new inode: a clone's source stays intact


def test_ls_lists_entries_with_split_pipeline_size_and_unindexed_folders(small_cache, capsys):
    cache = Cache(small_cache)
    stale = cache.entries("train")[0]
    cache.remove_from_index([stale.key])
    assert cli(["cache", "ls", str(small_cache), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [e["subject_id"] for e in listing["entries"]] == ["sub-01", "sub-02", "sub-03"]
    assert {e["split"] for e in listing["entries"]} == {"train", "val"}
    assert all(e["pipeline_name"] == "test" and e["bytes"] > 0 for e in listing["entries"])
    assert [e["key"] for e in listing["unindexed"]] == [stale.key]
    assert cli(["cache", "ls", str(small_cache)]) == 0
    text = capsys.readouterr().out
    assert "(not indexed)" in text and "3 entries (train 2, val 1)" in text


@pytest.mark.parametrize("damage", [b'{"version": 1, "entries": {"ab', b"[]", b"\x00garbage"])
def test_repair_rebuilds_a_damaged_index_with_the_manifest_splits(small_cache, tmp_path,
                                                                  damage, capsys):
    cache = Cache(small_cache)
    before = {e.key: e.split for e in cache.entries()}
    cache.index_path.write_bytes(damage)
    assert cli(["check", str(small_cache)]) == 1
    assert "mriprep cache repair" in capsys.readouterr().out
    manifest = manifest_of(tmp_path / "m.csv", {"sub-00": "train", "sub-01": "train",
                                                "sub-02": "train", "sub-03": "val"})
    assert cli(["cache", "repair", str(small_cache), "--manifest", str(manifest)]) == 0
    assert {e.key: e.split for e in cache.entries()} == before
    backups = list(small_cache.glob("index.json.before-repair-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == damage  # nothing is lost


def test_repair_quarantines_a_damaged_entry_and_leaves_unknown_splits_out(small_cache):
    cache = Cache(small_cache)
    damaged, *others = cache.entries()
    flip_a_byte(cache, damaged.key)
    cache.index_path.write_text("{")
    report = repair_index(cache)  # no manifest, no run reports: no split is known
    assert set(report.quarantined) == {damaged.key}
    assert "checksum" in report.quarantined[damaged.key]
    reason = (small_cache / "quarantine" / damaged.key / "reason.txt").read_text()
    assert "checksum" in reason and not cache.entry_dir(damaged.key).exists()
    assert sorted(e.key for e in report.unassigned) == sorted(e.key for e in others)
    assert cache.entries() == [] and "--manifest" in report.summary()


def test_run_repairs_a_truncated_index_itself(demo_cohort, demo_cache, tmp_path):
    from mriprep.pipelines import load_pipeline
    from mriprep.run.cohort import cohort_rows, run_cohort

    clone = clone_cache(demo_cache.path, tmp_path / "cache")
    before = {e.key: e.split for e in clone.entries()}
    text = clone.index_path.read_text()
    clone.index_path.write_text(text[: len(text) // 3])
    cached = {(r.subject_id, r.session_id) for r in demo_cache.run.results
              if r.status == "cached"}
    rows = [r for r in cohort_rows(demo_cohort.manifest) if r.key in cached][:2]
    run = run_cohort(rows, clone.root, load_pipeline("t1w_mni_rigid"), scheduler="sync",
                     report=False)
    assert [r.status for r in run.results] == ["skipped", "skipped"]
    assert "index.json was damaged" in run.index_note
    assert {e.key: e.split for e in clone.entries()} == before  # splits from the reports


def test_run_refuses_a_second_pipeline_unless_it_replaces_the_first(small_cache):
    from mriprep.pipelines import load_pipeline
    from mriprep.run.cohort import run_cohort

    pipeline = load_pipeline("t1w_mni_rigid")
    with pytest.raises(CacheError, match="indexes 4 entries of pipeline test") as refused:
        run_cohort([], small_cache, pipeline, scheduler="sync", report=False)
    assert pipeline.hash[:12] in str(refused.value) and "--replace-pipeline" in str(refused.value)
    assert len(Cache(small_cache).entries()) == 4  # refused before touching anything
    run = run_cohort([], small_cache, pipeline, scheduler="sync", report=False,
                     replace_pipeline=True)
    assert Cache(small_cache).entries() == [] and "prune" in run.index_note
    plan = plan_prune(Cache(small_cache), grace_seconds=0)
    assert len([r for r in plan.removals if r.folder == "entries"]) == 4


def test_prune_keeps_the_manifest_rows_and_one_pipeline(small_cache, tmp_path, capsys):
    cache = Cache(small_cache)
    build_template_cache(tmp_path / "other", splits={"train": 1}, pipeline_hash="b" * 64,
                         first=7, step=8)
    other = Cache(tmp_path / "other").entries()[0]
    os.rename(Cache(tmp_path / "other").entry_dir(other.key), cache.entry_dir(other.key))
    cache.update_index([other])
    with pytest.raises(CacheError, match="mixes 2 pipelines"):
        plan_prune(cache)
    manifest = manifest_of(tmp_path / "m.csv", {"sub-00": "train", "sub-03": "val",
                                                "sub-07": "train"})
    assert cli(["cache", "prune", str(small_cache), "--manifest", str(manifest),
                "--pipeline", "aaaa", "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "not a row of" in shown and "not the kept" in shown
    assert len(cache.entries()) == 5  # a dry run removes nothing
    plan = plan_prune(cache, manifest=manifest, pipeline="a" * 12, grace_seconds=0)
    removed = {r.entry.subject_id for r in plan.removals if r.entry}
    assert removed == {"sub-01", "sub-02", "sub-07"}
    freed = apply_prune(cache, plan)
    assert freed == plan.bytes > 0
    assert [e.subject_id for e in cache.entries()] == ["sub-00", "sub-03"]
    assert sorted(p.name for p in cache.entries_dir.iterdir() if not p.name.startswith(".")) \
        == sorted(e.key for e in cache.entries())


def test_prune_without_a_terminal_asks_for_yes(small_cache, monkeypatch):
    cache = Cache(small_cache)
    cache.remove_from_index([cache.entries()[0].key])
    stale = next(p for p in cache.entries_dir.iterdir() if not p.name.startswith(".")
                 and p.name not in {e.key for e in cache.entries()})
    old = stale.stat().st_mtime - 3600
    os.utime(stale, (old, old))
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert cli(["cache", "prune", str(small_cache)]) == 2 and stale.exists()
    assert cli(["cache", "prune", str(small_cache), "--yes"]) == 0 and not stale.exists()


def test_verify_names_a_damaged_entry(small_cache, capsys):
    cache = Cache(small_cache)
    assert cli(["cache", "verify", str(small_cache)]) == 0
    assert "OK: 0 error(s)" in capsys.readouterr().out
    victim = cache.entries()[1]
    flip_a_byte(cache, victim.key, "valid")
    assert cli(["cache", "verify", str(small_cache), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    [finding] = [f for f in report["findings"] if f["severity"] == "error"]
    assert finding["code"] == "checksum-mismatch" and finding["subjects"] == [victim.subject_id]


def test_dataset_reads_only_the_manifest_rows(small_cache, tmp_path):
    from mriprep.training import MRIDataset

    manifest = manifest_of(tmp_path / "m.csv", {"sub-00": "train", "sub-02": "train",
                                                "sub-09": "train"})
    with pytest.warns(UserWarning, match=r"1 row\(s\) of split 'train'.*sub-09"):
        ds = MRIDataset(small_cache, "train", manifest=manifest)
    assert ds.subject_ids == ["sub-00", "sub-02"]
    assert np.asarray(ds[1]["image"]).shape[0] == 1


def test_dataset_serves_a_k_fold_split_from_the_manifest_fold_column(tmp_path):
    from mriprep.splits import assign_folds
    from mriprep.training import MRIDataset

    root = build_template_cache(tmp_path / "cache", splits={"train": 6, "test": 1}, step=8)
    rows = [ManifestRow(0, e.subject_id, "", tmp_path / f"{e.subject_id}.nii.gz",
                        split=e.split) for e in Cache(root).entries()]
    folds = assign_folds(rows, 3, seed=0)
    manifest = write_manifest(folds.rows, tmp_path / "folds.csv")
    fold_of = {r.subject_id: r.metadata["fold"] for r in folds.rows}
    seen = set()
    for k in ("1", "2", "3"):
        train = MRIDataset(root, "train", manifest=manifest, fold=k).subject_ids
        val = MRIDataset(root, "val", manifest=manifest, fold=int(k)).subject_ids
        assert val and train and not set(train) & set(val)
        assert {fold_of[s] for s in val} == {k} and k not in {fold_of[s] for s in train}
        assert len(train) + len(val) == 6
        seen |= set(val)
    assert len(seen) == 6  # every training subject validates once
    assert MRIDataset(root, "test", manifest=manifest, fold=1).subject_ids == ["sub-06"]
    with pytest.raises(CacheError, match=r"fold '4' is not in .*folds are 1, 2, 3"):
        MRIDataset(root, "val", manifest=manifest, fold=4)
    with pytest.raises(ValueError, match="fold= needs manifest="):
        MRIDataset(root, "val", fold=1)
    plain = write_manifest(rows, tmp_path / "plain.csv")
    with pytest.raises(CacheError, match="no 'fold' column.*--folds K"):
        MRIDataset(root, "val", manifest=plain, fold=1)
