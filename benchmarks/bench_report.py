"""What the QC report costs, and how its outlier threshold separates planted defects.

1. Share of the run: the demo cohort through the default pipeline twice, side by side in
   this run, alternating: ``report=False`` (no QC in the workers, no HTML) and the
   default (QC pictures and metrics in each worker, the HTML report at the end). The
   goal is at most 10% more wall time. Also per subject, from each subject's own
   record: the worker's QC seconds against the subject's seconds.
2. Assembly: ``mriprep report`` on the finished cache (every subject's QC already
   made), per subject; and the QC made after the run from the cache (for a cache run
   with ``--no-report``), per subject.
3. Against nilearn: the same three pictures of one output (invalid voxels, template
   outline, labels; 18 tiles each, JPEG) drawn by nilearn as its user guide draws them
   (``against_nilearn`` names the pages) and by mriprep, interleaved after a warm-up:
   why the mosaics are drawn with numpy.
4. The outlier threshold (robust |z| > 3.5): each cached subject's largest |z| over the
   judged metrics, grouped as clean and planted, from the demo's ground truth.
5. The minimum effects the metrics declare (``QCMetric.min_effect``): per judged metric,
   the largest |value - cohort median| of clean scans, in three cohorts (the demo's
   clean scans; the calibration people in three acquisitions with the population's
   variations; the real heads Colin27, S1 and ROBEX as stored and in two acquisitions),
   against the smallest |value - median| of the demo's planted image defects that the
   plain robust z flags on that metric; the declared minimum effect should lie between.

Run: ``python benchmarks/bench_report.py COHORT [--workers 2] [--rounds 1]``; sections 3
to 5 alone on a cache already made from COHORT: ``... COHORT --cache CACHE``.
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
from mriprep.qc.outliers import OUTLIER_Z, Rule, cohort_flags, robust_z  # noqa: E402
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


# Rounds of the comparison with nilearn, each side once a round, after one warm-up each.
NILEARN_ROUNDS = 7


def against_nilearn(cache_root: Path, work: Path, rounds: int = NILEARN_ROUNDS) -> None:
    """The same three pictures of one output drawn by nilearn as its user guide draws
    them, and by mriprep.

    nilearn, as its examples do (nilearn 0.14, "More plotting tools from nilearn",
    ``auto_examples/01_plotting/plot_demo_more_plotting.py``, and ``plot_roi``'s page for
    an atlas): ``plot_anat(display_mode="mosaic", cut_coords=6)`` (6 cuts in each of the
    3 directions: mriprep's 18 tiles) with the invalid voxels as ``add_overlay``; the same
    with the template brain as ``add_contours``; ``plot_roi`` of the label map over the
    image. Each saved as JPEG (quality 85, as mriprep encodes) and closed. mriprep:
    ``subject_qc`` of the output alone (no native scan, no causes recorded, so every
    invalid voxel in one colour, as nilearn's overlay draws them). One warm-up of each
    side (imports, fonts, the template's cache), then ``rounds`` rounds alternating the
    two; medians and ranges.
    """
    import matplotlib

    matplotlib.use("Agg")
    import nibabel as nib
    from nilearn import plotting

    from mriprep.qc.subject import OutputData, subject_qc, template_from_records

    cache = Cache(cache_root)
    entry = next((e for e in cache.entries() if "label" in e.files), None)
    meta = cache.read_meta(entry.key) if entry is not None else {}
    template = template_from_records(meta.get("provenance", []))
    if entry is None or template is None or "template_to_subject" not in meta:
        print("3. against nilearn: skipped, the cache holds no registered entry with a "
              "label map (the three pictures need one)")
        return
    affine = np.asarray(meta["affine"])
    output = OutputData(image=cache.load_tensor(entry.key, "image", mmap=False),
                        valid=cache.load_tensor(entry.key, "valid"), affine=affine,
                        label=cache.load_tensor(entry.key, "label"),
                        template_to_subject=np.asarray(meta["template_to_subject"]))
    image = nib.Nifti1Image(np.asarray(output.image, dtype=np.float32), affine)
    invalid = nib.Nifti1Image((~output.valid).astype(np.uint8), affine)
    brain = nib.Nifti1Image(template.mask.astype(np.uint8), template.affine)
    labels = nib.Nifti1Image(np.asarray(output.label, dtype=np.int32), affine)
    jpeg = {"pil_kwargs": {"quality": 85}}

    def with_nilearn() -> None:
        display = plotting.plot_anat(image, display_mode="mosaic", cut_coords=6)
        display.add_overlay(invalid, threshold=0.5, cmap="autumn")
        display.savefig(str(work / "nilearn-invalid.jpg"), **jpeg)
        display.close()
        display = plotting.plot_anat(image, display_mode="mosaic", cut_coords=6)
        display.add_contours(brain, levels=[0.5], colors="c")
        display.savefig(str(work / "nilearn-template.jpg"), **jpeg)
        display.close()
        display = plotting.plot_roi(labels, bg_img=image, display_mode="mosaic", cut_coords=6)
        display.savefig(str(work / "nilearn-labels.jpg"), **jpeg)
        display.close()

    def with_mriprep() -> None:
        qc = subject_qc(None, [], output, template, meta["provenance"])
        if sorted(qc.images) != ["labels", "output", "template"]:
            raise RuntimeError(f"mriprep drew {sorted(qc.images)}: {qc.notes}")

    timed: dict[str, list[float]] = {"nilearn": [], "mriprep": []}
    draw = {"nilearn": with_nilearn, "mriprep": with_mriprep}
    for side in draw:
        draw[side]()  # warm-up
    for _ in range(rounds):
        for side in draw:
            start = time.perf_counter()
            draw[side]()
            timed[side].append(time.perf_counter() - start)
    ratios = [n / m for n, m in zip(timed["nilearn"], timed["mriprep"])]
    print(f"3. three pictures of {entry.subject_id}'s output (image with invalid voxels, "
          f"template outline, labels; 18 tiles each), {rounds} rounds after a warm-up:")
    for side in draw:
        print(f"   {side}: median {statistics.median(timed[side]):.3f} s "
              f"({min(timed[side]):.3f}-{max(timed[side]):.3f})")
    print(f"   nilearn / mriprep, per round: median {statistics.median(ratios):.1f}x "
          f"({min(ratios):.1f}-{max(ratios):.1f})")


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


# The demo's defects that damage the image (the others are about identity, storage or
# refusal): a metric's flags must still find these where the plain z finds them.
IMAGE_DEFECTS = ("nan_blob", "extreme_values", "spike_slice", "dropout_slice", "zero_slab")
# Clean cohorts for section 5 (case names of mriprep.demo.calibration / population).
CALIBRATION_ACQUISITIONS = ("1mm", "ax3_tilt20", "cor5_lps")
POPULATION_VARIATIONS = ("person-0/bias2x", "person-0/bias4x", "person-0/defaced",
                         "person-1/defaced", "person-0/mp2rage", "person-1/ghost0.15",
                         "person-0/lesions8", "person-1/int16_12bit", "person-0/clipped_p95",
                         "person-0/size0.88", "person-0/size1.12")
REAL_HEADS = ("colin27", "s1", "robex")


def _clean_cohorts(folder: Path) -> tuple[Path, dict[str, str]]:
    """A manifest of clean scans written under ``folder``, and subject id -> cohort
    ("calibration", "population" or "real"). Real heads that are not installed are left
    out, and said so."""
    import functools

    import nibabel as nib

    from mriprep.demo.calibration import (ACQUISITIONS, Case, _scan, calibration_cases,
                                          real_head)
    from mriprep.demo.population import population_cases
    from mriprep.demo.real_scans import real_scan
    from mriprep.inputs.manifest import ManifestRow, write_manifest

    cases = [("calibration", c) for c in calibration_cases(
        people=4, real=False, failures=False, acquisitions=CALIBRATION_ACQUISITIONS)]
    cases += [("population", c) for c in population_cases(people=2, real=False)
              if c.name in POPULATION_VARIATIONS]
    rows, cohorts = [], {}
    for name in REAL_HEADS:
        path = real_scan(name)
        if path is None:
            print(f"   real head {name} is not installed: left out")
            continue
        sid = f"rea-{name}-stored"
        rows.append(ManifestRow(0, sid, "", Path(path), split="train"))
        cohorts[sid] = "real"
        for index, acq in enumerate(CALIBRATION_ACQUISITIONS[1:]):
            cases.append(("real", Case(f"{name}/{acq}", "good", name, acq, functools.partial(
                _scan, functools.partial(real_head, name), ACQUISITIONS[acq],
                [7, index, len(name)]))))
    folder.mkdir(parents=True, exist_ok=True)
    for cohort, case in cases:
        scan = case.build()
        sid = f"{cohort[:3]}-{case.name.replace('/', '-').replace('_', '-').replace('.', 'p')}"
        image = folder / f"{sid}.nii.gz"
        nib.save(nib.Nifti1Image(scan.data, scan.affine), image)
        label = None
        if scan.labels is not None:
            label = folder / f"{sid}_dseg.nii.gz"
            nib.save(nib.Nifti1Image(scan.labels.astype(np.int16), scan.affine), label)
        rows.append(ManifestRow(0, sid, "", image, label, "train"))
        cohorts[sid] = cohort
    return write_manifest(rows, folder / "clean.csv"), cohorts


def _largest_differences(values: dict[str, dict[str, float]],
                         members: dict[str, list[str]], medians_of: dict[str, list[str]],
                         metric: str) -> dict[str, tuple[float, str]]:
    """Per group, the largest |value - median| of its members on ``metric``, the median
    taken over the group's cohort (``medians_of``), and who has it."""
    out = {}
    for group, names in members.items():
        cohort = [values[n].get(metric, np.nan) for n in medians_of[group]]
        finite = [v for v in cohort if np.isfinite(v)]
        if len(finite) < 2:
            continue
        median = float(np.median(finite))
        diffs = [(abs(values[n][metric] - median), n) for n in names
                 if np.isfinite(values[n].get(metric, np.nan))]
        if diffs:
            out[group] = max(diffs)
    return out


def minimum_effects(cache_root: Path, cohort: Path, work: Path, workers: int) -> bool:
    """Section 5 (see the module docstring); False when a cohort had nothing to measure."""
    from mriprep.qc.measures import OWN

    truth = load_demo_cohort(cohort).truth["subjects"]
    by_ids = {(t["subject_id"], t.get("session_id") or ""): t for t in truth.values()}
    demo = gather(cache_root, make_missing=False)
    declared = demo.declared
    cached = [s for s in demo.subjects if s.status == "cached" and s.qc is not None]
    defects = {s.name: [d["kind"] for d in by_ids.get((s.subject_id, s.session_id), {})
                        .get("defects", []) if d["kind"] in IMAGE_DEFECTS] for s in cached}
    values = {f"demo:{s.name}": s.metrics for s in cached}
    demo_all = [f"demo:{s.name}" for s in cached]
    members = {"demo": [f"demo:{s.name}" for s in cached if not defects[s.name]]}
    medians_of = {"demo": demo_all}

    start = time.perf_counter()
    manifest, cohorts = _clean_cohorts(work / "clean-scans")
    built = time.perf_counter() - start
    clean_root = work / "clean-cache"
    shutil.rmtree(clean_root, ignore_errors=True)
    start = time.perf_counter()
    result = run_cohort(cohort_rows(manifest), clean_root, load_pipeline(DEFAULT_PIPELINE),
                        workers=workers, report=True)
    failed = [f"{r.subject_id} ({r.stage})" for r in result.results if r.failed]
    print(f"5. minimum effects: {len(cohorts)} clean scans built in {built:.0f} s, "
          f"preprocessed in {time.perf_counter() - start:.0f} s"
          + (f"; refused, so not measured: {', '.join(failed)}" if failed else ""))
    clean = gather(clean_root, make_missing=False)
    measured = {cohorts.get(s.subject_id) for s in clean.subjects if s.status == "cached"}
    unmeasured = sorted(set(cohorts.values()) - measured)
    if unmeasured:
        print(f"   FAILED: not one clean scan of the {', '.join(unmeasured)} cohort was "
              "cached, so there is nothing to measure there; the refusals and their stages "
              "are listed above")
        return False
    declared = {**clean.declared, **declared}
    for s in clean.subjects:
        if s.status == "cached" and s.qc is not None:
            values[f"clean:{s.subject_id}"] = s.metrics
    group_of = {n: cohorts.get(n.split(":", 1)[1]) for n in values if n.startswith("clean:")}
    synthetic = [n for n, g in group_of.items() if g in ("calibration", "population")]
    for group in ("calibration", "population", "real"):
        members[group] = [n for n, g in group_of.items() if g == group]
        medians_of[group] = synthetic if group != "real" else members[group]

    judged = sorted(m for m in {k for v in values.values() for k in v}
                    if (declared.get(m) or OWN.get(m)) is None
                    or (declared.get(m) or OWN[m]).judge != "none")
    print("   per judged metric: the clean cohorts' largest |value - median| (who), the "
          "smallest of the demo's image defects that the plain robust z flags, and the "
          "declared minimum effect (the floor of the spread is it over "
          f"{OUTLIER_Z:g}):")
    print(f"   {'metric':<24}{'demo clean':>12}{'calibration':>12}{'population':>12}"
          f"{'real heads':>12}{'defects min':>13}{'declared':>10}  verdict")
    flagged_now = cohort_flags({n: values[n] for n in demo_all}, declared)
    for metric in judged:
        metric_decl = declared.get(metric)
        rule = Rule.of(metric_decl) if metric_decl is not None else Rule()
        largest = _largest_differences(values, members, medians_of, metric)
        z, median = robust_z([values[n].get(metric, np.nan) for n in demo_all])
        hits = sorted((abs(values[n][metric] - median), n.split(":", 1)[1])
                      for n, score in zip(demo_all, z)
                      if defects[n.split(":", 1)[1]] and np.isfinite(score)
                      and abs(score) > OUTLIER_Z and score * rule.side >= 0
                      and not rule.at_bound(values[n][metric]))
        # The demo and the calibration people are the ordinary cohorts, where no clean
        # scan should be flagged; the population's deliberate extremes (strong fields,
        # ghosts) and three real heads from three sites are left to the z.
        ordinary = max((largest[g][0] for g in ("demo", "calibration") if g in largest),
                       default=0.0)
        wider = [g for g in ("population", "real")
                 if g in largest and largest[g][0] > rule.min_effect]
        cells = [f"{largest[g][0]:>12.4g}" if g in largest else f"{'-':>12}"
                 for g in ("demo", "calibration", "population", "real")]
        defect_cell = (f"{hits[0][0]:>13.4g}" if hits else f"{'none':>13}")
        effect = rule.min_effect
        if hits and effect > hits[0][0]:
            lost = hits[0][1]
            still = sorted({o.metric for o in flagged_now if o.name == f"demo:{lost}"})
            verdict = (f"above {lost}'s difference: that flag goes, {lost} is still flagged "
                       f"by {', '.join(still)}" if still else
                       f"TOO HIGH: {lost} is no longer flagged at all")
        elif effect < ordinary:
            verdict = "below the ordinary cohorts' largest clean difference"
        else:
            verdict = "between" if hits else "above the ordinary cohorts' clean differences"
        if wider:
            verdict += f"; {' and '.join(wider)} spread wider: the z decides there"
        who = max(((d, n) for d, n in largest.values()), default=(0.0, "-"))[1]
        print(f"   {metric:<24}{''.join(cells)}{defect_cell}{effect:>10.4g}  {verdict} "
              f"(largest clean: {who.split(':', 1)[-1]}"
              + (f"; smallest defect: {hits[0][1]}" if hits else "") + ")")
    _flag_counts(values, members, medians_of, defects, declared)
    return True


def _flag_counts(values, members, medians_of, defects, declared) -> None:
    """The flags each cohort gets by the z alone and with the declared minimum effects
    and bounds: clean scans flagged (each a false alarm) and the demo's defects found."""
    from mriprep.qc.outliers import find_outliers

    plain = {n: Rule(side=Rule.of(m).side) for n, m in declared.items()}
    for group, names in members.items():
        cohort = {n: {k: v for k, v in values[n].items()
                      if k not in declared or declared[k].judge != "none"}
                  for n in medians_of[group]}
        before = [o for o in find_outliers(cohort, rules=plain) if o.name in names]
        after = [o for o in cohort_flags(cohort, declared) if o.name in names]
        print(f"   {group}: {len(names)} clean scans; flags of clean scans by the z alone "
              f"{len(before)} ({_named_flags(before)}), with the minimum effects "
              f"{len(after)} ({_named_flags(after)})")
        if group == "demo":
            planted = [n for n in medians_of[group] if defects[n.split(":", 1)[1]]]
            for rule, flags in (("z alone", find_outliers(cohort, rules=plain)),
                                ("with the minimum effects", cohort_flags(cohort, declared))):
                mine = [o for o in flags if o.name in planted]
                found = {o.name for o in mine}
                print(f"   demo image defects flagged, {rule}: {len(found)} of "
                      f"{len(planted)} scans ({_named_flags(mine)})")


def _named_flags(flags) -> str:
    return ", ".join(f"{o.name.split(':', 1)[1]} {o.metric} {o.z:+.1f}" for o in flags) or "none"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cohort", help="a demo cohort folder (mriprep demo DIR)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work-dir")
    parser.add_argument("--cache", help="a cache already made from COHORT: run sections "
                                        "3, 4 and 5 alone")
    args = parser.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mriprep-bench-report-"))
    if args.cache:
        cache_root = Path(args.cache)
    else:
        cache_root = share_of_run(Path(args.cohort), work, args.workers, args.rounds)
        assembly(cache_root, work)
    against_nilearn(cache_root, work)
    threshold(cache_root, Path(args.cohort))
    measured = minimum_effects(cache_root, Path(args.cohort), work, args.workers)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
