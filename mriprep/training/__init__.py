"""Training-side access to a cache: :class:`MRIDataset` and :func:`make_dataloader`;
and training that names its NaN: :mod:`~mriprep.training.guards` (:class:`NaNGuard`,
:class:`NonFiniteLocator`, :func:`clamp_gradients`, :class:`GradientClipper`) and
:mod:`~mriprep.training.losses` (:class:`DiceLoss`, :class:`CrossEntropyLoss`, masked and
finite by construction).

    >>> from mriprep import MRIDataset, make_dataloader
    >>> ds = MRIDataset("cache/", split="train", mode="patch", patch_size=96)
    >>> for batch in make_dataloader(ds, seed=0):
    ...     image = batch["image"].to("cuda", non_blocking=True)   # [B, 1, 96, 96, 96]

Items are dicts: ``image`` float32 ``[C, X, Y, Z]`` (``[1, px, py, pz]`` in patch mode,
``[2k+1, H, W]`` in slice mode), ``valid`` bool with the spatial shape, ``label`` int64
with the spatial shape and no channel (what ``torch.nn.functional.cross_entropy`` takes)
when the cache has label maps, ``subject_id``, ``session_id``, the ``affine`` of the
item's own voxels, and ``location`` (patch start voxel, patch mode) or ``slice_index``
(slice modes). Thick-slice mode (FastSurfer's training items,
:mod:`~mriprep.training.thick_slices`) gives ``label`` as the classes of a label table
and adds its ``weight`` map and ``zoom``. ``channel_first=True`` gives ``valid`` and
``label`` a channel axis and ``meta_tensor=True`` makes MONAI MetaTensors of them;
:mod:`~mriprep.training.interop` has those and the TorchIO side
(:func:`to_torchio_subject`, :func:`torchio_subjects`).

How the loader reads, and why
-----------------------------
Opening a dataset reads ``index.json`` only (slice mode also reads each valid mask once,
to list the usable slices). A ``.npy`` tensor is memory-mapped read-only and never
unpickled (:func:`mriprep.cache.formats.npy.open_npy`) when an item is read, and copied
once, straight from the page cache into the batch tensor: no per-item arrays, no collate
copy.
A compressed tensor (``.b2nd``, :mod:`mriprep.cache.formats`) decodes only the chunks of
axis-0 slices the item touches, then is copied (and cast) into the batch tensor the same
way; ``make bench`` (storage) measures what that costs against the ``.npy``.

The read path decides the speed: a copy into fresh memory (a new tensor, or the
shared-memory tensor a process worker must send) pays a page fault for every 4 KiB page
and runs several times slower than a copy into a *reused* buffer, from the memory map or
with ``readinto`` (within about a tenth of each other, so the memory map, which reads only
what a patch or slice touches, stays). Measured: ``benchmarks/bench_loader.py``;
docs/benchmarks.md, "Reading for training".

So the default backend, ``"threads"``, reads whole batches from a small pool of threads
(the copies release the GIL) into reused buffers: on a CUDA machine, buffers from torch's
pinned caching host allocator (one copy from page cache into pinned memory, then a
non-blocking copy to the GPU with :func:`to_device`); on a CPU-only machine, a pool of
numpy-backed buffers that is only recycled once nothing outside the pool refers to them,
so a batch a caller keeps is never overwritten. The ``"processes"`` backend is the
standard torch DataLoader with process workers, for CPU-heavy ``transform`` callables that
need to escape the GIL; its workers still read each batch straight into one
shared-memory tensor (no collate copy). ``backend="auto"`` picks threads without a
transform and processes with one.

Randomness
----------
Every random draw (patch centres, shuffling) comes from ``(seed, epoch, index)``, never
from a worker's global state: the same seed gives the same batches in every run, with
either backend and any worker count. :class:`EpochSampler` hands the dataset
:class:`SampleKey` s carrying the epoch's draw seed; ``dataset[i]`` is item ``i`` of epoch 0.
A ``transform`` that draws from global RNGs is reproducible with the processes backend
only (torch seeds each worker from the loader's seeded generator).
"""

from mriprep.training.buffers import BufferPool, collate
from mriprep.training.dataset import MRIDataset
from mriprep.training.guards import (
    GradientClipper,
    NaNGuard,
    NonFiniteError,
    NonFiniteLocator,
    clamp_gradients,
)
from mriprep.training.interop import to_torchio_subject, torchio_subjects
from mriprep.training.loader import (
    BACKENDS,
    DEFAULT_BATCH_SIZE,
    MRIDataLoader,
    default_num_workers,
    make_dataloader,
    to_device,
)
from mriprep.training.losses import CrossEntropyLoss, DiceLoss
from mriprep.training.options import DEFAULT_PATCH_SIZE, MODES
from mriprep.training.sampling import EpochSampler, SampleKey, draw_seed

__all__ = [
    "BACKENDS", "DEFAULT_BATCH_SIZE", "DEFAULT_PATCH_SIZE", "MODES", "BufferPool",
    "CrossEntropyLoss", "DiceLoss", "EpochSampler", "GradientClipper", "MRIDataLoader",
    "MRIDataset", "NaNGuard", "NonFiniteError", "NonFiniteLocator", "SampleKey",
    "clamp_gradients", "collate", "default_num_workers", "draw_seed", "make_dataloader",
    "to_device", "to_torchio_subject", "torchio_subjects",
]
