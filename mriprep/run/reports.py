"""The record of a run: per-subject report files and the closing summary.

After a run, ``CACHE/reports/latest.json`` and ``latest.csv`` (and a timestamped copy of
each) list every subject of the manifest with ``status`` ("cached": computed and written
now; "skipped": a verified entry already existed; "failed"), the failing ``stage`` and
``reason``, the entry ``key``, the ``seconds`` taken and every stage's metrics.
"""

from __future__ import annotations

import csv
import io
import json
import os
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mriprep
from mriprep.cache import Cache
from mriprep.core.volume import jsonable

if TYPE_CHECKING:
    from mriprep.run.cohort import RunResult

STATUSES = ("cached", "skipped", "failed")
REPORT_FORMAT = "mriprep-run-report"
REPORT_VERSION = 1
REPORT_COLUMNS = (
    "subject_id", "session_id", "split", "status", "stage", "reason", "key", "seconds",
)


def report_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-subject report rows (results without the index summaries)."""
    keep = REPORT_COLUMNS + ("metrics", "warnings", "peak_rss_mb", "worker")
    rows = []
    for result in results:
        row = {k: result.get(k) for k in keep}
        if result.get("traceback"):  # an unexpected error: where it came from
            row["traceback"] = result["traceback"]
        rows.append(row)
    return rows


def write_reports(
    cache: Cache, run: RunResult, started: datetime, manifest: Any = None
) -> dict[str, Path]:
    """Write ``reports/latest.{json,csv}`` and a timestamped copy of each."""
    rows = report_rows(run.results)
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
        "json": cache.write_report("latest.json", json_text),
        "csv": cache.write_report("latest.csv", csv_text),
        "json_copy": cache.write_report(f"run-{stamp}.json", json_text),
        "csv_copy": cache.write_report(f"run-{stamp}.csv", csv_text),
    }


def report_csv(rows: list[dict[str, Any]]) -> str:
    """Rows as CSV: fixed columns, then one ``stage.metric`` column per metric seen."""
    flat_rows = []
    metric_columns: list[str] = []
    for row in rows:
        flat = {k: row.get(k) for k in REPORT_COLUMNS}
        for stage_name, metrics in (row.get("metrics") or {}).items():
            for metric, value in metrics.items():
                column = f"{stage_name}.{metric}"
                if column not in metric_columns:
                    metric_columns.append(column)
                flat[column] = value if not isinstance(value, (list, dict)) else json.dumps(value)
        flat["warnings"] = "; ".join(row.get("warnings") or [])
        flat_rows.append(flat)
    out = io.StringIO()
    writer = csv.DictWriter(
        out, fieldnames=list(REPORT_COLUMNS) + ["warnings"] + metric_columns,
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
        lines += [f"  {subject_name(r)} at {r['stage']}: {r['reason']}" for r in run.failed]
    if run.report_paths:
        lines.append(f"report: {run.report_paths['json']} (and .csv)")
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
        "failed": [{k: r[k] for k in ("subject_id", "session_id", "stage", "reason")}
                   for r in run.failed],
        "subjects": [{k: r.get(k) for k in REPORT_COLUMNS} for r in run.results],
    })



def subject_name(result: dict[str, Any]) -> str:
    """A subject as people read it: its id, and its session when it has one."""
    sid, ses = result["subject_id"], result.get("session_id")
    return f"{sid} (session {ses})" if ses else sid
