"""Pipelines as data: the shipped YAML definitions (package data) and their loader.

A pipeline is an ordered list of stages with parameters, validated against the stages'
parameter dataclasses and hashed by content (:mod:`mriprep.pipelines.loader`), and run
on a volume by :func:`~mriprep.pipelines.execute.run_stages`, which the runner, the QC
and the demo all import from here. The YAML
files next to this module are the named pipelines (``mriprep run -p NAME``); the
repository's top-level ``pipelines/`` is a link to this folder.
"""

from mriprep.pipelines.loader import (
    DEFAULT_PIPELINE,
    OUTPUT_DTYPES,
    Pipeline,
    StageStep,
    available_pipelines,
    load_pipeline,
    pipeline_from_dict,
    pipelines_dir,
)
from mriprep.pipelines.execute import run_stages

__all__ = [
    "DEFAULT_PIPELINE", "OUTPUT_DTYPES", "Pipeline", "StageStep", "available_pipelines",
    "load_pipeline", "pipeline_from_dict", "pipelines_dir", "run_stages",
]
