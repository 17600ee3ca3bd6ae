"""The outcome bench's table and picture."""

from __future__ import annotations

import math
from pathlib import Path

STRUCTURES = ("mean", "cerebellar WM", "cortex", "lateral ventricles")


def _f(value, spec=".3f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def print_table(out: dict) -> None:
    print(f"\noutcome: {out['steps']} steps per arm. Non-finite: steps with a non-finite "
          "input, loss or gradient (an unguarded arm's NaN weights make every later step "
          "one); per 10 epochs of the arm's own training slices. Dice on the clean test "
          "subjects, the leaked person apart: mean over the classes each holds, and "
          "structures. Leak gap: the leaked person's Dice minus the unseen people's; lift: "
          "what the leak adds to the test split's mean")
    head = (f"  {'arm':48s} {'non-finite':>10s} {'/10 epochs':>10s} {'skipped':>7s} "
            f"{'train lost':>10s} {'train s':>7s} {'prep s':>6s} "
            + " ".join(f"{s[:11]:>11s}" for s in STRUCTURES)
            + f" {'leak gap':>8s} {'lift':>6s}")
    print(head)
    for row in out["arms"]:
        if row.get("skipped"):
            print(f"  {row['arm']:48s} skipped: {row.get('why', 'no FastSurfer checkout')}")
            continue
        dice = row["dice"]
        print(f"  {row['arm'][:48]:48s} {row['event_steps']:>10d} "
              f"{row['events_per_10_epochs']:>10.0f} {row['steps_skipped']:>7d} "
              f"{len(row['train_subjects_lost']):>10d} {row['train_seconds']:>7.0f} "
              f"{row['prepare_seconds']:>6.0f} "
              + " ".join(f"{_f(dice.get(s)):>11s}" for s in STRUCTURES)
              + f" {_f(row.get('leak_gap'), '+.3f'):>8s} {_f(row.get('leak_lift'), '+.3f'):>6s}")
    print("  first non-finite cause, subjects lost, notes:")
    for row in out["arms"]:
        if row.get("skipped"):
            continue
        if row["first_cause"]:
            print(f"    {row['arm']}: first: {row['first_cause']}")
        for sid, why in row["subjects_lost"].items():
            print(f"    {row['arm']}: lost {sid}: {why}")
        for note in row["notes"]:
            print(f"    {row['arm']}: {note}")
    nan = [r for r in out["ablations"] if r["ablation"] == "NaN"]
    if nan:
        print("\n  NaN ablation (mriprep's clean cache, NaN blobs planted in the training "
              "volumes): test Dice, and the first batch norm's variance error")
        print(f"  {'share':>6s} {'handling':>13s} "
              + " ".join(f"{s[:11]:>11s}" for s in STRUCTURES) + f" {'BN var err':>10s}")
        for r in nan:
            error = r["batch_norm_error"]
            print(f"  {r['share']:>6.0%} {r['handling']:>13s} "
                  + " ".join(f"{_f(r['dice'].get(s)):>11s}" for s in STRUCTURES)
                  + f" {'-' if error is None else format(error, '.1%'):>10s}")


# What the field reports (issue 46, its sources' figures), set beside the ablations.
REPORTED = {
    "batch norm": "up to 7% error in batch-norm statistics with more than 15% of voxels NaN",
    "mean filling": "about 0.03 Dice lost on the ventricles with mean filling",
    "cerebellum": "cerebellar white matter 0.72 -> 0.83 Dice with the cerebellum weighted 0.3",
}


def print_beside_reported(out: dict) -> None:
    nan = [r for r in out["ablations"] if r["ablation"] == "NaN"]
    arms = {r["arm"]: r for r in out["arms"] if not r.get("skipped")}
    print("\n  beside the reported figures:")
    if nan:
        errors = ", ".join(f"{r['handling']} {r['share']:.0%}: {r['batch_norm_error']:.1%}"
                           for r in nan if r["share"] >= 0.15
                           and r["batch_norm_error"] is not None)
        print(f"    reported: {REPORTED['batch norm']}\n      here (first batch norm's "
              f"variance): {errors}")
        zero = next((r for r in nan if r["handling"] == "none"), None)
        if zero is not None:
            lost = ", ".join(
                f"{r['share']:.0%}: {_f(zero['dice']['lateral ventricles'] - r['dice']['lateral ventricles'], '+.3f')}"
                for r in nan if r["handling"] == "mean")
            again = next((r for r in nan if r["handling"] == "none, seed 1"), None)
            noise = ("" if again is None else
                     f"; two seeds at 0% lie {_f(abs(zero['dice']['lateral ventricles'] - again['dice']['lateral ventricles']))} apart")
            print(f"    reported: {REPORTED['mean filling']}\n      here (ventricles, 0% "
                  f"minus mean-filled): {lost}{noise}")
    for r in out["ablations"]:
        if r["ablation"] == "cerebellum weight" and r["weighted"] in arms \
                and r["unweighted"] in arms:
            before = arms[r["unweighted"]]["dice"]["cerebellar WM"]
            after = arms[r["weighted"]]["dice"]["cerebellar WM"]
            print(f"    reported: {REPORTED['cerebellum']}\n      here (dirty copy, arm C): "
                  f"{_f(before)} -> {_f(after)}")


def plot(out: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [r for r in out["arms"] if not r.get("skipped")]
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(13, 4.8))
    for row in arms:
        losses = row["losses"]
        shown = [x if math.isfinite(x) else float("nan") for x in losses]
        line, = curves.plot(_smooth(shown), label=row["arm"], linewidth=1.4)
        bad = [i for i, x in enumerate(losses) if not math.isfinite(x)]
        if bad:
            curves.plot(bad, [curves.get_ylim()[1] * 0.98] * len(bad), "|",
                        color=line.get_color(), markersize=8)
    curves.set_xlabel("step")
    curves.set_ylabel("training loss (median of 5 steps)")
    curves.set_title("Loss; ticks at the top: non-finite steps")
    curves.legend(fontsize=7)
    width = 0.8 / max(len(arms), 1)
    for n, row in enumerate(arms):
        values = [row["dice"].get(s) for s in STRUCTURES]
        values = [v if v is not None and math.isfinite(v) else 0.0 for v in values]
        bars.bar([i + n * width for i in range(len(STRUCTURES))], values, width,
                 label=row["arm"])
    bars.set_xticks([i + 0.4 - width / 2 for i in range(len(STRUCTURES))], STRUCTURES)
    bars.set_ylabel("Dice on the clean test subjects")
    bars.set_ylim(0, 1)
    bars.set_title("Dice per structure")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(values: list[float], n: int = 5) -> list[float]:
    out = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - n + 1):i + 1] if math.isfinite(v)]
        out.append(sorted(window)[len(window) // 2] if window else float("nan"))
    return out
