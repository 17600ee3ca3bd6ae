"""Quality outliers: the QC report's robust-z flags, as warnings of ``mriprep check``.

The metrics are those each subject's worker recorded in ``CACHE/qc/<key>/qc.json``
(:mod:`mriprep.qc`); the flags are computed over the indexed entries exactly as the
report computes them (:func:`mriprep.qc.outliers.cohort_flags`), so the two agree. An
outlier is a warning: a scan unlike its cohort deserves a look, not a refusal.
"""

from __future__ import annotations

from typing import Mapping

from mriprep.cache import IndexEntry
from mriprep.core.findings import Finding
from mriprep.qc.measures import declared_metrics, with_stage_declarations
from mriprep.qc.outliers import cohort_flags
from mriprep.qc.store import read_qc


def check_quality(cache_root, index: Mapping[str, IndexEntry]) -> list[Finding]:
    """``qc-outlier`` per flagged metric of an entry; ``qc-missing`` once when some
    entries have QC metrics and others have none (those cannot be judged). A cache
    made wholly without QC (``--no-report``) gets neither: it asked for none."""
    keys = sorted(index)
    findings = []
    docs = {k: read_qc(cache_root, k) for k in keys}
    missing = [k for k, doc in docs.items() if doc is None]
    recorded = {k: doc.get("metrics", {}) for k, doc in docs.items()
                if doc is not None and doc.get("status") == "cached"}
    declared = declared_metrics(doc for k, doc in docs.items() if k in recorded)
    # qc.json made before metrics (or their minimum effects) were declared in it: the
    # stages' declarations fill the gap (imported only then), so the check and the report
    # judge alike.
    declared = with_stage_declarations(
        declared, {name for metrics in recorded.values() for name in metrics})
    for outlier in cohort_flags(recorded, declared):
        entry = index[outlier.name]
        findings.append(Finding(
            "qc-outlier",
            f"{entry.finding_name}: {outlier.describe()}; look at it in the QC report "
            f"(`mriprep report {cache_root}`)",
            keys=(entry.key,), subjects=(entry.subject_id,)))
    if missing and len(missing) < len(keys):
        findings.append(Finding(
            "qc-missing",
            f"{len(missing)} of {len(keys)} entries have no QC metrics (cached with "
            f"--no-report, or QC removed), so the quality outliers are judged without "
            f"them; `mriprep report {cache_root}` makes them",
            keys=tuple(missing), subjects=tuple(index[k].subject_id for k in missing)))
    return findings
