"""Pipelines as data: load a YAML definition, validate it against the stages, hash it.

A pipeline file names the ordered stages and their parameters::

    name: t1w_mni_rigid
    description: Rigid registration to MNI152 1 mm, z-scored, float32.
    output_dtype: float32          # float32 | float16 | uint8: dtype of the cached image
    compression: lz4               # none | lz4 | zstd, or per tensor: {valid: lz4, ...}
    header: auto                   # auto | qform | sform: which NIfTI form gives the geometry
    stages:
      - reorient                   # a bare name runs the stage with its defaults
      - sanitize:                  # a one-key mapping gives parameters
          strategy: local

Every parameter is checked against the stage's frozen parameter dataclass (its typed
fields are the schema) before any subject runs: an unknown stage, an unknown key, a value
of the wrong type or a template file that does not exist is a
:class:`~mriprep.core.errors.PipelineConfigError` that names the file, the key, the value and
the fix. All problems of a file are reported at once.

``header`` chooses between a NIfTI's qform and sform: ``auto`` (the default) is
FastSurfer's rule (:func:`mriprep.inputs.headers.choose_nifti_affine`), ``qform`` or
``sform`` takes that form for every scan (the manifest's ``header`` column overrides it per
scan). It changes what is read, so the hash covers it.

The pipeline hash identifies what a pipeline computes: the SHA-256 of the resolved
configuration (every parameter, defaults filled in), the bytes of every template it uses
(by content, so moving a template file changes nothing) and the mriprep version. The
description is left out: rewording it must not invalidate a cache.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import mriprep
from mriprep.core.errors import PipelineConfigError
from mriprep.inputs.headers import HEADER_CHOICES
from mriprep.pipelines.params import coerce_value
from mriprep.stages import HASHED_ONLY_WHEN_SET, STAGE_MODULES, all_stages, get_stage

OUTPUT_DTYPES = ("float32", "float16", "uint8")
TOP_LEVEL_KEYS = ("name", "description", "output_dtype", "compression", "header", "stages")
# The tensors a pipeline's ``compression`` may name (those an entry stores).
COMPRESSED_TENSORS = ("image", "valid", "label")
DEFAULT_PIPELINE = "t1w_mni_rigid"


def pipelines_dir() -> Path:
    """The folder of named pipelines shipped with mriprep: package data
    (``mriprep/pipelines/``), so that a wheel or ``pip install .`` finds them too; the
    repository's top-level ``pipelines/`` is a link to it."""
    return Path(__file__).resolve().parent


def available_pipelines() -> list[str]:
    """Names accepted by ``mriprep run -p NAME``."""
    return sorted(p.stem for p in pipelines_dir().glob("*.yaml"))


@dataclass(frozen=True)
class StageStep:
    """One step of a pipeline: a registered stage name and its resolved parameters."""

    name: str
    params: Any

    def resolved(self) -> dict[str, Any]:
        params = dataclasses.asdict(self.params)
        for field in dataclasses.fields(self.params):
            # An option added after caches existed: a pipeline that leaves it at its
            # default computes what it did before, so it keeps its hash and its caches.
            if (field.metadata.get(HASHED_ONLY_WHEN_SET)
                    and params[field.name] == field.default):
                del params[field.name]
        return {"stage": self.name, "params": params}


@dataclass(frozen=True)
class Pipeline:
    """A validated pipeline: ordered stage steps, output dtype, and its content hash.

    Build one with :func:`load_pipeline` (a name or a YAML path) or
    :func:`pipeline_from_dict`; the constructor does no validation.
    """

    name: str
    description: str
    output_dtype: str
    steps: tuple[StageStep, ...]
    source: str
    hash: str
    # How each cached tensor is stored (mriprep.cache.formats): image, valid, label.
    compression: dict[str, str] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(COMPRESSED_TENSORS, "none"), hash=False)
    # Which NIfTI form gives every scan's geometry (HEADER_CHOICES); a manifest row's
    # ``header`` overrides it.
    header: str = "auto"

    def resolved(self) -> dict[str, Any]:
        """The configuration with every default filled in (what the hash covers), but
        the stage options marked ``HASHED_ONLY_WHEN_SET`` that hold their defaults."""
        resolved = {
            "name": self.name,
            "output_dtype": self.output_dtype,
            "stages": [step.resolved() for step in self.steps],
        }
        if any(c != "none" for c in self.compression.values()):
            # Only then: a pipeline without compression keeps the hash it had before
            # the key existed, and the caches made with it stay valid.
            resolved["compression"] = dict(self.compression)
        if self.header != "auto":
            # Likewise: the default keeps the hash of every pipeline made before.
            resolved["header"] = self.header
        return resolved

    def templates(self) -> list[str]:
        """Every template (builtin name or absolute file path) the steps refer to."""
        found = []
        for step in self.steps:
            for name in get_stage(step.name).template_fields:
                value = getattr(step.params, name)
                if value and value not in found:
                    found.append(value)
        return found

    def params_of(self, stage: str) -> Any | None:
        """The parameters of the first step running ``stage``, or None."""
        for step in self.steps:
            if step.name == stage:
                return step.params
        return None


def resolve_pipeline_path(name_or_path: str | Path) -> Path:
    """The YAML file for a pipeline name (from :func:`pipelines_dir`) or a path.

    Raises
    ------
    PipelineConfigError
        When neither a file nor a shipped pipeline of that name exists.
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        return path.resolve()
    looks_like_name = "/" not in text and not text.endswith((".yaml", ".yml"))
    if looks_like_name:
        named = pipelines_dir() / f"{text}.yaml"
        if named.is_file():
            return named
    known = ", ".join(available_pipelines()) or "(none found)"
    raise PipelineConfigError(
        f"pipeline {text!r} is neither a YAML file nor a shipped pipeline; "
        f"give a path to a .yaml file or one of: {known} (in {pipelines_dir()})"
    )


def load_pipeline(name_or_path: str | Path = DEFAULT_PIPELINE,
                  output_dtype: str | None = None,
                  compression: str | dict[str, str] | None = None) -> Pipeline:
    """Load, validate and hash a pipeline given by name or YAML path.

    Parameters
    ----------
    name_or_path
        A shipped pipeline name (``t1w_mni_rigid``, ``conform_1mm``) or a YAML file path.
        Relative template paths inside the file are resolved against the file's folder.
    output_dtype
        Replaces the file's ``output_dtype`` (e.g. ``"uint8"`` for FastSurfer's conformed
        images), as a copy of the file with that one line changed would: the stages that
        inherit it and the hash follow.
    compression
        Replaces the file's ``compression`` the same way (``"none"``: plain ``.npy``).

    Returns
    -------
    Pipeline

    Raises
    ------
    PipelineConfigError
        Listing every problem found in the file, each with the key, value and fix.

    Examples
    --------
    >>> pipe = load_pipeline("conform_1mm")
    >>> pipe.output_dtype, pipe.compression["valid"], len(pipe.hash)
    ('uint8', 'lz4', 64)
    """
    path = resolve_pipeline_path(name_or_path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PipelineConfigError(
            f"pipeline file {path} is not valid YAML: {exc}; fix the syntax at the line shown"
        ) from exc
    except OSError as exc:
        raise PipelineConfigError(f"cannot read pipeline file {path}: {exc}") from exc
    if output_dtype is not None and isinstance(doc, dict):
        doc = {**doc, "output_dtype": output_dtype}
    if compression is not None and isinstance(doc, dict):
        doc = {**doc, "compression": compression}
    return pipeline_from_dict(doc, source=str(path), base_dir=path.parent)


def pipeline_from_dict(
    doc: Any, source: str = "<dict>", base_dir: str | Path | None = None
) -> Pipeline:
    """Validate a parsed pipeline document and build the :class:`Pipeline`.

    Parameters
    ----------
    doc
        The document as ``yaml.safe_load`` returns it.
    source
        How errors name the pipeline (usually its file path).
    base_dir
        Folder that relative template paths are relative to (default: the working folder).
    """
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise PipelineConfigError(
            f"pipeline {source}: the document must be a mapping with keys "
            f"{', '.join(TOP_LEVEL_KEYS)}; got {type(doc).__name__}"
        )
    for key in doc:
        if key not in TOP_LEVEL_KEYS:
            problems.append(
                f"unknown top-level key {key!r}; allowed keys: {', '.join(TOP_LEVEL_KEYS)}"
            )
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"'name' must be a non-empty string, got {name!r}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        problems.append(f"'description' must be a string, got {description!r}")
    output_dtype = doc.get("output_dtype", "float32")
    if output_dtype not in OUTPUT_DTYPES:
        problems.append(
            f"'output_dtype' = {output_dtype!r} is not supported; use one of "
            f"{', '.join(OUTPUT_DTYPES)}"
        )
    compression = _compression(doc.get("compression", "none"), problems)
    header = doc.get("header", "auto")
    if header not in HEADER_CHOICES:
        problems.append(
            f"'header' = {header!r} is not supported; use one of {', '.join(HEADER_CHOICES)} "
            "(auto: FastSurfer's rule, the qform when both are set and differ; sform for "
            "SPM-coregistered files)"
        )
    raw_stages = doc.get("stages")
    steps: list[StageStep] = []
    if not isinstance(raw_stages, list) or not raw_stages:
        problems.append(
            f"'stages' must be a non-empty list of stage names or one-key mappings "
            f"{{stage: {{param: value}}}}, got {raw_stages!r}"
        )
    else:
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        # Pipeline-level settings that stages may inherit (only valid values: an invalid
        # one is already a problem of its own).
        pipeline_fields = {"output_dtype": output_dtype} if output_dtype in OUTPUT_DTYPES else {}
        for position, entry in enumerate(raw_stages, start=1):
            step = _parse_step(entry, position, base, pipeline_fields, problems)
            if step is not None:
                steps.append(step)
        problems.extend(_order_problems(steps))
    if problems:
        raise PipelineConfigError(_format_problems(source, problems))
    pipe = Pipeline(
        name=name,
        description=description.strip(),
        output_dtype=output_dtype,
        steps=tuple(steps),
        source=source,
        hash="",
        compression=compression,
        header=header if header in HEADER_CHOICES else "auto",
    )
    return dataclasses.replace(pipe, hash=pipeline_hash(pipe))


def pipeline_hash(pipe: Pipeline) -> str:
    """SHA-256 of the resolved configuration, the templates' content and the version."""
    from mriprep.core.hashing import hash_json, sha256_file
    from mriprep.inputs.templates import is_builtin, load_template, template_digest

    config = pipe.resolved()
    for step in config["stages"]:
        for key in get_stage(step["stage"]).template_fields:
            value = step["params"][key]
            if value:
                # By content: the same template under another path is the same pipeline.
                try:
                    # A file is hashed by its bytes, read now: template_digest's per-process
                    # cache would miss an edit made since the file was first loaded.
                    if is_builtin(value):
                        digest = template_digest(value)
                    else:
                        load_template(value)  # proves it is a readable image
                        digest = sha256_file(value)
                except (OSError, ValueError) as exc:
                    raise PipelineConfigError(
                        f"pipeline {pipe.source}: stage {step['stage']!r} key {key!r} = "
                        f"{value!r}: the template cannot be read ({exc}); give a readable "
                        "NIfTI image or a builtin template name"
                    ) from exc
                step["params"][key] = {"template_sha256": digest}
    return hash_json({"config": config, "mriprep_version": mriprep.__version__}, default=list)


# -- validation helpers --------------------------------------------------------------


def _compression(value: Any, problems: list[str]) -> dict[str, str]:
    """The ``compression`` key as one choice per tensor: a name applies to every tensor,
    a mapping names some of them (the others stay ``none``). The choices are those of the
    registered storage formats (:mod:`mriprep.cache.formats`)."""
    from mriprep.cache.formats import choices as format_choices

    known = format_choices()
    choices = ", ".join(known)
    out = dict.fromkeys(COMPRESSED_TENSORS, "none")
    if isinstance(value, str):
        if value not in known:
            problems.append(f"'compression' = {value!r} is not supported; use one of {choices}"
                            " (or a mapping such as {valid: lz4, label: lz4})")
            return out
        return dict.fromkeys(COMPRESSED_TENSORS, value)
    if not isinstance(value, dict):
        problems.append(f"'compression' must be one of {choices} or a mapping of tensor "
                        f"names ({', '.join(COMPRESSED_TENSORS)}) to them, got {value!r}")
        return out
    for tensor, choice in value.items():
        if tensor not in COMPRESSED_TENSORS:
            problems.append(f"'compression' names tensor {tensor!r}; the tensors are "
                            f"{', '.join(COMPRESSED_TENSORS)}")
        elif choice not in known:
            problems.append(f"'compression' of {tensor} = {choice!r} is not supported; use "
                            f"one of {choices}")
        else:
            out[tensor] = choice
    return out



def _parse_step(
    entry: Any, position: int, base: Path, pipeline_fields: dict[str, Any],
    problems: list[str],
) -> StageStep | None:
    where = f"stages[{position}]"
    if isinstance(entry, str):
        stage_name, raw_params = entry, {}
    elif isinstance(entry, dict) and len(entry) == 1:
        stage_name, raw_params = next(iter(entry.items()))
        raw_params = {} if raw_params is None else raw_params
    else:
        problems.append(
            f"{where} = {entry!r} must be a stage name or a one-key mapping "
            "{stage: {param: value}}; check the indentation of its parameters"
        )
        return None
    known = sorted(STAGE_MODULES)
    try:
        stage_obj = get_stage(str(stage_name))
    except KeyError:
        problems.append(
            f"{where}: unknown stage {stage_name!r}; known stages: {', '.join(known)}"
        )
        return None
    except ImportError as exc:
        problems.append(
            f"{where}: stage {stage_name!r} cannot be imported ({exc}); check that "
            "mriprep and its dependencies are installed completely"
        )
        return None
    if not isinstance(raw_params, dict):
        problems.append(
            f"{where} ({stage_name}): parameters must be a mapping, got {raw_params!r}"
        )
        return None
    params_type = stage_obj.params_type
    hints = typing.get_type_hints(params_type)
    fields = {f.name: f for f in dataclasses.fields(params_type) if f.init}
    values: dict[str, Any] = {}
    problems_before = len(problems)
    for key, value in raw_params.items():
        if key not in fields:
            problems.append(
                f"{where} ({stage_name}): unknown key {key!r}; "
                f"{stage_name} accepts: {', '.join(sorted(fields)) or '(no parameters)'}"
            )
            continue
        try:
            coerced = coerce_value(value, hints[key])
        except ValueError as exc:
            problems.append(f"{where} ({stage_name}): key {key!r} = {value!r} {exc}")
            continue
        if key in stage_obj.template_fields and coerced:
            key_name = f"{where} ({stage_name}): key {key!r}"
            coerced = _resolve_template(coerced, key_name, base, problems)
        values[key] = coerced
    for key in stage_obj.inherits:
        # A stage that needs a pipeline-level setting (e.g. sanitize's float16 range needs
        # the cache dtype) inherits it; two different values in one file would contradict
        # each other.
        if key not in values and key in pipeline_fields:
            values[key] = pipeline_fields[key]
        elif key in values and values[key] != pipeline_fields.get(key, values[key]):
            problems.append(
                f"{where} ({stage_name}): key {key!r} = {values[key]!r} contradicts the "
                f"pipeline's {key} {pipeline_fields[key]!r}; remove the key from the stage, "
                "it inherits the pipeline's"
            )
    if len(problems) > problems_before:
        return None
    try:
        params = params_type(**values)
    except (TypeError, ValueError) as exc:
        # The dataclass's own __post_init__ checks (ranges, combinations) speak here.
        problems.append(f"{where} ({stage_name}): {exc}")
        return None
    for key in stage_obj.template_fields:
        if key not in values:
            default = getattr(params, key)
            if default:
                key_name = f"{where} ({stage_name}): default {key!r}"
                _resolve_template(default, key_name, base, problems)
    return StageStep(name=stage_obj.name, params=params)


def _resolve_template(value: str, where: str, base: Path, problems: list[str]) -> str:
    from mriprep.inputs.templates import BUILTIN_TEMPLATES, is_builtin

    if is_builtin(value):
        return value
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base / path
    if not path.is_file():
        problems.append(
            f"{where} = {value!r}: template file {path} does not exist; give an existing "
            f"image path (relative paths are relative to the pipeline file) or a builtin "
            f"template: {', '.join(BUILTIN_TEMPLATES)}"
        )
        return value
    return str(path.resolve())


def _order_problems(steps: list[StageStep]) -> list[str]:
    """Orderings no subject could survive, caught before the run rather than per subject.

    Each stage declares its constraints (see :class:`mriprep.stages.Stage`): a transform
    handed over must be applied by a later step, a stage that must come last does, and
    each stage's own check of what comes before it.
    """
    problems = []
    stages = [get_stage(step.name) for step in steps]
    pending_from: str | None = None
    for step, stage_obj in zip(steps, stages):
        if stage_obj.order_check is not None:
            problems.extend(stage_obj.order_check(step.params, pending_from is not None))
        if stage_obj.applies_transform:
            pending_from = None
        if stage_obj.hands_over_transform:
            pending_from = step.name
    if pending_from is not None:
        appliers = [s.name for s in all_stages() if s.applies_transform]
        problems.append(
            f"stage {pending_from!r} estimates a transform that only "
            f"{' or '.join(repr(a) for a in appliers)} applies; add a {appliers[0]!r} step "
            f"after {pending_from!r}"
        )
    for position, stage_obj in enumerate(stages):
        if stage_obj.last and position != len(stages) - 1:
            problems.append(
                f"stage {stage_obj.name!r} {stage_obj.last}; move it to the end of 'stages'"
            )
    return problems


def _format_problems(source: str, problems: list[str]) -> str:
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"pipeline {source} has {len(problems)} problem(s):\n{lines}"
