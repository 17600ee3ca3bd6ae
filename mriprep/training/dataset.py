"""The cache as a torch Dataset: :class:`MRIDataset` and how it reads items.

Items are read straight into batch tensors handed out by an allocator (reused,
shared-memory or fresh buffers, see :mod:`mriprep.training.buffers`); the entries and
options are checked at opening (:mod:`~mriprep.training.entries`,
:mod:`~mriprep.training.options`). :mod:`mriprep.training` explains the read path and
the randomness, and :mod:`mriprep.training.loader` drives it.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from mriprep.cache import Cache, IndexEntry
from mriprep.cache.formats import format_of, open_tensor
from mriprep.core.errors import CacheError
from mriprep.core.machine import default_process_workers
from mriprep.training.buffers import (
    Allocator,
    BufferPool,
    PreCollated,
    copy_into,
    fresh_tensor,
    shared_tensor,
)
from mriprep.training.entries import (check_files, leave_out_flagged, resolve_labels,
                                     split_entries)
from mriprep.training.interop import (
    as_meta_item,
    patch_affine,
    require_monai,
    slice_affine,
    torchio_subjects,
)
from mriprep.training.labels.table import LabelTable
from mriprep.training.labels.weights import WeightOptions
from mriprep.training.options import (
    MODES,
    as_channel_first,
    as_fraction,
    as_patch_size,
    as_positive_int,
    refuse_options_of_other_modes,
    refuse_renamed,
)
from mriprep.training.sampling import SampleKey, draw_seed
from mriprep.training.thick_slices import ThickSlices

# Random centre draws before falling back to listing candidate voxels: with a brain's
# valid mask or tissue labels a draw hits within a few tries and reads a few bytes.
_CENTRE_TRIES = 32
# Candidate centres kept per entry after a fallback scan (int16 triplets, 24 KB).
_MAX_CANDIDATES = 4096


class MRIDataset(Dataset):
    """A split of an mriprep cache as a map-style torch Dataset, read lazily.

    Parameters
    ----------
    cache_dir : path
        A cache folder written by ``mriprep run``.
    split : str
        The split to read (``"train"``, ``"val"``, ...). Every entry of the cache, in all
        splits, must come from one pipeline hash.
    manifest : path or Manifest, optional
        Read only the entries of this manifest's rows (a subject dropped from the cohort
        but still cached is not served); a row of ``split`` that is not cached is named
        in a warning. The split is still the index's.
    fold : int or str, optional
        K-fold cross-validation with the manifest's ``fold`` column (``mriprep splits
        --folds K``): ``split="train"`` reads the subjects of every other fold, ``"val"``
        those of fold ``fold``; another split (``"test"``) is read as without ``fold``.
        Needs ``manifest``.
    mode : {"volume", "patch", "slice", "thick_slice"}
        ``"volume"``: one item per entry, the whole volume ``[1, X, Y, Z]`` and its affine.
        ``"patch"``: ``samples_per_volume`` patches of ``patch_size`` per entry, each
        centred on a valid voxel; a ``foreground_fraction`` share of them centred on a
        voxel with label > 0. The centre of a patch is ``location + patch_size // 2``.
        ``"slice"``: one item per usable slice along ``axis``, with ``context`` neighbours
        on each side as channels (neighbours beyond the edge repeat the edge slice); the
        label is the cached FreeSurfer-numbered map. ``"thick_slice"``: FastSurfer's
        training items, one per kept slice of ``view``, with ``context`` neighbours each
        side, the slice's classes of ``table`` as ``label`` and its ``weight`` map
        (:mod:`~mriprep.training.thick_slices`); equal to the FastSurfer HDF5 export.
    patch_size : int or 3 ints, optional
        Patch mode only; default 96^3. Must fit inside every volume of the split.
    samples_per_volume : int, optional
        Patch mode only; default 4.
    foreground_fraction : float, optional
        Patch mode only; default 0. Needs label maps. A volume without any foreground
        voxel where a patch fits gets valid-centred patches instead.
    axis : int, optional
        Slice mode only; default 0 (sagittal in the cache's RAS order, and the axis whose
        slices are contiguous on disk: a slice along axis 2 touches every page of the
        volume).
    context : int, optional
        Slice and thick-slice modes: neighbouring slices on each side as channels
        (FastSurfer's ``thickness``); default 0 in slice mode, 3 in thick-slice mode.
    min_valid_fraction : float, optional
        Slice mode only; default 0.5. A *masked slice* is one whose valid mask is all
        False (what the mask-slices stage leaves on a zero-filled or artifact slice) or
        whose share of valid voxels is below this threshold (e.g. mostly outside the field
        of view). Masked slices are never yielded as the centre slice.
    view : {"coronal", "axial", "sagittal"}, optional
        Thick-slice mode only; default ``"coronal"``. FastSurfer's view of a conformed
        (LIA) cache; the sagittal classes merge left and right.
    table : LabelTable, optional
        Thick-slice mode only: FreeSurfer values to classes (and the rules before the
        lookup); default the shipped FastSurfer DKT table. Values it does not list are
        an error naming them; ``LabelTable(unknown="background")`` counts them as 0.
    weights : WeightOptions, optional
        Thick-slice mode only: FastSurfer's weight rules; default ``generate_hdf5``'s.
    blank_slice_threshold : float, optional
        Thick-slice mode only; default 50: slices whose class sum is at most this are
        left out, as FastSurfer leaves them out.
    absent_classes : {"error", "allow"}, optional
        Thick-slice mode only: a class of the table that no entry of the split holds is
        refused, naming the classes (a network never learns them), or (``"allow"``)
        named in a warning. Default: ``"error"`` for the ``"train"`` split, ``"allow"``
        for the others (a small validation split may lack a rare structure).
        ``label_rewrites`` then holds the voxels each rule before the lookup rewrote
        (rule -> voxels), and values the table does not list but counts as background
        are named in a warning.
    padded_size : int, optional
        Thick-slice mode only: every item padded with background (image 0, label 0,
        weight 0, not valid) to ``padded_size`` x ``padded_size`` at its first row and
        column, or cut there, as FastSurfer's ``PADDED_SIZE``, so that a cohort of
        mixed resolutions (``conform_min``: 256, 320, ... voxel cubes) batches
        together; each item's ``zoom`` says its voxel size. Default: no padding, and
        items of different sizes cannot share a batch.
    derived_dir : path, optional
        Thick-slice mode only: where the classes derived from the label maps are kept;
        default ``CACHE/derived`` (:mod:`~mriprep.training.labels.derived`). They are
        derived at opening where missing, in ``workers`` processes, and reused.
    workers : int, optional
        Thick-slice mode only: processes deriving classes at opening; default from the
        machine's cores.
    exclude_flagged : bool or {"warning", "error"}, optional
        Leave out the entries the last ``mriprep check`` flagged (its findings are kept
        in ``CACHE/check/findings.json``): ``True`` or ``"warning"``, those a warning
        or an error concerns alone; ``"error"``, errors only. Findings about several
        entries (an identity leak, a class absent from a split) and infos leave nothing
        out. What is left out is named in a warning and in ``excluded`` (entry name ->
        its codes). No record, or one older than an entry (rebuilt or made since the
        check), is an error naming the check to run. Default: False.
    labels : bool, optional
        Return ``label``. Default: when every entry of the split has a label map.
    channel_first : bool, optional
        Give ``valid`` and ``label`` a channel axis of 1, as ``image`` has (``[1, X, Y,
        Z]``): the layout MONAI's dictionary transforms and ``DiceLoss(to_onehot_y=True)``
        expect. Default: False (``[X, Y, Z]``, what ``cross_entropy`` takes), or True
        with ``meta_tensor``.
    meta_tensor : bool, optional
        Return ``image``, ``valid`` and ``label`` as MONAI ``MetaTensor`` s carrying the
        item's affine and its subject and session ids, so that ``Orientationd``,
        ``Spacingd`` and ``SaveImaged`` read the real geometry. Needs ``monai``
        installed, and channel-first; batches are collated by MONAI's
        ``list_data_collate`` (one copy per batch, which the plain tensors avoid).
    transform : callable, optional
        Applied to each item dict; returns a dict. Use ``make_dataloader(backend=
        "processes")`` (what ``"auto"`` picks) when it is CPU-heavy.
    seed : int
        Seed of the random draws when the dataset is indexed directly (``ds[i]`` is item
        ``i`` of epoch 0 of a loader with this seed).

    Raises
    ------
    CacheError
        The cache mixes pipeline hashes, the split is empty, or an entry's files are
        missing or truncated; in thick-slice mode also: label maps the table cannot map
        (every subject named with its reason), or a class no entry holds.
    ValueError
        An unknown mode, an option of another mode, or values that cannot work (patch
        larger than a volume, fraction outside [0, 1], ...).
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike,
        split: str = "train",
        mode: str = "volume",
        *,
        manifest=None,
        fold: int | str | None = None,
        patch_size: int | Sequence[int] | None = None,
        samples_per_volume: int | None = None,
        foreground_fraction: float | None = None,
        axis: int | None = None,
        context: int | None = None,
        min_valid_fraction: float | None = None,
        view: str | None = None,
        table: LabelTable | None = None,
        weights: WeightOptions | None = None,
        blank_slice_threshold: float | None = None,
        absent_classes: str | None = None,
        padded_size: int | None = None,
        derived_dir: str | os.PathLike | None = None,
        exclude_flagged: bool | str = False,
        labels: bool | None = None,
        channel_first: bool | None = None,
        meta_tensor: bool = False,
        transform: Callable[[dict], dict] | None = None,
        seed: int = 0,
        workers: int | None = None,
        **renamed,
    ):
        refuse_renamed(mode, renamed)
        if mode not in MODES:
            raise ValueError(f"MRIDataset: unknown mode {mode!r}; choose one of {MODES}")
        thick = dict(view=view, table=table, weights=weights,
                     blank_slice_threshold=blank_slice_threshold,
                     absent_classes=absent_classes, padded_size=padded_size,
                     derived_dir=derived_dir, workers=workers)
        refuse_options_of_other_modes(
            mode,
            patch=dict(
                patch_size=patch_size,
                samples_per_volume=samples_per_volume,
                foreground_fraction=foreground_fraction,
            ),
            slice=dict(axis=axis, min_valid_fraction=min_valid_fraction),
            thick_slice=thick,
        )
        if context is not None and mode not in ("slice", "thick_slice"):
            raise ValueError(f"MRIDataset: context only applies to mode='slice' or "
                             f"'thick_slice', not mode={mode!r}; drop it")
        if transform is not None and not callable(transform):
            raise ValueError(f"MRIDataset: transform must be callable, got {transform!r}")
        self.meta_tensor = bool(meta_tensor)
        self.channel_first = as_channel_first(channel_first, self.meta_tensor)
        self.cache = Cache(cache_dir)
        self.split = split
        self.mode = mode
        self.transform = transform
        self.seed = int(seed)
        self.fold = None if fold is None else str(fold)
        self.entries: list[IndexEntry] = split_entries(self.cache, split, manifest, self.fold)
        self.entries, self.excluded = leave_out_flagged(self.cache, split, self.entries,
                                                        exclude_flagged)
        self.pipeline_hash = self.entries[0].pipeline_hash
        if mode == "thick_slice" and labels is False:
            raise ValueError("MRIDataset: mode='thick_slice' serves classes and weights "
                             "from the label maps; drop labels=False")
        self.labels = resolve_labels(self.cache, split, self.entries, labels)
        check_files(self.cache, self.entries, self.labels)
        if self.meta_tensor:
            if mode == "thick_slice":
                raise ValueError("MRIDataset: meta_tensor=True is for the volume, patch "
                                 "and slice modes; thick slices are FastSurfer's plain "
                                 "tensors (each item carries its affine)")
            require_monai()
        self.shapes = [tuple(int(s) for s in e.shape) for e in self.entries]
        self.affines = [e.affine for e in self.entries]

        if mode == "patch":
            self.patch_size = as_patch_size(patch_size)
            self.samples_per_volume = as_positive_int(
                "samples_per_volume", 4 if samples_per_volume is None else samples_per_volume
            )
            self.foreground_fraction = as_fraction(
                "foreground_fraction", 0.0 if foreground_fraction is None else foreground_fraction
            )
            if self.foreground_fraction > 0 and not self.labels:
                raise ValueError(
                    f"MRIDataset: foreground_fraction={self.foreground_fraction} needs label "
                    f"maps, but split {split!r} of cache {self.cache.root} is read without "
                    "them; set foreground_fraction=0 or use a cache with label maps"
                )
            self._check_patch_fits()
        elif mode == "slice":
            self.axis = 0 if axis is None else axis
            if self.axis not in (0, 1, 2):
                raise ValueError(f"MRIDataset: axis must be 0, 1 or 2, got {self.axis!r}")
            self.context = 0 if context is None else context
            if not isinstance(self.context, int) or self.context < 0:
                raise ValueError(
                    f"MRIDataset: context (neighbouring slices on each side) must be an "
                    f"int >= 0, got {self.context!r}"
                )
            self.min_valid_fraction = as_fraction(
                "min_valid_fraction", 0.5 if min_valid_fraction is None else min_valid_fraction
            )
            self.slices = self._list_usable_slices()
        elif mode == "thick_slice":
            self.context = 3 if context is None else context
            if not isinstance(self.context, int) or self.context < 0:
                raise ValueError(
                    f"MRIDataset: context (neighbouring slices on each side, FastSurfer's "
                    f"thickness) must be an int >= 0, got {self.context!r}")
            self.thick = ThickSlices(
                self.cache, self.entries, split, view="coronal" if view is None else view,
                context=self.context, table=LabelTable() if table is None else table,
                weights=WeightOptions() if weights is None else weights,
                blank_slice_threshold=50 if blank_slice_threshold is None
                else blank_slice_threshold,
                derived_dir=derived_dir,
                absent_classes=(("error" if split == "train" else "allow")
                                if absent_classes is None else absent_classes),
                padded_size=padded_size,
                workers=default_process_workers() if workers is None else workers)
            self.view = self.thick.view
            self.slices = self.thick.slices
            self.label_rewrites = self.thick.moved
        self._init_runtime()

    # -- state that is rebuilt in every process --------------------------------------

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._candidates: dict[tuple[int, str], np.ndarray] = {}
        self._pool = BufferPool()

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_lock", "_candidates", "_pool"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    # -- the Dataset protocol --------------------------------------------------------

    def __len__(self) -> int:
        if self.mode == "volume":
            return len(self.entries)
        if self.mode == "patch":
            return len(self.entries) * self.samples_per_volume
        return len(self.slices)

    def __getitem__(self, key: int | SampleKey) -> dict[str, Any]:
        items = self.load_items([key], fresh_tensor)
        return items[0]

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> list[dict[str, Any]]:
        """A whole batch, read into one tensor per field (called by torch's DataLoader)."""
        worker = get_worker_info() is not None
        # In a worker the batch must end up in shared memory to reach the main process:
        # allocating it there now saves the copy torch would make when sending it.
        return self.load_items(keys, shared_tensor if worker else self._pool.allocate)

    def __repr__(self) -> str:
        return (
            f"MRIDataset({str(self.cache.root)!r}, split={self.split!r}, mode={self.mode!r}, "
            f"{len(self.entries)} entries, {len(self)} items)"
        )

    def to_torchio(self, transform=None):
        """This split as a ``torchio.SubjectsDataset``, what ``torchio.Queue`` takes
        (see :func:`~mriprep.training.interop.torchio_subjects`)."""
        return torchio_subjects(self, transform)

    def dry_iter(self):
        # TorchIO's Queue calls this on what it thinks is a SubjectsDataset.
        raise TypeError(
            "torchio.Queue needs a torchio.SubjectsDataset, not an MRIDataset: pass "
            "dataset.to_torchio() (mriprep.training.torchio_subjects) instead"
        )

    @property
    def subject_ids(self) -> list[str]:
        return [e.subject_id for e in self.entries]

    def item_shape(self, index: int) -> tuple[int, ...]:
        """Spatial shape of item ``index`` (what must match inside a batch)."""
        entry = int(self.slices[index, 0]) if self.mode in ("slice", "thick_slice") else index
        return self.entry_item_shape(entry)

    def entry_item_shape(self, entry: int) -> tuple[int, ...]:
        """Spatial shape of the items read from entry ``entry``."""
        if self.mode == "patch":
            return self.patch_size
        if self.mode == "thick_slice":
            return self.thick.planes[entry]
        shape = self.shapes[entry]
        if self.mode == "volume":
            return shape
        return tuple(s for a, s in enumerate(shape) if a != self.axis)

    def load_items(self, keys: Sequence[int | SampleKey], allocate: Allocator) -> list[dict]:
        """Read items into tensors from ``allocate(shape, dtype)``.

        Without a transform the items are views into one batch tensor per field, and the
        returned list carries the collated batch (``.batch``) for
        :func:`~mriprep.training.buffers.collate`. With a transform every item gets its
        own tensors and goes through the transform.
        """
        keys = [self._resolve_key(k) for k in keys]
        if self.transform is not None:
            return [self.transform(self._read([k], fresh_tensor)[0]) for k in keys]
        return self._read(keys, allocate)

    # -- reading -----------------------------------------------------------------------

    def _resolve_key(self, key: int | SampleKey) -> SampleKey:
        if isinstance(key, tuple):
            index, seed = int(key[0]), int(key[1])
        else:
            index, seed = int(key), draw_seed(self.seed, 0)
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {key!r} out of range for {self!r}")
        return SampleKey(index, seed)

    def _read(self, keys: list[SampleKey], allocate: Allocator) -> "PreCollated":
        spatial = {self.item_shape(k.index) for k in keys}
        if len(spatial) > 1:
            raise ValueError(
                f"cannot batch items of different shapes {sorted(spatial)} from cache "
                f"{self.cache.root}; use batch_size=1, patch mode, or one output grid"
            )
        shape = spatial.pop()
        b = len(keys)
        channels = 2 * self.context + 1 if self.mode in ("slice", "thick_slice") else 1
        mask_shape = (b, 1, *shape) if self.channel_first else (b, *shape)
        batch = {"image": allocate((b, channels, *shape), torch.float32),
                 "valid": allocate(mask_shape, torch.bool)}
        if self.labels:
            batch["label"] = allocate(mask_shape, torch.int64)
        if self.mode == "thick_slice":
            batch["weight"] = allocate(mask_shape, torch.float32)
        # Every field as [B, C, ...] numpy views, so that the readers copy into [j, c].
        out = {name: tensor.numpy().reshape(b, -1, *shape) for name, tensor in batch.items()}
        read_one = {"volume": self._read_volume, "patch": self._read_patch,
                    "slice": self._read_slice, "thick_slice": self._read_thick_slice,
                    }[self.mode]
        extras = [read_one(k.index, k.draw_seed, out, j) for j, k in enumerate(keys)]
        for name in ("subject_id", "session_id"):
            batch[name] = [x.pop(name) for x in extras]
        for name in extras[0]:
            batch[name] = torch.stack([torch.as_tensor(x[name]) for x in extras])
        items = PreCollated.of(batch)
        if self.meta_tensor:
            # A plain list: collate() hands MetaTensor items to MONAI's collate.
            return [as_meta_item(item) for item in items]
        return items

    def _map(self, entry: int, name: str):
        """One tensor of an entry as an array-like that reads only the region sliced from
        it: a read-only memory map of a ``.npy`` (never unpickled), or a blosc2 array that
        decodes only the chunks the region touches."""
        ref = self.entries[entry]
        # The file the index names (no stat per item to find out its format); its
        # existence and size were checked at opening (check_files).
        path = self.cache.entry_file(ref, name)
        try:
            array = open_tensor(path)
        except FileNotFoundError:
            raise CacheError(f"{path} (subject {ref.subject_id!r}) is gone since the "
                             "dataset was opened; rerun `mriprep run` to rebuild it") from None
        if array.shape != self.shapes[entry]:
            raise CacheError(
                f"{path} (subject {ref.subject_id!r}) has "
                f"shape {array.shape}, the index says {self.shapes[entry]}; the cache is "
                "corrupt: run `mriprep check` and rebuild the entry with `mriprep run --force`"
            )
        return array

    def _copy_region(self, entry: int, region: tuple, out: dict, j: int) -> None:
        for name, dst in out.items():
            copy_into(dst[j, 0], self._map(entry, name)[region])

    def _identity(self, entry: int) -> dict:
        ref = self.entries[entry]
        return {"subject_id": ref.subject_id, "session_id": ref.session_id}

    def _read_volume(self, entry: int, seed: int, out: dict, j: int) -> dict:
        for name, dst in out.items():  # the format decodes the volume into the batch
            fmt = format_of(self.cache.entry_file(self.entries[entry], name))
            fmt.decode_into(self._map(entry, name), dst[j, 0], copy_into)
        return {**self._identity(entry), "affine": self.affines[entry]}

    def _read_patch(self, index: int, seed: int, out: dict, j: int) -> dict:
        entry, sample = divmod(index, self.samples_per_volume)
        rng = np.random.default_rng([seed, index])
        wants_foreground = sample < round(self.foreground_fraction * self.samples_per_volume)
        centre = self._patch_centre(entry, rng, wants_foreground)
        start = centre - np.asarray(self.patch_size) // 2
        region = tuple(slice(int(s), int(s) + p) for s, p in zip(start, self.patch_size))
        self._copy_region(entry, region, out, j)
        return {**self._identity(entry), "location": np.asarray(start, dtype=np.int64),
                "affine": patch_affine(self.affines[entry], start)}

    def _read_slice(self, index: int, seed: int, out: dict, j: int) -> dict:
        entry, k = (int(v) for v in self.slices[index])
        depth = self.shapes[entry][self.axis]
        lead = (slice(None),) * self.axis
        # The slices with their neighbours in one read: a compressed image decodes each
        # chunk once per item, not once per channel.
        first, stop = max(k - self.context, 0), min(k + self.context + 1, depth)
        slab = self._map(entry, "image")[lead + (slice(first, stop),)]
        for c, offset in enumerate(range(-self.context, self.context + 1)):
            neighbour = min(max(k + offset, 0), depth - 1)
            copy_into(out["image"][j, c], slab[lead + (neighbour - first,)])
        for name in ("valid", "label"):
            if name in out:
                copy_into(out[name][j, 0], self._map(entry, name)[lead + (k,)])
        return {**self._identity(entry), "slice_index": k,
                "affine": slice_affine(self.affines[entry], self.axis, k)}

    def _read_thick_slice(self, index: int, seed: int, out: dict, j: int) -> dict:
        extra = self.thick.read(index, out, j)
        return {**self._identity(int(self.slices[index, 0])), **extra}

    # -- patch centres ---------------------------------------------------------------

    def _centre_box(self, entry: int) -> tuple[np.ndarray, np.ndarray]:
        """Voxels where a patch can be centred and still fit: [low, high) per axis."""
        size = np.asarray(self.patch_size)
        low = size // 2
        high = np.asarray(self.shapes[entry]) - size + low + 1
        return low, high

    def _patch_centre(self, entry: int, rng: np.random.Generator, foreground: bool):
        low, high = self._centre_box(entry)
        valid = self._map(entry, "valid")
        label = self._map(entry, "label") if foreground else None
        for _ in range(_CENTRE_TRIES):
            c = tuple(int(v) for v in rng.integers(low, high))
            if valid[c] and (label is None or label[c] > 0):
                return np.asarray(c)
        if foreground:
            candidates = self._centre_candidates(entry, "foreground")
            if len(candidates) == 0:
                # No labelled voxel where a patch fits: a valid-centred patch still trains.
                return self._patch_centre(entry, rng, foreground=False)
        else:
            candidates = self._centre_candidates(entry, "valid")
            if len(candidates) == 0:
                ref = self.entries[entry]
                raise CacheError(
                    f"subject {ref.subject_id!r} ({self.cache.entry_dir(ref.key)}) has no "
                    f"valid voxel where a {self.patch_size} patch fits; exclude it or use "
                    "a smaller patch_size"
                )
        return low + candidates[rng.integers(len(candidates))].astype(np.int64)

    def _centre_candidates(self, entry: int, kind: str) -> np.ndarray:
        """Up to _MAX_CANDIDATES centre voxels (offsets into the centre box), cached."""
        cached = self._candidates.get((entry, kind))
        if cached is not None:
            return cached
        low, high = self._centre_box(entry)
        box = tuple(slice(int(a), int(b)) for a, b in zip(low, high))
        mask = np.asarray(self._map(entry, "valid")[box])
        if kind == "foreground":
            mask = mask & (np.asarray(self._map(entry, "label")[box]) > 0)
        flat = np.flatnonzero(mask)
        step = max(1, math.ceil(len(flat) / _MAX_CANDIDATES))
        coords = np.stack(np.unravel_index(flat[::step], mask.shape), axis=1).astype(np.int16)
        with self._lock:
            self._candidates[(entry, kind)] = coords
        return coords

    # -- checks done once at opening -------------------------------------------------

    def _check_patch_fits(self) -> None:
        too_small = [
            (e.subject_id, shape)
            for e, shape in zip(self.entries, self.shapes)
            if any(p > s for p, s in zip(self.patch_size, shape))
        ]
        if too_small:
            listed = ", ".join(f"{sid} {shape}" for sid, shape in too_small[:5])
            raise ValueError(
                f"MRIDataset: patch_size {self.patch_size} is larger than {len(too_small)} "
                f"volume(s) of split {self.split!r} in cache {self.cache.root}: {listed}; "
                "choose a patch_size no larger than the smallest volume, or mode='volume'"
            )

    def _list_usable_slices(self) -> np.ndarray:
        """(entry, slice) pairs of every slice that is not masked, as an int array."""
        rows = []
        other = tuple(a for a in range(3) if a != self.axis)
        for entry in range(len(self.entries)):
            valid = self._map(entry, "valid")[...]
            count = np.count_nonzero(valid, axis=other)
            plane = math.prod(self.entry_item_shape(entry))
            usable = np.flatnonzero((count > 0) & (count >= self.min_valid_fraction * plane))
            rows.append(np.stack([np.full(len(usable), entry), usable], axis=1))
        slices = np.concatenate(rows).astype(np.int64)
        if len(slices) == 0:
            raise CacheError(
                f"split {self.split!r} of cache {self.cache.root} has no slice along axis "
                f"{self.axis} with at least {self.min_valid_fraction:.0%} valid voxels; "
                "lower min_valid_fraction or check the masks with `mriprep check`"
            )
        return slices
