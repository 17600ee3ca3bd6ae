"""File digests, the one home of both kinds mriprep records.

* SHA-256 identifies *inputs* (scans, label maps, templates): a cache key and a pipeline
  hash are built from it, so it must resist crafted collisions.
* XXH3-128 (``xxhash``) checksums *tensors* in the cache: not a security hash, but it
  detects flipped bits at memory speed, which is what a pre-training check needs.

Every digest mriprep records or derives a number from is made here, so that its recipe
is written once: a JSON document is hashed as its ``json.dumps(..., sort_keys=True)``
text (:func:`hash_json`: cache keys, pipeline hashes, label tables). The values are
pinned by ``tests/core/test_hashing.py``: a change here would orphan every cache.

Files are streamed through one reusable buffer, never read whole.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, BinaryIO, Callable

import xxhash

# 4 MiB: large enough that the per-call overhead vanishes, small enough to stay in cache.
CHUNK_BYTES = 4 << 20


def sha256_hex(*parts: Any) -> str:
    """SHA-256 hex digest of ``parts`` fed in order: text as UTF-8, anything else as its
    bytes (``bytes``, a ``memoryview``, a C-contiguous array)."""
    return _sha256(parts).hexdigest()


def sha256_bytes(*parts: Any) -> bytes:
    """SHA-256 digest, as raw bytes, of ``parts`` (as :func:`sha256_hex` takes them): for
    a number drawn from it (a split draw, a random state)."""
    return _sha256(parts).digest()


def _sha256(parts: tuple) -> Any:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
    return digest


def hash_json(document: Any, default: Callable[[Any], Any] | None = None) -> str:
    """SHA-256 hex digest of ``document`` as ``json.dumps(document, sort_keys=True)``
    writes it (``default`` as ``json.dumps`` takes it): the identity of a configuration,
    the same whatever order its keys were built in."""
    return sha256_hex(json.dumps(document, sort_keys=True, default=default))


def short_digest(*parts: bytes | str) -> bytes:
    """A 16-byte BLAKE2b digest of ``parts`` (text as UTF-8): a fast stable seed of an id,
    never recorded as an identity."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
    return digest.digest()


def new_checksum(first: bytes | memoryview = b"") -> Any:
    """A running XXH3-128 tensor checksum (``update``, ``hexdigest``), fed ``first``:
    for a caller that meets the bytes piece by piece (a file read once for its checksum
    and its values, an array hashed from memory)."""
    return xxhash.xxh3_128(first)


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
    digest = new_checksum()
    with open(path, "rb", buffering=0) as fh:
        size = digest_stream(fh, digest, buffer)
    return digest.hexdigest(), size


def checksum_file(path: str | os.PathLike) -> str:
    """XXH3-128 hex digest of a file's bytes: the tensor checksum recorded in the index."""
    return file_checksum(path)[0]
