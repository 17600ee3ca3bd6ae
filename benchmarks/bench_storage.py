"""Storage formats: bytes per subject, and what each costs the loader, against MONAI.

A few of a demo cohort's people go through both shipped pipelines into float32 ``.npy``
(what every cache held before storage formats existed; without a cohort: template-sized
volumes), and every entry is written again in each storage format from those values:
float32, float16 and (conform only) uint8, with no compression, LZ4 or Zstd.

Then the loader's decoded throughput per format: ``MRIDataset`` in volume mode (2 reader
threads, batch 2: image float32 [1, X, Y, Z] and valid mask, the tensors the training
loop receives whatever the storage) and in 96^3 patch mode, against MONAI over the
float32 ``.npy`` files run its two documented ways (``bench_loader``'s docstring names the
pages): PersistentDataset (its transform cache written in the warm-up epoch) with
ThreadDataLoader, and the fast-training guide's CacheDataset, every volume in memory,
with ThreadDataLoader(num_workers=0); for the patches, that CacheDataset with the
tutorial's random crop after the load (``bench_loader.monai_patch_dataset``), read with
no worker as the guide has it and with 2 threads. Each of
mriprep's rows is set against the faster MONAI loader of its unit. All in interleaved
rounds of one run; a row is the median round and the range. MB/s counts the bytes
handed to the training loop. Nothing is asserted.

    python benchmarks/bench_storage.py [--cohort COHORT] [--subjects 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (label, image dtype, compression): the formats compared; the first is the reference.
FORMATS = [
    ("float32 .npy (before)", "float32", "none"),
    ("float32 lz4", "float32", "lz4"),
    ("float32 zstd", "float32", "zstd"),
    ("float16 .npy", "float16", "none"),
    ("float16 lz4 (t1w_mni_rigid)", "float16", "lz4"),
    ("float16 zstd", "float16", "zstd"),
]
CONFORM_FORMATS = [
    ("float32 .npy (before)", "float32", "none"),
    ("uint8 .npy", "uint8", "none"),
    ("uint8, masks lz4 (conform_1mm)", "uint8", {"valid": "lz4", "label": "lz4"}),
    ("uint8 lz4", "uint8", "lz4"),
    ("uint8 zstd", "uint8", "zstd"),
]
LOADER_FORMATS = ("float32 .npy (before)", "float16 .npy", "float16 lz4 (t1w_mni_rigid)",
                  "float16 zstd")


def _as_dtype(image: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "uint8":
        return np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return image.astype(dtype)


def reencode(source, root: Path, dtype: str, compression, split: str = "train"):
    """Every entry of cache ``source`` written again into a new cache at ``root`` with
    ``dtype`` images and ``compression``, all in ``split``; returns the new Cache."""
    from mriprep.cache import Cache

    out = Cache(root, create=True)
    entries = []
    for entry in source.entries():
        tensors = {name: np.asarray(source.load_tensor(entry.key, name))
                   for name in entry.files}
        tensors["image"] = _as_dtype(tensors["image"].astype(np.float32), dtype)
        meta = source.read_meta(entry.key)
        for name in ("key", "files", "extra_files", "format_version"):
            meta.pop(name, None)
        entries.append(out.write_entry(entry.key, tensors, meta, compression=compression)
                       .with_split(split))
    out.update_index(entries)
    return out


def sizes(source, formats, scratch: Path) -> tuple[list[dict], dict]:
    """Mean bytes per subject of each format, per tensor; and the caches written."""
    caches, rows = {}, []
    for label, dtype, compression in formats:
        t0 = time.perf_counter()
        cache = reencode(source, scratch / label.split(" (")[0].replace(" ", "-").replace(
            ",", ""), dtype, compression)
        seconds = time.perf_counter() - t0
        entries = cache.entries()
        per_tensor = {n: np.mean([e.files[n].bytes for e in entries if n in e.files])
                      for n in ("image", "valid", "label")
                      if any(n in e.files for e in entries)}
        rows.append({"format": label, "bytes": sum(per_tensor.values()),
                     "tensors": per_tensor, "write_s": seconds / len(entries)})
        caches[label] = cache
    return rows, caches


def format_sizes(rows: list[dict], title: str) -> str:
    base = rows[0]["bytes"]
    lines = [title, f"{'format':34s} {'MB/subject':>10s} {'smaller':>8s}  image / valid / label MB"
             "   write s/subject", "-" * 100]
    for r in rows:
        parts = " / ".join(f"{r['tensors'].get(n, 0) / 1e6:.2f}" for n in ("image", "valid",
                                                                          "label"))
        lines.append(f"{r['format']:34s} {r['bytes'] / 1e6:10.1f} {base / r['bytes']:7.1f}x"
                     f"  {parts:24s} {r['write_s']:8.2f}")
    return "\n".join(lines)


def loaders(caches: dict, scratch: Path, rounds: int, epochs: int) -> list[dict]:
    """Decoded MB/s of every format's Dataset (volume and patch mode) and of MONAI's
    datasets over the float32 .npy files: interleaved rounds, each row the median round
    and the range."""
    import torch
    from monai.data import ThreadDataLoader, set_track_meta

    from benchmarks.bench_loader import (interleaved, median_row, measure,
                                         monai_cache_dataset, monai_dataset,
                                         monai_patch_dataset, tensor_files, warm_up)
    from mriprep.training import MRIDataset, make_dataloader

    torch.set_num_threads(1)
    common = dict(batch_size=2, num_workers=2, seed=0, shuffle=True)
    contenders = []
    for label in LOADER_FORMATS:
        cache = caches[label]
        volume = make_dataloader(MRIDataset(cache.root, "train", mode="volume", labels=False),
                                 backend="threads", **common)
        patch = make_dataloader(MRIDataset(cache.root, "train", mode="patch", patch_size=96,
                                           samples_per_volume=4, labels=False),
                                backend="threads", **common)
        contenders += [(f"mriprep volume, {label}", volume, "volumes"),
                       (f"mriprep patch 96^3, {label}", patch, "patches")]
    files = tensor_files(caches[LOADER_FORMATS[0]], "train", False)
    persistent = ThreadDataLoader(monai_dataset(files, scratch / "monai"), batch_size=2,
                                  shuffle=True, num_workers=2, use_thread_workers=True)
    in_memory = ThreadDataLoader(monai_cache_dataset(files, 2), batch_size=2, shuffle=True,
                                 num_workers=0)
    set_track_meta(False)  # the fast-training guide's, for the crop: no metadata is read
    cropped = monai_patch_dataset(files, 2, 96, 4, labels=False)
    patches = ThreadDataLoader(cropped, batch_size=2, shuffle=True, num_workers=0)
    patches_2 = ThreadDataLoader(cropped, batch_size=2, shuffle=True, num_workers=2,
                                 use_thread_workers=True)
    contenders += [("MONAI PersistentDataset (float32 .npy)", persistent, "volumes"),
                   ("MONAI CacheDataset, in memory (float32 .npy)", in_memory, "volumes"),
                   ("MONAI CacheDataset + crop 96^3 (float32 .npy)", patches, "patches"),
                   ("MONAI the same, 2 threads (float32 .npy)", patches_2, "patches")]
    for _, loader, _ in contenders:
        warm_up(loader)
    measured = interleaved([(name, lambda loader=loader: measure(loader, epochs), None)
                            for name, loader, _ in contenders], rounds)
    return [median_row(name, unit, "", measured[name]) for name, _, unit in contenders]


def format_loaders(rows: list[dict]) -> str:
    from benchmarks.bench_loader import fastest_monai, x_monai

    monai = fastest_monai(rows)
    lines = [f"{'loader, storage':58s} {'MB/s':>7s} {'range':>11s} {'items/s':>9s} "
             f"{'x MONAI':>8s}", "-" * 98]
    for r in rows:
        low, high = r["MB/s range"]
        lines.append(f"{r['name']:58s} {r['MB/s']:7.0f} {low:5.0f}-{high:<5.0f} "
                     f"{r['items/s']:7.1f} {r['unit'][0]} {x_monai(r, monai)}")
    lines.append("MB/s: decoded bytes handed to the training loop (image float32 and valid "
                 "mask, whatever the storage), the median round; x MONAI: over the median of the "
                 "faster MONAI loader of the same unit (volumes or patches)")
    return "\n".join(lines)


def pipeline_source(cohort: Path, pipeline: str, scratch: Path, subjects: int):
    """A float32 .npy cache of the cohort's first ``subjects`` subjects (of those the
    pipeline accepts) through ``pipeline``: the values every format is written from."""
    from mriprep.cache import Cache
    from mriprep.pipelines import load_pipeline
    from mriprep.run.cohort import cohort_rows, run_cohort

    rows = [r for r in cohort_rows(cohort / "cohort.csv") if not r.session_id][:subjects + 3]
    root = scratch / f"{pipeline}-source"
    run_cohort(rows, root, load_pipeline(pipeline, output_dtype="float32", compression="none"),
               scheduler="sync", report=False)
    cache = Cache(root)
    cache.write_index(cache.entries()[:subjects])
    return cache


def main(argv=None) -> int:
    from benchmarks.bench_loader import format_rounds
    from mriprep.cache import Cache

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cohort", type=Path,
                        help="a demo cohort: its people through both shipped pipelines "
                             "(default: 8 template-sized volumes, no conform)")
    parser.add_argument("--subjects", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    try:
        if args.cohort is not None:
            source = pipeline_source(args.cohort, "t1w_mni_rigid", scratch, args.subjects)
            what = f"t1w_mni_rigid, {len(source.entries())} demo subjects with labels"
        else:
            from benchmarks.bench_loader import build_bench_cache

            source = Cache(build_bench_cache(scratch / "source", n=8, labels=True))
            what = "8 template-sized volumes with labels"
        rows, caches = sizes(source, FORMATS, scratch / "formats")
        print(format_sizes(rows, f"bytes per subject, {what}:"))
        if args.cohort is not None:
            conform = pipeline_source(args.cohort, "conform_1mm", scratch, args.subjects)
            crows, _ = sizes(conform, CONFORM_FORMATS, scratch / "conform")
            print()
            print(format_sizes(crows, f"bytes per subject, conform_1mm, "
                                      f"{len(conform.entries())} demo subjects with labels:"))
        print(f"\nloaders, 2 reader threads, batch 2, {args.epochs} epochs, warm page cache, "
              f"median of {args.rounds} rounds ({os.cpu_count()} CPUs):")
        loader_rows = loaders(caches, scratch, args.rounds, args.epochs)
        print(format_loaders(loader_rows))
        print(format_rounds(loader_rows))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
