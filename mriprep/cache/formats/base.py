"""What a storage format of a cached tensor must do: :class:`TensorFormat`, and
:class:`FileScan`, what one checking pass over a stored file learned.

A format is one way of laying a tensor out in a file, known by its suffix (``.npy``,
``.b2nd``); a pipeline's ``compression`` names one of its *choices* (``none``; ``lz4`` or
``zstd``), and a format may offer several (blosc2 has a codec per choice, and reads any
of them back by its suffix alone). Subclasses write two methods, :meth:`~TensorFormat.write`
and :meth:`~TensorFormat.open`; the rest has a general default that a format replaces
only to be faster (the ``.npy`` checksums a file it just wrote from memory and checks it
in one read; blosc2 decodes a volume chunk by chunk into the caller's buffer).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Protocol

import numpy as np

from mriprep.core.hashing import CHUNK_BYTES, file_checksum

# The codes a format reports about its file in a check (``mriprep check`` names them).
UNREADABLE = "tensor-unreadable"
LAYOUT = "tensor-layout"
FILE_SIZE = "file-size"


class RowSink(Protocol):
    """What a checking pass feeds the decoded values to: whole first-axis slices, in
    order (``first_row`` is the index of ``rows[0]``)."""

    def add(self, rows: np.ndarray, first_row: int) -> None: ...


# Told the dtype and shape once the file is open; returns the sink of its rows (or None
# when nobody wants the values).
StartScan = Callable[[np.dtype, tuple], "RowSink | None"]


@dataclass
class FileScan:
    """What one checking pass over a stored tensor learned: the XXH3-128 checksum and
    size of the file's bytes (what the index records), its dtype and shape as the file
    says, ``(code, detail)`` problems with the file itself, and whether every slice was
    decoded and handed to the sink (``complete``: only then is the analysis whole)."""

    checksum: str | None = None
    bytes_read: int = 0
    dtype: np.dtype | None = None
    shape: tuple[int, ...] | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = False


class TensorFormat:
    """One storage format of cached tensors.

    Attributes
    ----------
    suffix : str
        The file suffix that says a file is in this format (``".npy"``).
    choices : tuple of str
        The names a pipeline's ``compression`` may give to choose it (``("none",)``;
        blosc2: ``("lz4", "zstd")``); unique across the registered formats.
    description : str
        How messages name a file of this format (``"a .npy"``, ``"a blosc2 array"``).
    """

    suffix: str = ""
    choices: tuple[str, ...] = ()
    description: str = ""

    def write(self, fh: BinaryIO, array: np.ndarray, choice: str) -> None:
        """Write the C-contiguous ``array`` losslessly, as ``choice`` asks, through the
        open binary file ``fh`` (the caller flushes and fsyncs it). Errors of the disk
        (a full one: ``OSError`` ENOSPC) must come out as they are."""
        raise NotImplementedError

    def open(self, path: str | os.PathLike) -> Any:
        """The tensor as a read-only array-like that decodes only what is sliced from it:
        it has ``shape``, ``dtype`` and ``array[region] -> numpy.ndarray`` (``[...]`` for
        all of it). What the Dataset reads patches and slices from."""
        raise NotImplementedError

    def read(self, path: str | os.PathLike, mmap: bool = True) -> np.ndarray:
        """The whole tensor as a NumPy array (``mmap``: memory-mapped where the format
        can be; the default decodes it)."""
        return np.asarray(self.open(path)[...])

    def decode_into(self, stored: Any, dst: np.ndarray,
                    copy: Callable[[np.ndarray, np.ndarray], None] = np.copyto) -> None:
        """Put all of ``stored`` (what :meth:`open` gave) into ``dst``, its shape, any
        dtype, through ``copy(dst, values)``, which casts."""
        copy(dst, stored[...])

    def written_checksum(self, path: Path, array: np.ndarray, size: int) -> str | None:
        """The checksum of the file ``path`` (``size`` bytes) this format just wrote from
        ``array``, computed without reading the file back; None when it cannot tell
        (the caller then reads and hashes the file)."""
        return None

    def rows_per_read(self, stored: Any) -> int:
        """First-axis slices a checking pass decodes at a time (default: about
        ``CHUNK_BYTES`` of values)."""
        shape = tuple(stored.shape)
        row_bytes = math.prod(shape[1:]) * np.dtype(stored.dtype).itemsize
        return max(1, CHUNK_BYTES // max(1, row_bytes))

    def scan(self, path: Path, buffer: bytearray | None, start: StartScan) -> FileScan:
        """One checking pass over the file ``path``: its checksum and size, then its
        values decoded :meth:`rows_per_read` slices at a time and handed to the sink
        ``start(dtype, shape)`` returns. ``buffer`` is scratch space to read through.

        A file that cannot be opened or decoded is an ``UNREADABLE`` problem (the checksum
        still stands). One that decodes into other values without an error (a flipped
        byte inside a compressed stream) is caught by the checksum, which the caller
        compares with the index's.
        """
        scan = FileScan()
        scan.checksum, scan.bytes_read = file_checksum(path, buffer)
        try:
            stored = self.open(path)
            dtype, shape = np.dtype(stored.dtype), tuple(int(n) for n in stored.shape)
        except Exception as exc:  # noqa: BLE001 - a decoder raises what it likes
            scan.problems.append((UNREADABLE, f"cannot be opened as {self.description} "
                                              f"({exc}); the file is damaged: rebuild the "
                                              "entry"))
            return scan
        scan.dtype, scan.shape = dtype, shape
        sink = start(dtype, shape)
        step = self.rows_per_read(stored) if shape else 1
        row = 0
        try:
            for row in range(0, (shape[0] if shape else 1) if math.prod(shape) else 0, step):
                rows = stored[row:row + step] if shape else np.asarray(stored[...]).reshape(1)
                if sink is not None:
                    sink.add(np.ascontiguousarray(rows), row)
        except Exception as exc:  # noqa: BLE001 - as above
            scan.problems.append((UNREADABLE, f"cannot be decoded from slice {row} on "
                                              f"({exc}); the stored stream is damaged: "
                                              "rebuild the entry"))
            return scan
        scan.complete = True
        return scan
