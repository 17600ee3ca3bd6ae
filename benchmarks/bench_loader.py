"""Loader throughput: mriprep against MONAI's datasets, nibabel and the ceiling.

Every loader delivers the same preprocessed volumes (image float32 [1, X, Y, Z] and valid
mask, plus int64 labels with ``--labels``) in batches of 2, shuffled. Each is run for one
untimed warm-up epoch (page cache warm, MONAI's caches filled, workers started), then
timed over 3 epochs (repeated until a measurement spans at least a second) in each of 3
interleaved rounds (:func:`interleaved`); a row is the median round and the range. MB/s
counts the bytes of the tensors handed to the training loop.

MONAI is run its documented ways for data that fits in memory and on disk: the
``PersistentDataset`` (MONAI's ``monai.data`` reference: a deterministic transform's
output kept on disk) with its ``DataLoader`` and its ``ThreadDataLoader``; and the fast
path of MONAI's fast-training guide (Project-MONAI/tutorials,
``acceleration/fast_model_training_guide.md`` and ``fast_training_tutorial.ipynb``):
``CacheDataset(cache_rate=1.0, copy_cache=False)``, every volume held in process memory,
read by ``ThreadDataLoader(num_workers=0)``. For 96^3 patches, that guide's pattern with
the random crop of MONAI's spleen segmentation tutorial (``3d_segmentation/
spleen_segmentation_3d.ipynb``) after the cached load: ``RandCropByPosNegLabeld`` with
``num_samples`` patches an item (a third centred on foreground, as mriprep's patches with
labels), or ``RandSpatialCropSamplesd`` without labels, and ``set_track_meta(False)`` (the
guide's: nothing downstream reads metadata), read by ``ThreadDataLoader`` as the guide
has it (``num_workers=0``) and with as many threads as mriprep's. "x MONAI" is against the
fastest MONAI loader of the same unit: volumes against volumes, patches against patches.

Beside them, what a plain training script does without a cache: the same volumes as
``.nii.gz`` files, read in a torch ``DataLoader`` (2 worker processes) by nibabel's
``get_fdata(dtype=np.float32)`` (nibabel's "Images and memory" page and its ``get_fdata``
reference: the data as float32, read once). It is slower by an order of magnitude (the
decompression), so it takes one round only.

The ceiling is what any loader could reach: one copy of the same cache files from the page
cache into reused buffers by 2 threads, no allocation and no decoding, made two ways, by
``readinto`` and from a memory map (the way mriprep reads a ``.npy``), each thread taking
whole volumes in turn; the faster of the two is the ceiling. This measures; it never
asserts a time.

    python benchmarks/bench_loader.py [--cache CACHE --split train] [--labels]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from mriprep.cache import Cache, entry_key
from mriprep.inputs.templates import load_mni152_tissue, load_template
from mriprep.training import MRIDataset, make_dataloader

PAGE = 4096
# A measurement spans at least this (interleaved): the fastest loaders' three epochs take
# a tenth of a second.
MIN_SECONDS = 1.0


# -- the data -----------------------------------------------------------------------------


def build_bench_cache(root: Path, n: int = 8, labels: bool = False, split: str = "train",
                      step: int = 1, val: int = 0) -> Path:
    """``n`` template-sized (197x233x189 at ``step=1``) subjects in a new cache at ``root``,
    in ``split`` but for the last ``val``, which are in "val".

    Subjects differ by gain and noise; each has one zero-filled, masked axial slice.
    """
    template = load_template("mni152")
    sub = (slice(None, None, step),) * 3
    base = template.data[sub]
    tissue = load_mni152_tissue() if labels else None
    affine = template.affine.copy()
    affine[:3, :3] *= step
    cache = Cache(root, create=True)
    entries = []
    for i in range(n):
        rng = np.random.default_rng(i)
        image = np.ascontiguousarray(base * (1 + 0.03 * i), dtype=np.float32)
        image += rng.normal(0, 2, image.shape).astype(np.float32)
        valid = np.ones(image.shape, dtype=bool)
        k = image.shape[2] // 3 + i
        valid[:, :, k] = False
        image[:, :, k] = 0
        tensors = {"image": image, "valid": valid}
        if tissue is not None:
            label = np.zeros(image.shape, dtype=np.int16)
            label[tissue["gm"][sub] > 0.5] = 1
            label[tissue["wm"][sub] > 0.5] = 2
            tensors["label"] = label
        sid = f"bench-{i:02d}"
        pipeline_hash = "bench" + "0" * 59
        meta = {
            "subject_id": sid, "session_id": "", "pipeline_name": "bench",
            "pipeline_hash": pipeline_hash,
            "inputs": {"t1w": {"path": "mni152", "sha256": f"{i:064x}"}},
            "affine": affine.tolist(), "spacing": [float(step)] * 3,
            "shape": list(image.shape), "provenance": [],
        }
        key = entry_key(sid, "", {"t1w": f"{i:064x}"}, pipeline_hash)
        in_split = "val" if i >= n - val else split
        entries.append(cache.write_entry(key, tensors, meta).with_split(in_split))
    cache.update_index(entries)
    return Path(root)


def tensor_files(cache: Cache, split: str, labels: bool) -> list[dict[str, Path]]:
    names = ("image", "valid", "label") if labels else ("image", "valid")
    return [{n: cache.tensor_path(r.key, n) for n in names} for r in cache.entries(split)]


def write_nifti_copies(files: list[dict[str, Path]], affine: np.ndarray, folder: Path):
    """The same volumes as gzipped NIfTI (valid as uint8), as a plain pipeline keeps them."""
    import nibabel as nib

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, paths in enumerate(files):
        row = {}
        for name, path in paths.items():
            array = np.load(path)
            if array.dtype == bool:
                array = array.astype(np.uint8)
            row[name] = folder / f"{i:02d}_{name}.nii.gz"
            nib.save(nib.Nifti1Image(array, affine), row[name])
        out.append(row)
    return out


# -- the loaders compared -----------------------------------------------------------------


class NiftiDataset(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        import nibabel as nib

        row = self.rows[i]
        item = {"image": torch.from_numpy(
            nib.load(row["image"]).get_fdata(dtype=np.float32)[None])}
        item["valid"] = torch.from_numpy(np.asanyarray(nib.load(row["valid"]).dataobj) > 0)
        if "label" in row:
            item["label"] = torch.from_numpy(
                np.asanyarray(nib.load(row["label"]).dataobj).astype(np.int64))
        return item


def _load_preprocessed():
    """MONAI's transform that yields the tensors every loader delivers (deterministic, so
    MONAI's datasets cache its output)."""
    from monai.transforms import Transform

    class LoadPreprocessed(Transform):
        def __call__(self, data):
            out = {"image": torch.from_numpy(np.load(data["image"])[None]),
                   "valid": torch.from_numpy(np.load(data["valid"]))}
            if "label" in data:
                out["label"] = torch.from_numpy(np.load(data["label"]).astype(np.int64))
            return out

    return LoadPreprocessed()


def _monai_rows(files) -> list[dict[str, str]]:
    return [{k: str(v) for k, v in row.items()} for row in files]


def monai_dataset(files, cache_folder: Path):
    """PersistentDataset whose cached (deterministic) transform yields the same tensors."""
    from monai.data import PersistentDataset

    return PersistentDataset(_monai_rows(files), transform=_load_preprocessed(),
                             cache_dir=cache_folder)


def monai_cache_dataset(files, workers: int):
    """CacheDataset as MONAI's fast-training guide sets it up: every item's transform run
    once, up front, and held in memory (``copy_cache=False``: nothing random follows)."""
    from monai.data import CacheDataset

    return CacheDataset(_monai_rows(files), transform=_load_preprocessed(), cache_rate=1.0,
                        num_workers=workers, copy_cache=False, progress=False)


def monai_patch_dataset(files, workers: int, patch_size: int, samples_per_volume: int,
                        labels: bool):
    """The fast-training guide's CacheDataset (every volume loaded once and held) with the
    spleen tutorial's random crop after it: ``samples_per_volume`` patches an item, a third
    of them centred on foreground where there are labels. As the guide sets it up for a
    random crop: ``copy_cache=False`` (a crop does not change the cached volume, so no
    copy of it per item), and the foreground and background indices found once, with
    the load, not at every crop."""
    from monai.data import CacheDataset
    from monai.transforms import (Compose, DeleteItemsd, EnsureChannelFirstd,
                                  FgBgToIndicesd, RandCropByPosNegLabeld,
                                  RandSpatialCropSamplesd)

    keys = ["image", "valid"] + (["label"] if labels else [])
    # MONAI crops channel-first arrays: the mask and labels get the image's channel axis
    # (cached with the load; the same bytes).
    steps = [_load_preprocessed(), EnsureChannelFirstd(keys[1:], channel_dim="no_channel")]
    size = (patch_size,) * 3
    if labels:
        steps += [FgBgToIndicesd("label"),
                  RandCropByPosNegLabeld(keys, label_key="label", spatial_size=size, pos=1,
                                         neg=2, num_samples=samples_per_volume,
                                         fg_indices_key="label_fg_indices",
                                         bg_indices_key="label_bg_indices"),
                  DeleteItemsd(["label_fg_indices", "label_bg_indices"])]
    else:
        steps.append(RandSpatialCropSamplesd(keys, roi_size=size,
                                             num_samples=samples_per_volume,
                                             random_size=False))
    for step in steps:
        if hasattr(step, "set_random_state"):
            step.set_random_state(seed=0)
    return CacheDataset(_monai_rows(files), transform=Compose(steps), cache_rate=1.0,
                        num_workers=workers, copy_cache=False, progress=False)


def batch_bytes_items(batch) -> tuple[int, int]:
    tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]
    return sum(t.element_size() * t.nelement() for t in tensors), len(tensors[0])


def measure(loader, epochs: int) -> dict:
    """Throughput of ``epochs`` epochs of an already warmed-up loader."""
    nbytes = items = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            b, n = batch_bytes_items(batch)
            nbytes += b
            items += n
            float(batch["image"].flatten()[0])  # the consumer touches the batch
    seconds = time.perf_counter() - start
    return {"MB/s": nbytes / seconds / 1e6, "items/s": items / seconds, "seconds": seconds,
            "items": items, "bytes": nbytes}


def interleaved(contenders: list, rounds: int,
                min_seconds: float = MIN_SECONDS) -> dict[str, list[dict]]:
    """Each of ``contenders`` (name, measure once, the rounds it takes part in or None for
    all) measured in ``rounds`` rounds: name -> one result per round it took part in.

    Interleaved, because other work on a shared machine comes and goes; the order is
    reversed every other round, so that no contender always follows the same one. Each
    measurement is repeated until it spans ``min_seconds`` (:func:`for_at_least`): the
    fastest loaders read the whole cache three times in a tenth of a second, a window
    that a moment of other work could fill."""
    measured: dict[str, list[dict]] = {name: [] for name, *_ in contenders}
    for r in range(rounds):
        for name, once, only in (contenders if r % 2 == 0 else contenders[::-1]):
            if only is None or r < only:
                measured[name].append(for_at_least(min_seconds, once))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return measured


def for_at_least(seconds: float, once) -> dict:
    """``once()`` (a dict with ``bytes``, ``items`` and ``seconds``) repeated until the
    repeats took ``seconds`` in all, summed into one result."""
    parts = [once()]
    while sum(part["seconds"] for part in parts) < seconds:
        parts.append(once())
    spent = sum(part["seconds"] for part in parts)
    nbytes = sum(part["bytes"] for part in parts)
    items = sum(part["items"] for part in parts)
    return {"MB/s": nbytes / spent / 1e6, "items/s": items / spent, "seconds": spent,
            "items": items, "bytes": nbytes, "repeats": len(parts)}


def warm_up(loader) -> None:
    """One untimed epoch: page cache warm, MONAI's cache written, workers started."""
    for _ in loader:
        pass


def _copy_by_readinto(path: Path, view: memoryview) -> int:
    with open(path, "rb", buffering=0) as fh:
        pos = 0
        while n := fh.readinto(view[pos:]):
            pos += n
    return pos


def _copy_from_memory_map(path: Path, view: memoryview) -> int:
    # Through NumPy, as the Dataset copies: its copy releases the GIL, where assigning
    # into a memoryview holds it and the two threads would take turns.
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    np.copyto(np.frombuffer(view, dtype=np.uint8, count=mapped.size), mapped)
    return mapped.size


CEILING_COPIES = {"readinto": _copy_by_readinto, "memory map": _copy_from_memory_map}


def measure_ceiling(files, epochs: int, threads: int, copy: str = "readinto") -> dict:
    """Cache files copied whole by ``threads`` threads into reused buffers, each by
    ``copy`` (a key of :data:`CEILING_COPIES`): the upper bound."""
    copy_one = CEILING_COPIES[copy]
    volumes = [list(row.values()) for _ in range(epochs) for row in files]
    size = max(p.stat().st_size for paths in volumes for p in paths)
    total = [0]
    lock = threading.Lock()

    def reader(paths):
        view = memoryview(bytearray(size))
        done = sum(copy_one(path, view) for path in paths)
        with lock:
            total[0] += done

    reader([p for paths in volumes[:len(files)] for p in paths])  # warm the page cache
    total[0] = 0
    # Whole volumes to each thread in turn, as a loader's threads take whole items: a
    # file at a time in turn gave one thread every image and the other every mask.
    shares = [[p for paths in volumes[i::threads] for p in paths] for i in range(threads)]
    start = time.perf_counter()
    workers = [threading.Thread(target=reader, args=(share,)) for share in shares]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    return {"MB/s": total[0] / seconds / 1e6, "items/s": len(volumes) / seconds,
            "seconds": seconds, "items": len(volumes), "bytes": total[0]}


def pages_touched(path: Path, start, size) -> int:
    """Distinct 4 KiB pages of a C-order .npy file that a region read must map."""
    array = np.load(path, mmap_mode="r")
    header = array.offset
    shape, itemsize = array.shape, array.itemsize
    x = np.arange(start[0], start[0] + size[0])[:, None]
    y = np.arange(start[1], start[1] + size[1])[None, :]
    first_byte = header + ((x * shape[1] + y) * shape[2] + start[2]).ravel() * itemsize
    last_byte = first_byte + size[2] * itemsize - 1
    first, last = first_byte // PAGE, last_byte // PAGE
    span = int((last - first).max()) + 1
    pages = first[:, None] + np.arange(span)[None, :]
    return int(np.unique(pages[pages <= last[:, None]]).size)


def patch_read_sizes(loader, files) -> tuple[float, float]:
    """Mean MB of cache pages a patch read maps, and MB of tensors per patch (one epoch)."""
    ds = loader.dataset
    touched, delivered = [], []
    for batch in loader:
        delivered.append(batch_bytes_items(batch)[0] / len(batch["subject_id"]))
        for sid, start in zip(batch["subject_id"], batch["location"]):
            paths = files[ds.subject_ids.index(sid)].values()
            touched.append(sum(pages_touched(p, start.tolist(), ds.patch_size) for p in paths))
    return np.mean(touched) * PAGE / 1e6, np.mean(delivered) / 1e6


# -- the run ------------------------------------------------------------------------------


def run(cache_dir: str | os.PathLike | None = None, *, split: str = "train",
        labels: bool = False, epochs: int = 3, batch_size: int = 2, workers: int = 2,
        patch_size: int = 96, samples_per_volume: int = 4, volumes: int = 8,
        rounds: int = 3) -> list[dict]:
    """Measure every loader; one dict per row (name, unit, note, MB/s, items/s, seconds).

    Each loader is timed over ``epochs`` epochs in each of ``rounds`` interleaved rounds
    (nibabel in one); its row is the median round, with the range (``MB/s range``).
    """
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="mriprep-bench-"))
    try:
        if cache_dir is None:
            t0 = time.perf_counter()
            cache_dir = build_bench_cache(scratch / "cache", n=volumes, labels=labels, split=split)
            print(f"built a cache of {volumes} template-sized volumes in "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
        cache = Cache(cache_dir)
        files = tensor_files(cache, split, labels)
        affine = cache.entries(split)[0].affine
        common = dict(batch_size=batch_size, num_workers=workers, seed=0, shuffle=True)
        contenders = []  # (name, unit, note, rounds, measure once)

        def loader(name, dl, unit="volumes", note="", rounds=None):
            warm_up(dl)
            contenders.append((name, unit, note, rounds, lambda: measure(dl, epochs)))

        volume_ds = MRIDataset(cache_dir, split=split, mode="volume", labels=labels)
        loader("mriprep volume (threads)", make_dataloader(volume_ds, backend="threads", **common))
        loader("mriprep volume (processes)",
               make_dataloader(volume_ds, backend="processes", **common))
        patch_ds = MRIDataset(cache_dir, split=split, mode="patch", patch_size=patch_size,
                              samples_per_volume=samples_per_volume, labels=labels,
                              foreground_fraction=0.33 if labels else 0.0)
        patch_loader = make_dataloader(patch_ds, **common)
        read_mb, patch_mb = patch_read_sizes(patch_loader, files)
        volume_mb = sum(p.stat().st_size for p in files[0].values()) / 1e6
        loader("mriprep patch (threads)", patch_loader, unit="patches",
               note=f"a {patch_size}^3 patch is {patch_mb:.1f} MB of tensors and reads "
                    f"{read_mb:.1f} MB (4 KiB pages) of its {volume_mb:.1f} MB volume "
                    f"({read_mb / volume_mb:.0%})")

        from monai.data import DataLoader as MonaiDataLoader, ThreadDataLoader

        monai_ds = monai_dataset(files, scratch / "monai")
        loader("MONAI PersistentDataset + DataLoader", MonaiDataLoader(
            monai_ds, batch_size=batch_size, shuffle=True, num_workers=workers,
            persistent_workers=True))
        loader("MONAI PersistentDataset + ThreadDataLoader", ThreadDataLoader(
            monai_ds, batch_size=batch_size, shuffle=True, num_workers=workers,
            use_thread_workers=True))
        cached = monai_cache_dataset(files, workers)
        held_mb = sum(t.element_size() * t.nelement() for item in cached._cache
                      for t in item.values()) / 1e6
        loader("MONAI CacheDataset + ThreadDataLoader", ThreadDataLoader(
            cached, batch_size=batch_size, shuffle=True, num_workers=0),
            note=f"holds every volume in process memory: {held_mb:.0f} MB for "
                 f"{len(files)} volumes")
        from monai.data import set_track_meta

        set_track_meta(False)
        patches = monai_patch_dataset(files, workers, patch_size, samples_per_volume, labels)
        crop = "RandCropByPosNegLabeld" if labels else "RandSpatialCropSamplesd"
        loader("MONAI CacheDataset + crop + ThreadDataLoader", ThreadDataLoader(
            patches, batch_size=batch_size, shuffle=True, num_workers=0), unit="patches",
            note=f"{patch_size}^3, {samples_per_volume} patches an item ({crop}); the guide's "
                 "num_workers=0")
        loader("MONAI CacheDataset + crop, 2 threads", ThreadDataLoader(
            patches, batch_size=batch_size, shuffle=True, num_workers=workers,
            use_thread_workers=True), unit="patches",
            note=f"the same, its crops in {workers} threads, as many as mriprep's")

        t0 = time.perf_counter()
        nifti = write_nifti_copies(files, affine, scratch / "nifti")
        print(f"wrote .nii.gz copies in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        # Slow by an order of magnitude: one round says all there is to say.
        loader("nibabel .nii.gz + DataLoader", torch.utils.data.DataLoader(
            NiftiDataset(nifti), batch_size=batch_size, shuffle=True, num_workers=workers,
            persistent_workers=True), rounds=1)
        for copy in CEILING_COPIES:
            contenders.append((f"ceiling, {copy}", "volumes",
                               f"{workers} threads, page cache -> reused buffers, whole "
                               "volumes each, no allocation", None,
                               lambda copy=copy: measure_ceiling(files, epochs, workers, copy)))

        # The warm-ups wrote MONAI's cache and the .nii.gz copies: flushed now, so that the
        # kernel's writeback does not fall on the first measurement.
        os.sync()
        measured = interleaved([(name, once, only) for name, _, _, only, once in contenders],
                               rounds)
        return [median_row(name, unit, note, measured[name])
                for name, unit, note, *_ in contenders]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def median_row(name: str, unit: str, note: str, results: list[dict]) -> dict:
    """A loader's row: its median round (by MB/s; the lower of the middle two for an
    even number of rounds, so that the row is a measured round), the range, and every
    round's MB/s in the order measured (which round is slow tells a cold start from
    other work on the machine)."""
    ordered = sorted(results, key=lambda r: r["MB/s"])
    median = ordered[(len(ordered) - 1) // 2]
    return {"name": name, "unit": unit, "note": note, **median, "rounds": len(results),
            "MB/s range": (ordered[0]["MB/s"], ordered[-1]["MB/s"]),
            "MB/s by round": [r["MB/s"] for r in results]}


def format_rounds(rows: list[dict]) -> str:
    """Every row's MB/s round by round, in the order measured (rows of several rounds)."""
    lines = ["MB/s by round, in the order measured:"]
    shown = [r for r in rows if len(r.get("MB/s by round", ())) > 1]
    width = max((len(r["name"]) for r in shown), default=0)
    for r in shown:
        lines.append(f"  {r['name']:{width}s} "
                     + " / ".join(f"{v:.0f}" for v in r["MB/s by round"]))
    return "\n".join(lines)


def fastest_monai(rows: list[dict]) -> dict[str, float]:
    """Per unit (volumes, patches), the fastest MONAI row's MB/s; a unit with no MONAI row
    has none, and its rows no ratio: volumes and patches are not the same work."""
    best = {}
    for r in rows:
        if r["name"].startswith("MONAI"):
            best[r["unit"]] = max(best.get(r["unit"], 0.0), r["MB/s"])
    return best


def x_monai(row: dict, fastest: dict[str, float]) -> str:
    """The row's "x MONAI" cell, 8 wide: over :func:`fastest_monai` of its unit, or "-"."""
    if row["unit"] not in fastest:
        return f"{'-':>8s}"
    return f"{row['MB/s'] / fastest[row['unit']]:8.2f}"


def format_table(rows: list[dict], labels: bool = False) -> str:
    """The rows as a table (median round, range), with ratios against the fastest MONAI
    loader of the same unit (:func:`fastest_monai`) and against the ceiling."""
    monai = fastest_monai(rows)
    ceiling = max(r["MB/s"] for r in rows if r["name"].startswith("ceiling"))
    lines = [f"{'loader':44s} {'MB/s':>7s} {'range':>11s} {'items/s':>8s} {'x MONAI':>8s} "
             f"{'of ceiling':>10s}", "-" * 93]
    for r in rows:
        low, high = r["MB/s range"]
        lines.append(
            f"{r['name']:44s} {r['MB/s']:7.0f} {low:5.0f}-{high:<5.0f} {r['items/s']:6.1f} "
            f"{r['unit'][:1]} {x_monai(r, monai)} {r['MB/s'] / ceiling:10.0%}"
        )
        if r["note"]:
            lines.append(f"    {r['note']}")
    lines.append("MB/s: the median round; x MONAI: over the median of the fastest MONAI "
                 "loader of the same unit (volumes or patches); "
                 "of ceiling: over the faster ceiling's median; items/s in volumes (v) or "
                 "patches (p)")
    if labels:
        lines.append("with labels, loaders deliver int64 label maps (4x the int16 stored) while "
                     "the ceiling reads stored bytes: compare volumes/s against it")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="an existing cache (default: build 8 template volumes)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--labels", action="store_true",
                        help="include int64 label maps (then patches oversample foreground)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rows = run(args.cache, split=args.split, labels=args.labels, epochs=args.epochs,
               batch_size=args.batch_size, workers=args.workers, rounds=args.rounds)
    print(f"\nloaders over {args.epochs} epochs, batch {args.batch_size}, "
          f"{args.workers} workers, warm page cache, median of {args.rounds} rounds "
          f"({os.cpu_count()} CPUs)")
    print(format_table(rows, labels=args.labels))
    print(format_rounds(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
