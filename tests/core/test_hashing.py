"""The two file digests against their libraries, on a file larger than one read chunk."""

import hashlib

import numpy as np
import xxhash

from mriprep.core.hashing import CHUNK_BYTES, checksum_file, file_checksum, sha256_file


def _file_of_chunks(tmp_path, n_bytes):
    path = tmp_path / "blob.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, n_bytes, dtype=np.uint8).tobytes())
    return path


def test_sha256_file_matches_hashlib(tmp_path):
    path = _file_of_chunks(tmp_path, 2 * CHUNK_BYTES + 17)
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_checksum_matches_xxh3_of_the_whole_file_with_any_buffer(tmp_path):
    path = _file_of_chunks(tmp_path, CHUNK_BYTES + 5)
    expected = xxhash.xxh3_128(path.read_bytes()).hexdigest()
    assert checksum_file(path) == expected
    # A buffer that does not divide the file still covers every byte once.
    assert file_checksum(path, bytearray(4093)) == (expected, CHUNK_BYTES + 5)


def test_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert file_checksum(path) == (xxhash.xxh3_128(b"").hexdigest(), 0)
    assert sha256_file(path) == hashlib.sha256(b"").hexdigest()
