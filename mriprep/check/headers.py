"""Header conflicts: entries whose input's qform and sform disagree by more than
:data:`~mriprep.inputs.headers.FORM_CONFLICT_LIMIT_MM`, as warnings of ``mriprep check``.

The distance is the one the load step recorded in the entry's provenance
(``form_conflict_mm``: how far apart the two forms place the field of view). When nobody
chose a form (``header: auto``, FastSurfer's rule took the qform), the subject's geometry
is uncertain: a ``header-conflict`` warning names the subject, the distance and the fix.
A form chosen by the pipeline's ``header:`` or the manifest's ``header`` column is a
decision, not a doubt, and is not reported.
"""

from __future__ import annotations

from typing import Any, Mapping

from mriprep.cache import IndexEntry
from mriprep.core.findings import Finding
from mriprep.inputs.headers import FORM_CONFLICT_LIMIT_MM, header_conflict


def check_headers(index: Mapping[str, IndexEntry], metas: Mapping[str, Any]) -> list[Finding]:
    """One ``header-conflict`` warning per entry whose load record's qform/sform distance
    is above the limit with the form chosen by the default rule.

    ``metas`` maps a key to its ``meta.json`` as the tensor pass read it (None when it
    could not: that is an error of its own)."""
    findings = []
    for key in sorted(index):
        load = _load_metrics(metas.get(key))
        distance = header_conflict(load)
        if distance is None:
            continue
        entry = index[key]
        source = load.get("affine_source", "qform")
        other = "sform" if source == "qform" else "qform"
        findings.append(Finding(
            "header-conflict",
            f"{entry.finding_name}: the qform and sform of {load.get('file', 'its input')} "
            f"place the field of view up to {distance:.1f} mm apart (limit "
            f"{FORM_CONFLICT_LIMIT_MM:g} mm); the {source} was used (FastSurfer's rule), so "
            f"the subject's geometry is uncertain. If the {other} is the intended geometry "
            f"(SPM-coregistered files: the sform), set `header: {other}` in the pipeline or "
            f"the manifest's `header` column for this scan; if the {source} is, set `header: "
            f"{source}` (or copy it over the {other} in the file) and rerun",
            keys=(key,), subjects=(entry.subject_id,)))
    return findings


def _load_metrics(meta: Any) -> Mapping[str, Any] | None:
    if not isinstance(meta, Mapping):
        return None
    for record in meta.get("provenance") or []:
        if isinstance(record, Mapping) and record.get("stage") == "load":
            metrics = record.get("metrics")
            return metrics if isinstance(metrics, Mapping) else None
    return None
