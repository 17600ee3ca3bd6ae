"""Arm C: mriprep, as its docs run it for FastSurfer-style training.

* ``mriprep run -p conform_1mm``: NaN and extreme values filled and marked invalid,
  incomplete and artifact slices masked, FastSurfer's conform; a scan it cannot serve is
  refused with its reason;
* ``mriprep run -p t1w_mni_rigid`` beside it: only a registered cache tells one person in
  two scans (docs/qc.md, "One person in two splits") and a header whose orientation is
  wrong (the register stage refuses it); what this run refuses is not trained on either;
* ``mriprep check`` of both caches (errors and warnings kept in the notes): the test
  subjects an ``identity-leak`` names leave the test split, the fix the finding gives;
* ``MRIDataset(mode="thick_slice", view="sagittal", manifest=<the served subjects>,
  exclude_flagged=True)`` (what a warning or an error of the check concerns is left out,
  docs/qc.md) with the bench table's classes and FastSurfer's weight map ->
  ``make_dataloader`` -> :class:`~mriprep.training.NaNGuard` as the network's first
  layer, and the valid-aware ``DiceLoss`` + weighted ``CrossEntropyLoss`` (filled and
  masked voxels teach nothing). No arm augments: the comparison is of data paths.

``cerebellum_weight`` adds that share to the weight map on the cerebellum's classes
(``WeightOptions.region_weights``: 0.3 multiplies it by 1.3), the ablation the bench
sets beside the reported lift.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mriprep.inputs.manifest import ManifestRow, write_manifest
from mriprep.training import CrossEntropyLoss, DiceLoss, MRIDataset, make_dataloader
from mriprep.training.labels.slices import as_view
from mriprep.training.labels.weights import WeightOptions

from benchmarks.outcome.cohort import Cohort
from benchmarks.outcome.training import TABLE, BATCH, VIEW, PreparedArm, TestVolume, class_table

PIPELINE = "conform_1mm"
IDENTITY_PIPELINE = "t1w_mni_rigid"
CEREBELLUM = ("Left-Cerebellum-White-Matter", "Left-Cerebellum-Cortex")


def cache_cohort(cohort: Cohort, copy: str, work: Path, pipeline: str = PIPELINE
                 ) -> tuple[Path, dict[str, str]]:
    """The cohort's copy through ``mriprep run``: (cache, subjects refused with their
    reasons)."""
    work.mkdir(parents=True, exist_ok=True)
    manifest = work / f"{copy}.csv"
    _write_manifest(manifest, cohort.subjects(copy))
    cache = work / f"cache-{copy}" if pipeline == PIPELINE else work / f"cache-{copy}-{pipeline}"
    out = _mriprep(["run", str(manifest), "-o", str(cache), "-p", pipeline, "--workers", "2",
                    "--no-report", "--json"], work / f"run-{copy}-{pipeline}.log")
    summary = json.loads(out.stdout)
    refused = {f["subject_id"]: f"{f.get('stage')}: {f.get('reason')}"
               for f in summary.get("failed", [])}
    return cache, refused


def _write_manifest(path: Path, subjects) -> None:
    write_manifest([ManifestRow(0, s.subject_id, "", Path(s.image), Path(s.label), s.split)
                    for s in subjects], path)


def check(cache: Path, labels: bool = True) -> tuple[int, list[dict]]:
    """``mriprep check CACHE --json`` (with the label maps judged against the bench's class
    table when ``labels``): (exit status, findings)."""
    table = ["--lut", str(TABLE), "--processing", "aseg"] if labels else []
    out = _mriprep(["check", str(cache), "--json", *table], cache.parent / f"check-{cache.name}.log")
    return out.returncode, json.loads(out.stdout).get("findings", [])


def _mriprep(args: list[str], log: Path) -> subprocess.CompletedProcess:
    """The ``mriprep`` command in its own process (its dask workers are its own), its
    progress kept in ``log``; JSON on stdout."""
    with open(log, "w") as err:
        return subprocess.run([sys.executable, "-c", "import sys; from mriprep.cli import "
                               "main; sys.exit(main())", *args], stdout=subprocess.PIPE,
                              stderr=err, text=True, check=False)


def prepare(cohort: Cohort, copy: str, work: Path, cerebellum_weight: float = 0.0
            ) -> PreparedArm:
    started = time.perf_counter()
    cache, refused = cache_cohort(cohort, copy, work)
    status, findings = check(cache)
    # conform_1mm does not register, and only a registered cache can tell one person in
    # two scans (docs/qc.md) or a header whose orientation is wrong: those are judged on
    # a t1w_mni_rigid cache, and what it refuses is not trained on.
    people, unserved = cache_cohort(cohort, copy, work, pipeline=IDENTITY_PIPELINE)
    identity_status, identity = check(people, labels=False)
    testing = {s.subject_id for s in cohort.subjects(copy) if s.split == "test"}
    leaked = sorted({s for f in identity if f.get("code") == "identity-leak"
                     for s in f.get("subjects", []) if s in testing})
    weights = WeightOptions(region_weights={name: 1.0 + cerebellum_weight
                                            for name in CEREBELLUM} if cerebellum_weight else {})
    table = class_table()
    options = dict(mode="thick_slice", view=VIEW, table=table, weights=weights)
    refused |= {sid: f"{IDENTITY_PIPELINE}: {why}" for sid, why in unserved.items()}
    kept = work / f"{copy}-served.csv"
    _write_manifest(kept, [s for s in cohort.subjects(copy) if s.subject_id not in refused])
    train = MRIDataset(cache, "train", manifest=kept, exclude_flagged=True, **options)
    for key, codes in train.excluded.items():
        refused[key] = f"left out on check's {', '.join(codes)} (exclude_flagged=True)"
    test = [_test_volume(train, entry, table) for entry in MRIDataset(cache, "test", **options).entries
            if entry.subject_id not in leaked]
    notes = [f"mriprep check exit {status}: " + ("; ".join(
        f"{f.get('severity')} {f.get('code')} ({', '.join(f.get('subjects', []))})"
        for f in findings if f.get("severity") in ("error", "warning")) or "no finding")]
    notes.append(f"identity search ({IDENTITY_PIPELINE} cache, check exit {identity_status}): "
                 + ("; ".join(f"{f['code']} ({', '.join(f.get('subjects', []))})"
                              for f in identity if "identity" in f.get("code", ""))
                    or "no person in two splits"))
    if leaked:
        notes.append(f"left the test split on check's identity-leak: {', '.join(leaked)}")
    return PreparedArm(
        name="C. mriprep" + (f", cerebellum weight {cerebellum_weight}" if cerebellum_weight else ""),
        batches=lambda seed: _batches(train, seed),
        loss=_loss(), test=test, lost=refused, notes=notes,
        seconds=time.perf_counter() - started, guarded=True,
        epoch_steps=len(train) // BATCH)


def _batches(dataset: MRIDataset, seed: int):
    loader = make_dataloader(dataset, batch_size=BATCH, num_workers=2, seed=seed,
                             drop_last=True)
    while True:
        for batch in loader:
            batch["image"] = batch["image"] / 255.0  # FastSurfer scales orig to 0-1
            batch["classes"] = batch["label"]
            yield batch


def _loss():
    dice, ce = DiceLoss(), CrossEntropyLoss()

    def loss(logits, batch):
        valid = batch["valid"]
        return (ce(logits, batch["classes"], valid=valid, weight_map=batch["weight"])
                + dice(logits, batch["classes"], valid=valid))
    return loss


def _test_volume(dataset: MRIDataset, entry, table) -> TestVolume:
    image = np.asarray(dataset.cache.load_tensor(entry.key, "image"), dtype=np.float32) / 255.0
    labels = np.asarray(dataset.cache.load_tensor(entry.key, "label"))
    valid = np.asarray(dataset.cache.load_tensor(entry.key, "valid"), dtype=bool)
    classes = table.map(labels, VIEW, subject=entry.subject_id).classes
    return TestVolume(entry.subject_id,
                      np.ascontiguousarray(as_view(image, VIEW)),
                      np.ascontiguousarray(as_view(classes, VIEW)).astype(np.int64),
                      np.ascontiguousarray(as_view(valid, VIEW)))


def training_volumes(cache: Path) -> list[TestVolume]:
    """The training split's volumes of a cache, read whole (the NaN ablation's input)."""
    table = class_table()
    dataset = MRIDataset(cache, "train", mode="thick_slice", view=VIEW, table=table)
    return [_test_volume(dataset, entry, table) for entry in dataset.entries]
