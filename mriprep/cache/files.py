"""How an entry's files are recorded and let go of: the sidecar's record of a file (its
checksum computed from memory where the file's format can) and dropping written pages
from the page cache (an entry is read at training time, not now)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mriprep.cache.formats import find_format
from mriprep.core.hashing import checksum_file


def drop_written_pages(fd: int) -> None:
    """Let the kernel drop a file's pages from the page cache once they are on disk.

    A cache entry is written once and read at training time, usually long after or on
    another machine: its pages are not worth keeping here. Kept, they also made every
    entry cost fresh memory. A worker keeps its own freed memory for the next subject
    (see ``mriprep.run.worker_setup``), so the page cache grew out of memory the kernel had
    not touched for a while, which on a VM is slow to fault in (the hypervisor hands it
    back). The next entry now reuses the dropped pages (docs/benchmarks.md, "Cache and
    runner"). Only clean pages can be dropped, so this follows the fsync. Without
    ``posix_fadvise`` (macOS) it does nothing.
    """
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def file_record(path: Path, array: np.ndarray | None = None) -> dict[str, Any]:
    """How the sidecar lists one file of an entry: name, size, checksum (and for a
    tensor, its dtype and shape).

    A tensor just saved from ``array`` is checksummed from memory when its format can
    tell the file is what it wrote (:meth:`TensorFormat.written_checksum`: a ``.npy``);
    any other file is read and hashed.
    """
    record: dict[str, Any] = {"file": path.name}
    size = path.stat().st_size
    checksum = None
    if array is not None:
        record.update(dtype=str(array.dtype), shape=list(array.shape))
        fmt = find_format(path)
        if fmt is not None:
            checksum = fmt.written_checksum(path, array, size)
    record.update(bytes=size, xxh3_128=checksum or checksum_file(path))
    return record
