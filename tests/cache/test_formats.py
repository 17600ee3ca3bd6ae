"""Every storage format an entry may use: written losslessly, recorded, read back whole
or by region, and checked (a damaged compressed stream is named)."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.cache.formats import open_tensor
from mriprep.check import check_cache, verify_cache
from mriprep.core.hashing import checksum_file

from .conftest import key_of, meta_of, tensors_of

FORMATS = [("float32", c) for c in ("none", "lz4", "zstd")] + [("float16", "lz4"),
                                                               ("uint8", "zstd")]


def _stored(data, dtype):
    tensors = tensors_of(data)
    image = tensors["image"]
    if dtype == "uint8":
        image = np.clip(np.rint((image - image.min()) * 40), 0, 255)
    tensors["image"] = image.astype(dtype)
    return tensors


def _entry(tmp_path, brain, dtype, compression, subject="sub-01"):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    tensors = _stored(data, dtype)
    entry = cache.write_entry(key_of(subject), tensors, meta_of(subject, data, affine),
                              compression=compression)
    cache.update_index([entry.with_split("train")])
    return cache, entry, tensors


@pytest.mark.parametrize("dtype, compression", FORMATS)
def test_every_format_reads_back_exactly_and_records_its_file(tmp_path, brain, dtype,
                                                             compression):
    cache, entry, tensors = _entry(tmp_path, brain, dtype, compression)
    suffix = ".npy" if compression == "none" else ".b2nd"
    for name, array in tensors.items():
        record = entry.files[name]
        path = cache.tensor_path(entry.key, name)
        assert path.name == name + suffix == record.file
        assert record.dtype == str(array.dtype) and record.shape == array.shape
        assert record.bytes == path.stat().st_size
        assert record.xxh3_128 == checksum_file(path)
        assert entry.to_json()["files"][name].get("compression", "none") == compression
        whole = cache.load_tensor(entry.key, name)
        assert whole.dtype == array.dtype
        np.testing.assert_array_equal(whole, array)
        region = (slice(3, 17), slice(5, 9), 7)
        np.testing.assert_array_equal(cache.open_tensor(entry.key, name)[region], array[region])
    assert cache.has_entry(entry.key, verify=True)
    report = check_cache(cache.root)
    assert report.ok, report.findings


def test_compression_makes_entries_smaller_and_per_tensor_choices_mix(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    sizes = {}
    for i, compression in enumerate(["none", "lz4", {"valid": "zstd", "label": "lz4"}]):
        entry = cache.write_entry(key_of(f"sub-{i}"), _stored(data, "float16"),
                                  meta_of(f"sub-{i}", data, affine), compression=compression)
        sizes[i] = {n: r.bytes for n, r in entry.files.items()}
        if isinstance(compression, dict):
            assert [entry.files[n].file for n in ("image", "valid", "label")] == [
                "image.npy", "valid.b2nd", "label.b2nd"]
            assert entry.storage == "float16, label lz4, valid zstd" or \
                entry.storage == "float16, valid zstd, label lz4"
        elif compression == "lz4":
            assert entry.storage == "float16 lz4"
        else:
            assert entry.storage == "float16"
    # The mask compresses most (one bit of information a byte), the image least.
    assert sizes[1]["valid"] * 5 < sizes[0]["valid"]
    assert sizes[1]["label"] * 3 < sizes[0]["label"]
    assert sizes[1]["image"] < sizes[0]["image"]
    assert sizes[2]["image"] == sizes[0]["image"]


def _flip_inside_a_chunk(path):
    """Change one byte in the middle of the file: inside a compressed chunk."""
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_compressed_stream_is_named_by_check_and_verify(tmp_path, brain, damage):
    cache, entry, _ = _entry(tmp_path, brain, "float16", "lz4")
    path = cache.tensor_path(entry.key, "image")
    if damage == "flipped byte":
        _flip_inside_a_chunk(path)
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    for report in (check_cache(cache.root), verify_cache(cache.root)):
        assert not report.ok
        named = [f for f in report.findings if "image.b2nd" in f.message]
        assert named and all(entry.key in f.keys for f in named), report.findings
    assert not cache.has_entry(entry.key, verify=True)


def test_a_compressed_chunk_that_no_longer_decodes_is_unreadable(tmp_path, brain):
    """Garbage over the whole chunk area: blosc2 refuses it, and check says so rather
    than crash (the checksum names it too)."""
    cache, entry, _ = _entry(tmp_path, brain, "float32", "zstd")
    path = cache.tensor_path(entry.key, "image")
    raw = bytearray(path.read_bytes())
    rng = np.random.default_rng(0)
    start = len(raw) // 4
    raw[start:] = rng.integers(0, 256, len(raw) - start, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(raw))
    report = check_cache(cache.root)
    codes = {f.code for f in report.findings if entry.key in f.keys}
    assert {"checksum-mismatch", "tensor-unreadable"} <= codes, report.findings
    unreadable = [f for f in report.findings if f.code == "tensor-unreadable"]
    assert all("image.b2nd" in f.message for f in unreadable), unreadable
    assert not report.ok


def test_open_tensor_of_a_compressed_file_decodes_regions(tmp_path, brain):
    cache, entry, tensors = _entry(tmp_path, brain, "float16", "zstd")
    stored = open_tensor(cache.tensor_path(entry.key, "image"))
    assert stored.shape == tensors["image"].shape and stored.dtype == np.float16
    np.testing.assert_array_equal(stored[..., 4], tensors["image"][..., 4])
    np.testing.assert_array_equal(stored[2], tensors["image"][2])


def test_repair_quarantines_an_entry_whose_compressed_stream_is_damaged(tmp_path, brain):
    from mriprep.cache import QUARANTINE_DIR
    from mriprep.maintenance import repair_index

    data, affine = brain
    cache, entry, _ = _entry(tmp_path, brain, "float16", "lz4")
    sound = cache.write_entry(key_of("sub-02"), _stored(data, "float16"),
                              meta_of("sub-02", data, affine), compression="lz4")
    cache.update_index([sound.with_split("val")])
    _flip_inside_a_chunk(cache.tensor_path(entry.key, "label"))
    cache.index_path.write_text("{ truncated")
    report = repair_index(cache, splits={("sub-02", ""): "val"})  # the index gave them
    assert list(report.quarantined) == [entry.key]
    assert "label.b2nd" in report.quarantined[entry.key]
    assert (cache.root / QUARANTINE_DIR / entry.key / "reason.txt").is_file()
    assert [(e.key, e.split) for e in cache.entries()] == [(sound.key, "val")]
