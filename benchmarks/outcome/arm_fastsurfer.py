"""Arm B: FastSurfer's own data path, run from its checkout on the cohort as it comes.

What a FastSurfer user does today to train the sagittal network on their own cohort:
conform every T1, build the training HDF5 with ``generate_hdf5.py``, load it with
FastSurfer's dataset and train with its CombinedLoss. Every step that FastSurfer has a
function for runs that function from the checkout (``mriprep.demo.fastsurfer_checkout``;
commit and known faults in its ``README.md``); nothing is fixed or guarded on the way.
Paths below are relative to the checkout's ``FastSurferCNN/``.

Per subject, as ``generate_hdf5.py`` ``H5pyDataset.create_hdf5_dataset`` (lines 270-360)
does for ``--plane sagittal`` with its argparser's defaults. ``create_hdf5_dataset``
itself is not called: at this commit it calls ``self.transform(imgs, zoom)`` without the
plane, so every subject is skipped and an empty file written (README). Its steps are
followed one by one with FastSurfer's own functions instead:

1. Image: ``data_loader/data_utils.py`` ``load_and_conform_image(path, interpol=1)``,
   the loader FastSurfer's prediction uses: it checks the NIfTI header
   (``conform.check_affine_in_nifti``) and calls ``data_loader/conform.py``
   ``conform(img, order=1, conform_vox_size=1.0)`` (1 mm, 256^3, LIA, uint8), as
   ``run_fastsurfer.sh`` conforms a T1 by default. What conform prints that starts with
   ``WARNING`` is kept in the notes, by subject.
   Labels (plumbing): FastSurfer expects the label map already on the conformed grid
   (recon-all writes ``aparc.DKTatlas+aseg.mgz`` there); the cohort's map is resampled
   onto it with nearest neighbour (``scipy.ndimage.affine_transform(order=0)``, the two
   affines), int16 as ``_load_volumes`` reads it.
2. ``read_classes_from_lut`` and ``get_labels_from_lut(lut, ("Left-", "ctx-rh"))`` on the
   bench's class table (:data:`benchmarks.outcome.training.TABLE`, FreeSurfer's aseg
   structures), ``unify_lateralized_labels(lut, ["Left-", "Right-"])``, then
   ``map_aparc_aseg2label(aseg, labels, labels_sag, lateralization, None,
   processing="aseg")`` (generate_hdf5's ``--processing aseg``); its sagittal map is
   kept. FastSurfer's sagittal class order is checked to equal the table's as mriprep
   reads it (``class_table().class_ids("sagittal")``); it does, so no remapping is
   needed (a mismatch raises).
3. ``create_weight_mask(mapped_sag, max_weight=5, ctx_thresh=19, max_edge_weight=5,
   max_hires_weight=None, cortex_mask=False, gradient=True)``: ``--max_w 5 --edge_w 5``,
   ``--hires_w None``, ``--gm`` off, ``--no_grad`` off.
4. ``transform_sagittal`` of image, classes and weights; ``get_thick_slices(orig, 3)``;
   ``filter_blank_slices_thick(..., threshold=50)`` (``--blank_slice_thresh``; it keeps
   slices whose *sum of class indices* exceeds 50, not their labelled voxel count as its
   help says); then generate_hdf5's transposes to slice-major.
5. A subject whose steps raise is skipped, as ``create_hdf5_dataset`` skips it (``except
   Exception``: "Failed Reading Data"), and named in ``lost`` with the error. Nothing else
   is checked: a subject that conforms to a black image trains as it is (a note says so).
6. The slices go into an HDF5 file in generate_hdf5's layout (group ``"256"``;
   ``orig_dataset`` uint8, ``aseg_dataset`` uint8, ``weight_dataset`` float64,
   ``zoom_dataset``, ``subject``), one file per split (``train.hdf5``, ``val.hdf5``) as
   generate_hdf5 is run once per split; written subject by subject (plumbing: the same
   datasets, without holding the cohort in memory as generate_hdf5 does). Only
   ``train.hdf5`` feeds the batches (the bench has no validation loop); ``val`` is
   prepared so that its losses are counted.

Batches (``loader="plain"``, the default): ``data_loader/loader.py``
``get_dataloader(cfg, "train")`` with ``cfg.DATA.AUG = ["None"]``, FastSurfer's training
loader without augmentation: ``data_loader/dataset.py`` ``MultiScaleDatasetVal(path, cfg,
Compose([ZeroPad2D((256, 256)), ToTensor()]))`` from ``data_loader/augmentation.py``.
``ToTensor`` casts to float32, divides by 255, clips to [0, 1] and moves channels first:
image [7, 256, 256] as FastSurfer's inference feeds it (``ToTensorTest``, also /255).
``get_dataloader`` itself is not imported (its ``torchvision.transforms.Compose`` is the
only reason it needs torchvision, absent here): the two transforms are applied in order
(plumbing), and its ``DataLoader(shuffle=True)`` gets a seeded generator, batch 8,
``drop_last``. ``MultiScaleDataset`` was asked for, but ``ToTensor`` does not fit it: it
hands its transforms a ``torchio.Subject``; FastSurfer pairs ``ToTensor`` with
``MultiScaleDatasetVal``, for validation and for training without augmentation.

``loader="torchio"``: ``MultiScaleDataset`` as ``get_dataloader`` builds it for training
with augmentation (FastSurfer's default ``DATA.AUG = ["Scaling", "Translation"]``), the
list of augmentations empty so that no random transform runs and the arms compare:
``tio.Compose([tio.Compose({}, p=0.8)])``. Its ``__getitem__`` normalises every slice by
its own maximum (``clamp(img / img.max(), 0, 1)``), not by 255 as inference does; an
all-black slice gives 0/0 = NaN. (The default list itself does not build here:
loader.py keys ``tio.Compose``'s dict by transform objects, which torchio 1.2.1 refuses,
"All keys in the transforms dictionary must be strings".)

Either way ``weight`` is cast to float32 as FastSurfer's trainer does
(``batch["weight"].float()``) and ``label`` to int64. The datasets do not say which
subject a slice came from (the file's ``subject`` holds one name per subject, not per
slice), so ``subject_id`` is ``"fastsurfer-hdf5"`` for every slice.

Loss: FastSurfer's ``CombinedLoss`` (``FastSurferCNN/models/losses.py`` upstream,
Deep-MI/FastSurfer; not in the checkout), restated in :func:`combined_loss`: soft Dice
loss on the softmax (one-hot target built as ``output.detach() * 0`` then scattered,
sums over batch and both image axes, ``eps = 0.001`` in the denominator, ``1 - dice``
averaged over all classes) plus cross-entropy per voxel times the weight map, averaged;
``weight_dice = weight_ce = 1``.

Training loop: FastSurfer's ``Trainer.train`` (``FastSurferCNN/train.py`` upstream, not in
the checkout) does ``zero_grad``, forward, ``loss_total.backward()``,
``optimizer.step()``: no check for non-finite values and no gradient clipping, so
``guarded=False``, ``clip=None`` (assumed from the upstream file;
the checkout holds no trainer to verify against).

Test volumes: each test subject (clean scans) through steps 1-2, the conformed image /255
and its sagittal classes, ``transform_sagittal`` then slice axis first ([S, H, W], the
same in-plane layout as the training slices, whose 7 channels ``get_thick_slices`` pads
at the edges as :func:`benchmarks.outcome.training.thick` does).

Surprises met on the way (FastSurfer's code as it is, not changed here):

* ``conform.getscale`` finds the robust upper intensity as ``bin_edges[i - 2]`` of a
  1000-bin histogram over [min, max]. When one extreme voxel puts every ordinary voxel
  into the first bin, ``i`` is 1 and ``i - 2`` is -1: Python's last edge, the maximum
  itself. A single 1e30 or 1e308 cluster so becomes the 255 of the scale and the head
  conforms to black, silently.
* A NaN anywhere in the scan makes ``np.histogram``'s range non-finite and conform raises:
  the subject is lost rather than repaired.
* generate_hdf5's ``--lut`` default is ``FASTSURFER_ROOT / "/config/..."``, an absolute
  path that discards the root (not used here: the table is given).
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from scipy import ndimage
from torch.nn import functional as F

from mriprep.demo.fastsurfer_checkout import HOW_TO_ENABLE, fastsurfer_module

from benchmarks.outcome.cohort import Cohort
from benchmarks.outcome.training import TABLE, BATCH, VIEW, PreparedArm, TestVolume, class_table

NAME = "B. FastSurfer"
SIZE = 256               # conform's 1 mm grid, generate_hdf5's group name
THICKNESS = 3            # --thickness
BLANK_SLICE_THRESHOLD = 50  # --blank_slice_thresh
SAG_MASK = ("Left-", "ctx-rh")   # --sag_mask
COMBI = ["Left-", "Right-"]      # --combi
DICE_EPS = 0.001         # models/losses.py DiceLoss
SUBJECT_ID = "fastsurfer-hdf5"
LOADERS = ("plain", "torchio")
# A conformed head whose labelled voxels are this dark is noted as black.
BLACK_SHARE = 0.01


def _modules():
    names = ("conform", "data_utils", "dataset", "augmentation")
    mods = {n: fastsurfer_module(f"FastSurferCNN.data_loader.{n}") for n in names}
    return None if any(m is None for m in mods.values()) else mods


def prepare(cohort: Cohort, copy: str, work: Path, loader: str = "plain"
            ) -> PreparedArm | None:
    """Arm B on ``copy`` of ``cohort`` (module docstring); files under ``work``. None,
    with the reason printed, where FastSurfer's checkout is not importable.

    ``loader``: ``"plain"``, FastSurfer's un-augmented training loader (the default), or
    ``"torchio"``, its augmented loader's dataset and normalisation with no random
    transform (module docstring, Batches)."""
    if loader not in LOADERS:
        raise ValueError(f"loader={loader!r}; choose one of {LOADERS}")
    mods = _modules()
    if mods is None:
        print(f"arm B skipped: FastSurfer's checkout is not importable; {HOW_TO_ENABLE}")
        return None
    import yacs.config

    started = time.perf_counter()
    files, test, lost, notes, seconds = _training_files(mods, cohort, copy, Path(work))
    notes = list(notes)

    cfg = yacs.config.CfgNode({
        "DATA": {"PADDED_SIZE": SIZE, "SIZES": [SIZE], "PLANE": VIEW,
                 "AUG": ["None"] if loader == "plain" else []},
        "MODEL": {"BASE_RES": 1.0}})
    dataset_module = mods["dataset"]
    with contextlib.redirect_stdout(io.StringIO()):
        if loader == "plain":
            aug = mods["augmentation"]
            steps = [aug.ZeroPad2D((cfg.DATA.PADDED_SIZE, cfg.DATA.PADDED_SIZE)),
                     aug.ToTensor()]

            def compose(sample):  # torchvision.transforms.Compose (plumbing)
                for step in steps:
                    sample = step(sample)
                return sample

            dataset = dataset_module.MultiScaleDatasetVal(str(files["train"]), cfg, compose)
        else:
            import torchio as tio

            # loader.py's torchio branch for cfg.DATA.AUG == []: no random transform.
            transform = tio.Compose([tio.Compose({}, p=0.8)],
                                    include=["img", "label", "weight"])
            dataset = dataset_module.MultiScaleDataset(str(files["train"]), cfg, False,
                                                       transform)
    notes.append(f"{len(dataset)} training slices in {files['train'].name}, "
                 f"{type(dataset).__name__}")

    def batches(seed: int):
        if len(dataset) < BATCH:
            raise RuntimeError(f"arm B: {len(dataset)} training slices, fewer than a batch")
        shuffled = torch.utils.data.DataLoader(
            dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=0,
            generator=torch.Generator().manual_seed(seed))
        while True:
            for batch in shuffled:
                yield {"image": batch["image"].float(),
                       "classes": batch["label"].long(),
                       "weight": batch["weight"].float(),
                       "subject_id": [SUBJECT_ID] * len(batch["image"])}

    name = f"{NAME}, {type(dataset).__name__}"
    return PreparedArm(name=name, batches=batches, loss=loss, test=test, lost=lost,
                       notes=notes, seconds=seconds + time.perf_counter() - started,
                       clip=None, guarded=False,
                       epoch_steps=len(dataset) // BATCH)


# The per-subject steps run once per (cohort, copy, folder): both loaders read their files.
_FILES: dict[tuple[str, str, str], tuple] = {}


def _training_files(mods, cohort: Cohort, copy: str, work: Path):
    """Steps 1-6 (module docstring): (HDF5 file per split, test volumes, lost subjects,
    notes, seconds), made once per cohort copy and folder."""
    key = (str(cohort.root), copy, str(work))
    if key in _FILES:
        return _FILES[key]
    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    du = mods["data_utils"]
    table = _Table(du)
    subjects = cohort.subjects(copy)
    lost: dict[str, str] = {}
    notes: list[str] = []
    files = {}
    for split in ("train", "val"):
        files[split] = work / f"{split}.hdf5"
        with _Hdf5(files[split]) as out:
            for s in (s for s in subjects if s.split == split):
                try:
                    orig, aseg, weights, zoom = _subject_slices(du, table, s, notes)
                except Exception as error:  # generate_hdf5: "Failed Reading Data"
                    lost[s.subject_id] = f"{type(error).__name__}: {error}"
                    continue
                out.add(s.subject_id, orig, aseg, weights, zoom)
            if split == "train" and out.count == 0:
                notes.append("no training subject survived: arm B has no batches")
    test = []
    for s in (s for s in subjects if s.split == "test"):
        try:
            image, classes = _conformed(du, table, s, notes)[:2]
        except Exception as error:
            lost[s.subject_id] = f"{type(error).__name__}: {error}"
            continue
        test.append(TestVolume(
            s.subject_id,
            _slice_major(du.transform_sagittal(image)).astype(np.float32) / 255.0,
            _slice_major(du.transform_sagittal(classes)).astype(np.int64)))
    _FILES[key] = (files, test, lost, notes, time.perf_counter() - started)
    return _FILES[key]


def loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """FastSurfer's total loss on a batch of this arm."""
    return combined_loss(logits, batch["classes"], batch["weight"])[0]


def combined_loss(inputx: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
                  weight_dice: float = 1.0, weight_ce: float = 1.0):
    """FastSurfer's ``CombinedLoss.forward`` (models/losses.py, upstream): (total, dice,
    ce) of logits [B, C, H, W], classes [B, H, W] and weights [B, H, W]."""
    target = target.long()
    output = F.softmax(inputx, dim=1)
    # DiceLoss.forward, weights=None, ignore_index=None
    encoded_target = output.detach() * 0
    encoded_target.scatter_(1, target.unsqueeze(1), 1)
    numerator = 2 * (output * encoded_target).sum(0).sum(1).sum(1)
    denominator = (output + encoded_target).sum(0).sum(1).sum(1) + DICE_EPS
    dice_val = torch.mean((1 - numerator / denominator).sum() / output.size(1))
    # CrossEntropy2D (reduction "none") times the weight map
    ce_val = torch.mean(torch.mul(F.cross_entropy(inputx, target, reduction="none"), weight))
    total = torch.add(torch.mul(dice_val, weight_dice), torch.mul(ce_val, weight_ce))
    return total, dice_val, ce_val


class _Table:
    """generate_hdf5's label lists from the bench's class table, read by FastSurfer."""

    def __init__(self, du):
        lut = du.read_classes_from_lut(str(TABLE))
        self.labels, self.labels_sag = du.get_labels_from_lut(lut, SAG_MASK)
        self.lateralization = du.unify_lateralized_labels(lut, COMBI)
        ours = class_table().class_ids(VIEW)
        if len(self.labels_sag) != class_table().num_classes(VIEW) or \
                not np.array_equal(np.asarray(self.labels_sag), np.asarray(ours)):
            raise RuntimeError(
                f"FastSurfer's sagittal classes {list(self.labels_sag)} differ from the "
                f"table's {list(ours)}: arm B's class indices would not compare")


def _conformed(du, table: _Table, subject, notes: list[str]):
    """Steps 1-2: the conformed uint8 image, its sagittal classes, and the zooms."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        header, affine, image = du.load_and_conform_image(str(subject.image), interpol=1)
    for line in printed.getvalue().splitlines():
        if line.startswith("WARNING"):
            notes.append(f"{subject.subject_id}: FastSurfer's conform printed: {line}")
    image = np.asarray(image, dtype=np.uint8)
    label = nib.load(subject.label)
    # Plumbing: the label map onto the conformed grid, nearest neighbour.
    to_label = np.linalg.inv(label.affine) @ affine
    aseg = ndimage.affine_transform(
        np.asarray(label.dataobj, dtype=np.int16), to_label[:3, :3], to_label[:3, 3],
        output_shape=image.shape, order=0, mode="constant", cval=0).astype(np.int16)
    _note_black(subject.subject_id, image, aseg, notes)
    _, mapped_sag = du.map_aparc_aseg2label(aseg, table.labels, table.labels_sag,
                                            table.lateralization, None, processing="aseg")
    return image, mapped_sag, header.get_zooms()


def _subject_slices(du, table: _Table, subject, notes: list[str]):
    """Steps 1-4 for one subject: thick slices, classes, weights, zooms (slice-major)."""
    orig, mapped, zoom = _conformed(du, table, subject, notes)
    weights = du.create_weight_mask(mapped, max_weight=5, ctx_thresh=19, max_edge_weight=5,
                                    max_hires_weight=None, cortex_mask=False, gradient=True)
    # H5pyDataset.transform for the sagittal plane
    orig, mapped, weights = (du.transform_sagittal(v) for v in (orig, mapped, weights))
    zooms = zoom[::-1][:2]
    orig_thick = du.get_thick_slices(orig, THICKNESS)
    orig, mapped, weights = du.filter_blank_slices_thick(orig_thick, mapped, weights,
                                                         threshold=BLANK_SLICE_THRESHOLD)
    return (np.transpose(orig, (2, 0, 1, 3)), np.transpose(mapped, (2, 0, 1)),
            np.transpose(weights, (2, 0, 1)), zooms)


def _slice_major(volume: np.ndarray) -> np.ndarray:
    """A ``transform_sagittal`` volume with its slice axis (FastSurfer's last) first."""
    return np.ascontiguousarray(np.transpose(volume, (2, 0, 1)))


def _note_black(sid: str, image: np.ndarray, aseg: np.ndarray, notes: list[str]) -> None:
    head = aseg > 0
    if not head.any():
        return
    lit = float(np.count_nonzero(image[head]) / head.sum())
    if lit < BLACK_SHARE or float(image[head].mean()) < 1.0:
        notes.append(f"{sid}: conformed image is black: {100 * lit:.2f}% of its labelled "
                     f"voxels above 0, their mean {float(image[head].mean()):.3f} of 255, "
                     f"{int(np.count_nonzero(image))} voxels above 0 in all; trained as is")


class _Hdf5:
    """generate_hdf5's file layout, written one subject at a time (plumbing)."""

    def __init__(self, path: Path):
        self.path, self.count, self.names = Path(path), 0, []

    def __enter__(self):
        import h5py

        self.file = h5py.File(self.path, "w")
        group = self.file.create_group(str(SIZE))
        shapes = {"orig_dataset": ((SIZE, SIZE, 2 * THICKNESS + 1), np.uint8),
                  "aseg_dataset": ((SIZE, SIZE), np.uint8),
                  "weight_dataset": ((SIZE, SIZE), float),
                  "zoom_dataset": ((2,), float)}
        self.sets = {name: group.create_dataset(name, shape=(0, *shape), dtype=dtype,
                                                maxshape=(None, *shape),
                                                chunks=(1, *shape))
                     for name, (shape, dtype) in shapes.items()}
        return self

    def add(self, sid, orig, aseg, weights, zoom) -> None:
        n = len(orig)
        arrays = {"orig_dataset": np.asarray(orig, dtype=np.uint8),
                  "aseg_dataset": np.asarray(aseg, dtype=np.uint8),
                  "weight_dataset": np.asarray(weights, dtype=float),
                  "zoom_dataset": np.broadcast_to(np.asarray(zoom, dtype=float), (n, 2))}
        for name, data in arrays.items():
            self.sets[name].resize(self.count + n, axis=0)
            self.sets[name][self.count:] = data
        self.count += n
        self.names.append(sid)

    def __exit__(self, *exc):
        import h5py

        self.file[str(SIZE)].create_dataset(
            "subject", data=[n.encode("ascii", "ignore") for n in self.names],
            dtype=h5py.special_dtype(vlen=str))
        self.file.close()
        return False
