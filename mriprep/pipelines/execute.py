"""Running a pipeline's steps on a volume, and what the runs record of them.

:func:`run_stages` is the one way a pipeline is applied: by the runner's worker
(:mod:`mriprep.run.subject`), by the QC when it replays the cheap steps of a cached
entry (:mod:`mriprep.qc.subject`), by the demo and the benchmarks. It lives beside
:class:`~mriprep.pipelines.loader.Pipeline` so that each of them imports it from here
and none imports another's package for it.

:func:`stage_metrics` and :func:`stage_warnings` turn the stage records a run leaves
(``Volume.provenance``, or their JSON form in an entry's sidecar) into the per-stage
metrics and the warnings the run report and the QC report show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from mriprep.core.errors import StageError
from mriprep.core.volume import Volume, jsonable
from mriprep.pipelines.loader import Pipeline
from mriprep.stages import all_stages, get_stage

# Called after each step with the step's name, the volume before it and after it.
Observer = Callable[[str, Volume, Volume], None]


@dataclass
class Position:
    """Where a run of stages is: the step running now and the last volume made, so that
    an unexpected error still names its stage and a failed subject keeps what ran."""

    stage: str = ""
    volume: Volume | None = None


def run_stages(volume: Volume, pipeline: Pipeline, position: Position | None = None,
               observe: Observer | None = None) -> Volume:
    """Run every step of ``pipeline`` on ``volume`` and return the final volume.

    ``position`` is kept up to date step by step; ``observe(step_name, before, after)``
    is called after each step (the QC's capture of what each step invalidated).

    Raises
    ------
    StageError
        From the failing stage, or when a transform handed over was never applied
        (a pipeline the loader accepted cannot end so; a hand-made one can).
    """
    position = position if position is not None else Position()
    handed_over_by = ""
    for step in pipeline.steps:
        position.stage = step.name
        had_pending = volume.pending is not None
        before = volume
        volume = get_stage(step.name)(volume, step.params)
        position.volume = volume
        if observe is not None:
            observe(step.name, before, volume)
        if volume.pending is not None and not had_pending:
            handed_over_by = step.name
    if volume.pending is not None:
        # Only a pipeline built by hand gets here: the loader refuses such an order.
        appliers = " or ".join(repr(s.name) for s in all_stages() if s.applies_transform)
        raise StageError(
            handed_over_by,
            "the pipeline ended with a registration transform that was never applied; "
            f"add a step that applies it ({appliers}) after {handed_over_by!r}",
        )
    return volume


def stage_metrics(records: Iterable) -> dict[str, dict[str, Any]]:
    """Stage name -> its metrics and seconds, from StageRecords."""
    return stage_metrics_json(record.to_json() for record in records)


def stage_metrics_json(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Stage name -> its metrics and seconds, from StageRecords as JSON."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        name = record["stage"]
        while name in out:  # a stage used twice keeps both: sanitize, sanitize_2, ...
            name = _next_name(name)
        out[name] = dict(jsonable(record.get("metrics", {})), seconds=record.get("seconds"))
    return out


def stage_warnings(records: Iterable) -> list[str]:
    """Each stage's warnings, prefixed with its name, from StageRecords."""
    return [f"{r.stage}: {w}" for r in records for w in r.warnings]


def stage_warnings_json(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """:func:`stage_warnings` of StageRecords as JSON."""
    return [f"{r['stage']}: {w}" for r in records for w in r.get("warnings", [])]


def _next_name(name: str) -> str:
    base, _, number = name.rpartition("_")
    if base and number.isdigit():
        return f"{base}_{int(number) + 1}"
    return f"{name}_2"
