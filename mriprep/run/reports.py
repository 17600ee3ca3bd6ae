"""The outcome of a run (:class:`RunResult`), its report files and its closing summary.

After a run, ``CACHE/reports/latest.json`` and ``latest.csv`` (and a timestamped copy of
each) list every subject of the manifest with ``status`` ("cached": computed and written
now; "skipped": a verified entry already existed; "failed"), the failing ``stage`` and
``reason``, the entry ``key``, the ``seconds`` taken and every stage's metrics. Reading
one back: :mod:`mriprep.cache.run_report`.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import mriprep
from mriprep.cache import Cache
from mriprep.cache.run_report import (
    LATEST_REPORT,
    REPORT_COLUMNS,
    REPORT_FORMAT,
    REPORT_VERSION,
    STATUSES,
    SubjectResult,
)
from mriprep.core.exit_codes import ExitCode
from mriprep.core.volume import jsonable
from mriprep.pipelines import Pipeline


@dataclass
class RunResult:
    """The outcome of :func:`run_cohort`: one result per subject, in manifest order."""

    results: list[SubjectResult]
    pipeline: Pipeline
    cache_root: Path
    scheduler: str
    workers: int
    seconds: float
    report_paths: dict[str, Path] = field(default_factory=dict)
    # Writing the HTML QC report after the subjects (not counted in ``seconds``).
    report_seconds: float = 0.0
    report_error: str = ""
    # What the run did to the index before starting (a repair, a pipeline replaced).
    index_note: str = ""

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def failed(self) -> list[SubjectResult]:
        return [r for r in self.results if r.failed]

    @property
    def exit_code(self) -> int:
        """0 when every subject is cached or skipped, 1 when some failed."""
        return ExitCode.PROBLEMS if self.failed else ExitCode.OK

    def counts(self) -> dict[str, int]:
        return {status: self.count(status) for status in STATUSES} | {
            "total": len(self.results)
        }


def write_reports(
    cache: Cache, run: RunResult, started: datetime, manifest: Any = None
) -> dict[str, Path]:
    """Write ``reports/latest.{json,csv}`` and a timestamped copy of each."""
    rows = [result.to_json() for result in run.results]
    doc = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "mriprep_version": mriprep.__version__,
        "pipeline": {"name": run.pipeline.name, "hash": run.pipeline.hash,
                     "source": run.pipeline.source},
        "manifest": str(manifest) if manifest is not None else None,
        "cache": str(cache.root),
        "scheduler": run.scheduler,
        "workers": run.workers,
        "started": started.isoformat(timespec="seconds"),
        "seconds": run.seconds,
        "counts": run.counts(),
        "subjects": rows,
    }
    json_text = json.dumps(jsonable(doc), indent=1)
    csv_text = report_csv(rows)
    stamp = f"{started.strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}"
    return {
        "json": cache.write_report(LATEST_REPORT, json_text),
        "csv": cache.write_report(Path(LATEST_REPORT).with_suffix(".csv").name, csv_text),
        "json_copy": cache.write_report(f"run-{stamp}.json", json_text),
        "csv_copy": cache.write_report(f"run-{stamp}.csv", csv_text),
    }


def report_csv(rows: list[dict[str, Any]]) -> str:
    """Rows as CSV: fixed columns, then one ``stage.metric`` column per metric seen."""
    flat_rows = []
    metric_columns: dict[str, None] = {}  # ordered as first seen, found in O(1)
    for row in rows:
        flat = {k: row.get(k) for k in REPORT_COLUMNS}
        for stage_name, metrics in (row.get("metrics") or {}).items():
            for metric, value in metrics.items():
                column = f"{stage_name}.{metric}"
                metric_columns.setdefault(column)
                flat[column] = value if not isinstance(value, (list, dict)) else json.dumps(value)
        flat["warnings"] = "; ".join(row.get("warnings") or [])
        flat_rows.append(flat)
    out = io.StringIO()
    writer = csv.DictWriter(
        out, fieldnames=list(REPORT_COLUMNS) + ["warnings"] + list(metric_columns),
        extrasaction="ignore", lineterminator="\n",
    )
    writer.writeheader()
    writer.writerows(flat_rows)
    return out.getvalue()


def summary_text(run: RunResult) -> str:
    """The closing lines of a run: counts, skips said out loud, and every failure."""
    counts = run.counts()
    lines = [
        f"mriprep run: {counts['total']} subjects in {run.seconds:.1f} s with pipeline "
        f"{run.pipeline.name} ({run.pipeline.hash[:12]}): {counts['cached']} cached, "
        f"{counts['skipped']} skipped, {counts['failed']} failed"
    ]
    if counts["skipped"]:
        everything = " (all of them)" if counts["skipped"] == counts["total"] else ""
        lines.append(
            f"{counts['skipped']} subjects{everything} already had a verified cache entry "
            "for these inputs and this pipeline: skipped (use --force to recompute)"
        )
    if run.failed:
        lines.append(f"{len(run.failed)} subject(s) failed and were not cached:")
        lines += [f"  {r.name} at {r.stage}: {r.reason}" for r in run.failed]
    if run.report_paths:
        lines.append(f"report: {run.report_paths['json']} (and .csv)")
    if "qc" in run.report_paths:
        lines.append(f"QC report: {run.report_paths['qc']} (open it in a browser)")
    if run.report_error:
        lines.append(run.report_error)
    return "\n".join(lines)


def summary_json(run: RunResult) -> dict[str, Any]:
    """The ``--json`` summary: counts, report paths, failures, per-subject status."""
    return jsonable({
        "pipeline": {"name": run.pipeline.name, "hash": run.pipeline.hash},
        "cache": str(run.cache_root),
        "scheduler": run.scheduler,
        "workers": run.workers,
        "seconds": run.seconds,
        "counts": run.counts(),
        "exit_code": run.exit_code,
        "reports": {k: str(v) for k, v in run.report_paths.items()},
        "qc_report_error": run.report_error or None,
        "index_note": run.index_note or None,
        "failed": [{k: getattr(r, k) for k in ("subject_id", "session_id", "stage", "reason")}
                   for r in run.failed],
        "subjects": [{k: getattr(r, k) for k in REPORT_COLUMNS} for r in run.results],
    })
