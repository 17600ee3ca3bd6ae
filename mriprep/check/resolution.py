"""Falsely fine inputs: entries whose input's header claims at least
:data:`~mriprep.stages.acquired_resolution.CLAIMED_FINER_RATIO` times finer voxels than
its data hold along an axis, as warnings of ``mriprep check``.

The measure is the one the plausibility step recorded in the entry's provenance
(``falsely_fine_axes``, ``acquired_resolution_mm`` and ``voxel_size_mm``, see
:mod:`mriprep.stages.acquired_resolution`); the record is found by those measures, not
by the step's name. A scan interpolated onto a finer grid than it was acquired on
trains a network on voxels nobody measured: a ``resolution-falsely-fine`` warning names
the subject, each such axis with its claimed and measured size, and the fix. An entry
made before the measure existed says nothing.
"""

from __future__ import annotations

from typing import Any, Mapping

from mriprep.cache import IndexEntry
from mriprep.core.findings import Finding
from mriprep.stages.acquired_resolution import CLAIMED_FINER_RATIO

_MEASURES = ("falsely_fine_axes", "acquired_resolution_mm", "voxel_size_mm")


def check_resolution(index: Mapping[str, IndexEntry],
                     metas: Mapping[str, Any]) -> list[Finding]:
    """One ``resolution-falsely-fine`` warning per entry whose recorded acquired
    resolution names a falsely fine axis.

    ``metas`` maps a key to its ``meta.json`` as the tensor pass read it (None when it
    could not: that is an error of its own)."""
    findings = []
    for key in sorted(index):
        measures = _resolution_metrics(metas.get(key))
        if measures is None or not measures["falsely_fine_axes"]:
            continue
        claimed, acquired = measures["voxel_size_mm"], measures["acquired_resolution_mm"]
        axes = "; ".join(f"voxel axis {a}: {claimed[a]:g} mm claimed, about "
                         f"{acquired[a]:.2g} mm carried" for a in measures["falsely_fine_axes"])
        entry = index[key]
        findings.append(Finding(
            "resolution-falsely-fine",
            f"{entry.finding_name}: its input's header claims at least "
            f"{CLAIMED_FINER_RATIO:g}x finer voxels than the data hold ({axes}): the scan "
            "was interpolated onto a finer grid than it was acquired on. Conform it to its "
            "true resolution, or re-export it at its acquired resolution, and rerun; or "
            "keep it knowingly",
            keys=(key,), subjects=(entry.subject_id,)))
    return findings


def _resolution_metrics(meta: Any) -> Mapping[str, Any] | None:
    """The first provenance record's metrics that hold the acquired-resolution
    measures, checked for shape; None when there is none."""
    if not isinstance(meta, Mapping):
        return None
    for record in meta.get("provenance") or []:
        metrics = record.get("metrics") if isinstance(record, Mapping) else None
        if not isinstance(metrics, Mapping) or not all(m in metrics for m in _MEASURES):
            continue
        axes, claimed, acquired = (metrics[m] for m in _MEASURES)
        if (isinstance(axes, list) and isinstance(claimed, list) and len(claimed) == 3
                and isinstance(acquired, list) and len(acquired) == 3
                and all(isinstance(a, int) and 0 <= a < 3 for a in axes)):
            return metrics
    return None
