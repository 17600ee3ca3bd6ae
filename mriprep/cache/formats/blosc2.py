"""blosc2 ``.b2nd`` (compression ``lz4`` or ``zstd``): lossless, in chunks of whole slices
that decode independently.

blosc2 itself checks nothing: a flipped byte inside a compressed chunk may decode to
other values without an error, so the XXH3-128 checksum of the file's bytes is what
catches it (``mriprep check`` and ``mriprep cache verify`` compare it).

Why blosc2: nnU-Net v2 stores its preprocessed data in it; its chunks decode
independently, so a patch or a slice decodes only the chunks it touches; its byte
shuffle makes intensities compress well at memory speed; and it is a maintained wheel
for every platform. The shipped pipelines use LZ4: it reaches their size goal and
decodes about twice as fast as Zstd (docs/benchmarks.md, "Cache and runner"; ``make
bench`` storage shows both).

blosc2 is imported only when a ``.b2nd`` is written or read: a cache of ``.npy`` files
needs none.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, BinaryIO, Callable

import numpy as np

from mriprep.cache.formats.base import TensorFormat

# Rows (slices along the first axis) per compressed chunk: about 0.7 MB of a float16
# template-sized volume, so that a 2.5D slice item decodes one chunk and a 96^3 patch
# 13 of 25 (a region decodes the chunks it touches, whole).
CHUNK_ROWS = 8
# Bytes of a block, the unit the codec works on inside a chunk (blosc2 picked about
# this for the demo's volumes itself); a block holds whole slices, a power of two of them,
# so that a decoded chunk is its slices in C order (see decode_into).
BLOCK_BYTES = 1 << 18
# Zstd level 1: levels 3-9 made the demo's images 2-4% smaller at 2-5x the write time.
_LEVELS = {"lz4": 5, "zstd": 1}

_SCRATCH = threading.local()


class Blosc2Format(TensorFormat):
    suffix = ".b2nd"
    choices = ("lz4", "zstd")
    description = "a blosc2 array"

    def write(self, fh: BinaryIO, array: np.ndarray, choice: str) -> None:
        """blosc2 writes its frame in memory (``cframe``) and the bytes go through
        ``fh``, so a full disk raises ``OSError`` (ENOSPC) here, like a ``.npy`` write,
        and never leaves a file that blosc2 reports as complete."""
        import blosc2

        codec = {"lz4": blosc2.Codec.LZ4, "zstd": blosc2.Codec.ZSTD}[choice]
        cparams = blosc2.CParams(codec=codec, clevel=_LEVELS[choice],
                                 filters=[_filter(array.dtype)],
                                 typesize=array.dtype.itemsize, nthreads=1)
        chunks = blocks = None
        if array.ndim and array.size:
            rows = min(CHUNK_ROWS, array.shape[0])
            plane = math.prod(array.shape[1:]) * array.itemsize
            block_rows = 1
            while block_rows * 2 <= rows and block_rows * 2 * plane <= BLOCK_BYTES:
                block_rows *= 2
            chunks, blocks = (rows,) + array.shape[1:], (block_rows,) + array.shape[1:]
        stored = blosc2.asarray(array, cparams=cparams, chunks=chunks, blocks=blocks)
        fh.write(stored.to_cframe())

    def open(self, path: str | os.PathLike) -> Any:
        """A blosc2 ``NDArray``: slicing it decodes only the chunks the region touches."""
        import blosc2

        # One decoding thread: the loader reads items in threads of its own, and blosc2's
        # default (as many as cores) made them compete (docs/benchmarks.md).
        return blosc2.open(str(path), mode="r", dparams=blosc2.DParams(nthreads=1))

    def decode_into(self, stored: Any, dst: np.ndarray,
                    copy: Callable[[np.ndarray, np.ndarray], None] = np.copyto) -> None:
        """One chunk at a time through a small per-thread buffer, ``copy`` casting each
        while it is in the CPU cache.

        Slicing (``stored[...]``) makes a new array of the whole volume, whose every page
        faults on first touch, so decoding into a reused chunk buffer is faster
        (docs/benchmarks.md, "Cache and runner"). It needs chunks and blocks of whole
        slices, which :meth:`write` writes; another layout is sliced whole.
        """
        shape = tuple(stored.shape)
        if (not stored.ndim or tuple(stored.chunks[1:]) != shape[1:]
                or tuple(stored.blocks[1:]) != shape[1:] or stored.chunks[0] % stored.blocks[0]):
            copy(dst, stored[...])
            return
        rows = int(stored.chunks[0])
        need = rows * math.prod(shape[1:]) * stored.dtype.itemsize
        buffer = getattr(_SCRATCH, "buffer", None)
        if buffer is None or buffer.nbytes < need:
            buffer = _SCRATCH.buffer = np.empty(need, dtype=np.uint8)
        chunk = buffer[:need].view(stored.dtype).reshape((rows,) + shape[1:])
        for i in range(stored.schunk.nchunks):
            stored.schunk.decompress_chunk(i, dst=chunk)
            first = i * rows
            n = min(rows, shape[0] - first)  # the last chunk is padded to the chunk shape
            copy(dst[first:first + n], chunk[:n])

    def rows_per_read(self, stored: Any) -> int:
        """One compressed chunk: a pass decodes each chunk once."""
        return int(stored.chunks[0]) if stored.ndim else 1


def _filter(dtype: np.dtype):
    """Byte shuffle for intensities (their high bytes repeat, the low ones are noise),
    none for masks and labels, which decode two to three times faster without it at
    about their size (measured: docs/benchmarks.md, "Cache and runner")."""
    import blosc2

    return blosc2.Filter.SHUFFLE if dtype.kind == "f" else blosc2.Filter.NOFILTER
