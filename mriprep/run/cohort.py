"""Run a pipeline over a cohort on dask: one task per subject, written to the cache.

Each subject is one dask task (:func:`mriprep.run.subject.process_subject`) that receives
its manifest row as it is and returns a :class:`~mriprep.cache.run_report.SubjectResult`; it
never raises into the scheduler, so a broken scan comes back failed with its stage and
reason, and the rest of the cohort completes.

The scheduler (a private LocalCluster of worker processes by default, dask's threaded or
synchronous scheduler, Slurm jobs, or a running cluster's address) and the pinned thread
pools of the workers are set up by :mod:`mriprep.run.worker_setup`; on Slurm the job board
(:mod:`mriprep.run.slurm.jobs`) scales the jobs and resubmits the subjects of dead ones.

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
Each worker also makes its subject's QC pictures and metrics (``CACHE/qc/<key>``), and the
run ends with the HTML QC report, ``CACHE/qc/index.html`` (:mod:`mriprep.qc`), unless
``report=False``. dask.distributed's own log (scheduler, workers) goes to
``CACHE/reports/distributed.log``, not to the terminal.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from mriprep.cache import Cache, IndexEntry
from mriprep.cache.run_report import SubjectResult
from mriprep.cache.store import REPORTS_DIR
from mriprep.core.errors import CacheError, SchedulerError
from mriprep.core.machine import usable_cores
from mriprep.inputs.manifest import ManifestRow
from mriprep.pipelines import Pipeline
from mriprep.run.interrupt import RunInterrupted, interrupts_ignored
from mriprep.run.reports import RunResult, write_reports
from mriprep.run.scheduling import scheduler_client
from mriprep.run.worker_setup import DISTRIBUTED_LOG_NAME
from mriprep.run.subject import process_subject

if TYPE_CHECKING:
    from mriprep.run.slurm import JobStatus, SlurmProfile

INDEX_FLUSH_SECONDS = 10.0
INDEX_TIME_SHARE = 0.02  # at most this share of a run goes to rewriting the index
SLURM_LOGS_DIR = "slurm-jobs"  # CACHE/reports/slurm-jobs: the Slurm jobs' stdout and stderr


def cohort_rows(manifest_path: str | os.PathLike) -> list[ManifestRow]:
    """The manifest's rows, input paths resolved, as the workers receive them.

    Missing image files are not an error here: each becomes that subject's failure at
    the ``load`` stage, so one bad path does not stop a cohort.
    """
    from mriprep.core.errors import ManifestError
    from mriprep.inputs.manifest import read_manifest

    try:
        manifest = read_manifest(manifest_path, check_files=False)
    except ManifestError:
        # Refused anyway: list every problem, missing files too, as `manifest validate`.
        read_manifest(manifest_path, check_files=True)
        raise
    return [
        dataclasses.replace(row, image=Path(row.image).resolve(),
                            label=Path(row.label).resolve() if row.label else None)
        for row in manifest.rows
    ]


def run_cohort(
    rows: list[ManifestRow],
    cache_root: str | os.PathLike,
    pipeline: Pipeline,
    *,
    scheduler: str = "processes",
    workers: int | None = None,
    force: bool = False,
    threads_per_worker: int = 1,
    on_result: Callable[[SubjectResult], None] | None = None,
    manifest: str | os.PathLike | None = None,
    report: bool = True,
    replace_pipeline: bool = False,
    slurm: "SlurmProfile | None" = None,
    on_jobs: "Callable[[JobStatus], None] | None" = None,
    on_report: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Process every subject into the cache and write the run reports.

    Parameters
    ----------
    rows
        One per subject (see :func:`cohort_rows`).
    cache_root
        Cache folder; created when new.
    pipeline
        A validated :class:`~mriprep.pipelines.Pipeline`.
    scheduler
        ``processes``, ``threads``, ``sync``, ``slurm`` or the address of a running
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
    report
        Make each subject's QC pictures and metrics in its worker, and write the HTML QC
        report (``CACHE/qc/index.html``, :mod:`mriprep.qc.report`) at the end.
    replace_pipeline
        Let this run's pipeline take over a cache whose index holds another pipeline's
        entries: they leave the index (``mriprep cache prune`` deletes their files).
        Without it such a cache is refused (:class:`CacheError`) before any work.
    slurm
        The Slurm jobs' profile with ``scheduler="slurm"`` (default: its defaults); the
        jobs' logs go to ``CACHE/reports/slurm-jobs``.
    on_jobs
        Called from a background thread with the Slurm jobs' state every few seconds.
    on_report
        Called as ``on_report(done, total)`` while the QC report reads the subjects.

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
    workers = max(1, min(workers or usable_cores(), max(1, len(rows))))
    started = datetime.now(timezone.utc)
    start = time.perf_counter()
    results: dict[int, SubjectResult] = {}
    if not replace_pipeline:
        _refuse_takeover_early(cache_root, pipeline)
    # The scheduler comes first: an unreachable cluster must not leave an empty cache.
    slurm_logs = Path(cache_root).resolve() / REPORTS_DIR / SLURM_LOGS_DIR
    # distributed's own log, kept off the terminal (mriprep.run.worker_setup).
    dask_log = Path(cache_root).resolve() / REPORTS_DIR / DISTRIBUTED_LOG_NAME
    # Holds the Ctrl-C shield of an interrupted run (see _process): closed last, after
    # the scheduler, so that closing the workers is not cut short either.
    shutdown_guard = contextlib.ExitStack()
    try:
        with shutdown_guard, scheduler_client(scheduler, workers, threads_per_worker,
                                              bool(rows), slurm=slurm, slurm_logs=slurm_logs,
                                              on_jobs=on_jobs, log_path=dask_log
                                              ) as (client, board):
            cache = Cache(cache_root, create=True)
            index_note = prepare_index(cache, pipeline, rows, replace_pipeline)
            _process(client, board, scheduler, workers, rows, pipeline, cache, force,
                     threads_per_worker, report, results, on_result, shutdown_guard)
    except KeyboardInterrupt:
        done = list(results.values())
        raise RunInterrupted(sum(r.status == "cached" for r in done),
                             sum(r.status == "skipped" for r in done), len(rows)) from None
    run = RunResult(
        results=[results[i] for i in range(len(rows))],
        pipeline=pipeline,
        cache_root=cache.root,
        scheduler=scheduler,
        workers=workers,
        seconds=round(time.perf_counter() - start, 3),
        index_note=index_note,
    )
    run.report_paths = write_reports(cache, run, started, manifest)
    if report:
        from mriprep.qc.report import write_report

        report_start = time.perf_counter()
        try:
            run.report_paths["qc"] = write_report(cache.root, make_missing=False,
                                                  progress=on_report)
        except Exception as exc:  # noqa: BLE001 - the cohort is done; the report is extra
            run.report_error = (f"the QC report could not be written ({type(exc).__name__}: "
                                f"{exc}); `mriprep report {cache.root}` tries again")
        run.report_seconds = round(time.perf_counter() - report_start, 3)
    return run


def _process(client, board, scheduler, workers, rows, pipeline, cache, force, threads,
             report, results, on_result, shutdown_guard) -> None:
    """Run every subject on ``client`` (or dask's local scheduler), collecting each
    result into ``results`` and the index as it comes."""
    index = _IndexWriter(cache)

    def collect(position: int, result: SubjectResult) -> None:
        results[position] = result
        index.add(result)
        if on_result is not None:
            on_result(result)

    run_id = uuid.uuid4().hex[:12]
    keys = [f"mriprep-{run_id}-{i}-{t.subject_id}" for i, t in enumerate(rows)]
    args = (rows, keys, pipeline, str(cache.root), force, threads, report, collect)
    try:
        if client is not None:
            _execute_on_client(client, board, *args)
        elif rows:
            _execute_local(scheduler, workers, *args)
    except KeyboardInterrupt:
        # Indexing what finished and closing the workers (cancelling Slurm jobs) must
        # not be cut short by a second Ctrl-C: ignored until ``shutdown_guard`` closes.
        shutdown_guard.enter_context(interrupts_ignored())
        raise
    finally:
        # Whatever finished is indexed, even when the run is interrupted.
        index.flush()


def prepare_index(cache: Cache, pipeline: Pipeline, rows: list[ManifestRow],
                  replace_pipeline: bool) -> str:
    """Make the index fit for this run, or refuse before any work; say what was done.

    A damaged index is rebuilt from the entries' sidecars (file sizes checked; the
    run's rows give their splits, the run reports the others'). A cache serves one
    pipeline (the Dataset refuses a mix): an index entry of any other pipeline hash, a
    changed parameter included, is refused (:func:`refuse_other_pipelines`) unless
    ``replace_pipeline`` takes those entries out of the index.
    """
    notes = []
    try:
        raw = cache.read_index()
    except CacheError as exc:
        from mriprep.maintenance import repair_index

        repaired = repair_index(cache, splits={r.key: r.split for r in rows if r.split},
                                verify="sizes")
        notes.append(f"index.json was damaged ({exc}); rebuilt it from the entries' "
                     f"sidecars: {repaired.summary()}. `mriprep cache verify {cache.root}` "
                     "reads every file")
        raw = cache.read_index()
    others = other_pipelines(raw, pipeline)
    if others:
        if not replace_pipeline:
            refuse_other_pipelines(cache, raw, pipeline)
        cache.remove_from_index(list(others))
        notes.append(f"--replace-pipeline: took {_listed(others)} out of the index; "
                     f"`mriprep cache prune {cache.root}` deletes their files")
    return "; ".join(notes)


def other_pipelines(raw: dict, pipeline: Pipeline) -> dict:
    """The index documents (key -> document) made by another pipeline hash than
    ``pipeline``'s; a document that is no object is ``mriprep check``'s to report."""
    return {k: doc for k, doc in raw.items()
            if isinstance(doc, dict) and doc.get("pipeline_hash") != pipeline.hash}


def refuse_other_pipelines(cache: Cache, raw: dict, pipeline: Pipeline) -> None:
    """Raise :class:`CacheError` when the index ``raw`` holds entries of another pipeline
    hash than ``pipeline``'s, naming both pipelines and both hashes.

    Running on would re-index every subject of this run under the new pipeline and leave
    the old entries unindexed for ``mriprep cache prune`` to delete: a silent takeover.
    """
    others = other_pipelines(raw, pipeline)
    if not others:
        return
    same_name = {doc.get("pipeline_name") for doc in others.values()} == {pipeline.name}
    why = " (the same name with other parameters or another mriprep version)"
    raise CacheError(
        f"cache {cache.root} indexes {_listed(others)}, and this run's pipeline is "
        f"{pipeline.name} ({pipeline.hash[:12]}){why if same_name else ''}: one cache "
        "serves one pipeline (MRIDataset refuses a mix), and running on would re-index "
        "its subjects under this pipeline and leave the old entries for "
        "`mriprep cache prune` to delete. Write this run to another folder (-o) to keep "
        "both, or pass --replace-pipeline to take the old entries out of the index")


def _listed(docs: dict) -> str:
    found = collections.Counter((doc.get("pipeline_name"), str(doc.get("pipeline_hash")))
                                for doc in docs.values())
    return ", ".join(f"{n} entr{'y' if n == 1 else 'ies'} of pipeline {name} ({h[:12]})"
                     for (name, h), n in found.most_common())


def _refuse_takeover_early(cache_root: str | os.PathLike, pipeline: Pipeline) -> None:
    """Refuse another pipeline's cache before any worker or Slurm job starts (an
    existing cache with a readable index; a damaged one is repaired, then judged, in
    :func:`prepare_index`)."""
    if not (Path(cache_root) / "mriprep-cache.json").exists():
        return
    try:
        cache = Cache(cache_root)
        raw = cache.read_index()
    except CacheError:
        return
    refuse_other_pipelines(cache, raw, pipeline)


class _IndexWriter:
    """Batches index updates: one locked rewrite per few seconds, not per subject.

    A rewrite costs time in proportion to the index (`make bench` scale;
    docs/benchmarks.md, "Cache and runner"), and the driver collects no result meanwhile.
    So the interval grows with the cost: rewrites never take more than
    :data:`INDEX_TIME_SHARE` of a run, however large the cohort.
    """

    def __init__(self, cache: Cache):
        self.cache = cache
        self.entries: dict[str, IndexEntry] = {}
        self.retire: list[tuple[str, str]] = []
        self.last_flush = time.monotonic()
        self.last_cost = 0.0

    def add(self, result: SubjectResult) -> None:
        if result.status in ("cached", "skipped") and result.entry is not None:
            self.entries[result.key] = result.entry.with_split(result.split)
        elif result.failed:
            # Its old entry (if any) belongs to other inputs or parameters: retire it.
            self.retire.append((result.subject_id, result.session_id))
        interval = max(INDEX_FLUSH_SECONDS, self.last_cost / INDEX_TIME_SHARE)
        if time.monotonic() - self.last_flush > interval:
            self.flush()

    def flush(self) -> None:
        start = time.monotonic()
        if self.entries or self.retire:
            self.cache.update_index(self.entries.values(), retire=self.retire)
            self.last_cost = time.monotonic() - start
        self.entries, self.retire = {}, []
        self.last_flush = time.monotonic()


def _execute_on_client(client, board, rows, keys, pipeline, cache_root, force, threads,
                       qc, collect):
    """One future per subject on a dask.distributed client, collected as they finish.

    With a Slurm job board, the board starts the jobs once the futures exist, and a
    subject whose jobs kept dying fails with the board's account of their fates.
    """
    from concurrent.futures import CancelledError

    from dask.distributed import KilledWorker, as_completed

    # Largest inputs first (longest-processing-time-first): a big subject started last
    # would leave the other workers idle at the end of the run. Results keep manifest order.
    order = largest_first(rows)
    futures = [None] * len(rows)
    for rank, i in enumerate(order):
        futures[i] = client.submit(
            process_subject,
            rows[i],
            pipeline=pipeline,
            cache_root=cache_root,
            force=force,
            threads=threads,
            qc=qc,
            key=keys[i],
            pure=False,
            priority=len(order) - rank,
        )
    position = {future.key: i for i, future in enumerate(futures)}
    if board is not None:
        board.watch({f.key: f for f in futures},
                    {f.key: rows[i].name for i, f in enumerate(futures)})
    for future in as_completed(futures, loop=client.loop):
        i = position[future.key]
        if board is not None and board.error:
            break
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - a dead worker fails one subject only
            if board is not None and isinstance(exc, (KilledWorker, CancelledError)):
                result = SubjectResult.of(rows[i], stage="worker",
                                          reason=board.failure_reason(future.key))
            else:
                result = _lost_result(rows[i], exc)
        if board is not None:
            board.done(future.key)
        collect(i, result)
        future.release()
    if board is not None and board.error:
        raise SchedulerError(board.error)


def largest_first(rows: list[ManifestRow]) -> list[int]:
    """Task positions by decreasing input file size (a cheap proxy for work), stable."""

    def size(row: ManifestRow) -> int:
        try:
            return os.path.getsize(row.image)
        except OSError:
            return 0  # a missing file fails at once: it costs nothing

    return sorted(range(len(rows)), key=lambda i: (-size(rows[i]), i))


def _execute_local(scheduler, workers, rows, keys, pipeline, cache_root, force, threads, qc,
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
            dask.delayed(row, traverse=False), shared, cache_root, force, threads, qc,
            dask_key_name=key,
        )
        for row, key in zip(rows, keys)
    ]
    with _Collect():
        dask.compute(*graph, scheduler=scheduler, num_workers=workers)


def _lost_result(row: ManifestRow, exc: BaseException) -> SubjectResult:
    """The result of a subject whose task never returned (its worker died)."""
    from distributed import KilledWorker

    if isinstance(exc, KilledWorker):
        reason = (
            "the worker process died while processing this subject (out of memory or a "
            "crash in a native library); rerun with fewer --workers or check the scan"
        )
    else:
        reason = f"the task could not run on the worker: {type(exc).__name__}: {exc}"
    return SubjectResult.of(row, stage="worker", reason=reason)
