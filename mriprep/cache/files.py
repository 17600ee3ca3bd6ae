"""How an entry's files are written and recorded: the ``.npy`` header, checksums
computed from memory, the sidecar's record of a file, and dropping written pages from
the page cache (an entry is read at training time, not now)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from mriprep.core.hashing import checksum_file

def npy_header(array: np.ndarray) -> bytes:
    """The header ``np.save`` writes before the bytes of a C-contiguous ``array``."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    return header.getvalue()


def npy_checksum(array: np.ndarray, header: bytes | None = None) -> tuple[str, int]:
    """XXH3-128 and size of the ``.npy`` file ``np.save`` writes for a C-contiguous
    ``array`` (header, then the raw bytes), computed from memory; ``header`` is
    :func:`npy_header` of ``array`` when the caller has it already."""
    header = npy_header(array) if header is None else header
    digest = xxhash.xxh3_128(header)
    digest.update(array.reshape(-1).view(np.uint8))  # the bytes, without a copy
    return digest.hexdigest(), len(header) + array.nbytes


def drop_written_pages(fd: int) -> None:
    """Let the kernel drop a file's pages from the page cache once they are on disk.

    A cache entry is written once and read at training time, usually long after or on
    another machine: its pages are not worth keeping here. Kept, they also made every
    entry cost fresh memory. A worker keeps its own freed memory for the next subject
    (see ``mriprep.run.scheduling``), so the page cache grew out of memory the kernel had
    not touched for a while, and on the CI VM each such page cost 7 us (the hypervisor
    hands it back): 0.1 s to write a 60 MB entry. The next entry now reuses the dropped
    pages: 0.015 s. Only clean pages can be dropped, so this follows the fsync. Without
    ``posix_fadvise`` (macOS) it does nothing.
    """
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def file_record(path: Path, array: np.ndarray | None = None) -> dict[str, Any]:
    """How the sidecar lists one file of an entry: name, size, checksum (and for a
    tensor, its dtype and shape).

    A ``.npy`` just saved from ``array`` is hashed from memory rather than read back, when
    the file starts with the header this module expects and has the expected size; any
    other file (a compressed tensor, a NumPy that lays out its header differently) is
    read and hashed.
    """
    record: dict[str, Any] = {"file": path.name}
    size = path.stat().st_size
    checksum = None
    if array is not None:
        record.update(dtype=str(array.dtype), shape=list(array.shape))
        if array.flags.c_contiguous and path.suffix == ".npy":
            header = npy_header(array)
            with open(path, "rb") as fh:
                written = fh.read(len(header))
            if written == header and size == len(header) + array.nbytes:
                checksum = npy_checksum(array, header)[0]
    record.update(bytes=size, xxh3_128=checksum or checksum_file(path))
    return record
