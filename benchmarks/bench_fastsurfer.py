"""FastSurfer training data (issue 29), measured side by side in one run:

1. ``mriprep export --format fastsurfer-hdf5`` (checksums, parallel workers) against a
   serial restatement of FastSurfer's ``generate_hdf5`` loop (the referee,
   :mod:`mriprep.demo.fastsurfer_referee`, one subject after another, then one write) on
   the same ``conform_1mm`` cache: seconds per subject, their ratio, the HDF5's size;
2. the thick-slice Dataset's items per second (derived in memory, and from a
   ``derived_dir`` of memory-mapped classes/weights) against reading the same items from
   the HDF5 with h5py.

The cohort is :func:`mriprep.demo.freesurfer_cohort.build_freesurfer_cohort` run through
``conform_1mm`` (256^3 LIA uint8). Nothing asserts a time: compare the ratios.

    python benchmarks/bench_fastsurfer.py [--work-dir DIR] [--subjects 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mriprep.cache import Cache  # noqa: E402
from mriprep.cli import main as cli  # noqa: E402
from mriprep.demo.fastsurfer_referee import referee_subject  # noqa: E402
from mriprep.demo.freesurfer_cohort import build_freesurfer_cohort  # noqa: E402


def _cache(work: Path, subjects: int, workers: int) -> Path:
    cache = work / "cache"
    if (cache / "index.json").exists():
        return cache
    manifest = work / "cohort" / "cohort.csv"
    if not manifest.exists():
        t = time.perf_counter()
        build_freesurfer_cohort(work / "cohort", subjects)
        took = time.perf_counter() - t
        print(f"  built {subjects} FreeSurfer-labelled people in {took:.0f} s")
    code = cli(["run", str(manifest), "-o", str(cache), "-p", "conform_1mm", "--workers",
                str(workers), "--scheduler", "processes", "--no-report"])
    if code != 0:
        raise SystemExit(f"mriprep run -p conform_1mm failed ({code}) on {manifest}")
    return cache


def _serial_generate_hdf5(cache: Path, out: Path, view: str, lut: str) -> int:
    """generate_hdf5's loop restated: every subject in turn, all slices in memory, one
    write at the end (its layout, its dtypes)."""
    import h5py

    c = Cache(cache)
    data = {"orig": [], "aseg": [], "weight": [], "zoom": [], "subject": []}
    for entry in c.entries():
        orig = np.asarray(c.load_tensor(entry.key, "image"))
        aseg = np.asarray(c.load_tensor(entry.key, "label")).astype(np.int16)
        o, a, w, z = referee_subject(orig, aseg, tuple(c.read_meta(entry.key)["spacing"]),
                                     lut, view)
        data["orig"].extend(o)
        data["aseg"].extend(a)
        data["weight"].extend(w)
        data["zoom"].extend([z] * len(o))
        data["subject"].append(entry.subject_id)
    with h5py.File(out, "w") as hf:
        g = hf.create_group(str(data["orig"][0].shape[0]))
        g.create_dataset("orig_dataset", data=np.asarray(data["orig"], dtype=np.uint8))
        g.create_dataset("aseg_dataset", data=np.asarray(data["aseg"], dtype=np.uint8))
        g.create_dataset("weight_dataset", data=np.asarray(data["weight"], dtype=float))
        g.create_dataset("zoom_dataset", data=data["zoom"])
        g.create_dataset("subject", data=data["subject"], dtype=h5py.special_dtype(vlen=str))
    return len(data["subject"])


def _items_per_second(get, n: int, count: int) -> float:
    rng = np.random.default_rng(0)
    picks = np.sort(rng.choice(n, size=min(count, n), replace=False))  # entry order
    t = time.perf_counter()
    for i in picks:
        get(int(i))
    return len(picks) / (time.perf_counter() - t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--subjects", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--view", default="coronal")
    p.add_argument("--items", type=int, default=200)
    args = p.parse_args(argv)
    try:
        import h5py
    except ImportError:
        print("fastsurfer: skipped, h5py missing (pip install 'mriprep[fastsurfer]')")
        return 0
    from importlib import resources

    from mriprep.training.thick_slices import ThickSliceDataset

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-fastsurfer-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = _cache(work, args.subjects, args.workers)
    n = len(Cache(cache).entries())
    lut = str(resources.files("mriprep.training.labels") / "fastsurfer_dkt.tsv")
    ours, serial = work / f"ours_{args.view}.hdf5", work / f"serial_{args.view}.hdf5"
    for f in (ours, serial):
        f.unlink(missing_ok=True)
    t = time.perf_counter()
    code = cli(["export", str(cache), "-o", str(ours), "--format", "fastsurfer-hdf5",
                "--view", args.view, "--workers", str(args.workers)])
    t_ours = time.perf_counter() - t
    t = time.perf_counter()
    _serial_generate_hdf5(cache, serial, args.view, lut)
    t_serial = time.perf_counter() - t
    print(f"fastsurfer HDF5 export, {n} subjects of {cache}, {args.view} view (exit {code}):")
    print(f"  mriprep export ({args.workers} workers, checksums)  {t_ours / n:7.2f} s/subject")
    print(f"  serial generate_hdf5 restated          {t_serial / n:7.2f} s/subject")
    print(f"  ratio serial / mriprep                 {t_serial / t_ours:7.2f}x")
    print(f"  HDF5 size: mriprep {ours.stat().st_size / 2**20:.0f} MiB "
          f"({ours.stat().st_size / 2**20 / n:.0f} MiB/subject), serial "
          f"{serial.stat().st_size / 2**20:.0f} MiB")

    with h5py.File(ours, "r") as hf:
        g = hf[next(iter(hf))]
        slices = len(g["orig_dataset"])

        def from_hdf5(i):
            return g["orig_dataset"][i], g["aseg_dataset"][i], g["weight_dataset"][i]
        _items_per_second(from_hdf5, slices, args.items)
        rate_h5 = _items_per_second(from_hdf5, slices, args.items)
    t = time.perf_counter()
    memory = ThickSliceDataset(cache, _split(cache), view=args.view)
    open_memory = time.perf_counter() - t
    first_mem = _items_per_second(memory.__getitem__, len(memory), args.items)
    rate_mem = _items_per_second(memory.__getitem__, len(memory), args.items)
    t = time.perf_counter()
    stored = ThickSliceDataset(cache, _split(cache), view=args.view,
                               derived_dir=work / "derived")
    open_stored = time.perf_counter() - t
    _items_per_second(stored.__getitem__, len(stored), args.items)
    rate_stored = _items_per_second(stored.__getitem__, len(stored), args.items)
    print(f"thick-slice items ({args.items} in entry order, {args.view}, 7x256x256, "
          f"second pass unless said):")
    print(f"  h5py from the HDF5                     {rate_h5:8.0f} items/s")
    print(f"  Dataset, derived in memory             {rate_mem:8.0f} items/s "
          f"(opening {open_memory:.1f} s; first pass, deriving weights: {first_mem:.0f}/s)")
    print(f"  Dataset, derived_dir memory maps       {rate_stored:8.0f} items/s "
          f"(opening {open_stored:.1f} s: derives and writes what the folder lacks)")
    return 0


def _split(cache: Path) -> str:
    """The split with the most entries (the Dataset reads one split)."""
    splits = [e.split for e in Cache(cache).entries()]
    return max(set(splits), key=splits.count)


if __name__ == "__main__":
    raise SystemExit(main())
