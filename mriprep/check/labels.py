"""Label values of the cached label maps against the allowed set.

Allowed label values come from, in order: the ``allowed_labels`` argument (``--labels``),
or the ``label_values`` list recorded in the entry's index entry or sidecar (a stage
declares it: validate's ``allowed_labels``). An entry with a label map and neither gets a
``labels-unchecked`` warning listing the values found.
"""

from __future__ import annotations

from typing import Any, Iterable

from mriprep.cache import IndexEntry
from mriprep.check.entries import EntryScan
from mriprep.check.report import by_name, subjects_of
from mriprep.core.findings import Finding


def recorded_label_set(entry: IndexEntry, meta: dict[str, Any] | None) -> set[int] | None:
    """The allowed label values an entry records, if any (see the module docstring)."""
    if entry.label_values is not None:
        return {int(v) for v in entry.label_values}
    values = (meta or {}).get("label_values")
    return {int(v) for v in values} if isinstance(values, list) else None


def check_labels(
    index: dict[str, IndexEntry],
    scans: dict[str, EntryScan],
    allowed_labels: Iterable[int] | None = None,
) -> list[Finding]:
    """A ``label-values`` error per entry whose label map holds a value outside its allowed
    set, and one ``labels-unchecked`` warning for the entries that have no allowed set.

    Parameters
    ----------
    index : dict
        Cache key -> :class:`~mriprep.cache.IndexEntry`.
    scans : dict
        Cache key -> :class:`~mriprep.check.entries.EntryScan` (label counts, sidecar).
    allowed_labels : iterable of int, optional
        Overrides the set recorded with each entry.
    """
    allowed = {int(v) for v in allowed_labels} if allowed_labels is not None else None
    findings = []
    unchecked: list[str] = []
    unchecked_values: set = set()
    for key in by_name(index, scans):
        scan = scans[key]
        if scan.label_counts is None:
            continue
        entry_allowed = (
            allowed if allowed is not None else recorded_label_set(index[key], scan.meta)
        )
        if entry_allowed is None:
            unchecked.append(key)
            unchecked_values |= set(scan.label_counts)
            continue
        bad = {v: c for v, c in scan.label_counts.items() if v not in entry_allowed}
        if bad:
            shown = ", ".join(f"{v} ({c} voxels)" for v, c in sorted(bad.items())[:10])
            findings.append(
                Finding(
                    "label-values",
                    f"{index[key].finding_name}: {index[key].files['label'].file} holds "
                    "value(s) outside the "
                    f"allowed set {_compact(entry_allowed)}: {shown}; fix the label map or "
                    "the pipeline's label list",
                    (key,),
                    (index[key].subject_id,),
                )
            )
    if unchecked:
        findings.append(
            Finding(
                "labels-unchecked",
                f"{len(unchecked)} entr{'y has' if len(unchecked) == 1 else 'ies have'} label "
                f"maps but no recorded set of allowed values (found {_compact(unchecked_values)}); "
                "pass --labels to check them",
                tuple(unchecked),
                subjects_of(index, unchecked),
            )
        )
    return findings


def _compact(values: Iterable) -> str:
    """A set of values for a message, cut after 20."""
    values = sorted(values)
    return (
        "{" + ", ".join(str(v) for v in values[:20]) + (", ..." if len(values) > 20 else "") + "}"
    )

