"""The check report as text for people: what ``mriprep check`` prints without ``--json``.

:func:`render_report` gives a header (entries, splits, pipeline hashes, the training
dtype the images' cast was checked for, read speed, the near-duplicate search), a table
of the splits, the findings grouped by severity and code (errors first, at most
:data:`MAX_FINDINGS_PER_CODE` of each code, the rest counted; then warnings, then infos),
a summary of the findings by code (severity and count), and the verdict. The
report's full form for machines is :meth:`~mriprep.check.report.CheckReport.to_json`.
"""

from __future__ import annotations

from collections import defaultdict

from mriprep.check.report import CheckReport
from mriprep.core.findings import Severity
from mriprep.core.limits import CAST_LIMITS

MAX_FINDINGS_PER_CODE = 20
_SEVERITY_ORDER = (Severity.ERROR, Severity.WARNING, Severity.INFO)


def render_report(report: CheckReport, command: str = "mriprep check") -> str:
    """The report as a table for people: header, per-split counts, findings, verdict."""
    lines = [f"{command} {report.cache}: {report.entries} entries, {len(report.splits)} split(s)"]
    if report.pipeline_hashes:
        hashes = ", ".join(f"{h[:12]} ({n})" for h, n in sorted(report.pipeline_hashes.items()))
        lines.append(f"  pipeline hash(es): {hashes}")
    if command == "mriprep check":
        lines.append(f"  cast check: {_cast_line(report.dtype)}")
    if report.bytes_read:
        lines.append(
            f"  read {report.bytes_read / 1e6:.1f} MB in {report.read_seconds:.2f} s "
            f"({report.read_mb_per_s:.0f} MB/s)"
        )
    search = report.near_duplicate_search
    if search.get("method") and search["method"] != "skipped":
        lines.append(
            f"  identity search: {search['method']} over {search.get('entries')} "
            f"fingerprints, {search.get('pairs_compared')} pairs compared, centred on the "
            f"{search.get('centre', 'cohort')}"
        )
    lines += [f"  identity: {note}" for note in search.get("notes", ())]
    if report.label_table is not None:
        lines.append(f"  label table: {_table_line(report.label_table)}")
    if report.splits:
        lines += ["", _split_table(report)]
    by_code: dict[str, list] = defaultdict(list)
    for finding in report.findings:
        by_code[(finding.severity, finding.code)].append(finding)
    if by_code:
        lines.append("")
    for (severity, code), findings in _ordered(by_code):
        for finding in findings[:MAX_FINDINGS_PER_CODE]:
            lines.append(f"{severity.upper():<8}{code:<24}{finding.message}")
        if len(findings) > MAX_FINDINGS_PER_CODE:
            lines.append(
                f"{'':<32}... and {len(findings) - MAX_FINDINGS_PER_CODE} more {code} "
                "finding(s); see --json"
            )
    if by_code:
        lines += ["", "findings by code:"]
        lines += [f"  {severity.upper():<8}{code:<24}{len(findings):>5}"
                  for (severity, code), findings in _ordered(by_code)]
    n_err, n_warn, n_info = len(report.errors), len(report.warnings), len(report.infos)
    verdict = "FAILED" if n_err else "OK"
    infos = f", {n_info} info" if n_info else ""
    lines += ["", f"{verdict}: {n_err} error(s), {n_warn} warning(s){infos}"]
    return "\n".join(lines)


def _ordered(by_code: dict) -> list:
    """(severity, code) -> findings, errors first, then warnings, then infos, each by
    code."""
    return sorted(by_code.items(),
                  key=lambda kv: (_SEVERITY_ORDER.index(kv[0][0]), kv[0][1]))


def _table_line(table: dict) -> str:
    classes = table["classes"]
    rules = ("no rules" if table["processing"] == "none"
             else f"{table['processing']} rules, cortex {table['cortex']}")
    return (f"{table['source']} ({rules}; {classes['axial']} classes, "
            f"{classes['sagittal']} sagittal; unknown values: {table['unknown']}, absent "
            f"classes: {table['absent_classes']}): {table['label_maps']} label map(s) "
            f"judged in {table['seconds']:.1f} s"
            + (f"; {table['without_label_map']} entries without a label map not judged"
               if table["without_label_map"] else "")
            + _volumes_line(table.get("volumes")))


def _volumes_line(volumes: dict | None) -> str:
    """Whether the structure volumes were judged (they need a cohort of maps)."""
    if not volumes or volumes["judged"]:
        return ""
    return (f"; structure volumes and missing structures not judged: {volumes['maps']} "
            f"label map(s), at least {volumes['min_maps']} needed")


def _cast_line(dtype: str) -> str:
    cast = CAST_LIMITS.get(dtype)
    if cast is None:
        return dtype
    if not cast.checked:
        return f"{cast.name} (none: images train as cached)"
    return (
        f"{cast.name} (overflow beyond |x| > {cast.max:.5g}, underflow below "
        f"{cast.tiny:.4g}, exact integers up to {cast.exact_int})"
    )


def _split_table(report: CheckReport) -> str:
    header = f"{'split':<10}{'entries':>8}{'subjects':>10}{'invalid':>10}  label shares"
    rows = [header]
    for name, s in sorted(report.splits.items()):
        shares = "  ".join(f"{v}:{share:.1%}" for v, share in list(s.label_shares.items())[:10])
        if len(s.label_shares) > 10:
            shares += f"  (+{len(s.label_shares) - 10} labels)"
        if not shares:
            shares = "(no labels)"
        rows.append(
            f"{name:<10}{s.entries:>8}{s.subjects:>10}{s.invalid_fraction:>10.2%}  {shares}"
        )
    return "\n".join(rows)
