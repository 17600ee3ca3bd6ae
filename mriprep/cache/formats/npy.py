"""The plain ``.npy`` (compression ``none``): NumPy's format, memory-mapped read-only,
never unpickled; the format every cache held before compression existed.

Its bytes are the header, then the array's bytes in C order, so the writer checksums
them from memory instead of reading the file back, and a check reads the file once,
in chunks of whole slices that feed the checksum and the values' analysis together.
"""

from __future__ import annotations

import io
import math
import os
import threading
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mriprep.cache.formats.base import (
    FILE_SIZE,
    LAYOUT,
    UNREADABLE,
    FileScan,
    StartScan,
    TensorFormat,
)
from mriprep.core.hashing import CHUNK_BYTES, digest_stream, file_checksum, new_checksum


# NumPy parses a .npy header with ast.literal_eval, and CPython's AST builder counts its
# recursion depth per interpreter, not per thread: threads opening files at once can fail
# with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905).
# `make test` met it with Python 3.11.7 in the threads loader. Opening a map takes
# microseconds, so opening is serialised; reading the voxels is not.
_HEADER_LOCK = threading.Lock()


def open_npy(path: str | os.PathLike) -> np.memmap:
    """``path`` memory-mapped read-only, never unpickled; safe from any thread."""
    with _HEADER_LOCK:
        return np.load(path, mmap_mode="r", allow_pickle=False)


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
    digest = new_checksum(header)
    digest.update(array.reshape(-1).view(np.uint8))  # the bytes, without a copy
    return digest.hexdigest(), len(header) + array.nbytes


class NpyFormat(TensorFormat):
    suffix = ".npy"
    choices = ("none",)
    description = "a safe .npy"

    def write(self, fh: BinaryIO, array: np.ndarray, choice: str) -> None:
        np.save(fh, array, allow_pickle=False)

    def open(self, path: str | os.PathLike) -> Any:
        return open_npy(path)

    def read(self, path: str | os.PathLike, mmap: bool = True) -> np.ndarray:
        mapped = open_npy(path)
        return mapped if mmap else np.array(mapped)

    def written_checksum(self, path: Path, array: np.ndarray, size: int) -> str | None:
        """From memory, when the file starts with the header this module expects and has
        the expected size; None for any other file (a NumPy that lays out its header
        differently), which the caller reads and hashes."""
        if not array.flags.c_contiguous:
            return None
        header = npy_header(array)
        with open(path, "rb") as fh:
            written = fh.read(len(header))
        if written != header or size != len(header) + array.nbytes:
            return None
        return npy_checksum(array, header)[0]

    def scan(self, path: Path, buffer: bytearray | None, start: StartScan) -> FileScan:
        """One read of the file: the header is parsed by :func:`open_npy`, exactly as the
        Dataset opens the file, so a file that cannot be memory-mapped safely is reported
        here; then the data are read in chunks of whole slices into ``buffer``, each
        feeding the checksum and, while it is still in the CPU cache, the sink. A short
        file or bytes after the data are ``FILE_SIZE`` problems, Fortran order a
        ``LAYOUT`` one (no values analysed)."""
        scan = FileScan()
        try:
            mapped = open_npy(path)
            dtype, shape, offset = mapped.dtype, tuple(mapped.shape), int(mapped.offset)
            fortran = mapped.ndim > 1 and not mapped.flags.c_contiguous
            del mapped
        except (ValueError, OSError, EOFError) as exc:
            scan.problems.append(
                (UNREADABLE, f"cannot be opened as a safe .npy ({exc}); rebuild the entry"))
            scan.checksum, scan.bytes_read = file_checksum(path, buffer)
            return scan
        scan.dtype, scan.shape = dtype, shape
        if fortran:
            scan.problems.append((LAYOUT, "is stored in Fortran order; the cache writes C "
                                          "order only"))
        sink = None if fortran else start(dtype, shape)
        row_elems = math.prod(shape[1:])
        row_bytes = max(1, row_elems * dtype.itemsize)
        rows_total = (shape[0] if shape else 1) if row_elems else 0  # empty: no data
        if buffer is None or len(buffer) < row_bytes:
            buffer = bytearray(max(CHUNK_BYTES, row_bytes))
        view = memoryview(buffer)
        rows_per_chunk = max(1, len(buffer) // row_bytes)
        digest = new_checksum()
        complete = not fortran
        with open(path, "rb", buffering=0) as fh:
            header = fh.read(offset)
            digest.update(header)
            scan.bytes_read += len(header)
            row = 0
            while row < rows_total:
                want = min(rows_per_chunk, rows_total - row) * row_bytes
                got = _read_full(fh, view[:want])
                digest.update(view[:got])
                scan.bytes_read += got
                rows = got // row_bytes
                if rows and sink is not None:
                    chunk = np.frombuffer(buffer, dtype=dtype, count=rows * row_elems)
                    sink.add(chunk.reshape((rows,) + shape[1:]), row)
                row += rows
                if got < want:
                    scan.problems.append(
                        (FILE_SIZE, f"ends after {row} of {rows_total} slices (truncated)"))
                    complete, sink = False, None
                    break
            trailing = digest_stream(fh, digest, buffer)
            if trailing:
                scan.bytes_read += trailing
                scan.problems.append(
                    (FILE_SIZE, f"has {trailing} bytes after the array data (rewritten?)"))
        scan.checksum = digest.hexdigest()
        scan.complete = complete
        return scan


def _read_full(fh: BinaryIO, view: memoryview) -> int:
    """Fill ``view`` from ``fh`` unless the file ends first; return the bytes read."""
    total = 0
    while total < len(view):
        n = fh.readinto(view[total:])
        if not n:
            break
        total += n
    return total
