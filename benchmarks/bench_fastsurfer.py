"""FastSurfer training data from a FreeSurfer ``SUBJECTS_DIR``, measured side by side in
one run (issue 44):

1. **The export, three views.** ``mriprep manifest from-freesurfer`` and ``mriprep run -p
   conform_1mm`` make the cache (timed apart: it is preprocessing a user runs once);
   then ``mriprep export --format fastsurfer-hdf5`` once per view, as documented
   (default workers; the first view derives the classes of all three, the others reuse
   them). The anchor is FastSurfer's own ``generate_hdf5.py`` (the pinned checkout in
   ``MRIPREP_FASTSURFER``, else ``../shared/fastsurfer``) run as its documentation runs
   it (FastSurfer's ``doc/scripts/fastsurfercnn.generate_hdf5.rst``: the script's own
   options, serial, as it has no option for workers), once per view, on the same
   subjects: the cache's images and label maps written as
   ``orig.mgz`` and ``aparc.DKTatlas+aseg.mgz`` (the very voxels mriprep exports; how
   ``conform_1mm`` treats an already conformed ``orig.mgz`` is another question), and
   the two files are compared dataset by dataset.
   One fault of that commit is mended so that it writes anything at all: its
   ``create_hdf5_dataset`` calls ``self.transform`` without the plane, and every subject
   is skipped (the checkout's README lists it). Its seconds per subject come from the
   moments it starts each subject.
2. **The thick-slice Dataset.** Opening with the classes stored (warm), one subject's
   derivation (cold, in this process), the first shuffled batch of ``make_dataloader``
   (batch 16) and the steady rate. The anchor is FastSurfer's training loader from the
   checkout, built as its ``data_loader/loader.py`` ``get_dataloader`` builds it
   (:func:`_fastsurfer_loaders`): it loads the whole file into memory, then serves items
   from there; the ratio is against its fastest worker count, steady and over a first
   epoch with each side's start. Beside it, h5py reading the export item by item in one
   fixed shuffled order: a streaming reader, as mriprep is one, but not FastSurfer's way.
   All in interleaved rounds of whole epochs (``bench_loader.measure`` and
   ``interleaved``: the order reversed every other round, each measurement at least a
   second), the median and the range.
3. **Data on disk per subject**, from the files the run left: the cache entry, the classes
   and view-ordered arrays mriprep derives, and the HDF5 files of both sides.

The people are synthetic (:mod:`mriprep.demo.freesurfer_subjects`: every class of the DKT
table, FreeSurfer's "unknown" medial wall). Nothing asserts a time: read the ratios.

    python benchmarks/bench_fastsurfer.py [--work-dir DIR] [--subjects 8]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mriprep.cache import Cache  # noqa: E402
from mriprep.cli import main as cli  # noqa: E402

VIEWS = ("coronal", "axial", "sagittal")


def _subjects_dir(work: Path, n: int) -> Path:
    from mriprep.demo.freesurfer_subjects import build_subjects_dir

    folder = work / f"subjects-{n}"
    if not (folder / f"subj-{n:02d}" / "mri" / "orig.mgz").exists():
        t = time.perf_counter()
        build_subjects_dir(folder, kinds=("dkt",) * n)
        print(f"  built {n} FreeSurfer subjects in {time.perf_counter() - t:.0f} s")
    return folder


def _cache(work: Path, subjects: Path) -> tuple[Path, float]:
    cache = work / "cache"
    if (cache / "index.json").exists():
        return cache, float("nan")
    manifest = work / "cohort.csv"
    t = time.perf_counter()
    for args in (["manifest", "from-freesurfer", str(subjects), "-o", str(manifest),
                  "--force"],
                 ["run", str(manifest), "-o", str(cache), "-p", "conform_1mm",
                  "--no-report"]):
        if cli(args) != 0:
            raise SystemExit(f"mriprep {' '.join(args[:2])} failed")
    return cache, time.perf_counter() - t


def _as_subjects_dir(cache: Path, folder: Path) -> Path:
    """The cache's entries as FreeSurfer subject folders: what generate_hdf5 reads."""
    import nibabel as nib

    c = Cache(cache)
    for entry in c.entries():
        mri = folder / entry.subject_id / "mri"
        mri.mkdir(parents=True, exist_ok=True)
        affine = np.asarray(entry.affine, dtype=np.float64)
        image = np.asarray(c.load_tensor(entry.key, "image"))
        labels = np.asarray(c.load_tensor(entry.key, "label")).astype(np.int32)
        nib.save(nib.MGHImage(image, affine), mri / "orig.mgz")
        nib.save(nib.MGHImage(labels, affine), mri / "aparc.DKTatlas+aseg.mgz")
    return folder


def _fastsurfer_checkout() -> Path | None:
    for folder in (os.environ.get("MRIPREP_FASTSURFER"), ROOT.parent / "shared" / "fastsurfer"):
        if folder and (Path(folder) / "FastSurferCNN" / "generate_hdf5.py").is_file():
            return Path(folder)
    return None


def _generate_hdf5(checkout: Path, subjects: Path, out: Path, view: str, lut: str):
    """FastSurfer's generate_hdf5 with its documented options; (seconds, per subject)."""
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from FastSurferCNN import generate_hdf5 as g

    starts = []
    cls = g.H5pyDataset
    if not getattr(cls, "_mended_by_mriprep_bench", False):
        transform, load = cls.transform, cls._load_volumes

        def mended(self, *args):
            # The commit's caller passes (imgs, zoom); the method wants (plane, imgs, zoom).
            return transform(self, self.plane, *args) if len(args) == 2 else \
                transform(self, *args)

        def timed_load(self, path):
            self._bench_starts.append(time.perf_counter())
            return load(self, path)
        cls.transform, cls._load_volumes = mended, timed_load
        cls._mended_by_mriprep_bench = True
    args = g.make_parser().parse_args([
        "--hdf5_name", str(out), "--plane", view, "--data_dir", str(subjects),
        "--pattern", "subj-*", "--lut", lut, "--image_name", "mri/orig.mgz",
        "--gt_name", "mri/aparc.DKTatlas+aseg.mgz"])
    cls._bench_starts = starts
    t = time.perf_counter()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        g.main(args)  # it prints a line per subject
    total = time.perf_counter() - t
    ends = starts[1:] + [t + total]
    return total, [b - a for a, b in zip(starts, ends)]


def _spread(values) -> str:
    values = list(values)
    if not values:
        return "-"
    return (f"median {statistics.median(values):.2f} s "
            f"(range {min(values):.2f}-{max(values):.2f})")


def _export(cache: Path, out: Path, view: str) -> float:
    out.unlink(missing_ok=True)
    t = time.perf_counter()
    code = cli(["export", str(cache), "-o", str(out), "--format", "fastsurfer-hdf5",
                "--view", view])
    if code != 0:
        raise SystemExit(f"mriprep export --view {view} exited {code}")
    return time.perf_counter() - t


def _export_section(work: Path, cache: Path, subjects: Path, n: int) -> dict[str, Path]:
    from importlib import resources

    import shutil

    shutil.rmtree(cache / "derived", ignore_errors=True)  # the first view derives, cold
    lut = str(resources.files("mriprep.training.labels") / "fastsurfer_dkt.tsv")
    ours = {v: work / f"mriprep_{v}.hdf5" for v in VIEWS}
    t_ours = {v: _export(cache, ours[v], v) for v in VIEWS}
    print(f"fastsurfer HDF5 from a SUBJECTS_DIR of {n} subjects (256^3), one run per view:")
    print("  mriprep export, per view (s)       " +
          "  ".join(f"{v} {t_ours[v]:6.1f}" for v in VIEWS) +
          f"   total {sum(t_ours.values()):6.1f} s (the first derives all three views)")
    checkout = _fastsurfer_checkout()
    if checkout is None:
        print("  FastSurfer generate_hdf5: skipped (set MRIPREP_FASTSURFER to FastSurfer's "
              "checkout with the `referee` extra installed)")
        return ours
    theirs, per_subject, same = {}, [], {}
    subjects = _as_subjects_dir(cache, work / "from-cache")
    for view in VIEWS:
        out = work / f"fastsurfer_{view}.hdf5"
        out.unlink(missing_ok=True)
        theirs[view], each = _generate_hdf5(checkout, subjects, out, view, lut)
        per_subject += each
        same[view] = _compare(ours[view], out)
    print("  FastSurfer generate_hdf5, per view  " +
          "  ".join(f"{v} {theirs[v]:6.1f}" for v in VIEWS) +
          f"   total {sum(theirs.values()):6.1f} s; per subject and view "
          f"{_spread(per_subject)}")
    print(f"  ratio mriprep / FastSurfer, three views  "
          f"{sum(t_ours.values()) / sum(theirs.values()):.3f}x  (goal <= 0.2x); per view "
          + ", ".join(f"{v} {t_ours[v] / theirs[v]:.3f}x" for v in VIEWS))
    print("  contents against FastSurfer's file, dataset by dataset: " +
          "; ".join(f"{v}: {same[v]}" for v in VIEWS))
    return ours


def _compare(ours: Path, theirs: Path) -> str:
    """Whether two FastSurfer HDF5 files hold the same slices per subject (FastSurfer
    writes its subjects in glob order, mriprep in manifest order)."""
    import h5py

    with h5py.File(ours, "r") as a, h5py.File(theirs, "r") as b:
        if sorted(a) != sorted(b):
            return f"groups differ ({sorted(a)} against {sorted(b)})"
        problems = []
        for size in a:
            ga, gb = a[size], b[size]
            names_a = [s.decode() for s in ga["subject"][:]]
            names_b = [s.decode() for s in gb["subject"][:]]
            if sorted(names_a) != sorted(names_b):
                return f"subjects differ ({names_a} against {names_b})"
            owner = ga["slice_subject"][:]
            counts = {n: int((owner == i).sum()) for i, n in enumerate(names_a)}
            starts_b = dict(zip(names_b, np.cumsum([0] + [counts[n] for n in names_b])))
            for i, name in enumerate(names_a):
                mine = np.flatnonzero(owner == i)
                theirs_rows = slice(int(starts_b[name]), int(starts_b[name]) + len(mine))
                for key in ("orig_dataset", "aseg_dataset", "weight_dataset",
                            "zoom_dataset"):
                    x, y = ga[key][mine[0]:mine[-1] + 1], gb[key][theirs_rows]
                    if x.shape != y.shape or not np.array_equal(x, y):
                        problems.append(f"{name} {key}")
        return "equal" if not problems else "differ: " + ", ".join(problems[:4])


def _loader_section(cache: Path, exported: Path, view: str, rounds: int = 3) -> None:
    import h5py

    from benchmarks.bench_loader import interleaved, measure
    from mriprep import MRIDataset, make_dataloader
    from mriprep.training.labels import dkt_table
    from mriprep.training.labels.derived import DerivedLabels, derive_entry

    c = Cache(cache)
    entry = c.entries()[0]
    spare = Path(tempfile.mkdtemp(prefix="derive-one-"))
    t = time.perf_counter()
    derive_entry(DerivedLabels(c, dkt_table(), spare), entry)
    one = time.perf_counter() - t
    split = entry.split
    t = time.perf_counter()
    ds = MRIDataset(cache, split, mode="thick_slice", view=view)
    opening = time.perf_counter() - t
    loader = make_dataloader(ds, batch_size=16, shuffle=True, seed=0)
    t = time.perf_counter()
    next(iter(loader))
    first = time.perf_counter() - t
    # Each measurement is whole epochs, as training reads them: a loader with worker
    # processes starts them at each epoch and stops them at its end (FastSurfer's way),
    # where a block of batches stopping inside an epoch left its workers refilling their
    # read-ahead on the next contender's time.
    contenders = [("mriprep", functools.partial(measure, loader, 1))]
    order = np.random.default_rng(0).permutation(len(ds))
    fastsurfer = _fastsurfer_loaders(exported, view)
    if fastsurfer is not None:
        load, held, loaders = fastsurfer
        contenders += [(workers, functools.partial(measure, loader, 1))
                       for workers, loader in loaders.items()]
    with h5py.File(exported, "r") as hf:
        g = hf[next(iter(hf))]

        def item_by_item() -> dict:
            t = time.perf_counter()
            for i in order:
                g["orig_dataset"][i], g["aseg_dataset"][i], g["weight_dataset"][i]
            return {"bytes": 0, "items": len(order), "seconds": time.perf_counter() - t}

        contenders.insert(1, ("h5py", item_by_item))
        measured = interleaved([(name, once, None) for name, once in contenders], rounds)
    rates = {name: sorted(r["items/s"] for r in results)
             for name, results in measured.items()}

    def rate(name) -> str:
        values = rates[name]
        return (f"median {statistics.median(values):7.0f} items/s (range "
                f"{values[0]:.0f}-{values[-1]:.0f})")

    print(f"thick-slice items, {view}, {len(ds)} slices of split {split!r}, shuffled; "
          f"{rounds} interleaved rounds of whole epochs (each measurement at least a "
          "second):")
    print(f"  one subject's derivation (three views)  {one:6.2f} s")
    print(f"  MRIDataset opening, classes stored       {opening:6.2f} s")
    print(f"  first batch of 16 (make_dataloader)      {first:6.2f} s = {first / one:.2f}x "
          "one subject's derivation (goal <= 2x)")
    print(f"  make_dataloader steady rate              {rate('mriprep')}")
    print(f"  h5py item by item from the export        {rate('h5py')}; a streaming reader, "
          "not FastSurfer's way")
    if fastsurfer is None:
        return
    print("  FastSurfer's training loader (get_dataloader, DATA.AUG None: "
          "MultiScaleDatasetVal, ZeroPad2D, ToTensor; batch 16, shuffled):")
    print(f"    the file into memory                   {load:6.2f} s, {held / 1e6:.0f} MB "
          "held for the training run")
    for workers in loaders:
        label = f"{workers} workers" + (" (its default)" if workers == 8 else "")
        print(f"    {label:<38} {rate(workers)}")
    workers = max(loaders, key=lambda w: statistics.median(rates[w]))
    fastest = statistics.median(rates[workers])
    mine = statistics.median(rates["mriprep"])
    # A first epoch: FastSurfer loads the file into memory first; mriprep's first batch
    # writes the view-ordered arrays of the subjects it touches (once per cache).
    theirs_first = load + len(ds) / fastest
    mine_first = first + len(ds) / mine
    print(f"  mriprep against FastSurfer's fastest way ({workers} workers): steady "
          f"{mine / fastest:.2f}x; a first epoch of this split, each side's start counted "
          f"(its load, mriprep's first batch): {theirs_first / mine_first:.2f}x")


def _fastsurfer_loaders(exported: Path, view: str):
    """FastSurfer's training loader on the export, as its ``data_loader/loader.py``
    ``get_dataloader(cfg, "train")`` builds it with ``cfg.DATA.AUG = ["None"]`` (no random
    transform, like the mriprep side): ``MultiScaleDatasetVal`` with ``ZeroPad2D`` and
    ``ToTensor``, a shuffled ``DataLoader`` of ``cfg.TRAIN.BATCH_SIZE`` 16 and
    ``cfg.TRAIN.NUM_WORKERS`` (FastSurfer's ``FastSurferCNN/config/defaults.py``, which the
    pinned checkout leaves out: 8; 0 and 2 beside it on this 2-core machine). Padded to
    the export's own 256, the size mriprep serves.

    Returns (seconds to load the file, bytes held, {workers: DataLoader}), or None where
    the checkout is not importable (said)."""
    import torch

    from mriprep.demo.fastsurfer_checkout import HOW_TO_ENABLE, fastsurfer_module

    dataset_module = fastsurfer_module("FastSurferCNN.data_loader.dataset")
    augmentation = fastsurfer_module("FastSurferCNN.data_loader.augmentation")
    if dataset_module is None or augmentation is None:
        print(f"  FastSurfer's training loader: skipped, {HOW_TO_ENABLE}")
        return None
    import h5py
    import yacs.config

    with h5py.File(exported, "r") as hf:
        size = int(next(iter(hf)))
    cfg = yacs.config.CfgNode({
        "DATA": {"PADDED_SIZE": size, "SIZES": [size], "PLANE": view, "AUG": ["None"]},
        "MODEL": {"BASE_RES": 1.0}})
    steps = [augmentation.ZeroPad2D((size, size)), augmentation.ToTensor()]

    def compose(sample):  # torchvision.transforms.Compose, which is not installed here
        for step in steps:
            sample = step(sample)
        return sample

    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        dataset = dataset_module.MultiScaleDatasetVal(str(exported), cfg, compose)
    load = time.perf_counter() - t
    held = sum(a.nbytes for column in (dataset.images, dataset.labels, dataset.weights)
               for a in column)
    # torch warns, at each epoch's start, that 8 workers exceed this machine's 2 cores:
    # they are FastSurfer's default, measured on purpose.
    warnings.filterwarnings("ignore", message="This DataLoader will create",
                            category=UserWarning)
    loaders = {workers: torch.utils.data.DataLoader(
        dataset, batch_size=16, shuffle=True, num_workers=workers,
        pin_memory=torch.cuda.is_available(), generator=torch.Generator().manual_seed(0))
        for workers in (0, 2, 8)}
    return load, held, loaders


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--subjects", type=int, default=8)
    args = p.parse_args(argv)
    try:
        import h5py  # noqa: F401
    except ImportError:
        print("fastsurfer: skipped, h5py missing (pip install 'mriprep[fastsurfer]')")
        return 0
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-fastsurfer-"))
    work.mkdir(parents=True, exist_ok=True)
    subjects = _subjects_dir(work, args.subjects)
    cache, t_run = _cache(work, subjects)
    if t_run == t_run:  # not NaN: made in this run
        print(f"  manifest from-freesurfer + run -p conform_1mm: {t_run:.0f} s for "
              f"{args.subjects} subjects")
    ours = _export_section(work, cache, subjects, args.subjects)
    _loader_section(cache, ours["coronal"], "coronal")
    _sizes_section(cache, work)
    return 0


def _sizes_section(cache: Path, work: Path) -> None:
    """What each side keeps on disk per subject, from the files this run left."""
    subjects = len(Cache(cache).entries())

    def megabytes(paths) -> float:
        return sum(p.stat().st_size for p in paths if p.is_file()) / 1e6 / subjects

    derived: dict[str, float] = {}
    for folder in sorted((cache / "derived").glob("*/")):
        kind = folder.name.split("-")[0]  # labels-<hash>, views-v<n>
        derived[kind] = derived.get(kind, 0.0) + megabytes(folder.rglob("*"))
    print(f"data on disk per subject (MB, the files this run left, {subjects} subjects):")
    entries = megabytes((cache / "entries").rglob("*"))
    print(f"  mriprep cache entry (conform_1mm)        {entries:7.1f}")
    print(f"  mriprep classes of three views (derived) {derived.get('labels', 0.0):7.1f}")
    print(f"  mriprep image and mask in view order     {derived.get('views', 0.0):7.1f} "
          "(the views the Dataset read: coronal)")
    for who in ("mriprep", "fastsurfer"):
        files = [work / f"{who}_{v}.hdf5" for v in VIEWS]
        if all(f.exists() for f in files):
            print(f"  {who + ' HDF5, three views':<40} {megabytes(files):7.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
