"""The reference training script on a cache without label maps: it says so at start, how
to give them, and exits with a code of its own; the cache's error gives the right fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mriprep.cache import Cache, entry_key
from mriprep.core.errors import CacheError
from mriprep.core.exit_codes import ExitCode
from tests.examples.scripts import load_example


@pytest.fixture()
def unlabelled(tmp_path) -> Path:
    """A cache of four 12^3 images with valid masks and no label maps, as `mriprep run`
    leaves a manifest without a 'label' column."""
    cache = Cache(tmp_path / "cache", create=True)
    rng = np.random.default_rng(0)
    entries = []
    for number, split in enumerate(["train", "train", "val", "val"]):
        sid = f"sub-{number:02d}"
        meta = {"subject_id": sid, "session_id": "", "pipeline_name": "test",
                "pipeline_hash": "a" * 64,
                "inputs": {"t1w": {"path": f"{sid}.nii.gz", "sha256": f"{number:064x}"}},
                "affine": np.diag([4.0, 4.0, 4.0, 1.0]).tolist(), "spacing": [4.0] * 3,
                "shape": [12, 12, 12], "provenance": []}
        tensors = {"image": rng.normal(size=(12, 12, 12)).astype(np.float32),
                   "valid": np.ones((12, 12, 12), bool)}
        key = entry_key(sid, "", {"t1w": f"{number:064x}"}, "a" * 64)
        entries.append(cache.write_entry(key, tensors, meta).with_split(split))
    cache.update_index(entries)
    return cache.root


def test_training_without_label_maps_stops_at_start_naming_the_label_column(
        unlabelled, capsys):
    script = load_example("train_2p5d")
    code = script.main([str(unlabelled), "--epochs", "1", "--workers", "0"])
    err = capsys.readouterr().err
    assert code == script.EXIT_NO_LABELS == 4
    assert code not in {int(c) for c in ExitCode} and code != script.EXIT_NON_FINITE
    assert "has no label maps" in err and "'label' column" in err
    assert "Traceback" not in err and "rebuild it" not in err


def test_cache_error_for_a_label_never_given_does_not_say_rebuild(unlabelled):
    cache = Cache(unlabelled)
    entry = cache.entries()[0]
    with pytest.raises(CacheError) as caught:
        cache.load_tensor(entry.key, "label")
    text = str(caught.value)
    assert "has no label map" in text and "'label' column" in text
    assert "rebuild it" not in text
    # A tensor the entry lists but lost keeps the rebuild advice.
    cache.tensor_path(entry.key, "valid").unlink()
    with pytest.raises(CacheError, match="rebuild it"):
        cache.load_tensor(entry.key, "valid")
