"""An entry's files: checksums from memory and pages dropped from the page cache."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mriprep.cache import Cache, file_record, npy_checksum
from mriprep.core.hashing import checksum_file

from .conftest import key_of, meta_of, tensors_of


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
