"""A second pipeline never silently takes over a cache: `mriprep run` refuses (exit 2) a
cache whose index holds another pipeline hash, naming both pipelines and both hashes,
even when the run covers every indexed subject; `--replace-pipeline` is the only way
through. On small template caches: the refusal comes before any subject is processed."""

from __future__ import annotations

from pathlib import Path

import pytest

from mriprep.cache import Cache
from mriprep.cli import main as cli
from mriprep.core.errors import CacheError
from mriprep.inputs.manifest import ManifestRow, write_manifest
from mriprep.pipelines import load_pipeline
from mriprep.run.cohort import run_cohort
from tests.training.template_cache import build_template_cache

OLD_HASH = "a" * 64


@pytest.fixture
def cache_and_manifest(tmp_path) -> tuple[Path, Path]:
    """A 3-entry cache of pipeline ``test`` and a manifest of exactly its subjects."""
    root = build_template_cache(tmp_path / "cache", splits={"train": 2, "val": 1}, step=8,
                                pipeline_hash=OLD_HASH)
    rows = [ManifestRow(0, e.subject_id, "", tmp_path / f"{e.subject_id}.nii.gz",
                        split=e.split) for e in Cache(root).entries()]
    return root, write_manifest(rows, tmp_path / "cohort.csv")


def test_run_refuses_another_pipeline_even_over_the_same_subjects(cache_and_manifest,
                                                                  capsys):
    root, manifest = cache_and_manifest
    before = (root / "index.json").read_bytes()
    new = load_pipeline("conform_1mm")
    code = cli(["run", str(manifest), "-o", str(root), "-p", "conform_1mm",
                "--scheduler", "sync", "--no-report"])
    err = capsys.readouterr().err
    assert code == 2
    assert "3 entries of pipeline test (aaaaaaaaaaaa)" in err
    assert f"conform_1mm ({new.hash[:12]})" in err and "--replace-pipeline" in err
    assert (root / "index.json").read_bytes() == before  # nothing re-indexed
    assert not list((root / "reports").glob("run-*.json"))  # no subject was run


def test_a_changed_parameter_is_another_pipeline_too(cache_and_manifest, tmp_path):
    root, manifest = cache_and_manifest
    from mriprep.run.cohort import cohort_rows

    first = tmp_path / "p1.yaml"
    first.write_text("name: test\nstages:\n  - sanitize\n")
    pipeline = load_pipeline(first)
    with pytest.raises(CacheError, match="the same name with other parameters") as refused:
        run_cohort(cohort_rows(manifest), root, pipeline, scheduler="sync", report=False)
    assert OLD_HASH[:12] in str(refused.value) and pipeline.hash[:12] in str(refused.value)


def test_replace_pipeline_is_the_way_through(cache_and_manifest, tmp_path, capsys):
    root, manifest = cache_and_manifest
    other = tmp_path / "other.yaml"
    other.write_text("name: other\nstages:\n  - sanitize\n")
    code = cli(["run", str(manifest), "-o", str(root), "-p", str(other),
                "--scheduler", "sync", "--no-report", "--replace-pipeline"])
    err = capsys.readouterr().err
    assert code == 1  # the run went on: its (missing) images fail at load
    assert "--replace-pipeline: took 3 entries of pipeline test" in err
    assert Cache(root).entries() == []  # the old entries left the index, for prune
