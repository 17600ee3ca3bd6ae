"""``mriprep export``: the cached values exactly, on the cache grid, with provenance; the
output folder and the subject ids checked first."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.cli import main as cli_main
from mriprep.core.errors import CacheError
from mriprep.outputs import EXPORT_MARKER, entries_for, export_entries
from tests.cache_clone import clone_cache, replace_bytes


def _assert_exported(cache: Cache, entry, folder, suffix: str) -> None:
    for name in ("image", "valid", "label"):
        img = nib.load(folder / f"{name}{suffix}")
        cached = np.asarray(cache.load_tensor(entry.key, name))
        data = np.asarray(img.dataobj)
        # NIfTI-1 and MGH hold no float16: a float16 cache's image is written as float32.
        expected_dtype = {"valid": np.uint8}.get(name, np.float32 if cached.dtype == np.float16
                                                  else cached.dtype)
        assert data.dtype.newbyteorder("=") == expected_dtype, name  # MGH is big-endian
        np.testing.assert_array_equal(data, cached.astype(expected_dtype))
        np.testing.assert_allclose(img.affine, entry.affine, atol=1e-5)


def test_export_writes_the_cached_values_on_the_cache_grid(tiny_cache, tmp_path, capsys):
    out = tmp_path / "export"
    assert cli_main(["export", str(tiny_cache.root), "-o", str(out)]) == 0
    assert "exported 2 of 2 entries" in capsys.readouterr().out
    assert (out / EXPORT_MARKER).is_file()
    for entry in tiny_cache.cache.entries():
        folder = out / entry.subject_id
        _assert_exported(tiny_cache.cache, entry, folder, ".nii.gz")
        img = nib.load(folder / "image.nii.gz")
        assert int(img.header["sform_code"]) == int(img.header["qform_code"]) == 4  # MNI152
        doc = json.loads((folder / "provenance.json").read_text())
        assert doc["key"] == entry.key and doc["subject_id"] == entry.subject_id
        assert doc["pipeline"]["hash"] == entry.pipeline_hash
        assert doc["inputs"]["image"]["sha256"] == entry.inputs["image"]["sha256"]
        assert doc["template_to_subject"] == entry.to_json()["template_to_subject"]
        assert [r["stage"] for r in doc["provenance"]] == ["register"]
        assert (folder / "transform.tfm").read_bytes() == (
            tiny_cache.cache.entry_dir(entry.key) / "transform.tfm").read_bytes()


def test_mgz_export_of_one_split(tiny_cache, tmp_path):
    out = tmp_path / "export"
    assert cli_main(["export", str(tiny_cache.root), "-o", str(out), "--split", "test",
                     "--format", "mgz"]) == 0
    [entry] = tiny_cache.cache.entries(split="test")
    assert sorted(p.name for p in out.iterdir()) == [EXPORT_MARKER, entry.subject_id]
    _assert_exported(tiny_cache.cache, entry, out / entry.subject_id, ".mgz")
    assert isinstance(nib.load(out / entry.subject_id / "label.mgz"), nib.MGHImage)


def test_unknown_subjects_and_foreign_folders_are_refused(tiny_cache, tmp_path, capsys):
    out = tmp_path / "export"
    assert cli_main(["export", str(tiny_cache.root), "-o", str(out), "--subject", "sub-a",
                     "sub-x"]) == 2
    err = capsys.readouterr().err
    assert "'sub-x' is not in cache" in err and "sub-a, sub-b" in err
    assert not out.exists()  # refused before anything was written
    with pytest.raises(CacheError, match="in split 'val'; its splits are 'test', 'train'"):
        entries_for(tiny_cache.cache, split="val")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert cli_main(["export", str(tiny_cache.root), "-o", str(foreign)]) == 2
    assert "holds no mriprep export" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    # An earlier export is updated in place.
    assert cli_main(["export", str(tiny_cache.root), "-o", str(out), "--subject", "sub-a"]) == 0
    assert cli_main(["export", str(tiny_cache.root), "-o", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {EXPORT_MARKER, "sub-a", "sub-b"}


def test_a_damaged_entry_is_named_and_the_others_are_exported(tiny_cache, tmp_path, capsys):
    clone = clone_cache(tiny_cache.root, tmp_path / "cache")
    key = tiny_cache.subjects["sub-b"].key
    path = clone.tensor_path(key, "label")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    replace_bytes(path, bytes(raw))
    out = tmp_path / "export"
    assert cli_main(["export", str(clone.root), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "sub-b" in err and "label.npy does not match its checksum" in err
    assert (out / "sub-a" / "image.nii.gz").is_file() and not (out / "sub-b").exists()


def test_progress_is_reported_per_entry(tiny_cache, tmp_path):
    seen = []
    result = export_entries(tiny_cache.cache, tiny_cache.cache.entries(), tmp_path / "x",
                            progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)] and len(result.folders) == 2 and not result.problems


@pytest.mark.slow
def test_a_demo_entry_exports_exactly(demo_cache, tmp_path):
    cache = Cache(demo_cache.path)
    out = tmp_path / "export"
    assert cli_main(["export", str(cache.root), "-o", str(out), "--subject", "sub-06"]) == 0
    [entry] = [e for e in cache.entries() if e.subject_id == "sub-06"]
    _assert_exported(cache, entry, out / "sub-06", ".nii.gz")
    doc = json.loads((out / "sub-06" / "provenance.json").read_text())
    assert doc["pipeline"]["name"] == "t1w_mni_rigid"
    assert [r["stage"] for r in doc["provenance"]][:2] == ["load", "reorient"]
