"""The tensor cache: atomic entries, checksums, memory maps, index and concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
import os

import numpy as np
import pytest
from scipy import ndimage

from mriprep.cache import (
    Cache,
    IndexEntry,
    MalformedEntry,
    entry_key,
    file_record,
    npy_checksum,
)
from mriprep.core.errors import CacheError
from mriprep.core.hashing import checksum_file
from mriprep.inputs.templates import load_template


@pytest.fixture(scope="module")
def brain():
    """The MNI152 template at 4 mm: real anatomy, small enough for many entries."""
    mni = load_template("mni152")
    data = ndimage.zoom(mni.data, 0.25, order=1).astype(np.float32)
    affine = mni.affine.copy()
    affine[:3, :3] *= 4
    return data, affine


def tensors_of(data):
    return {
        "image": (data - data.mean()) / data.std(),
        "valid": data > 0,
        "label": np.digitize(data, [1, 4000, 7000]).astype(np.int16),
    }


def meta_of(subject, data, affine, session=""):
    return {
        "subject_id": subject,
        "session_id": session,
        "pipeline_name": "test",
        "pipeline_hash": "p" * 64,
        "inputs": {"image": {"path": f"/data/{subject}.nii.gz", "sha256": "0" * 64}},
        "affine": affine,
        "spacing": [4.0, 4.0, 4.0],
        "shape": list(data.shape),
        "provenance": [{"stage": "load", "params": {}, "metrics": {}}],
    }


def key_of(subject, version=0):
    return entry_key(subject, "", {"image": f"{version:064d}"}, "p" * 64)


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


def test_half_written_entries_are_never_visible(tmp_path, brain, monkeypatch):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    saved = []
    real_save = np.save

    def save_then_crash(fh, array, allow_pickle):
        if saved:
            raise OSError(28, "No space left on device")
        saved.append(True)
        real_save(fh, array, allow_pickle=allow_pickle)

    monkeypatch.setattr(np, "save", save_then_crash)
    with pytest.raises(OSError, match="No space left"):
        cache.write_entry(key, tensors_of(data), meta_of("sub-01", data, affine))
    monkeypatch.undo()
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


def test_index_entry_round_trips_and_refuses_a_malformed_document(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    cache.update_index(
        [cache.write_entry(key, tensors_of(data), meta_of("sub-01", data, affine),
                           extra_files={"transform.tfm": "x"}).with_split("train")]
    )
    doc = json.loads(cache.index_path.read_text())["entries"][key]
    entry = IndexEntry.from_json(key, doc)
    assert entry.to_json() == doc
    assert json.dumps(entry.to_json(), indent=1) == json.dumps(doc, indent=1)  # key order too
    assert (entry.subject_id, entry.session_id, entry.split) == ("sub-01", "", "train")
    assert entry.label_values is None and entry.has_label
    assert entry.extra_files["transform.tfm"].file == "transform.tfm"
    np.testing.assert_array_equal(entry.affine, affine)
    # Rewriting the index from its entries leaves the file byte for byte as it was.
    before = cache.index_path.read_bytes()
    cache.update_index(cache.entries())
    assert cache.index_path.read_bytes() == before
    broken = {k: v for k, v in doc.items() if k != "pipeline_hash"}
    with pytest.raises(MalformedEntry, match=f"index entry {key} lacks 'pipeline_hash'"):
        IndexEntry.from_json(key, broken)
    with pytest.raises(CacheError, match=r"'shape' is not a list"):
        IndexEntry.from_json(key, dict(doc, shape="64x64x64"))
    with pytest.raises(MalformedEntry, match=r"affine \[\[1, 0\]\] is not a finite 4x4 matrix"):
        IndexEntry.from_json(key, dict(doc, affine=[[1, 0]])).affine
    with pytest.raises(ValueError, match=r"valid lacks dtype/shape/bytes/xxh3_128"):
        IndexEntry.from_json(key, dict(doc, files=dict(doc["files"], valid={"file": "v"})))
    cache.index_path.write_text(json.dumps({"version": 1, "entries": {key: broken}}))
    with pytest.raises(CacheError, match="lacks 'pipeline_hash'"):
        cache.entries()


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


@pytest.mark.parametrize("array", [
    np.linspace(-1, 1, 5 * 6 * 7, dtype=np.float32).reshape(5, 6, 7),
    np.eye(9, dtype=bool)[None],
    np.arange(-500, 500, dtype=np.int16).reshape(10, 10, 10),
    np.zeros((4, 0, 3), dtype=np.float16),
], ids=["float32", "bool", "int16", "empty-float16"])
def test_tensor_checksums_from_memory_equal_the_saved_files(array, tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, array, allow_pickle=False)
    checksum, size = npy_checksum(array)
    assert (checksum, size) == (checksum_file(path), path.stat().st_size)
    # A file that is not what np.save wrote for the array is read, never trusted: a
    # longer one, and one of the right size whose header differs.
    saved = path.read_bytes()
    path.write_bytes(saved + b"\0")
    assert file_record(path, array)["xxh3_128"] == checksum_file(path)
    path.write_bytes(saved.replace(b"'descr'", b"'DESCR'", 1))
    assert file_record(path, array)["xxh3_128"] == checksum_file(path) != checksum


def _resident_pages(path) -> int:
    """How many of a file's pages are in the page cache (mincore on a fresh mapping)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as fh:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fh.fileno(), 0)
        try:
            vector = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, vector) == 0, ctypes.get_errno()
            return sum(byte & 1 for byte in vector.raw)
        finally:
            libc.munmap(address, size)


def _filesystem_type(path) -> str:
    best, kind = "", ""
    for line in open("/proc/mounts"):
        _, mount, fstype = line.split()[:3]
        if str(path).startswith(mount) and len(mount) > len(best):
            best, kind = mount, fstype
    return kind


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not os.path.exists("/proc/mounts"),
                    reason="Linux page cache")
def test_written_tensors_leave_the_page_cache(tmp_path, brain):
    # The writer drops an entry's pages once they are on disk (see drop_written_pages);
    # reading the file brings them back, which shows that the probe can see them.
    if _filesystem_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("a memory file system keeps its pages: they are the storage")
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    cache.write_entry(key, tensors_of(data), meta_of("sub-01", data, affine))
    path = cache.tensor_path(key, "image")
    pages = -(-path.stat().st_size // os.sysconf("SC_PAGE_SIZE"))
    assert pages > 100
    # The checksum step reads the header back: a page or a few of read-ahead return.
    assert _resident_pages(path) <= 0.1 * pages
    path.read_bytes()
    assert _resident_pages(path) >= 0.9 * pages
