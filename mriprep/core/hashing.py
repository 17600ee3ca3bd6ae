"""File digests, the one home of both kinds mriprep records.

* SHA-256 identifies *inputs* (scans, label maps, templates): a cache key and a pipeline
  hash are built from it, so it must resist crafted collisions.
* XXH3-128 (``xxhash``) checksums *tensors* in the cache: not a security hash, but it
  detects flipped bits at memory speed, which is what a pre-training check needs.

Files are streamed through one reusable buffer, never read whole.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, BinaryIO

import xxhash

# 4 MiB: large enough that the per-call overhead vanishes, small enough to stay in cache.
CHUNK_BYTES = 4 << 20


def digest_stream(fh: BinaryIO, digest: Any, buffer: bytearray | None = None) -> int:
    """Feed what is left of ``fh`` to ``digest`` (anything with ``update``) through
    ``buffer``; return the number of bytes read."""
    buffer = buffer if buffer is not None else bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    total = 0
    while got := fh.readinto(buffer):
        digest.update(view[:got])
        total += got
    return total


def sha256_file(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file's bytes (inputs and templates)."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        digest_stream(fh, digest)
    return digest.hexdigest()


def file_checksum(path: str | os.PathLike, buffer: bytearray | None = None) -> tuple[str, int]:
    """XXH3-128 hex digest and size of a file's bytes (the tensor checksum)."""
    digest = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as fh:
        size = digest_stream(fh, digest, buffer)
    return digest.hexdigest(), size


def checksum_file(path: str | os.PathLike) -> str:
    """XXH3-128 hex digest of a file's bytes: the tensor checksum recorded in the index."""
    return file_checksum(path)[0]
