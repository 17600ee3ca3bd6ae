"""Where batches live: the tensors items are read into, and the collate that hands them over.

An *allocator*, ``allocate(shape, dtype) -> Tensor``, gives
:meth:`~mriprep.training.dataset.MRIDataset.load_items` one tensor per field of a batch:
:class:`BufferPool` reuses numpy-backed buffers once nothing refers to them,
:func:`pinned_tensor` hands out page-locked memory for a non-blocking copy to the GPU,
:func:`shared_tensor` shared memory that a worker process sends without a copy, and
:func:`fresh_tensor` new memory for an item of its own. The items of one batch come as a
:class:`PreCollated` list, which :func:`collate` turns back into that batch without a
copy, and :func:`copy_into` fills a batch tensor from a cached one. Why reuse matters is
in :mod:`mriprep.training`.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate

from mriprep.training.interop import holds_meta_tensors

_NUMPY_DTYPES = {torch.float32: np.float32, torch.bool: np.bool_, torch.int64: np.int64}

Allocator = Callable[[tuple, torch.dtype], torch.Tensor]


class BufferPool:
    """Reused numpy-backed tensors: a buffer returns to service once nothing refers to it.

    A tensor from :meth:`allocate` wraps a numpy array the pool keeps; the tensor's storage
    holds a reference to that array, and so does every view of it. When the reference
    count of the array is back to the pool's own, no batch, view or item uses it any more
    and it can be overwritten. Reuse avoids the page faults of fresh memory (4 KiB each;
    what that costs: docs/benchmarks.md, "Reading for training"). Beyond ``max_free``
    buffers of one shape the pool allocates without keeping, so a caller that holds every
    batch leaks nothing.
    """

    def __init__(self, max_free: int = 16):
        self.max_free = max_free
        self._buffers: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        probe = [np.empty(1)]
        self._idle_refs = sys.getrefcount(probe[0])

    def allocate(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        key = (tuple(shape), dtype)
        with self._lock:
            buffers = self._buffers.setdefault(key, [])
            for i in range(len(buffers)):
                if sys.getrefcount(buffers[i]) == self._idle_refs:
                    return torch.from_numpy(buffers[i])
            array = np.empty(shape, dtype=_NUMPY_DTYPES[dtype])
            if len(buffers) < self.max_free:
                buffers.append(array)
            return torch.from_numpy(array)


def fresh_tensor(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    # numpy advises huge pages for large arrays: fewer page faults than torch.empty.
    return torch.from_numpy(np.empty(shape, dtype=_NUMPY_DTYPES[dtype]))


def pinned_tensor(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A page-locked tensor, so that the copy to the GPU can be non-blocking."""
    # torch's caching host allocator recycles pinned blocks once freed and once the
    # non-blocking copies that read them have completed.
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def shared_tensor(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    # The way torch's default_collate allocates its output inside a worker.
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


class PreCollated(list):
    """Item dicts that are views into one batch, carrying that batch for :func:`collate`.

    A plain ``default_collate`` still sees a list of dicts and stacks them.
    """

    batch: dict[str, Any]

    @classmethod
    def of(cls, batch: dict[str, Any]) -> "PreCollated":
        n = len(batch["subject_id"])
        items = cls({name: value[j] for name, value in batch.items()} for j in range(n))
        items.batch = batch
        return items


def collate(items: list[dict]) -> dict[str, Any]:
    """Collate items: free for batches read by :meth:`MRIDataset.load_items`; MONAI's
    collate for MetaTensor items (torch's would keep one item's affine for the batch)."""
    if isinstance(items, PreCollated):
        return items.batch
    if items and isinstance(items[0], dict) and holds_meta_tensors(items[0]):
        from monai.data import list_data_collate

        return list_data_collate(items)
    return default_collate(items)


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src, casting="same_kind")``: a tensor read from the cache into
    its place in a batch. float16 (a float16 cache's images) goes through torch, whose
    cast is vectorised and several times faster than NumPy's (docs/benchmarks.md,
    "Reading for training"). A read-only
    source (a memory-mapped ``.npy``) stays with NumPy: torch would warn for it."""
    if src.dtype == np.float16 and dst.dtype == np.float32 and src.flags.writeable:
        torch.from_numpy(dst).copy_(torch.from_numpy(src))
    else:
        np.copyto(dst, src, casting="same_kind")
