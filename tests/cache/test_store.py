"""The cache folder: atomic entries, verification, the index and concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
import os

import numpy as np
import pytest

from mriprep.cache import Cache, IndexEntry
from mriprep.cache.formats import format_for
from mriprep.core.errors import CacheError
from mriprep.core.hashing import checksum_file

from .conftest import key_of, meta_of, tensors_of


def test_entry_round_trip_is_memory_mapped_and_checksummed(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    tensors = tensors_of(data)
    entry = cache.write_entry(key, tensors, meta_of("sub-01", data, affine))
    assert cache.has_entry(key, verify=True)
    image = cache.load_tensor(key, "image")
    assert isinstance(image, np.memmap) and not image.flags.writeable
    np.testing.assert_array_equal(image, tensors["image"])
    assert cache.load_tensor(key, "valid").dtype == bool
    assert cache.load_tensor(key, "label").dtype == np.int16
    for name, record in entry.files.items():
        assert record.xxh3_128 == checksum_file(cache.tensor_path(key, name))
    assert "provenance" not in entry.to_json()
    assert entry.shape == data.shape and entry.affine.dtype == np.float64
    assert cache.read_meta(key)["provenance"][0]["stage"] == "load"
    assert cache.read_meta(key)["affine"] == affine.tolist()


def test_flipped_byte_or_truncation_fails_verification(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    cache.write_entry(key, tensors_of(data), meta_of("sub-01", data, affine))
    path = cache.tensor_path(key, "image")
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert cache.has_entry(key)  # same size: only the checksum can tell
    assert not cache.has_entry(key, verify=True)
    path.write_bytes(bytes(raw[:-8]))
    assert not cache.has_entry(key)


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_a_full_disk_leaves_no_entry_and_says_how_much_space(tmp_path, brain, monkeypatch,
                                                             compression):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    written = []
    fmt = format_for(compression)
    real = fmt.write

    def write_then_fill_the_disk(*args, **kwargs):
        if written:  # the second tensor finds the disk full
            raise OSError(28, "No space left on device")
        written.append(True)
        real(*args, **kwargs)

    monkeypatch.setattr(fmt, "write", write_then_fill_the_disk)
    with pytest.raises(CacheError, match="no space left") as err:
        cache.write_entry(key, tensors_of(data), meta_of("sub-01", data, affine),
                          compression=compression)
    monkeypatch.undo()
    message = str(err.value)
    assert str(cache.root) in message and "sub-01" in message
    need = sum(a.nbytes for a in tensors_of(data).values()) / 1e6
    assert f"needs up to {need:.0f} MB" in message and "MB are free" in message
    assert not cache.entry_dir(key).exists()
    assert list(cache.tmp_dir.iterdir()) == []
    # A folder under the final name without its sidecar (e.g. a partial copy) is no entry.
    cache.entry_dir(key).mkdir()
    np.save(cache.entry_dir(key) / "image.npy", data)
    assert not cache.has_entry(key)


def test_stale_temporary_folders_are_swept_but_fresh_ones_kept(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    stale = cache.tmp_dir / "deadbeef.123.aaaa"
    fresh = cache.tmp_dir / "cafe.456.bbbb"
    stale.mkdir()
    fresh.mkdir()
    two_days_ago = os.path.getmtime(stale) - 2 * 24 * 3600
    os.utime(stale, (two_days_ago, two_days_ago))
    cache.write_entry(key_of("sub-01"), tensors_of(data), meta_of("sub-01", data, affine))
    assert not stale.exists() and fresh.exists()


def test_existing_entry_wins_unless_replaced(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    cache.write_entry(key, tensors_of(data), meta_of("sub-01", data, affine))
    first = checksum_file(cache.tensor_path(key, "image"))
    cache.write_entry(key, tensors_of(data * 2 + 1), meta_of("sub-01", data, affine))
    assert checksum_file(cache.tensor_path(key, "image")) == first
    cache.write_entry(key, tensors_of(data[::-1]), meta_of("sub-01", data, affine), replace=True)
    assert checksum_file(cache.tensor_path(key, "image")) != first
    assert cache.has_entry(key, verify=True)


def test_extra_files_are_atomic_listed_and_verified(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    text = "#Insight Transform File V1.0\n#Transform 0\nTransform: Euler3DTransform_double_3_3\n"
    cache.write_entry(
        key, tensors_of(data), meta_of("sub-01", data, affine),
        extra_files={"transform.tfm": text},
    )
    path = cache.entry_dir(key) / "transform.tfm"
    assert path.read_text() == text
    meta = cache.read_meta(key)
    assert set(meta["files"]) == {"image", "valid", "label"}
    assert meta["extra_files"]["transform.tfm"]["xxh3_128"] == checksum_file(path)
    path.write_text(text.replace("V1.0", "V9.9"))
    assert not cache.has_entry(key, verify=True)
    for bad in ("../escape.txt", "meta.json", "image.npy", ".hidden"):
        with pytest.raises(ValueError, match="must be a plain file name"):
            cache.write_entry(
                key_of("sub-02"), tensors_of(data), meta_of("sub-02", data, affine),
                extra_files={bad: "x"},
            )


def test_meta_must_hold_the_required_fields(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    meta = meta_of("sub-01", data, affine)
    del meta["pipeline_hash"], meta["provenance"]
    with pytest.raises(ValueError, match=r"meta lacks \['pipeline_hash', 'provenance'\]"):
        cache.write_entry(key_of("sub-01"), tensors_of(data), meta)


def test_index_keeps_one_entry_per_subject_with_its_split(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    old, new, other = key_of("sub-01", 1), key_of("sub-01", 2), key_of("sub-02")
    cache.update_index(
        cache.write_entry(k, tensors_of(data), meta_of(s, data, affine)).with_split(split)
        for k, s, split in [(old, "sub-01", "train"), (other, "sub-02", "val")]
    )
    assert [(r.subject_id, r.split) for r in cache.entries()] == [
        ("sub-01", "train"), ("sub-02", "val")
    ]
    replacement = cache.write_entry(new, tensors_of(data + 1), meta_of("sub-01", data, affine))
    cache.update_index([replacement.with_split("test")])
    assert set(cache.read_index()) == {new, other}
    assert [r.key for r in cache.entries("test")] == [new]
    cache.update_index([], retire=[("sub-02", "")])
    assert cache.entries() == [IndexEntry.from_json(new, cache.read_index()[new])]


def test_new_cache_refuses_a_foreign_folder(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "holiday.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(CacheError, match="is not empty and is not an mriprep cache"):
        Cache(folder, create=True)
    with pytest.raises(CacheError, match="create one with `mriprep run MANIFEST -o CACHE`"):
        Cache(tmp_path / "nothing")
    # A layout half made by a concurrent creator is accepted, not taken for foreign.
    racing = tmp_path / "racing"
    (racing / "entries" / ".tmp").mkdir(parents=True)
    Cache(racing, create=True)
    assert json.loads((racing / "mriprep-cache.json").read_text())["format"] == "mriprep-cache"


def _writer(root, worker, subjects, data, affine, barrier):
    cache = Cache(root, create=True)
    barrier.wait()
    for subject in subjects:
        key = key_of(subject)
        entry = cache.write_entry(key, tensors_of(data), meta_of(subject, data, affine))
        cache.update_index([entry.with_split(f"w{worker}")])


def test_two_processes_writing_one_cache_leave_it_whole(tmp_path, brain):
    data, affine = brain
    root = tmp_path / "shared"
    subjects = [f"sub-{i:02d}" for i in range(12)]
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    # Both writers cover every subject (same keys, same content), in opposite orders,
    # so that entry renames and index updates collide as often as possible.
    procs = [
        ctx.Process(target=_writer, args=(root, w, order, data, affine, barrier))
        for w, order in enumerate([subjects, subjects[::-1]])
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    cache = Cache(root)
    refs = cache.entries()
    assert [r.subject_id for r in refs] == subjects
    assert all(cache.has_entry(r.key, verify=True) for r in refs)
    assert sorted(p.name for p in cache.entries_dir.iterdir()) == sorted(
        [".tmp"] + [r.key for r in refs]
    )
    assert list(cache.tmp_dir.iterdir()) == []


def test_the_header_a_manifest_row_chose_is_part_of_the_key():
    from mriprep.cache import entry_key

    hashes = {"image": "a" * 64}
    before = entry_key("sub-01", "", hashes, "p" * 64)
    # FastSurfer's rule keeps the key every cache had before the choice existed.
    assert entry_key("sub-01", "", hashes, "p" * 64, header="auto") == before
    assert entry_key("sub-01", "", hashes, "p" * 64, header="") == before
    sform = entry_key("sub-01", "", hashes, "p" * 64, header="sform")
    qform = entry_key("sub-01", "", hashes, "p" * 64, header="qform")
    assert len({before, sform, qform}) == 3
