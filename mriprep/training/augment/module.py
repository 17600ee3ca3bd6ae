"""The :class:`Augment` module: batches in, batches out, on the batch's device."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from mriprep.training.augment.config import AugmentConfig
from mriprep.training.augment.geometry import resample, sampling_grid
from mriprep.training.augment.intensity import apply_intensity
from mriprep.training.augment.params import SampleParams, draw, sample_id_of

_IDENTITY_KEYS = ("subject_id", "session_id", "location", "slice_index")
_FROM_DATA = object()  # the mirror's axis is read from the batch given


class Augment(torch.nn.Module):
    """Random geometry and intensity for a whole batch, after the DataLoader::

        augment = Augment(AugmentConfig.from_yaml("augment.yaml"), lr_swap=table)
        for epoch in range(epochs):
            augment.set_epoch(epoch)
            for batch in loader:
                batch = augment(to_device(batch, "cuda"))
                batch["augment"]          # one dict of parameters per sample

    **Input.** A dict with ``image`` ``[B, C, X, Y, Z]`` (3D) or ``[B, C, H, W]`` (2.5D:
    the ``2t+1`` neighbouring slices as channels, one 2D geometry for all), and optionally
    ``valid`` (bool, ``[B, *S]`` or ``[B, 1, *S]``; all True when absent), ``label``
    (integer or MONAI's whole-number floats, same shapes), weight maps named in
    ``config.weight_keys``, and the identity keys ``subject_id``, ``session_id``,
    ``location``, ``slice_index`` (what :class:`~mriprep.training.MRIDataset` batches
    carry). Values may be MONAI MetaTensors (returned as MetaTensors with their meta; the
    grid, hence the affine, is unchanged). A bare image tensor gives a bare tensor back.
    Other keys pass through. The output's image is float32 (float16 input stays float16),
    and every other tensor keeps its dtype and shape.

    **Randomness.** A sample's parameters come from ``(config.seed, epoch, sample id)``
    only: the sample id is built from its identity keys (or given as ``sample_ids=``), so
    the same sample is augmented alike whatever batch, worker or worker count brought it.
    Without identity keys the id is the call's number within the epoch and the position
    in the batch (reproducible when batches come in the same order, as a seeded
    DataLoader's do at any worker count). Call :meth:`set_epoch` every epoch: a sample id
    seen twice in one epoch gets the same draw (a warning says so once). ``params=``
    replays a list of recorded parameters (``batch["augment"]``).

    **Left-right flip.** The mirror is folded into the sampling grid. Labels must then
    swap their Left-* and Right-* values: ``lr_swap`` is an integer permutation ``perm``
    (``perm[v]`` the mirrored value, an involution, indexed by the label values the batch
    holds: class indices if classes are mapped before augmenting, else FreeSurfer
    numbers), or an object with an ``lr_swap()`` method returning it (a label table).
    Choice: with ``flip_prob > 0``, labels in the batch and no ``lr_swap``, the call is
    **refused** (ValueError) unless ``lateralised_labels=False`` declares the labels
    symmetric (tissue classes, say): a silently wrong hemisphere is worse than an error.
    Batches without labels flip freely. ``lr_axis="auto"`` takes the item axis whose
    affine column points most along world x; a sagittal 2.5D slice has none in plane and
    is then not flipped (its parameters say ``flip: False``).

    **Numerics.** Interpolation and intensity run in float32 with autocast off, and
    without autograd. Non-finite input voxels count as invalid. Every output is finite,
    and the image is clamped to ``±config.clamp`` (float16's range by default); the
    clamps are counted per sample (``clamped``) and in :attr:`clamp_count`.

    **Limits.** Lengths are in voxels: with anisotropic voxels a rotation is not a rigid
    motion in mm. Rotation is about the item's centre; what a patch rotates in from
    outside itself is out of the grid (invalid), so crop patches larger than the network
    input when that matters. Per-label linear labels cost one interpolation per 8 labels.
    On the CPU a batch is worked through one sample at a time where one fits the cache
    (:data:`CPU_CHUNK_BYTES`; results are the same), and intra-op threads on a CPU
    shared with loader workers mostly wait on each other: there, augment in the
    workers, with :meth:`collate` as the DataLoader's ``collate_fn``.
    Figures: ``docs/benchmarks.md`` (augment).
    """

    def __init__(self, config: AugmentConfig | Mapping | str | Path | None = None,
                 lr_swap: Any = None, **options):
        super().__init__()
        if config is None:
            config = AugmentConfig()
        elif isinstance(config, Mapping):
            config = AugmentConfig.from_dict(dict(config))
        elif isinstance(config, (str, Path)):
            config = AugmentConfig.from_yaml(config)
        if options:
            config = AugmentConfig.from_dict({**config.to_dict(), **options})
        self.config = config
        self.lr_swap = _as_permutation(lr_swap)
        self.epoch = 0
        self.clamp_count = 0
        self.last_params: list[SampleParams] = []
        self._calls = 0
        self._seen: set[str] = set()
        self._warned = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._calls = int(epoch), 0
        self._seen.clear()

    def draw(self, sample_ids: Sequence[str], ndim: int, epoch: int | None = None):
        """The parameters of ``sample_ids`` (no image needed: to inspect or test)."""
        epoch = self.epoch if epoch is None else int(epoch)
        return [draw(self.config, epoch, str(s), ndim) for s in sample_ids]

    def forward(self, batch, *, epoch: int | None = None, sample_ids=None, params=None):
        if not isinstance(batch, Mapping):
            out = self.forward({"image": batch}, epoch=epoch, sample_ids=sample_ids,
                               params=params)
            return out["image"]
        image = _plain(batch["image"])
        with torch.no_grad(), _no_autocast(image.device):
            chunk = _cpu_chunk(image)
            if chunk >= len(image) or any(_is_meta(v) for v in batch.values()):
                return self._augment(dict(batch), epoch, sample_ids, params)
            # On the CPU, a sample or a few at a time: each stays in cache through its ~20
            # passes, where whole-batch passes stream from memory (slower: `make bench`
            # augment), and goes into the output while it is still in cache. A sample's
            # result never depends on its batch.
            b = len(image)
            if params is None:
                ndim = image.dim() - 2
                params = self._params(dict(batch), b, ndim, epoch, sample_ids, None)
            return self._in_chunks(lambda i, j: _rows(batch, b, i, j), batch, b, chunk,
                                   epoch, params, _private_tensor, image.dim() - 2)

    def collate(self, items: Sequence[Mapping]) -> dict:
        """A DataLoader ``collate_fn`` that augments each batch in the worker that loads
        it, for hosts whose training runs on the CPU::

            DataLoader(dataset, batch_size=16, num_workers=2, collate_fn=augment.collate)

        The same result as ``augment(default_collate(items))``, with fewer passes over
        memory: items are stacked a chunk at a time (:data:`CPU_CHUNK_BYTES`), each
        chunk augmented while in cache, and its result written straight into the
        batch's tensors, which a worker allocates in shared memory (where
        ``default_collate`` would have copied the inputs, and the outputs then again).

        Items need identity keys (``subject_id``...): each worker numbers its own calls,
        so call numbers would repeat across workers. The workers' copies of this module
        keep the epoch they started with (with ``persistent_workers`` the draws repeat
        every epoch; a warning says so), and their ``last_params`` and ``clamp_count``:
        read ``batch["augment"]`` in the main process.
        """
        from torch.utils.data import default_collate, get_worker_info

        from mriprep.training.buffers import shared_tensor

        if any(_is_meta(v) for v in items[0].values()):
            return self(default_collate(items))  # MetaTensors keep their meta this way
        if "subject_id" not in items[0]:
            raise ValueError(
                "Augment.collate: items without a subject_id: in DataLoader workers, each "
                "worker numbers its own calls, so samples would share draws; give items "
                "identity keys (subject_id, and location or slice_index for patches and "
                "slices), or augment the collated batch in the main process")
        heavy = [k for k in ("image", "valid", "label", *self.config.weight_keys)
                 if k in items[0]]
        batch = default_collate([{k: v for k, v in item.items() if k not in heavy}
                                 for item in items])
        first = torch.as_tensor(items[0]["image"])[None]
        b, ndim = len(items), first.dim() - 2
        with torch.no_grad(), _no_autocast(first.device):
            params = self._params(batch, b, ndim, None, None, None)
            new_tensor = shared_tensor if get_worker_info() is not None else _private_tensor
            return self._in_chunks(lambda i, j: _stacked(items[i:j], heavy), batch, b,
                                   _cpu_chunk(first), None, params, new_tensor, ndim)

    def _in_chunks(self, rows, batch: Mapping, b: int, chunk: int, epoch, params,
                   new_tensor, ndim: int) -> dict:
        """Samples ``rows(i, j)`` of a batch of ``b``, augmented ``chunk`` at a time,
        each chunk's results copied into the batch's outputs (:func:`_outputs`). The
        mirror's axis comes from the whole batch (its ``affine``, which a chunk of
        items lacks, or a chunk's rows might slice)."""
        lr_axis = self._lr_axis(batch, ndim)
        out, slots, drawn = None, [], []
        for i in range(0, b, chunk):
            part = self._augment(rows(i, i + chunk), epoch, None, params[i:i + chunk],
                                 lr_axis)
            if out is None:
                out, slots = _outputs(batch, part, b, new_tensor)
            _place(out, slots, part, i)
            drawn += part["augment"]
        out["augment"] = drawn
        self.last_params = [SampleParams.from_dict(p) for p in drawn]
        return out

    # -- the work ---------------------------------------------------------------------

    def _augment(self, data: dict, epoch, sample_ids, params, lr_axis=_FROM_DATA) -> dict:
        c = self.config
        original = data["image"]
        image = _plain(original)
        if image.dim() not in (4, 5):
            raise ValueError(
                f"Augment: image of shape {tuple(image.shape)} is neither [B, C, X, Y, Z] "
                "nor [B, C, H, W]; give a batch (unsqueeze(0) a single item)")
        b, shape = image.shape[0], tuple(image.shape[2:])
        ndim = len(shape)
        image = image.to(torch.float32)
        valid = self._mask(data, "valid", b, shape, image.device)
        # A sum is finite when every voxel is (and a few huge finite ones, whose sum
        # overflows, only take the exact path): one pass and no mask in the usual case.
        if not bool(torch.isfinite(image.sum())):
            finite = torch.isfinite(image)
            valid = valid & finite.all(1)
            image = torch.where(finite, image, 0.0)
        all_valid = bool(valid.all())
        label = self._mask(data, "label", b, shape, image.device) if "label" in data else None
        weights = {k: self._mask(data, k, b, shape, image.device)
                   for k in c.weight_keys if k in data}

        params = self._params(data, b, ndim, epoch, sample_ids, params)
        if lr_axis is _FROM_DATA:
            lr_axis = self._lr_axis(data, ndim)
        if lr_axis is None:
            for p in params:
                p.flip = False
        flipped = [i for i, p in enumerate(params) if p.flip]
        swap = self.lr_swap
        if flipped and label is not None and swap is None and c.lateralised_labels:
            raise ValueError(
                "Augment: flip_prob > 0 on a batch with labels but no lr_swap: a mirrored "
                "brain would keep Left-* labels on the right. Give lr_swap= (a class "
                "permutation, or a label table with .lr_swap()), or lateralised_labels="
                "False when the labels have no sides, or flip_prob=0")

        moving = [i for i, p in enumerate(params) if p.moves]
        if moving:
            image, valid, label = self._move(params, moving, shape, lr_axis, image, valid,
                                             weights, label, all_valid)
        if flipped and label is not None and swap is not None:
            label = self._swap(label, flipped, swap)

        if any(p.changes_intensity for p in params):
            every = valid.flatten(1).all(1).tolist()
            image = apply_intensity(image, valid, params, c.bias_order, every)
        # one pass and one synchronisation when nothing needs clamping (the usual case),
        # over the whole batch: on the CPU, a per-sample reduction took 8 times as long
        low, high = torch.aminmax(image)
        over = [0] * b
        # (written so that a NaN, which fails every comparison, takes the clamping branch:
        # an overflow to Inf in one transform can make a NaN in the next)
        if not bool(torch.maximum(-low, high) <= c.clamp):
            over = (~(image.abs() <= c.clamp)).flatten(1).sum(1).tolist()
            image = torch.nan_to_num(image, nan=0.0, posinf=c.clamp, neginf=-c.clamp)
            image = image.clamp(-c.clamp, c.clamp)
            self.clamp_count += int(sum(over))
        for p, n in zip(params, over):
            p.clamped = int(n)

        out_dtype = original.dtype if original.dtype in (torch.float16, torch.float32) \
            else torch.float32
        data["image"] = _rewrap(original, image.to(out_dtype))
        data["valid"] = _restore(data.get("valid"), valid, None)
        if label is not None:
            data["label"] = _restore(data["label"], label, None)
        for k, w in weights.items():
            data[k] = _restore(data[k], w, None)
        self.last_params = params
        data["augment"] = [p.as_dict() for p in params]
        return data

    def _move(self, params, moving, shape, lr_axis, image, valid, weights, label, all_valid):
        """Resample the moving samples in place of the originals (``weights`` is updated
        in place). Samples whose every voxel is valid and the others go through
        separate calls (see :func:`~.geometry.resample`), so a sample's result never
        depends on the other samples of its batch."""
        c = self.config
        if all_valid:
            groups = [(moving, True)]
        else:
            every = valid.flatten(1).all(1).tolist()
            groups = [([i for i in moving if every[i]], True),
                      ([i for i in moving if not every[i]], False)]
        for members, fast in groups:
            if not members:
                continue
            everyone = len(members) == len(params)
            idx = None if everyone else torch.tensor(members, device=image.device)

            def pick(t):
                return t if t is None or everyone else t[idx]

            def put(t, new):
                return new if everyone else t.index_copy(0, idx, new)

            grid = sampling_grid([params[i] for i in members], shape, lr_axis,
                                 c.elastic_points, image.device)
            names = list(weights)
            out = resample(grid, pick(image), None if fast else pick(valid),
                           [pick(weights[k]) for k in names], pick(label), c.label_mode,
                           c.valid_threshold)
            for k, w in zip(names, out[2]):
                weights[k] = put(weights[k], w)
            image, valid = put(image, out[0]), put(valid, out[1])
            label = None if label is None else put(label, out[3])
        return image, valid, label

    def _params(self, data, b, ndim, epoch, sample_ids, params) -> list[SampleParams]:
        if params is not None:
            if len(params) != b:
                raise ValueError(f"Augment: {len(params)} parameter sets for a batch of {b}")
            return [SampleParams.from_dict(dict(p)) if isinstance(p, Mapping)
                    else SampleParams.from_dict(p.as_dict()) for p in params]
        if sample_ids is None:
            sample_ids = _identity_ids(data, b)
        if sample_ids is None:
            sample_ids = [f"call{self._calls}/{i}" for i in range(b)]
        self._calls += 1
        sample_ids = [str(s) for s in sample_ids]
        if len(sample_ids) != b:
            raise ValueError(f"Augment: {len(sample_ids)} sample ids for a batch of {b}")
        repeated = self._seen.intersection(sample_ids)
        if repeated and not self._warned:
            self._warned = True
            warnings.warn(f"Augment: sample {sorted(repeated)[0]!r} seen twice in epoch "
                          f"{self.epoch}: it gets the same draw; call augment.set_epoch("
                          "epoch) every epoch", stacklevel=4)
        self._seen.update(sample_ids)
        return self.draw(sample_ids, ndim, epoch)

    def _lr_axis(self, data: Mapping, ndim: int) -> int | None:
        axis = self.config.lr_axis
        if axis != "auto":
            if not 0 <= axis < ndim:
                raise ValueError(f"Augment: lr_axis={axis} is not an axis of a {ndim}D item")
            return int(axis)
        affine = data.get("affine")
        if affine is None:
            return 0
        a = np.asarray(_plain(torch.as_tensor(affine)).detach().cpu(), dtype=np.float64)
        a = a[0] if a.ndim == 3 else a
        best = int(np.argmax(np.abs(a[0, :3])))  # the column most along world x
        return best if best < ndim else None

    def _mask(self, data, name, b, shape, device) -> torch.Tensor:
        """``data[name]`` as ``[B, *S]`` (``valid``: bool, all True when absent)."""
        value = data.get(name)
        if value is None:
            return torch.ones((b, *shape), dtype=torch.bool, device=device)
        t = _plain(value).to(device)
        if t.dim() == len(shape) + 2 and t.shape[1] == 1:
            t = t[:, 0]
        if tuple(t.shape) != (b, *shape):
            raise ValueError(f"Augment: {name} of shape {tuple(_plain(value).shape)} does "
                             f"not match the image's batch and grid {(b, *shape)}")
        if name == "valid":
            return t.to(torch.bool)
        if name == "label" and t.is_floating_point():
            return t.round().to(torch.int64)
        return t

    def _swap(self, label: torch.Tensor, flipped: list[int], swap: torch.Tensor):
        top = int(label.max())
        if top >= len(swap) or int(label.min()) < 0:
            raise ValueError(
                f"Augment: lr_swap has {len(swap)} entries but the labels hold values up to "
                f"{top}: give the permutation in the batch's label values (class indices "
                "after a lookup table, or a table of length max+1)")
        swap = swap.to(label.device)
        idx = torch.tensor(flipped, device=label.device)
        return label.index_copy(0, idx, swap[label[idx]].to(label.dtype))

    def extra_repr(self) -> str:
        return f"epoch={self.epoch}, {self.config}"


#: bytes of image per CPU chunk: about a core's L2 cache. One 7 x 256 x 256 slice per
#: chunk was faster than two in the workers (`make bench` augment, docs/benchmarks.md).
CPU_CHUNK_BYTES = 2 << 20


def _cpu_chunk(image: torch.Tensor) -> int:
    if image.device.type != "cpu":
        return len(image)
    per_sample = image[0].numel() * 4
    return max(1, CPU_CHUNK_BYTES // max(per_sample, 1))


def _rows(batch: Mapping, b: int, start: int, stop: int) -> dict:
    """Samples ``start:stop`` of every per-sample value (tensors and lists of length B)."""
    out = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0 and len(v) == b:
            out[k] = v[start:stop]
        elif isinstance(v, (list, tuple)) and len(v) == b:
            out[k] = v[start:stop]
        else:
            out[k] = v
    return out


def _per_sample_tensor(value, b: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and len(value) == b


def _outputs(batch: Mapping, first: Mapping, b: int, new_tensor) -> tuple[dict, list[str]]:
    """Where a batch of ``b`` samples' results go, given the results ``first`` of its
    first samples: (the output dict, the keys of its per-sample tensors, each a
    ``new_tensor(shape, dtype)`` of ``b`` samples)."""
    out, slots = dict(batch), []
    for k, value in first.items():
        per_sample = (_per_sample_tensor(batch[k], b) if k in batch
                      else isinstance(value, torch.Tensor) and value.dim() > 0)
        if k == "augment" or not per_sample:
            # what the augmentation passes through is the batch's (whole lists of ids)
            out[k] = batch[k] if k in batch and k != "augment" else value
            continue
        slots.append(k)
        out[k] = new_tensor((b, *value.shape[1:]), value.dtype)
    return out, slots


def _private_tensor(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def _stacked(items: Sequence[Mapping], keys: Sequence[str]) -> dict:
    """``keys`` of ``items`` stacked into a batch, in this process's own memory (in a
    worker, ``default_collate`` would allocate it in shared memory)."""
    return {k: torch.stack([torch.as_tensor(item[k]) for item in items]) for k in keys}


def _place(out: dict, slots: list[str], part: Mapping, start: int) -> None:
    for k in slots:
        out[k][start:start + len(part[k])].copy_(part[k])


def _as_permutation(lr_swap) -> torch.Tensor | None:
    if lr_swap is None:
        return None
    if hasattr(lr_swap, "lr_swap"):
        lr_swap = lr_swap.lr_swap()
    perm = torch.as_tensor(np.asarray(lr_swap)).to(torch.int64).flatten()
    n = len(perm)
    if n == 0 or int(perm.min()) < 0 or int(perm.max()) >= n or \
            not torch.equal(perm[perm], torch.arange(n)):
        raise ValueError("Augment: lr_swap must be an involution of 0..n-1 (perm[perm[v]] "
                         f"== v, each value its mirror), got {perm.tolist()[:20]}")
    return perm


def _identity_ids(data: Mapping, b: int) -> list[str] | None:
    present = [k for k in _IDENTITY_KEYS if k in data]
    if "subject_id" not in present:
        return None
    columns = []
    for k in present:
        value = data[k]
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().reshape(b, -1).tolist()
        columns.append([v if not isinstance(v, list) else "-".join(map(str, v))
                        for v in value])
    return [sample_id_of(row) for row in zip(*columns)]


def _no_autocast(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


def _plain(tensor) -> torch.Tensor:
    as_tensor = getattr(tensor, "as_tensor", None)  # a MetaTensor's plain tensor
    return as_tensor() if as_tensor is not None else tensor


def _is_meta(tensor) -> bool:
    module = sys.modules.get("monai.data.meta_tensor")
    return module is not None and isinstance(tensor, module.MetaTensor)


def _rewrap(original, tensor: torch.Tensor):
    if not _is_meta(original):
        return tensor
    out = type(original)(tensor, meta=dict(original.meta),
                         applied_operations=list(original.applied_operations))
    out.is_batch = original.is_batch
    return out


def _restore(original, tensor: torch.Tensor, dtype):
    """``tensor`` ``[B, *S]`` back in the shape, dtype and type of ``original``."""
    if original is None:
        return tensor
    plain = _plain(original)
    if plain.dim() == tensor.dim() + 1:
        tensor = tensor[:, None]
    return _rewrap(original, tensor.to(dtype or plain.dtype))
