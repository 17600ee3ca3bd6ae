"""FastSurfer's thick 2.5D slices of one view straight from the cache, without an HDF5.

``MRIDataset(cache, split, mode="slices", view="coronal", thickness=3)`` (or
:class:`ThickSliceDataset` directly) gives one item per kept slice of every entry:

    image        float32 [2t+1, H, W]  the slice and its neighbours (edge slices repeat,
                                       as FastSurfer pads), the cached values
    label        int64   [H, W]        the centre slice's classes of the view
    weight       float32 [H, W]        its weight map (computed over the whole volume)
    valid        bool    [H, W]        the cache's valid mask of the centre slice
    subject_id, session_id, slice_index

The slices and their order equal the FastSurfer HDF5 that ``mriprep export --format
fastsurfer-hdf5`` writes with the same options (both use
:mod:`mriprep.training.labels.subject`). Blank slices (class sum <= ``blt``) are left out.

Classes and weights of an entry are derived from its labels once and kept in the view's
voxel order with the image and valid mask (a slice is then one contiguous copy): in
memory for the ``keep_entries`` most recent entries (reading in entry order, as
FastSurfer's loader does without shuffling, derives each entry once; a shuffled order
derives again on most items, so use ``derived_dir`` there), or, with ``derived_dir``, as
memory-mapped ``.npy`` files written at opening (the "cached tensor" way: any order
costs the same). Batch with ``torch.utils.data.DataLoader``; ``make_dataloader`` serves
the other modes. Opening looks every entry's labels up once to list the kept
slices. Items per second both ways: docs/benchmarks.md (fastsurfer).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from mriprep.cache import Cache
from mriprep.cache.formats.npy import open_npy
from mriprep.core.atomic import atomic_path
from mriprep.core.errors import CacheError, InputError
from mriprep.core.hashing import sha256_hex
from mriprep.training.labels.slices import as_view, kept_slices, thick_slice
from mriprep.training.labels.subject import derive
from mriprep.training.labels.table import LabelTable
from mriprep.training.labels.weights import WeightOptions


_FIELDS = ("image", "classes", "weights", "valid")


class ThickSliceDataset(Dataset):
    """Thick slices of one view of a cache split (module docstring)."""

    def __init__(self, cache_dir: str | os.PathLike, split: str = "train",
                 mode: str = "slices", *, view: str = "coronal", thickness: int = 3,
                 table: LabelTable | None = None, weights: WeightOptions = WeightOptions(),
                 blt: float = 50, keep_entries: int = 2,
                 derived_dir: str | os.PathLike | None = None):
        if mode != "slices":
            raise ValueError(f"ThickSliceDataset reads mode='slices', not {mode!r}")
        if not isinstance(thickness, int) or thickness < 0:
            raise ValueError(f"thickness must be an int >= 0, got {thickness!r}")
        self.cache = Cache(cache_dir)
        self.split, self.view, self.thickness = split, view, thickness
        self.table = table or LabelTable()
        self.weights, self.blt = weights, blt
        self.entries = [e for e in self.cache.entries() if e.split == split]
        if not self.entries:
            raise CacheError(f"split {split!r} of cache {self.cache.root} has no entries")
        unlabelled = [e.finding_name for e in self.entries if "label" not in e.files]
        if unlabelled:
            raise CacheError(f"{', '.join(unlabelled)} have no label map; thick-slice "
                             "training needs one per entry")
        self.keep_entries = max(1, int(keep_entries))
        self.derived_dir = None if derived_dir is None else Path(derived_dir)
        self._memory: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self.slices = self._list_slices()

    def _derive(self, e: int) -> dict[str, np.ndarray]:
        """The entry's image, classes, weights and valid mask in view order (slice, row,
        column), each contiguous: an item then copies whole slices, where the cache's
        voxel order would make a coronal slice a strided gather."""
        ref = self.entries[e]
        try:
            derived = derive(np.asarray(self.cache.load_tensor(ref.key, "label")),
                             self.table, self.view, self.weights, ref.finding_name)
        except InputError as exc:
            raise CacheError(str(exc)) from None
        arrays = {"image": self.cache.load_tensor(ref.key, "image"),
                  "classes": derived.classes, "weights": derived.weights.astype(np.float32),
                  "valid": np.asarray(self.cache.load_tensor(ref.key, "valid"), dtype=bool)}
        return {k: np.ascontiguousarray(as_view(v, self.view)) for k, v in arrays.items()}

    def _list_slices(self) -> np.ndarray:
        rows = []
        for e in range(len(self.entries)):
            if self.derived_dir is not None:
                classes = self._stored(e, create=True)["classes"]
            else:
                # Only the lookup here: the weights wait until the entry is read.
                ref = self.entries[e]
                try:
                    mapped = self.table.map(np.asarray(self.cache.load_tensor(
                        ref.key, "label")), self.view, subject=ref.finding_name)
                except InputError as exc:
                    raise CacheError(str(exc)) from None
                classes = as_view(mapped.classes, self.view)
            keep = kept_slices(classes, self.blt)
            rows.append(np.stack([np.full(len(keep), e), keep], axis=1))
        slices = np.concatenate(rows).astype(np.int64)
        if len(slices) == 0:
            raise CacheError(f"split {self.split!r} of cache {self.cache.root} has no "
                             f"{self.view} slice with a class sum above {self.blt}")
        return slices

    def _stored(self, e: int, create: bool = False) -> dict[str, np.ndarray]:
        stem = f"{self.entries[e].key}-{self._options_hash()}-{self.view}"
        paths = {n: self.derived_dir / f"{stem}.{n}.npy" for n in _FIELDS}
        if create and not all(p.exists() for p in paths.values()):
            self.derived_dir.mkdir(parents=True, exist_ok=True)
            for name, array in self._derive(e).items():
                with atomic_path(paths[name], suffix=".npy") as tmp:
                    np.save(tmp, array)
        return {name: open_npy(path) for name, path in paths.items()}

    def _options_hash(self) -> str:
        text = f"{self.table.hash()}{self.weights!r}".encode()
        return sha256_hex(text)[:16]

    def _remember(self, e: int, arrays: dict[str, np.ndarray]) -> None:
        self._memory[e] = arrays
        self._memory.move_to_end(e)
        while len(self._memory) > self.keep_entries:
            self._memory.popitem(last=False)

    def _arrays(self, e: int) -> dict[str, np.ndarray]:
        if e not in self._memory:
            # Memory maps are kept too: opening four .npy files per item cost more than
            # reading the item.
            self._remember(e, self._stored(e) if self.derived_dir is not None
                           else self._derive(e))
        self._memory.move_to_end(e)
        return self._memory[e]

    def __getstate__(self):
        # Worker processes derive their own entries: the arrays held here stay here.
        return {**self.__dict__, "_memory": OrderedDict()}

    def __len__(self) -> int:
        return len(self.slices)

    def __getitem__(self, index: int) -> dict:
        if not -len(self) <= index < len(self):  # negative indices count from the end
            raise IndexError(f"index {index} out of range for {len(self)} slices")
        e, k = (int(v) for v in self.slices[index])
        ref = self.entries[e]
        arrays = self._arrays(e)
        thick = thick_slice(arrays["image"], k, self.thickness)  # [H, W, 2t+1]
        return {
            "image": torch.from_numpy(np.moveaxis(thick, -1, 0).astype(np.float32)),
            "label": torch.from_numpy(arrays["classes"][k].astype(np.int64)),
            "weight": torch.from_numpy(np.array(arrays["weights"][k])),
            "valid": torch.from_numpy(np.array(arrays["valid"][k])),
            "subject_id": ref.subject_id,
            "session_id": ref.session_id,
            "slice_index": k,
        }
