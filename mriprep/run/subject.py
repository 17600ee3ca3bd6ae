"""One subject, on a worker: hash the inputs, load, run every stage, write the entry.

:func:`process_subject` takes a :class:`~mriprep.inputs.manifest.ManifestRow` as the
manifest holds it and returns a :class:`~mriprep.cache.run_report.SubjectResult`; it never
raises. It skips the subject when a verified entry with the same key exists, and
otherwise runs load + every stage + the cache write in the worker that holds the data:
volumes never travel between workers, only the small result goes back.

What a stage adds to the entry (sidecar fields, extra files such as registration's
``transform.tfm``) the stage declares (:class:`mriprep.stages.Stage`); this module only
collects it.
"""

from __future__ import annotations

import os
import resource
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import mriprep
from mriprep.cache import Cache, IndexEntry, entry_key
from mriprep.cache.run_report import SubjectResult
from mriprep.cache.sidecar import EntrySidecar, InputFile
from mriprep.core.errors import CacheError, MriprepError, StageError
from mriprep.core.hashing import sha256_file
from mriprep.core.limits import INT16, UINT8_MAX
from mriprep.core.volume import Volume, jsonable
from mriprep.inputs.manifest import ManifestRow
from mriprep.pipelines import Pipeline
from mriprep.pipelines.execute import (
    Position,
    run_stages,
    stage_metrics,
    stage_metrics_json,
    stage_warnings,
)
from mriprep.qc.capture import Capture
from mriprep.run.worker_setup import configure_worker
from mriprep.stages import get_stage
from mriprep.stages.intensity import all_finite


def input_paths(row: ManifestRow) -> dict[str, str]:
    """The subject's input files by role (``image``, and ``label`` when it has one)."""
    paths = {"image": str(row.image)}
    if row.label is not None:
        paths["label"] = str(row.label)
    return paths


def header_choice(row: ManifestRow, pipeline: Pipeline) -> str:
    """Which NIfTI form gives the scan's geometry: the manifest row's ``header`` when it
    sets one, else the pipeline's (``auto``: FastSurfer's rule)."""
    return row.header or pipeline.header


def process_subject(
    row: ManifestRow,
    pipeline: Pipeline,
    cache_root: str,
    force: bool = False,
    threads: int = 1,
    qc: bool = True,
) -> SubjectResult:
    """Process one subject into the cache and return its result; never raises.

    Parameters
    ----------
    row
        The subject's manifest row (ids, split, input paths).
    pipeline
        The validated pipeline to run.
    cache_root
        The cache folder (created by the caller).
    force
        Recompute even when a verified entry with the same key exists.
    threads
        ITK/BLAS threads for this worker.
    qc
        Make the subject's QC pictures and metrics (:mod:`mriprep.qc`) while its data
        are in memory; a failed subject gets a picture of its input when it was read.
    """
    start = time.perf_counter()
    current = _Current("load", capture=Capture() if qc else None, cache_root=cache_root)
    fields: dict[str, Any] = {}
    stage_failure_metrics: dict[str, Any] = {}
    try:
        configure_worker(threads)
        fields = _process(row, pipeline, Cache(cache_root), force, current)
    except StageError as exc:
        fields = dict(stage=exc.stage, reason=exc.reason)
        stage_failure_metrics = exc.metrics
    except MriprepError as exc:
        fields = dict(stage=current.stage, reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - one subject's bug must not stop the cohort
        fields = dict(stage=current.stage, reason=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc(limit=8))
    if "status" not in fields:  # failed: what ran so far is the subject's record
        if current.volume is not None:
            fields.update(metrics=stage_metrics(current.volume.provenance),
                          warnings=tuple(stage_warnings(current.volume.provenance)))
        if stage_failure_metrics:
            metrics = dict(fields.get("metrics", {}))
            metrics[fields["stage"]] = jsonable(stage_failure_metrics)
            fields["metrics"] = metrics
        fields["key"] = current.key
        if current.capture is not None and current.capture.loaded is not None and current.key:
            _write_failed_qc(row, current, fields)
    return SubjectResult.of(
        row, **fields,
        seconds=round(time.perf_counter() - start, 3),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        worker=f"{socket.gethostname()}:{os.getpid()}",
    )


@dataclass
class _Current(Position):
    """Where a task is (its step, as :func:`run_stages` keeps it, and its entry's key),
    so that an unexpected error still names its stage."""

    key: str = ""
    capture: Capture | None = None
    cache_root: str = ""


def _process(row: ManifestRow, pipeline: Pipeline, cache: Cache, force: bool,
             current: _Current) -> dict[str, Any]:
    """The result fields of a subject that is cached or skipped (raises on failure)."""
    hashes = input_hashes(row)
    header = header_choice(row, pipeline)
    key = entry_key(row.subject_id, row.session_id, hashes, pipeline.hash, header=header)
    current.key = key
    if not force and cache.has_entry(key, verify=True):
        try:
            meta = cache.read_meta(key)
            sidecar = EntrySidecar.from_json(meta,
                                             where=str(cache.entry_dir(key) / "meta.json"))
            return dict(status="skipped", key=key, entry=IndexEntry.from_meta(key, meta),
                        metrics=stage_metrics_json(sidecar.records))
        except CacheError:
            pass  # files intact but a sidecar edited out of shape: made again below
    # An entry folder that exists but did not verify (or whose sidecar does not read)
    # is corrupt: swap it out.
    replace = force or cache.entry_dir(key).exists()

    from mriprep.inputs.readers import load_volume

    volume = load_volume(row.image, row.label, subject_id=row.subject_id, header=header)
    current.volume = volume
    if current.capture is not None:
        current.capture.loaded = volume
    volume = run_stages(volume, pipeline, current, observe=current.capture)

    current.stage = "cache"
    tensors = output_tensors(volume, pipeline.output_dtype)
    sidecar, extra_files = entry_meta(row, pipeline, hashes, volume)
    entry = cache.write_entry(key, tensors, sidecar.to_json(), replace=replace,
                              extra_files=extra_files,
                              compression=pipeline.compression)
    warnings = stage_warnings(volume.provenance)
    if replace and not force:
        warnings.append("replaced an entry that failed verification")
    if current.capture is not None:
        current.stage = "qc"
        warnings += _write_qc(row, pipeline, cache, key, current.capture, volume, tensors)
    return dict(status="cached", key=key, entry=entry,
                metrics=stage_metrics(volume.provenance), warnings=tuple(warnings))


def input_hashes(row: ManifestRow) -> dict[str, str]:
    """SHA-256 of the subject's input files, by role (``image``, ``label``)."""
    hashes = {}
    for role, path in input_paths(row).items():
        if not Path(path).is_file():
            raise StageError(
                "load",
                f"{role} file {path} does not exist; fix its path in the manifest "
                f"(row {row.row}) or remove the subject",
            )
        hashes[role] = sha256_file(path)
    return hashes


def output_tensors(volume: Volume, output_dtype: str) -> dict[str, np.ndarray]:
    """The arrays to cache: image in ``output_dtype``, ``valid`` as bool, label int16."""
    with np.errstate(over="ignore", invalid="ignore"):
        if output_dtype == "uint8":
            # Rounded, as FastSurfer rounds its conformed images (validate checked 0-255).
            image = np.clip(np.rint(volume.data), 0, UINT8_MAX).astype(np.uint8)
        else:
            image = volume.data.astype(output_dtype, copy=False)
    bad = 0 if all_finite(image) else int(np.count_nonzero(~np.isfinite(image)))
    if bad:
        peak = float(np.nanmax(np.abs(volume.data))) if np.isfinite(volume.data).any() else np.nan
        raise StageError(
            "cache",
            f"{bad} image values are not finite in {output_dtype} (largest |value| "
            f"{peak:.3g}); add a 'normalize' step or set output_dtype: float32",
        )
    tensors = {"image": image, "valid": volume.valid}
    if volume.label is not None:
        label = volume.label
        if label.size and (label.min() < INT16.min or label.max() > INT16.max):
            raise StageError(
                "cache",
                f"label values {int(label.min())}..{int(label.max())} do not fit int16; "
                "relabel the map to values below 32768",
            )
        tensors["label"] = label.astype(np.int16, copy=False)
    return tensors


def entry_meta(
    row: ManifestRow, pipeline: Pipeline, hashes: dict[str, str], volume: Volume,
) -> tuple[EntrySidecar, dict[str, str]]:
    """The entry's sidecar (the cache adds key, files and checksums) and the extra files
    the stages declare (name -> text)."""
    paths = input_paths(row)
    declared: dict[str, Any] = {}
    extra_files: dict[str, str] = {}
    for step in pipeline.steps:
        stage = get_stage(step.name)
        if stage.entry_meta is not None:
            declared.update(stage.entry_meta(step.params, volume))
        if stage.entry_files is not None:
            extra_files.update(stage.entry_files(step.params, volume))
    label_values = declared.pop("label_values", None)
    sidecar = EntrySidecar(
        subject_id=row.subject_id,
        session_id=row.session_id,
        pipeline_name=pipeline.name,
        pipeline_hash=pipeline.hash,
        pipeline_source=pipeline.source,
        output_dtype=pipeline.output_dtype,
        inputs={role: InputFile(paths[role], h) for role, h in hashes.items()},
        # Which NIfTI form gave the input's geometry (what reads the scan again uses it).
        header=header_choice(row, pipeline),
        affine=volume.affine,
        spacing=tuple(volume.spacing),
        shape=tuple(volume.shape),
        # The allowed label values, when a stage declares them (None: not checked).
        label_values=None if label_values is None else tuple(label_values),
        provenance=tuple(record.to_json() for record in volume.provenance),
        mriprep_version=mriprep.__version__,
        other=jsonable(declared),
    )
    return sidecar, extra_files


def _write_qc(row: ManifestRow, pipeline: Pipeline, cache: Cache, key: str, capture: Capture,
              volume: Volume, tensors: dict[str, np.ndarray]) -> list[str]:
    """Make and store the subject's QC; a problem is a warning, never a failure."""
    from mriprep.qc.store import write_qc
    from mriprep.qc.subject import OutputData, subject_qc, template_from_records

    try:
        applied = volume.applied
        output = OutputData(
            image=tensors["image"], valid=tensors["valid"], affine=volume.affine,
            label=tensors.get("label"),
            template_to_subject=applied.template_to_subject if applied is not None else None)
        template = template_from_records(step.resolved() for step in pipeline.steps) \
            if applied is not None else None
        qc = subject_qc(capture.loaded, capture.layers, output, template,
                        (record.to_json() for record in volume.provenance))
        if capture.problem:
            qc.notes.append(capture.problem)
        write_qc(cache.root, key, qc, _identity(row, "cached"))
    except Exception as exc:  # noqa: BLE001 - the entry is written; QC is an extra
        return [f"qc: not made ({type(exc).__name__}: {exc})"]
    return []


def _write_failed_qc(row: ManifestRow, current: _Current, fields: dict[str, Any]) -> None:
    """A failed subject's QC: a picture of its input, with what was invalidated so far."""
    from mriprep.qc.store import write_qc
    from mriprep.qc.subject import subject_qc

    try:
        qc = subject_qc(current.capture.loaded, current.capture.layers, None, None, ())
        write_qc(Path(current.cache_root), current.key, qc,
                 _identity(row, "failed", stage=fields.get("stage"),
                           reason=fields.get("reason")))
    except Exception as exc:  # noqa: BLE001 - the failure itself is what matters
        fields["warnings"] = tuple(fields.get("warnings", ())) + (
            f"qc: not made ({type(exc).__name__}: {exc})",)


def _identity(row: ManifestRow, status: str, **extra: Any) -> dict[str, Any]:
    return {"subject_id": row.subject_id, "session_id": row.session_id, "split": row.split,
            "status": status, **extra}
