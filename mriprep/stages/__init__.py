"""Pure preprocessing stages: ``Volume -> Volume`` plus a provenance record.

Each stage lives in its own module and registers itself with :func:`stage`, giving a
name (used in pipeline YAML files), a frozen dataclass of parameters (its fields, types
and defaults are the schema the pipeline loader validates against) and a function
``(Volume, Params) -> StageOutput``. The :class:`Stage` wrapper does the plumbing once for
all of them: timing, strict float error settings, and the provenance record.

Stage functions read and write no files of a subject: ``mriprep.inputs`` reads them and
``mriprep.run`` writes the cache entry (the exceptions: the read-only, per-process cached
template of ``mriprep.inputs.templates``, and register's ``transform.tfm`` text, which
SimpleITK can only write through a temporary file).

Parameter fields may only use these types, so that YAML can express them and the loader
can check them: ``bool``, ``int``, ``float``, ``str``, ``typing.Literal[...]`` of strings,
``tuple[float, float, float]`` / ``tuple[int, int, int]``, and ``X | None`` of those. A
field added to a stage that caches already used carries the metadata
:data:`HASHED_ONLY_WHEN_SET` when its default computes what the stage computed before:
the pipeline hash then covers it only when a pipeline sets it, and existing caches stay
valid.

What the pipeline loader, the runner and the QC report need from a stage, the stage
declares when it registers (see :class:`Stage`): the pipeline-level fields it inherits
(``output_dtype``), the parameters that hold a template, whether it hands a transform to
a later stage or applies one, whether it must come last, its own check of what comes
before it, what it adds to a cache entry (sidecar fields, extra files), and what the QC
report shows of it (:class:`~mriprep.stages.qc_declaration.StageQC`: its measures, the
causes of the invalid voxels it marks, named readings of its metrics). The loader, the
runner, the QC report and the demo read these declarations and never name a stage.

So a new stage needs its module and, when it ships in this package, one line in
:data:`STAGE_MODULES` (the name -> module map that lets a pipeline file name a stage
before anything imported it: stages are imported on first use); nothing else is edited.
A stage defined outside this package (a plugin, a test) registers when its module is
imported and needs not even that line: ``tests/stages/test_new_stage.py`` defines one
and follows it through a pipeline, the run report and the QC report.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from mriprep.core.volume import StageRecord, Volume
from mriprep.stages.qc_declaration import StageQC

# Stage name -> module that defines it. Modules are imported on first use so that a
# process which only reads the cache never imports ANTs or SimpleITK.
STAGE_MODULES: dict[str, str] = {
    "reorient": "mriprep.stages.reorient",
    "sanitize": "mriprep.stages.sanitize",
    "plausibility": "mriprep.stages.plausibility",
    "mask_slices": "mriprep.stages.mask_slices",
    "register": "mriprep.stages.register",
    "resample": "mriprep.stages.resample",
    "normalize": "mriprep.stages.normalize",
    "validate": "mriprep.stages.validate",
}

# Parameter field metadata: the pipeline hash covers the field only when it differs from
# its default (module doc).
HASHED_ONLY_WHEN_SET = "hashed_only_when_set"

_REGISTRY: dict[str, "Stage"] = {}


@dataclass
class StageOutput:
    """What a stage function returns: the new volume, its metrics and any warnings."""

    volume: Volume
    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


# A stage's check of its place in a pipeline: (its params, whether an earlier step handed
# over a transform not yet applied) -> problems, each a sentence with the fix.
OrderCheck = Callable[[Any, bool], "list[str]"]
# What a stage adds to a cache entry, from its params and the final volume.
EntryMeta = Callable[[Any, Volume], "dict[str, Any]"]
EntryFiles = Callable[[Any, Volume], "dict[str, str]"]


@dataclass(frozen=True)
class Stage:
    """A registered stage: its function, its parameter schema and its declarations.

    Attributes
    ----------
    inherits
        Pipeline-level fields (``output_dtype``) copied into the stage's parameters of
        the same name; a different value in the stage's own parameters is an error.
    template_fields
        Parameters that name a template (a builtin name or an image path): resolved
        against the pipeline file's folder and hashed by content.
    hands_over_transform
        The stage leaves ``Volume.pending`` set: a later step must apply it.
    applies_transform
        The stage applies (and clears) ``Volume.pending``.
    last
        Why the stage must be the last step (None: it may go anywhere).
    order_check
        The stage's own check of its place in a pipeline (see :data:`OrderCheck`).
    entry_meta, entry_files
        Sidecar fields and extra files (name -> text) the stage adds to a cache entry.
    qc
        What the QC report shows of the stage (see :mod:`mriprep.stages.qc_declaration`).
    """

    name: str
    params_type: type
    func: Callable[[Volume, Any], StageOutput]
    inherits: tuple[str, ...] = ()
    template_fields: tuple[str, ...] = ()
    hands_over_transform: bool = False
    applies_transform: bool = False
    last: str | None = None
    order_check: OrderCheck | None = None
    entry_meta: EntryMeta | None = None
    entry_files: EntryFiles | None = None
    qc: StageQC | None = None

    def __call__(self, volume: Volume, params: Any = None, **overrides) -> Volume:
        """Run the stage on ``volume``; ``params`` or keyword overrides of the defaults."""
        if params is None:
            params = self.params_type(**overrides)
        elif overrides:
            params = dataclasses.replace(params, **overrides)
        start = time.perf_counter()
        # Overflow, invalid operations and divisions by zero are bugs or bad data that
        # must surface, never silently produce Inf/NaN. Underflow to 0 is harmless.
        with np.errstate(all="raise", under="ignore"):
            out = self.func(volume, params)
        seconds = time.perf_counter() - start
        record = StageRecord(
            stage=self.name,
            params=dataclasses.asdict(params),
            metrics=dict(out.metrics),
            warnings=tuple(out.warnings),
            seconds=seconds,
        )
        return out.volume.with_record(record)


def stage(name: str, params_type: type, **declarations):
    """Register a stage function under ``name`` with its parameter dataclass and its
    declarations (the keyword fields of :class:`Stage`)."""
    if not dataclasses.is_dataclass(params_type):
        raise TypeError(f"stage {name!r}: params_type must be a dataclass")
    fields = {f.name for f in dataclasses.fields(params_type)}
    for field_name in declarations.get("inherits", ()) + declarations.get("template_fields", ()):
        if field_name not in fields:
            raise TypeError(f"stage {name!r} declares {field_name!r}, not a parameter field")

    def decorate(func):
        wrapped = Stage(name=name, params_type=params_type, func=func, **declarations)
        _REGISTRY[name] = wrapped
        return wrapped

    return decorate


def all_stages() -> list[Stage]:
    """Every stage: those of :data:`STAGE_MODULES`, their modules imported, then any other
    registered one (a plugin's, a test's), in the order they registered (for messages that
    name the stages able to fix a pipeline, and the QC's legend of causes; a normal run
    imports only the stages it uses)."""
    shipped = [get_stage(name) for name in STAGE_MODULES]
    return shipped + [s for name, s in _REGISTRY.items() if name not in STAGE_MODULES]


def get_stage(name: str) -> Stage:
    """The registered stage called ``name`` (importing its module on first use)."""
    if name not in _REGISTRY:
        module = STAGE_MODULES.get(name)
        if module is None:
            known = ", ".join(sorted(STAGE_MODULES))
            raise KeyError(f"unknown stage {name!r}; known stages: {known}")
        importlib.import_module(module)
        if name not in _REGISTRY:
            raise ImportError(
                f"{module} registers no stage called {name!r}: its @stage(...) name and "
                "its STAGE_MODULES key must be the same"
            )
    return _REGISTRY[name]


def declared_stage(name: str):
    """The registered stage a record's name stands for (``sanitize_2``: the second
    sanitize step of a pipeline), or None for a name that is no stage."""
    base, _, number = name.rpartition("_")
    for candidate in (name, base if number.isdigit() else None):
        if candidate:
            try:
                return get_stage(candidate)
            except KeyError:  # no such stage; a stage that fails to import must say so
                continue
    return None


def declared_reading(stage_metrics: Mapping[str, Any], role: str) -> tuple[str, Any] | None:
    """``(stage, value)`` of the first stage of a subject's metrics (stage name ->
    its metrics, as the run report holds them) that declares a reading for ``role``;
    None when none does. Names that are no stage (``load``, ``cache``) are passed by."""
    for name, metrics in stage_metrics.items():
        declared = declared_stage(name)
        if declared is None or declared.qc is None or not isinstance(metrics, Mapping):
            continue
        reading = declared.qc.readings.get(role)
        if reading is not None:
            return name, reading(metrics)
    return None
