"""Batches from an :class:`~mriprep.training.dataset.MRIDataset`: :func:`make_dataloader`.

The ``"threads"`` backend reads whole batches from a small thread pool into reused
buffers; ``"processes"`` is torch's DataLoader with worker processes. Why, and what each
costs, is in :mod:`mriprep.training`.
"""

from __future__ import annotations

import collections
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import DataLoader

from mriprep.core.machine import usable_cores
from mriprep.training.buffers import Allocator, BufferPool, collate, pinned_tensor
from mriprep.training.dataset import MRIDataset
from mriprep.training.sampling import EpochSampler

BACKENDS = ("auto", "threads", "processes")

#: Batch sizes that fit a 16 GB T4 training a 3D U-Net-sized network with mixed precision:
#: a whole 1 mm brain (~197x233x189) per item in volume mode leaves room for 2; 96^3
#: patches for 8; FastSurfer-style 2.5D slices (7 channels, 256x256) for 16, as
#: FastSurfer's own training configuration batches them.
DEFAULT_BATCH_SIZE = {"volume": 2, "patch": 8, "slice": 16, "thick_slice": 16}


# -- the loader --------------------------------------------------------------------------


class MRIDataLoader(DataLoader):
    """A torch DataLoader whose ``"threads"`` backend reads batches from a thread pool.

    With ``backend="processes"`` this is exactly torch's DataLoader. With ``"threads"``
    torch sees ``num_workers=0`` and :attr:`io_threads` threads read
    ``io_threads * io_prefetch`` batches ahead, in order, into reused (pinned when
    ``pin_memory``) buffers; the pool lives as long as the loader when
    :attr:`io_persistent`. Iteration, ``len``, ``batch_size``, ``sampler``,
    ``drop_last`` and ``pin_memory`` mean what they mean in torch.
    """

    def __init__(self, dataset, *, backend: str, num_workers: int, pin_memory: bool,
                 persistent_workers: bool, prefetch_factor: int | None, **kwargs):
        self.backend = backend
        threads = backend == "threads"
        self.io_threads = num_workers if threads else 0
        self.io_prefetch = prefetch_factor if threads else None
        self.io_persistent = persistent_workers if threads else False
        self._executor: ThreadPoolExecutor | None = None
        self._buffers = BufferPool(max_free=2 * (num_workers * (prefetch_factor or 2) + 2))
        super().__init__(
            dataset,
            num_workers=0 if threads else num_workers,
            pin_memory=pin_memory,
            persistent_workers=False if threads else persistent_workers,
            prefetch_factor=None if threads else prefetch_factor,
            **kwargs,
        )

    def __iter__(self):
        if self.backend != "threads":
            return super().__iter__()
        return _ThreadedBatches(self)

    def _allocator(self) -> Allocator:
        return pinned_tensor if self.pin_memory else self._buffers.allocate

    def _thread_pool(self) -> ThreadPoolExecutor:
        if not self.io_persistent:
            return ThreadPoolExecutor(self.io_threads, thread_name_prefix="mriprep-io")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.io_threads, thread_name_prefix="mriprep-io")
            weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)
        return self._executor


class _ThreadedBatches:
    """One epoch of a threads-backend loader: batches in sampler order, read ahead."""

    def __init__(self, loader: MRIDataLoader):
        self._loader = loader
        self._batches = iter(loader.batch_sampler)
        self._len = len(loader)
        self._pool = loader._thread_pool()
        self._allocate = loader._allocator()
        self._pending: collections.deque = collections.deque()
        for _ in range(loader.io_threads * loader.io_prefetch):
            self._submit_next()

    def _submit_next(self) -> None:
        keys = next(self._batches, None)
        if keys is not None:
            self._pending.append(self._pool.submit(self._load, keys))

    def _load(self, keys):
        loader = self._loader
        return loader.collate_fn(loader.dataset.load_items(keys, self._allocate))

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return self._len

    def __next__(self):
        if not self._pending:
            self.close()
            raise StopIteration
        future = self._pending.popleft()
        self._submit_next()
        try:
            return future.result()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Cancel the batches read ahead (after a ``break``); end a per-epoch pool."""
        while self._pending:
            self._pending.popleft().cancel()
        if not self._loader.io_persistent:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self):
        if hasattr(self, "_pending"):  # __init__ may have failed half-way
            self.close()


def default_num_workers(backend: str = "threads") -> int:
    """Workers from the cores this process may use.

    Processes: one core is left to the training loop, at most 8 (more only adds memory).
    Threads: 2 to 4, as reading is bound by memory bandwidth, not cores.
    """
    cores = usable_cores()
    if backend == "threads":
        return max(2, min(cores, 4))
    return max(1, min(cores - 1, 8))


def make_dataloader(
    dataset: MRIDataset,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    num_workers: int | None = None,
    seed: int = 0,
    *,
    backend: str = "auto",
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = None,
    drop_last: bool = False,
) -> MRIDataLoader:
    """A DataLoader over an :class:`MRIDataset`, tuned for speed and repeatable.

    Parameters
    ----------
    dataset : MRIDataset
    batch_size : int, optional
        Default by mode for a 16 GB T4 (:data:`DEFAULT_BATCH_SIZE`): 2 whole volumes,
        8 patches, 16 slices or thick slices. Volume and slice batches need one grid for all entries.
    shuffle : bool, optional
        Default: True for the ``"train"`` split, False otherwise.
    num_workers : int, optional
        Reader threads or worker processes; default from the machine's cores
        (:func:`default_num_workers`). 0 reads in the calling thread.
    seed : int
        Seeds the order, the random draws of every epoch and the workers' RNGs: the same
        seed gives the same batches in every run, whatever the backend and worker count.
    backend : {"auto", "threads", "processes"}
        ``"threads"`` is the fast path for reading (see :mod:`mriprep.training`);
        ``"processes"`` runs a CPU-heavy ``transform`` outside the GIL. ``"auto"``: threads
        unless the dataset has a transform.
    pin_memory : bool, optional
        Default: when CUDA is available. Batches then land in pinned memory; move them with
        :func:`to_device` (non-blocking).
    persistent_workers : bool, optional
        Default: True when there are workers. Refused with ``num_workers=0``.
    prefetch_factor : int, optional
        Batches read ahead per worker; default 2 when there are workers. Refused with
        ``num_workers=0``.
    drop_last : bool

    Returns
    -------
    MRIDataLoader
        A ``torch.utils.data.DataLoader``. Its sampler is an :class:`EpochSampler`: each
        iteration is the next epoch (``loader.sampler.set_epoch(n)`` to resume).
    """
    if not isinstance(dataset, MRIDataset):
        raise TypeError(
            f"make_dataloader needs an MRIDataset, got {type(dataset).__name__}; "
            "use torch.utils.data.DataLoader for other datasets"
        )
    if backend not in BACKENDS:
        raise ValueError(f"make_dataloader: unknown backend {backend!r}; choose one of {BACKENDS}")
    if backend == "auto":
        backend = "threads" if dataset.transform is None else "processes"
    if num_workers is None:
        num_workers = default_num_workers(backend)
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"make_dataloader: num_workers must be an int >= 0, got {num_workers!r}")
    if num_workers == 0:
        for name, value in (("persistent_workers", persistent_workers),
                            ("prefetch_factor", prefetch_factor)):
            if value:
                raise ValueError(
                    f"make_dataloader: {name}={value!r} needs workers, but num_workers=0 "
                    f"reads in the calling thread; drop {name} or set num_workers >= 1"
                )
        backend = "processes"  # torch's own single-process loading
    if prefetch_factor is not None and (
        not isinstance(prefetch_factor, int) or prefetch_factor < 1
    ):
        raise ValueError(
            f"make_dataloader: prefetch_factor must be an int >= 1, got {prefetch_factor!r}"
        )
    if num_workers > 0:
        persistent_workers = True if persistent_workers is None else bool(persistent_workers)
        prefetch_factor = 2 if prefetch_factor is None else prefetch_factor
    else:
        persistent_workers = False

    batch_size = DEFAULT_BATCH_SIZE[dataset.mode] if batch_size is None else batch_size
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"make_dataloader: batch_size must be an int >= 1, got {batch_size!r}")
    if drop_last and len(dataset) < batch_size:
        raise ValueError(
            f"make_dataloader: drop_last=True with batch_size={batch_size} and {len(dataset)} "
            f"items in {dataset!r} gives no batch at all; lower batch_size or drop_last=False"
        )
    if batch_size > 1:
        _check_one_grid(dataset)

    cuda = torch.cuda.is_available()
    if pin_memory is None:
        pin_memory = cuda
    elif pin_memory and not cuda:
        warnings.warn("make_dataloader: pin_memory=True without CUDA; pinning is skipped",
                      stacklevel=2)
        pin_memory = False

    shuffle = dataset.split == "train" if shuffle is None else bool(shuffle)
    return MRIDataLoader(
        dataset,
        backend=backend,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor,
        batch_size=batch_size,
        sampler=EpochSampler(len(dataset), shuffle=shuffle, seed=seed),
        collate_fn=collate,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(int(seed)),
    )


def to_device(batch: Any, device: str | torch.device, non_blocking: bool = True) -> Any:
    """Move every tensor of a batch to ``device``; non-blocking from pinned memory."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, list) and batch and isinstance(batch[0], torch.Tensor):
        return [to_device(v, device, non_blocking) for v in batch]
    return batch


def _check_one_grid(dataset: MRIDataset) -> None:
    if dataset.mode == "patch":
        return
    shapes = collections.defaultdict(list)
    for entry, ref in enumerate(dataset.entries):
        shapes[dataset.entry_item_shape(entry)].append(ref.subject_id)
    if len(shapes) > 1:
        listed = "; ".join(f"{s}: {', '.join(ids[:3])}" for s, ids in shapes.items())
        raise ValueError(
            f"make_dataloader: {dataset!r} holds {dataset.mode}s of {len(shapes)} shapes "
            f"({listed}), which cannot share a batch; use batch_size=1, mode='patch', or "
            "a pipeline that resamples every subject to one grid"
        )
