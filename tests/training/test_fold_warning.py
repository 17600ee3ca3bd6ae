"""MRIDataset(..., fold=k) names the fold's part, not "split None", when manifest rows of
that part are not in the cache, and counts only that part's rows."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from mriprep.cache import Cache, entry_key
from mriprep.inputs.manifest import ManifestRow, write_manifest
from mriprep.training import MRIDataset


def _tiny_cache(root: Path, subjects: list[str]) -> Path:
    cache = Cache(root, create=True)
    entries = []
    for number, sid in enumerate(subjects):
        meta = {"subject_id": sid, "session_id": "", "pipeline_name": "test",
                "pipeline_hash": "a" * 64,
                "inputs": {"t1w": {"path": f"{sid}.nii.gz", "sha256": f"{number:064x}"}},
                "affine": np.eye(4).tolist(), "spacing": [1.0] * 3, "shape": [8, 8, 8],
                "provenance": []}
        tensors = {"image": np.ones((8, 8, 8), np.float32), "valid": np.ones((8, 8, 8), bool)}
        key = entry_key(sid, "", {"t1w": f"{number:064x}"}, "a" * 64)
        entries.append(cache.write_entry(key, tensors, meta).with_split("train"))
    cache.update_index(entries)
    return root


def test_fold_warning_names_the_fold_part_and_counts_only_its_rows(tmp_path):
    cached = ["sub-00", "sub-01", "sub-02", "sub-03"]
    root = _tiny_cache(tmp_path / "cache", cached)
    folds = {"sub-00": "1", "sub-01": "2", "sub-02": "1", "sub-03": "2",
             "sub-08": "1", "sub-09": "2"}  # sub-08 and sub-09 failed: not cached
    rows = [ManifestRow(i, s, "", tmp_path / f"{s}.nii.gz", split="train",
                        metadata={"fold": f}) for i, (s, f) in enumerate(folds.items())]
    manifest = write_manifest(rows, tmp_path / "folds.csv")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        val = MRIDataset(root, "val", manifest=manifest, fold=1, labels=False)
    texts = [str(w.message) for w in caught if "not in cache" in str(w.message)]
    assert sorted(val.subject_ids) == ["sub-00", "sub-02"]
    assert len(texts) == 1, texts
    assert "None" not in texts[0] and "fold 1's validation part" in texts[0]
    assert "1 row(s)" in texts[0] and "sub-08" in texts[0] and "sub-09" not in texts[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MRIDataset(root, "train", manifest=manifest, fold=1, labels=False)
    texts = [str(w.message) for w in caught if "not in cache" in str(w.message)]
    assert len(texts) == 1 and "fold 1's training part" in texts[0] and "sub-09" in texts[0]
