"""Run a pipeline over a cohort on dask: one task per subject, written to the cache.

Each subject is one dask task that hashes its input files, skips the subject when a
verified entry with that key already exists, and otherwise runs load + every stage +
the cache write in the worker that holds the data: volumes never travel between workers,
only a small result dict goes back. The task never raises into the scheduler: a broken
scan comes back as ``status="failed"`` with the stage and the reason, and the rest of the
cohort completes.

The scheduler (a private LocalCluster of worker processes by default, dask's threaded or
synchronous scheduler, or a running cluster's address) and the pinned thread pools of the
workers are set up by :mod:`mriprep.run.scheduling`.

Index
-----
Results reach ``CACHE/index.json`` as they arrive, batched (one locked rewrite every
few seconds, and at the end or on interruption), each entry with its split from the
manifest. A subject that fails leaves the index: its old entry, if any, was computed from
other inputs or parameters.

Reports
-------
After a run, ``CACHE/reports/latest.json`` and ``latest.csv`` list every subject with its
status, failing stage and reason, key, seconds and metrics (see :mod:`mriprep.run.reports`).
"""

from __future__ import annotations

import os
import resource
import socket
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

import mriprep
from mriprep.cache import Cache, entry_key, sha256_file, summary_of
from mriprep.core.errors import MriprepError, SchedulerError, StageError
from mriprep.pipelines import Pipeline
from mriprep.run.progress import ProgressReporter
from mriprep.run.reports import STATUSES, summary_json, summary_text, write_reports
from mriprep.run.scheduling import (
    SCHEDULERS,
    configure_worker,
    connect,
    scheduler_client,
    usable_cores,
)
from mriprep.stages import get_stage
from mriprep.stages.intensity import all_finite
from mriprep.core.volume import Volume, jsonable

# Names that lived here before reporting and scheduling got their own modules: tests
# and older callers still import them from mriprep.run.cohort.
__all__ = [
    "ProgressReporter", "RunResult", "SCHEDULERS", "SchedulerError", "SubjectTask",
    "configure_worker", "connect", "process_subject", "run_cohort", "run_stages",
    "summary_json", "summary_text", "tasks_from_manifest",
]

INDEX_FLUSH_SECONDS = 10.0
_INT16 = np.iinfo(np.int16)


@dataclass(frozen=True)
class SubjectTask:
    """What a worker needs to process one subject: ids, split and input paths."""

    subject_id: str
    session_id: str
    split: str
    image: str
    label: str | None = None
    row: int = 0

    @property
    def input_paths(self) -> dict[str, str | None]:
        """The input files by role (``image``, ``label``); a missing label is None."""
        return {"image": self.image, "label": self.label}


def tasks_from_manifest(manifest_path: str | os.PathLike) -> list[SubjectTask]:
    """Read a cohort manifest into one :class:`SubjectTask` per row.

    Missing image files are not an error here: each becomes that subject's failure at
    the ``load`` stage, so one bad path does not stop a cohort.
    """
    from mriprep.inputs.manifest import read_manifest

    manifest = read_manifest(manifest_path, check_files=False)
    return [
        SubjectTask(
            subject_id=str(row.subject_id),
            session_id=str(row.session_id or ""),
            split=str(row.split or ""),
            image=str(Path(row.image).resolve()),
            label=str(Path(row.label).resolve()) if row.label else None,
            row=int(row.row),
        )
        for row in manifest.rows
    ]


# -- worker side ---------------------------------------------------------------------


def process_subject(
    task: SubjectTask,
    pipeline: Pipeline,
    cache_root: str,
    force: bool = False,
    threads: int = 1,
) -> dict[str, Any]:
    """Process one subject into the cache and return its result; never raises.

    Parameters
    ----------
    task
        The subject's ids, split and input paths.
    pipeline
        The validated pipeline to run.
    cache_root
        The cache folder (created by the caller).
    force
        Recompute even when a verified entry with the same key exists.
    threads
        ITK/BLAS threads for this worker.

    Returns
    -------
    dict
        ``subject_id``, ``session_id``, ``split``, ``row``, ``status`` (one of
        :data:`STATUSES`), ``stage`` and ``reason`` (failures), ``key``, ``seconds``,
        ``metrics`` (stage -> metrics), ``warnings``, ``peak_rss_mb``, ``worker`` and, for
        cached or skipped subjects, the index ``summary`` of the entry.
    """
    start = time.perf_counter()
    result = _failed_result(task, worker=f"{socket.gethostname()}:{os.getpid()}")
    progress = _Progress("load")
    failed_stage_metrics: dict[str, Any] = {}
    try:
        configure_worker(threads)
        _process(task, pipeline, Cache(cache_root), force, result, progress)
    except StageError as exc:
        result.update(status="failed", stage=exc.stage, reason=exc.reason)
        failed_stage_metrics = exc.metrics
    except MriprepError as exc:
        result.update(status="failed", stage=progress.stage, reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - one subject's bug must not stop the cohort
        result.update(
            status="failed",
            stage=progress.stage,
            reason=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(limit=8),
        )
    if result["status"] == "failed" and progress.volume is not None:
        result["metrics"] = stage_metrics(progress.volume.provenance)
        result["warnings"] = stage_warnings(progress.volume.provenance)
    if failed_stage_metrics:
        result.setdefault("metrics", {})[result["stage"]] = jsonable(failed_stage_metrics)
    result["seconds"] = round(time.perf_counter() - start, 3)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


@dataclass
class _Progress:
    """Where a task is, so that an unexpected error still names its stage."""

    stage: str
    volume: Volume | None = None


def _process(task, pipeline, cache, force, result, progress) -> None:
    hashes = input_hashes(task)
    key = entry_key(task.subject_id, task.session_id, hashes, pipeline.hash)
    result["key"] = key
    if not force and cache.has_entry(key, verify=True):
        meta = cache.read_meta(key)
        result.update(
            status="skipped",
            summary=summary_of(meta),
            metrics=stage_metrics_json(meta.get("provenance", [])),
        )
        return
    # An entry folder that exists but did not verify is corrupt: swap it out.
    replace = force or cache.entry_dir(key).exists()

    from mriprep.inputs.io import load_volume

    volume = load_volume(
        Path(task.image),
        Path(task.label) if task.label else None,
        subject_id=task.subject_id,
    )
    progress.volume = volume
    volume, transform = run_stages(volume, pipeline, progress)

    progress.stage = "cache"
    tensors = output_tensors(volume, pipeline.output_dtype)
    extra_files = {}
    if transform is not None:
        extra_files["transform.tfm"] = itk_transform_text(transform)
    meta = entry_meta(task, pipeline, hashes, volume, transform)
    summary = cache.write_entry(key, tensors, meta, replace=replace, extra_files=extra_files)
    result.update(
        status="cached",
        summary=summary,
        metrics=stage_metrics(volume.provenance),
        warnings=stage_warnings(volume.provenance),
    )
    if replace and not force:
        result["warnings"].append("replaced an entry that failed verification")


def input_hashes(task: SubjectTask) -> dict[str, str]:
    """SHA-256 of the subject's input files, by role (``image``, ``label``)."""
    hashes = {}
    for role, path in task.input_paths.items():
        if path is None:
            continue
        if not Path(path).is_file():
            raise StageError(
                "load",
                f"{role} file {path} does not exist; fix its path in the manifest "
                f"(row {task.row}) or remove the subject",
            )
        hashes[role] = sha256_file(path)
    return hashes


def run_stages(
    volume: Volume, pipeline: Pipeline, progress: _Progress | None = None
) -> tuple[Volume, np.ndarray | None]:
    """Run every step of ``pipeline`` on ``volume``.

    Returns the final volume and the registration's ``template_to_subject`` matrix
    (None without a register step), which the resample stage consumes.
    """
    progress = progress or _Progress("")
    transform = None
    for step in pipeline.steps:
        progress.stage = step.name
        volume = get_stage(step.name)(volume, step.params)
        progress.volume = volume
        if volume.pending is not None:
            transform = volume.pending.template_to_subject
    if volume.pending is not None:
        raise StageError(
            "resample",
            "the pipeline ended with a registration transform that was never applied; "
            "add a 'resample' step after 'register'",
        )
    return volume, transform


def output_tensors(volume: Volume, output_dtype: str) -> dict[str, np.ndarray]:
    """The arrays to cache: image in ``output_dtype``, ``valid`` as bool, label int16."""
    with np.errstate(over="ignore", invalid="ignore"):
        if output_dtype == "uint8":
            # Rounded, as FastSurfer rounds its conformed images (validate checked 0-255).
            image = np.clip(np.rint(volume.data), 0, 255).astype(np.uint8)
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
        if label.size and (label.min() < _INT16.min or label.max() > _INT16.max):
            raise StageError(
                "cache",
                f"label values {int(label.min())}..{int(label.max())} do not fit int16; "
                "relabel the map to values below 32768",
            )
        tensors["label"] = label.astype(np.int16, copy=False)
    return tensors


def entry_meta(
    task: SubjectTask,
    pipeline: Pipeline,
    hashes: dict[str, str],
    volume: Volume,
    transform: np.ndarray | None,
) -> dict[str, Any]:
    """The JSON sidecar of an entry (the cache adds key, files and checksums)."""
    paths = task.input_paths
    meta = {
        "subject_id": task.subject_id,
        "session_id": task.session_id,
        "pipeline_name": pipeline.name,
        "pipeline_hash": pipeline.hash,
        "pipeline_source": pipeline.source,
        "output_dtype": pipeline.output_dtype,
        "inputs": {role: {"path": paths[role], "sha256": h} for role, h in hashes.items()},
        "affine": volume.affine.tolist(),
        "spacing": list(volume.spacing),
        "shape": list(volume.shape),
        "label_values": allowed_label_values(pipeline),
        "provenance": [record.to_json() for record in volume.provenance],
        "mriprep_version": mriprep.__version__,
    }
    if transform is not None:
        meta["template_to_subject"] = np.asarray(transform).tolist()
        meta["transform_file"] = "transform.tfm"
    return meta


def allowed_label_values(pipeline: Pipeline) -> list[int] | None:
    """The label values the pipeline's validate step allows, when it declares them."""
    params = pipeline.params_of("validate")
    for name in ("label_values", "allowed_labels", "allowed_label_values"):
        values = getattr(params, name, None) if params is not None else None
        if values is not None:
            return [int(v) for v in values]
    return None


def itk_transform_text(template_to_subject: np.ndarray) -> str:
    """The registration transform as an ITK ``.tfm`` text file (LPS, as ITK expects)."""
    import SimpleITK as sitk

    from mriprep.stages.register import to_sitk_transform

    transform = to_sitk_transform(np.asarray(template_to_subject))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "transform.tfm")
        sitk.WriteTransform(transform, path)
        return Path(path).read_text()


def stage_metrics(records: Iterable) -> dict[str, dict[str, Any]]:
    """Stage name -> its metrics and seconds, from StageRecords."""
    return stage_metrics_json(record.to_json() for record in records)


def stage_metrics_json(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Stage name -> its metrics and seconds, from StageRecords as JSON."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        name = record["stage"]
        while name in out:  # a stage used twice keeps both: sanitize, sanitize_2, ...
            name = _next_name(name)
        out[name] = dict(jsonable(record.get("metrics", {})), seconds=record.get("seconds"))
    return out


def stage_warnings(records: Iterable) -> list[str]:
    return [f"{r.stage}: {w}" for r in records for w in r.warnings]


def _next_name(name: str) -> str:
    base, _, number = name.rpartition("_")
    if base and number.isdigit():
        return f"{base}_{int(number) + 1}"
    return f"{name}_2"


# -- driver side ---------------------------------------------------------------------


@dataclass
class RunResult:
    """The outcome of :func:`run_cohort`: one result per subject, in manifest order."""

    results: list[dict[str, Any]]
    pipeline: Pipeline
    cache_root: Path
    scheduler: str
    workers: int
    seconds: float
    report_paths: dict[str, Path] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r["status"] == status)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r["status"] == "failed"]

    @property
    def exit_code(self) -> int:
        """0 when every subject is cached or skipped, 1 when some failed."""
        return 1 if self.failed else 0

    def counts(self) -> dict[str, int]:
        return {status: self.count(status) for status in STATUSES} | {
            "total": len(self.results)
        }


def run_cohort(
    tasks: list[SubjectTask],
    cache_root: str | os.PathLike,
    pipeline: Pipeline,
    *,
    scheduler: str = "processes",
    workers: int | None = None,
    force: bool = False,
    threads_per_worker: int = 1,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    manifest: str | os.PathLike | None = None,
) -> RunResult:
    """Process every subject into the cache and write the run reports.

    Parameters
    ----------
    tasks
        One per subject (see :func:`tasks_from_manifest`).
    cache_root
        Cache folder; created when new.
    pipeline
        A validated :class:`~mriprep.pipelines.Pipeline`.
    scheduler
        ``processes``, ``threads``, ``sync`` or the address of a running
        dask.distributed scheduler (``tcp://host:port``).
    workers
        Local workers (default: one per core, at most one per subject); ignored with an
        address.
    force
        Recompute entries that already exist.
    threads_per_worker
        ITK/BLAS threads inside each task.
    on_result
        Called in this process with each subject's result as it completes (progress).
    manifest
        Only recorded in the report.

    Returns
    -------
    RunResult
        Results in manifest order; ``exit_code`` is 0 or 1.

    Notes
    -----
    The ``processes`` scheduler spawns its workers, and each re-imports the calling
    script: keep heavy imports (torch) out of that script's top level, or every worker
    start pays for them.
    """
    workers = max(1, min(workers or usable_cores(), max(1, len(tasks))))
    started = datetime.now(timezone.utc)
    start = time.perf_counter()
    results: dict[int, dict[str, Any]] = {}
    # The scheduler comes first: an unreachable cluster must not leave an empty cache.
    with scheduler_client(scheduler, workers, threads_per_worker, bool(tasks)) as client:
        cache = Cache(cache_root, create=True)
        index = _IndexWriter(cache)

        def collect(position: int, result: dict[str, Any]) -> None:
            results[position] = result
            index.add(result)
            if on_result is not None:
                on_result(result)

        run_id = uuid.uuid4().hex[:12]
        keys = [f"mriprep-{run_id}-{i}-{t.subject_id}" for i, t in enumerate(tasks)]
        args = (tasks, keys, pipeline, str(cache.root), force, threads_per_worker, collect)
        try:
            if client is not None:
                _execute_on_client(client, *args)
            elif tasks:
                _execute_local(scheduler, workers, *args)
        finally:
            # Whatever finished is indexed, even when the run is interrupted.
            index.flush()
    run = RunResult(
        results=[results[i] for i in range(len(tasks))],
        pipeline=pipeline,
        cache_root=cache.root,
        scheduler=scheduler,
        workers=workers,
        seconds=round(time.perf_counter() - start, 3),
    )
    run.report_paths = write_reports(cache, run, started, manifest)
    return run


class _IndexWriter:
    """Batches index updates: one locked rewrite per few seconds, not per subject."""

    def __init__(self, cache: Cache):
        self.cache = cache
        self.summaries: dict[str, dict[str, Any]] = {}
        self.retire: list[tuple[str, str]] = []
        self.last_flush = time.monotonic()

    def add(self, result: dict[str, Any]) -> None:
        if result["status"] in ("cached", "skipped") and result.get("summary"):
            self.summaries[result["key"]] = dict(result["summary"], split=result["split"])
        elif result["status"] == "failed":
            # Its old entry (if any) belongs to other inputs or parameters: retire it.
            self.retire.append((result["subject_id"], result["session_id"]))
        if time.monotonic() - self.last_flush > INDEX_FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.summaries or self.retire:
            self.cache.update_index(self.summaries, retire=self.retire)
        self.summaries, self.retire = {}, []
        self.last_flush = time.monotonic()


def _execute_on_client(client, tasks, keys, pipeline, cache_root, force, threads, collect):
    """One future per subject on a dask.distributed client, collected as they finish."""
    from dask.distributed import as_completed

    # Largest inputs first (longest-processing-time-first): a big subject started last
    # would leave the other workers idle at the end of the run. Results keep manifest order.
    order = largest_first(tasks)
    futures = [None] * len(tasks)
    for rank, i in enumerate(order):
        futures[i] = client.submit(
            process_subject,
            tasks[i],
            pipeline=pipeline,
            cache_root=cache_root,
            force=force,
            threads=threads,
            key=keys[i],
            pure=False,
            priority=len(order) - rank,
        )
    position = {future.key: i for i, future in enumerate(futures)}
    for future in as_completed(futures, loop=client.loop):
        i = position[future.key]
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - a dead worker fails one subject only
            result = _lost_result(tasks[i], exc)
        collect(i, result)
        future.release()


def largest_first(tasks: list[SubjectTask]) -> list[int]:
    """Task positions by decreasing input file size (a cheap proxy for work), stable."""

    def size(task: SubjectTask) -> int:
        try:
            return os.path.getsize(task.image)
        except OSError:
            return 0  # a missing file fails at once: it costs nothing

    return sorted(range(len(tasks)), key=lambda i: (-size(tasks[i]), i))


def _execute_local(scheduler, workers, tasks, keys, pipeline, cache_root, force, threads,
                   collect):
    """One delayed task per subject on dask's threaded or synchronous scheduler."""
    import dask
    from dask.callbacks import Callback

    position = {key: i for i, key in enumerate(keys)}

    class _Collect(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if key in position:
                collect(position[key], result)

    # traverse=False: dask must hand the dataclasses over as they are, not rebuild them.
    shared = dask.delayed(pipeline, traverse=False)
    graph = [
        dask.delayed(process_subject, pure=False)(
            dask.delayed(task, traverse=False), shared, cache_root, force, threads,
            dask_key_name=key,
        )
        for task, key in zip(tasks, keys)
    ]
    with _Collect():
        dask.compute(*graph, scheduler=scheduler, num_workers=workers)


def _lost_result(task: SubjectTask, exc: BaseException) -> dict[str, Any]:
    """The result of a subject whose task never returned (its worker died)."""
    from distributed import KilledWorker

    if isinstance(exc, KilledWorker):
        reason = (
            "the worker process died while processing this subject (out of memory or a "
            "crash in a native library); rerun with fewer --workers or check the scan"
        )
    else:
        reason = f"the task could not run on the worker: {type(exc).__name__}: {exc}"
    return _failed_result(task, stage="worker", reason=reason)


def _failed_result(task: SubjectTask, stage="", reason="", worker="") -> dict[str, Any]:
    """A subject's result before (or without) any work: failed until proven otherwise."""
    return {
        "subject_id": task.subject_id,
        "session_id": task.session_id,
        "split": task.split,
        "row": task.row,
        "status": "failed",
        "stage": stage,
        "reason": reason,
        "key": "",
        "seconds": 0.0,
        "metrics": {},
        "warnings": [],
        "worker": worker,
    }
