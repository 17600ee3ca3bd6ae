"""What the QC report costs, and how its outlier threshold separates planted defects.

1. Share of the run: the demo cohort through the default pipeline twice, side by side in
   this run, alternating: ``report=False`` (no QC in the workers, no HTML) and the
   default (QC pictures and metrics in each worker, the HTML report at the end). The
   goal is at most 10% more wall time. Also per subject, from each subject's own
   record: the worker's QC seconds against the subject's seconds.
2. Assembly: ``mriprep report`` on the finished cache (every subject's QC already
   made), per subject; and the QC made after the run from the cache (for a cache run
   with ``--no-report``), per subject.
3. Against nilearn: one ``nilearn.plotting.plot_anat(display_mode="mosaic")`` figure of
   one output, saved as PNG, against mriprep's three pictures of that output (invalid
   causes, template outline, labels; no native scan, no metrics): why the mosaics are
   drawn with numpy.
4. The outlier threshold (robust |z| > 3.5): each cached subject's largest |z| over the
   judged metrics, grouped as clean and planted, from the demo's ground truth.

Run: ``python benchmarks/bench_report.py COHORT [--workers 2] [--rounds 1]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mriprep.cache import Cache  # noqa: E402
from mriprep.demo.cohort import load_demo_cohort  # noqa: E402
from mriprep.pipelines import DEFAULT_PIPELINE, load_pipeline  # noqa: E402
from mriprep.qc.gather import gather  # noqa: E402
from mriprep.qc.outliers import OUTLIER_Z, robust_z  # noqa: E402
from mriprep.qc.report import write_report  # noqa: E402
from mriprep.qc.store import read_qc  # noqa: E402
from mriprep.run.cohort import cohort_rows, run_cohort  # noqa: E402

GOAL_SHARE = 0.10


def _run(rows, root: Path, pipeline, workers: int, report: bool):
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    result = run_cohort(rows, root, pipeline, workers=workers, report=report)
    return time.perf_counter() - start, result


def share_of_run(cohort: Path, work: Path, workers: int, rounds: int) -> Path:
    pipeline = load_pipeline(DEFAULT_PIPELINE)
    rows = cohort_rows(load_demo_cohort(cohort).manifest)
    plain, with_qc = [], []
    subject_plain: dict[str, list[float]] = {}
    subject_qc: dict[str, list[float]] = {}
    last = None
    for _ in range(rounds):
        seconds, result = _run(rows, work / "plain", pipeline, workers, report=False)
        plain.append(seconds)
        for r in result.results:
            subject_plain.setdefault(r.name, []).append(r.seconds)
        seconds, result = _run(rows, work / "qc", pipeline, workers, report=True)
        with_qc.append(seconds)  # run_cohort's time: the HTML report included
        for r in result.results:
            subject_qc.setdefault(r.name, []).append(r.seconds)
        last = result
    a, b = min(plain), min(with_qc)
    print(f"1. {len(rows)} subjects, {pipeline.name}, {workers} workers, best of {rounds}, "
          "alternating:")
    print(f"   wall: without QC {a:6.1f} s | with QC + HTML report {b:6.1f} s | added "
          f"{b / a - 1:+.1%} (goal <= {GOAL_SHARE:.0%}; the HTML report "
          f"{last.report_seconds:.2f} s of it; on 2 workers one subject's place in the "
          "queue moves the wall time by seconds)")
    paired = [min(subject_qc[n]) / min(subject_plain[n]) for n in subject_plain
              if n in subject_qc and min(subject_plain[n]) > 0.5]
    work_plain = sum(min(v) for v in subject_plain.values())
    work_qc = sum(min(v) for n, v in subject_qc.items()) + last.report_seconds
    print(f"   work: sum of subject seconds without QC {work_plain:.1f} s | with QC + HTML "
          f"{work_qc:.1f} s | added {work_qc / work_plain - 1:+.1%}; per subject, paired: "
          f"median {statistics.median(paired) - 1:+.1%} ({len(paired)} subjects that "
          "ran over 0.5 s)")
    shares, qc_seconds = [], []
    for r in last.results:
        qc = read_qc(last.cache_root, r.key) if r.key else None
        if qc is None or not r.seconds:
            continue
        qc_seconds.append(qc["seconds"])
        shares.append(qc["seconds"] / r.seconds)
    if shares:
        print(f"   worker QC per subject: median {statistics.median(qc_seconds):.3f} s, "
              f"max {max(qc_seconds):.3f} s; share of the subject's time: median "
              f"{statistics.median(shares):.1%}, max {max(shares):.1%} "
              f"({len(shares)} subjects, failed ones included)")
    return last.cache_root


def assembly(cache_root: Path, work: Path) -> None:
    n = len(gather(cache_root, make_missing=False).subjects)
    start = time.perf_counter()
    write_report(cache_root)
    seconds = time.perf_counter() - start
    print(f"2. report of {n} subjects with QC made: {seconds:.2f} s "
          f"({seconds / max(n, 1) * 1000:.0f} ms a subject)")
    clone = work / "from-cache"
    shutil.rmtree(clone, ignore_errors=True)
    shutil.copytree(cache_root, clone, ignore=shutil.ignore_patterns("qc"))
    cached = len(Cache(clone).entries())
    start = time.perf_counter()
    write_report(clone)
    seconds = time.perf_counter() - start
    print(f"   report of a --no-report cache (QC made from the cache for {cached} entries): "
          f"{seconds:.2f} s ({seconds / max(cached, 1):.2f} s an entry)")


def against_nilearn(cache_root: Path, work: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import nibabel as nib
    from nilearn import plotting

    from mriprep.qc.subject import OutputData, subject_qc, template_from_records

    cache = Cache(cache_root)
    entry = cache.entries()[0]
    meta = cache.read_meta(entry.key)
    image = cache.load_tensor(entry.key, "image", mmap=False)
    img = nib.Nifti1Image(image, meta["affine"])
    start = time.perf_counter()
    display = plotting.plot_anat(img, display_mode="mosaic", cut_coords=6)
    display.savefig(str(work / "nilearn.png"))
    display.close()
    nilearn_s = time.perf_counter() - start
    output = OutputData(image=image, valid=cache.load_tensor(entry.key, "valid"),
                        affine=np.asarray(meta["affine"]),
                        label=cache.load_tensor(entry.key, "label"),
                        template_to_subject=np.asarray(meta["template_to_subject"]))
    template = template_from_records(meta["provenance"])
    start = time.perf_counter()
    subject_qc(None, [], output, template, meta["provenance"])
    ours = time.perf_counter() - start
    print(f"3. one nilearn plot_anat mosaic of {entry.subject_id}'s output: {nilearn_s:.2f} s | "
          f"mriprep's three output pictures: {ours:.2f} s ({nilearn_s / ours:.1f}x)")


def threshold(cache_root: Path, cohort: Path) -> None:
    truth = load_demo_cohort(cohort).truth["subjects"]
    by_ids = {(t["subject_id"], t.get("session_id") or ""): (name, t) for name, t in truth.items()}
    data = gather(cache_root, make_missing=False)
    cached = [s for s in data.subjects if s.status == "cached" and s.qc is not None]
    # the measures the report judges: a property of the person (head size, a skull-stripped
    # input) is declared not judged, by the QC or by its stage
    metrics = sorted({k for s in cached for k in s.metrics
                      if k not in data.declared or data.declared[k].judge != "none"})
    z = {}
    for metric in metrics:
        values = [s.metrics.get(metric, float("nan")) for s in cached]
        scores, _ = robust_z(values)
        for s, score in zip(cached, scores):
            z.setdefault(s.key, []).append((abs(score) if score == score else 0.0, metric))
    print(f"4. largest robust |z| of each cached subject (threshold {OUTLIER_Z}; one-sided "
          "counts judged on their high side only in the report):")
    for group in ("clean", "planted"):
        print(f"   {group}:")
        for s in cached:
            name, t = by_ids.get((s.subject_id, s.session_id), (s.name, {}))
            defects = [d["kind"] for d in t.get("defects", [])]
            if (group == "planted") != bool(defects):
                continue
            top, metric = max(z.get(s.key, [(0.0, "-")]))
            flags = ", ".join(f"{o.metric} {o.z:+.1f}" for o in s.outliers) or "none"
            print(f"     {name:<14} {'+'.join(defects) or '-':<28} max |z| {top:5.1f} "
                  f"({metric}); flagged: {flags}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cohort", help="a demo cohort folder (mriprep demo DIR)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work-dir")
    args = parser.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mriprep-bench-report-"))
    cache_root = share_of_run(Path(args.cohort), work, args.workers, args.rounds)
    assembly(cache_root, work)
    against_nilearn(cache_root, work)
    threshold(cache_root, Path(args.cohort))
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
