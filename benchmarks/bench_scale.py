"""What the runner itself costs as a cohort grows: 250 to 2,000 subjects.

A synthetic cohort of small volumes (MNI152 at 8 mm, 23x27x23 voxels, each subject with
its own noise and gain, so every entry is distinct) goes through ``run_cohort`` with the
default ``processes`` scheduler and 2 workers, at each size, with a pipeline of real
stages that costs little per subject (sanitize, z-score, validate) and the QC pictures
and report of a default run: what is left is the runner's own work, the part that would grow faster than the cohort if anything did.

Per size it reports:

- scheduling overhead per subject: the workers' wall time not spent inside a subject's
  task, ``(wall x workers - sum of task seconds) / subjects``;
- the index: seconds spent rewriting ``index.json`` (batched, locked rewrites), in all
  and per subject, and how many rewrites; and what one rewrite costs once the index
  holds the whole cohort (it grows with the index, so the runner spaces rewrites out to
  keep their total under 2% of the run: see ``mriprep.run.cohort._IndexWriter``);
- the run reports (``reports/latest.json`` and ``.csv``): seconds to write;
- the HTML QC report written at the end of the run (each worker makes its subject's
  pictures and metrics, counted in the task's seconds);
- the driver's memory: peak resident memory of this process above its level before the
  run (the scheduler runs in this process, as with Slurm).

Linear growth means the per-subject figures stay flat; the last row gives each figure at
the largest size over the smallest. Nothing is asserted.

    python benchmarks/bench_scale.py [--sizes 250,500,1000,2000] [--workers 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIPELINE = """\
name: scale_bench
description: the runner's own cost; stages that take milliseconds on small volumes
output_dtype: float16
stages:
  - sanitize:
      strategy: local
  - normalize:
      mode: zscore
      mask: foreground
  - validate
"""


def build_cohort(folder: Path, subjects: int) -> Path:
    """``subjects`` small NIfTI volumes of MNI152 anatomy and a manifest listing them."""
    import nibabel as nib
    from scipy import ndimage

    from mriprep.inputs.templates import load_template

    folder.mkdir(parents=True, exist_ok=True)
    mni = load_template("mni152")
    small = ndimage.zoom(mni.data, 0.125, order=1).astype(np.float32)
    affine = mni.affine.copy()
    affine[:3, :3] *= 8
    rng = np.random.default_rng(0)
    manifest = folder / "cohort.csv"
    with open(manifest, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["subject_id", "image", "split"])
        for i in range(subjects):
            path = folder / f"sub-{i:05d}_T1w.nii.gz"
            data = small * rng.uniform(0.8, 1.2) + rng.normal(0, 5, small.shape)
            nib.save(nib.Nifti1Image(data.astype(np.float32), affine), path)
            writer.writerow([f"sub-{i:05d}", path.name, ("train", "val", "test")[i % 3]])
    return manifest


def subset_manifest(manifest: Path, subjects: int, target: Path) -> Path:
    lines = manifest.read_text().splitlines()
    target.write_text("\n".join(lines[: subjects + 1]) + "\n")
    return target


class PeakMemory:
    """Peak resident memory of this process while in the block, sampled every 50 ms."""

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.before = self.process.memory_info().rss
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def one_rewrite_seconds(cache, run, rounds: int = 3) -> float:
    """One batched index rewrite (one entry refreshed) into the run's full index, best of
    ``rounds``: what each rewrite costs the driver once the index is this large."""
    entry = next(r.entry.with_split(r.split) for r in run.results if r.entry is not None)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        cache.update_index([entry])
        best = min(best, time.perf_counter() - start)
    return best


def measure(manifest: Path, cache_root: Path, pipeline_path: Path, workers: int,
            qc: bool = True) -> dict:
    """One run of the whole manifest into a new cache, with its costs."""
    from mriprep.cache import Cache
    from mriprep.pipelines import load_pipeline
    from mriprep.run import cohort as cohort_module
    from mriprep.run.cohort import cohort_rows, run_cohort

    index_seconds, rewrites, report_seconds = [0.0], [0], [0.0]
    update_index = Cache.update_index
    write_reports = cohort_module.write_reports

    def timed_update(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return update_index(self, *args, **kwargs)
        finally:
            index_seconds[0] += time.perf_counter() - start
            rewrites[0] += 1

    def timed_reports(*args, **kwargs):
        start = time.perf_counter()
        try:
            return write_reports(*args, **kwargs)
        finally:
            report_seconds[0] += time.perf_counter() - start

    rows = cohort_rows(manifest)
    pipeline = load_pipeline(pipeline_path)
    import dask.distributed  # noqa: F401 - imported before the baseline, as by any run
    Cache.update_index = timed_update
    cohort_module.write_reports = timed_reports
    try:
        with PeakMemory() as memory:
            start = time.perf_counter()
            run = run_cohort(rows, cache_root, pipeline, scheduler="processes",
                             workers=workers, report=qc)
            wall = time.perf_counter() - start
    finally:
        Cache.update_index = update_index
        cohort_module.write_reports = write_reports
    rewrite_s = one_rewrite_seconds(Cache(cache_root), run)
    n = len(rows)
    task_seconds = sum(r.seconds or 0.0 for r in run.results)
    failed = run.count("failed")
    return {
        "subjects": n,
        "cached": run.count("cached"),
        "failed": failed,
        "first_failure": run.failed[0].reason if failed else "",
        "wall_s": round(wall, 2),
        "subjects_per_s": round(n / wall, 1),
        "task_ms_per_subject": round(task_seconds / n * 1000, 2),
        "overhead_s": wall * workers - task_seconds,
        "overhead_ms_per_subject": round((wall * workers - task_seconds) / n * 1000, 2),
        "index_s": round(index_seconds[0], 3),
        "index_rewrites": rewrites[0],
        "index_ms_per_subject": round(index_seconds[0] / n * 1000, 3),
        "index_share": f"{index_seconds[0] / wall:.1%}",
        "rewrite_ms": round(rewrite_s * 1000, 1),
        "index_mb": round((cache_root / "index.json").stat().st_size / 1e6, 2),
        "reports_s": round(report_seconds[0], 3),
        "reports_ms_per_subject": round(report_seconds[0] / n * 1000, 3),
        "qc_report_s": round(run.report_seconds, 2),
        "qc_report_ms_per_subject": round(run.report_seconds / n * 1000, 2),
        "driver_bytes": memory.peak - memory.before,
        "driver_peak_mb": round((memory.peak - memory.before) / 1e6, 1),
        "driver_kb_per_subject": round((memory.peak - memory.before) / n / 1e3, 1),
    }


COLUMNS = [("subjects", "subjects"), ("wall_s", "wall s"), ("subjects_per_s", "subj/s"),
           ("task_ms_per_subject", "task ms/subj"),
           ("overhead_ms_per_subject", "overhead ms/subj"),
           ("index_rewrites", "index rewrites"), ("index_s", "index s"),
           ("index_share", "index % of run"), ("rewrite_ms", "1 rewrite ms"),
           ("index_mb", "index MB"),
           ("reports_s", "reports s"), ("reports_ms_per_subject", "reports ms/subj"),
           ("qc_report_s", "QC report s"), ("qc_report_ms_per_subject", "QC ms/subj"),
           ("driver_peak_mb", "driver MB"), ("driver_kb_per_subject", "driver kB/subj"),
           ("marginal_overhead_ms", "added overhead ms/subj"),
           ("marginal_driver_kb", "added driver kB/subj")]
PER_SUBJECT = ("overhead_ms_per_subject", "reports_ms_per_subject", "qc_report_ms_per_subject",
               "driver_kb_per_subject")


def add_marginals(rows: list[dict]) -> None:
    """What each size adds over the one before, per added subject: the fixed costs (the
    cluster's start, imports, the first allocations) cancel, and a flat column is linear
    growth."""
    for before, row in zip([None] + rows[:-1], rows):
        if before is None:
            row["marginal_overhead_ms"] = row["marginal_driver_kb"] = "-"
            continue
        added = row["subjects"] - before["subjects"]
        row["marginal_overhead_ms"] = round(
            (row["overhead_s"] - before["overhead_s"]) / added * 1000, 2)
        row["marginal_driver_kb"] = round(
            (row["driver_bytes"] - before["driver_bytes"]) / added / 1e3, 1)


def print_table(rows: list[dict]) -> None:
    widths = [max(len(title), 8) for _, title in COLUMNS]
    print("  ".join(title.rjust(w) for (_, title), w in zip(COLUMNS, widths)))
    for row in rows:
        print("  ".join(str(row[key]).rjust(w) for (key, _), w in zip(COLUMNS, widths)))
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        growth = {key: (last[key] / first[key] if first[key] else float("nan"))
                  for key in PER_SUBJECT}
        print(f"per-subject cost at {last['subjects']} over {first['subjects']} subjects "
              "(1.0 = linear growth): " + ", ".join(
                  f"{key.replace('_per_subject', '')} {value:.2f}x"
                  for key, value in growth.items()))
    for row in rows:
        if row["failed"]:
            print(f"  {row['subjects']} subjects: {row['failed']} failed, e.g. "
                  f"{row['first_failure']}")


def measure_in_fresh_process(manifest: Path, cache_root: Path, pipeline: Path,
                             workers: int) -> dict:
    """:func:`measure` in a new Python process, so that the driver's memory is this
    size's alone (a process keeps the memory an earlier run freed)."""
    import subprocess

    shutil.rmtree(cache_root, ignore_errors=True)
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(manifest), str(cache_root), str(pipeline),
         str(workers)], capture_output=True, text=True, check=True)
    shutil.rmtree(cache_root, ignore_errors=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250,500,1000,2000",
                        help="cohort sizes, comma-separated (default 250,500,1000,2000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work-dir", help="keep the cohort and caches here")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", nargs=4, metavar=("MANIFEST", "CACHE", "PIPELINE", "WORKERS"),
                        help=argparse.SUPPRESS)  # one size, in this process
    args = parser.parse_args(argv)
    if args.one:
        manifest, cache_root, pipeline, workers = args.one
        print(json.dumps(measure(Path(manifest), Path(cache_root), Path(pipeline),
                                 int(workers))))
        return 0
    sizes = sorted(int(s) for s in args.sizes.split(",") if s)
    work = Path(args.work_dir) if args.work_dir else Path(
        tempfile.mkdtemp(prefix="mriprep-scale-"))
    try:
        manifest = build_cohort(work / "cohort", max(sizes))
        pipeline = work / "scale_bench.yaml"
        pipeline.write_text(PIPELINE)
        rows = []
        for size in sizes:
            subset = subset_manifest(manifest, size, work / "cohort" / f"cohort-{size}.csv")
            rows.append(measure_in_fresh_process(subset, work / f"cache-{size}", pipeline,
                                                 args.workers))
        add_marginals(rows)
        print(f"runner at scale: {args.workers} local workers, 8 mm volumes "
              "(23x27x23), sanitize + z-score + validate, QC pictures in the workers and "
              "the HTML QC report at the end (as `mriprep run` by default)")
        print_table(rows)
        if args.json:
            print(json.dumps(rows, indent=1))
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
