"""The whole promise in one run: a FastSurfer-style training on a dirty cohort, three ways.

The same network (:mod:`benchmarks.outcome.network`), optimiser (AdamW, lr 3e-3), seed and
number of steps in every arm, and no augmentation in any; the data prepared:

* **A. MONAI** as its tutorial configures it, as is and with ``nan_to_zero`` or
  ``nan_to_mean`` on the loaded image plus gradient clipping (:mod:`.outcome.arm_monai`);
* **B. FastSurfer's own data path**: its conform, its per-subject ``generate_hdf5`` steps
  and weights, its datasets (the un-augmented ``MultiScaleDatasetVal`` and the training
  ``MultiScaleDataset``), its loss (:mod:`.outcome.arm_fastsurfer`; needs a FastSurfer
  checkout, ``MRIPREP_FASTSURFER``);
* **C. mriprep**: ``conform_1mm`` and ``t1w_mni_rigid`` -> ``mriprep check`` -> thick
  slices with table classes and weights, what the check flags left out -> guards and
  valid-aware losses (:mod:`.outcome.arm_mriprep`);
* **the clean reference**: arm C on the clean copy of the same cohort; and, to show that
  their set-ups train at all, A and B on the clean copy;
* **ablations**: NaN handling at 5, 15 and 30% of the brain (:mod:`.outcome.ablations`),
  and the cerebellum's weight at 0 and 0.3 (arm C on the dirty copy).

The cohort (:mod:`.outcome.cohort`): 6 training, 1 validation and 3 test people, labelled
in FreeSurfer's numbers; the dirty copy of the training and validation scans carries the
defects of real cohorts at the rates its docstring states; the test scans stay clean, and
one training person is scanned again into the test split under another id.

Chosen for the CPU: sagittal slices only, 21 classes (FreeSurfer's aseg structures, left
and right merged as FastSurfer's sagittal view merges them), the network computing at
2 mm in-plane, :data:`STEPS` steps of 8 slices per arm (about 3 passes over the training
slices), :data:`ABLATION_STEPS` per NaN-ablation run. An epoch is one pass over an arm's
own training slices. The Dice is on the clean test subjects' every voxel, in each arm's
own 1 mm space; the leaked person's scan is scored apart.

Nothing is asserted: the arms are reported as they come out. It prints the table, and
writes ``outcome.png`` (loss curves, Dice per structure) and ``outcome.json`` into
``--out`` (default: ``docs/img``, the picture the README shows).

    python benchmarks/bench_outcome.py [--steps 300] [--work-dir DIR] [--out docs/img]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = 300
ABLATION_STEPS = 200


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps per arm")
    parser.add_argument("--ablation-steps", type=int, default=ABLATION_STEPS,
                        help="training steps per NaN-ablation run (all of them alike)")
    parser.add_argument("--work-dir", type=Path,
                        help="keep the cohort and caches here (a rerun reuses them)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img",
                        help="where outcome.png and outcome.json go")
    parser.add_argument("--device", default="cpu", help="where the networks train")
    parser.add_argument("--amp", action="store_true",
                        help="float16 autocast with a GradScaler (CUDA)")
    parser.add_argument("--full-size", action="store_true",
                        help="the network computes at the slices' 1 mm (default: 2 mm, "
                        "to fit the CPU budget)")
    parser.add_argument("--skip-ablations", action="store_true",
                        help="the arms only (the ablations take about a third of the "
                        "time)")
    args = parser.parse_args(argv)
    if args.work_dir:
        return run(args, args.work_dir)
    with tempfile.TemporaryDirectory(prefix="bench-outcome-") as scratch:
        return run(args, Path(scratch))


def run(args, work: Path) -> int:
    import torch

    from benchmarks.outcome import arm_fastsurfer, arm_monai, arm_mriprep
    from benchmarks.outcome.cohort import DEFECTS, LEAK_ID, LEAKED, build_cohort
    from benchmarks.outcome.report import plot, print_beside_reported, print_table
    from benchmarks.outcome.training import dice_scores, train

    torch.set_num_threads(2)
    started = time.perf_counter()
    print(f"outcome: {args.steps} steps of 8 sagittal 7-slice stacks per arm "
          f"({args.ablation_steps} per NaN-ablation run), "
          f"device {args.device}, autocast {'float16' if args.amp else 'off'}, network at "
          f"{'1' if args.full_size else '2'} mm, torch threads {torch.get_num_threads()}")
    cohort = build_cohort(work / "cohort")
    print("  dirty copy (training and validation scans; test scans clean):")
    for sid, defects in DEFECTS.items():
        print(f"    {sid}: {', '.join(defects)}")
    print(f"    {LEAK_ID}: a second scan of {LEAKED} (training) in the test split")

    results = []
    training_ids = {s.subject_id for s in cohort.clean if s.split == "train"}

    def measure(arm, name=None):
        run_ = train(arm, args.steps, **training_options(args))
        scores = dice_scores(run_.model, arm.test)
        row = summarise(arm, run_, scores, LEAK_ID, training_ids, name)
        results.append(row)
        print(f"  {row['arm']}: {row['event_steps']} non-finite step(s), test Dice "
              f"{_fmt(row['dice']['mean'])}, {row['train_seconds']:.0f} s training, "
              f"{row['prepare_seconds']:.0f} s preparing", flush=True)
        return run_

    clean = arm_mriprep.prepare(cohort, "clean", work / "mriprep")
    measure(clean, "clean reference (C, clean copy)")
    measure(arm_mriprep.prepare(cohort, "dirty", work / "mriprep"))
    for variant in arm_monai.VARIANTS:
        measure(arm_monai.prepare(cohort, "dirty", work / "monai", variant))
    for loader in arm_fastsurfer.LOADERS:
        fastsurfer = arm_fastsurfer.prepare(cohort, "dirty", work / "fastsurfer", loader)
        if fastsurfer is None:
            results.append({"arm": arm_fastsurfer.NAME, "skipped": True,
                            "why": "no FastSurfer checkout"})
            break
        measure(fastsurfer)
    # Sanity: each anchor on the clean copy, to show that its set-up trains at all.
    monai_clean = arm_monai.prepare(cohort, "clean", work / "monai-clean")
    measure(monai_clean, f"{monai_clean.name}, clean copy")
    fastsurfer_clean = arm_fastsurfer.prepare(cohort, "clean", work / "fastsurfer-clean")
    if fastsurfer_clean is not None:
        measure(fastsurfer_clean, f"{fastsurfer_clean.name}, clean copy")

    ablation_rows = []
    if not args.skip_ablations:
        ablation_rows = run_ablations(args, cohort, work, clean, measure)

    out = {"steps": args.steps, "arms": results,
           "ablations": ablation_rows, "seconds": time.perf_counter() - started}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "outcome.json").write_text(json.dumps(out, indent=1, default=float))
    print_table(out)
    print_beside_reported(out)
    plot(out, args.out / "outcome.png")
    print(f"outcome: wrote {args.out / 'outcome.png'} and outcome.json; "
          f"{out['seconds'] / 60:.1f} min in all")
    return 0


def run_ablations(args, cohort, work, clean, measure) -> list[dict]:
    from benchmarks.outcome import ablations, arm_mriprep
    from benchmarks.outcome.training import dice_scores, train

    rows = []
    # On the dirty copy, whose posterior-fossa artifacts the weight is meant to answer;
    # its weight-0 run is arm C.
    weighted = arm_mriprep.prepare(cohort, "dirty", work / "mriprep", cerebellum_weight=0.3)
    measure(weighted)
    rows.append({"ablation": "cerebellum weight", "weighted": weighted.name,
                 "unweighted": "C. mriprep"})

    base = ablations.from_test_volumes(
        arm_mriprep.training_volumes(work / "mriprep" / "cache-clean"))
    zero_arm = ablations.arm("NaN 0%", base, clean.test)
    zero_run = train(zero_arm, args.ablation_steps, **training_options(args))
    zero_dice = dice_scores(zero_run.model, clean.test)
    rows.append({"ablation": "NaN", "share": 0.0, "handling": "none",
                 "dice": _mean_rows(zero_dice), "batch_norm_error": None})
    print(f"  NaN ablation 0%: test Dice {_fmt(rows[-1]['dice']['mean'])}", flush=True)
    # The same run with another seed: how far two runs apart by chance alone lie.
    again = train(zero_arm, args.ablation_steps, seed=1, **training_options(args))
    rows.append({"ablation": "NaN", "share": 0.0, "handling": "none, seed 1",
                 "dice": _mean_rows(dice_scores(again.model, clean.test)),
                 "batch_norm_error": None})
    print(f"  NaN ablation 0%, seed 1: test Dice {_fmt(rows[-1]['dice']['mean'])}", flush=True)
    for share in ablations.SHARES:
        for handling in ablations.HANDLINGS:
            handled = ablations.with_nan(base, share, handling)
            run_ = train(ablations.arm(f"NaN {share:.0%} {handling}", handled, clean.test),
                         args.ablation_steps, **training_options(args))
            dice = _mean_rows(dice_scores(run_.model, clean.test))
            error = ablations.batch_norm_error(zero_run.model, base, handled)
            rows.append({"ablation": "NaN", "share": share, "handling": handling,
                         "dice": dice, "batch_norm_error": error,
                         "event_steps": run_.event_steps})
            print(f"  NaN ablation {share:.0%} {handling}: test Dice {_fmt(dice['mean'])}, "
                  f"ventricles {_fmt(dice['lateral ventricles'])}, batch-norm variance "
                  f"error {error:.1%}", flush=True)
    return rows


def training_options(args) -> dict:
    return dict(device=args.device, amp=args.amp, stride=1 if args.full_size else 2)


def summarise(arm, run_, scores: dict, leak_id: str, training_ids: set[str],
              name: str | None = None) -> dict:
    kept = {s: v for s, v in scores.items() if s != leak_id}
    steps = max(len(run_.losses), 1)
    row = {
        "arm": name or arm.name,
        "event_steps": run_.event_steps,
        "events": run_.events,
        "epoch_steps": arm.epoch_steps,
        # the arm's own epoch: one pass over its training slices
        "events_per_10_epochs": run_.event_steps / steps * 10 * arm.epoch_steps,
        "first_cause": run_.first_cause,
        "steps_skipped": run_.events["skipped"],
        "subjects_lost": arm.lost,
        "train_subjects_lost": sorted(s for s in arm.lost if s in training_ids),
        "notes": arm.notes,
        "train_seconds": run_.seconds,
        "prepare_seconds": arm.seconds,
        "losses": run_.losses,
        "dice": _mean_rows(kept),
        "per_subject": scores,
    }
    if leak_id in scores:
        # How much better the model scores the person it trained on than the unseen test
        # people, and what that does to the test split's mean. No control: 3 unseen people.
        row["leak_gap"] = scores[leak_id]["mean"] - row["dice"]["mean"]
        row["leak_lift"] = _mean_rows(scores)["mean"] - row["dice"]["mean"]
    return row


def _mean_rows(scores: dict) -> dict:
    keys = next(iter(scores.values())).keys() if scores else ()
    return {k: _nanmean([row[k] for row in scores.values()]) for k in keys}


def _nanmean(values) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def _fmt(value) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
