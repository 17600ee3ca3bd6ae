"""Pipelines as data: YAML loading, schema validation with clear errors, and hashing."""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass
from typing import Literal

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

import mriprep
from mriprep.core.errors import PipelineConfigError
from mriprep.inputs.templates import load_template
from mriprep.pipelines.loader import (
    load_pipeline,
    pipeline_from_dict,
    pipelines_dir,
    resolve_pipeline_path,
)
from mriprep.stages import StageOutput, stage


@dataclass(frozen=True)
class ProbeParams:
    flag: bool = False
    count: int = 3
    scale: float = 1.0
    mode: Literal["a", "b"] = "a"
    spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)
    limit: float | None = None
    template: str = "mni152"


@stage("test_pipeline_probe", ProbeParams, template_fields=("template",))
def _probe(volume, params):
    return StageOutput(volume)


def write_yaml(path, text):
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def small_template(tmp_path_factory):
    """A 4 mm copy of the MNI152 template written as NIfTI: a user template file."""
    mni = load_template("mni152")
    affine = mni.affine.copy()
    affine[:3, :3] *= 4
    data = ndimage.zoom(mni.data, 0.25, order=1).astype(np.float32)
    path = tmp_path_factory.mktemp("templates") / "small_mni.nii.gz"
    nib.save(nib.Nifti1Image(data, affine), path)
    return path


def test_yaml_is_resolved_with_defaults_and_types(tmp_path, small_template):
    path = write_yaml(
        tmp_path / "probe.yaml",
        f"""
        name: probe
        description: a probe
        output_dtype: float16
        stages:
          - test_pipeline_probe
          - test_pipeline_probe:
              scale: 2          # an int where a float is expected is fine
              spacing: [1, 1, 3]
              limit: 1e30       # PyYAML reads this as text; a float field accepts it
              template: {small_template.name}
        """,
    )
    shutil.copy(small_template, tmp_path / small_template.name)
    pipe = load_pipeline(path)
    assert pipe.name == "probe" and pipe.output_dtype == "float16"
    assert [s.name for s in pipe.steps] == ["test_pipeline_probe"] * 2
    assert pipe.steps[0].params == ProbeParams()
    second = pipe.steps[1].params
    assert second.scale == 2.0 and isinstance(second.scale, float)
    assert second.spacing == (1.0, 1.0, 3.0)
    assert second.limit == 1e30
    # Relative template paths are relative to the pipeline file, stored absolute.
    assert second.template == str((tmp_path / small_template.name).resolve())
    resolved = pipe.resolved()
    assert resolved["stages"][0]["params"]["count"] == 3
    assert "description" not in resolved


def test_unknown_key_names_key_file_and_fix(tmp_path):
    path = write_yaml(
        tmp_path / "bad.yaml",
        """
        name: bad
        stages:
          - test_pipeline_probe:
              scael: 2
        """,
    )
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(path)
    message = str(info.value)
    assert str(path) in message
    assert "unknown key 'scael'" in message
    assert "accepts: count, flag, limit, mode, scale, spacing, template" in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("count", "3", "must be an integer"),
        ("count", 2.5, "must be an integer"),
        ("flag", "yes please", "must be true or false"),
        ("scale", True, "must be a number"),
        ("mode", "c", "must be one of 'a', 'b'"),
        ("spacing", [1, 1], "must be a list of 3 values"),
        ("limit", "lots", "must be number or null"),
    ],
)
def test_wrong_type_names_key_value_and_expectation(key, value, expected):
    doc = {"name": "bad", "stages": [{"test_pipeline_probe": {key: value}}]}
    with pytest.raises(PipelineConfigError) as info:
        pipeline_from_dict(doc, source="bad.yaml")
    message = str(info.value)
    assert "bad.yaml" in message
    assert f"key {key!r} = {value!r} {expected}" in message


def test_unknown_stage_and_every_problem_reported_at_once(tmp_path):
    path = write_yaml(
        tmp_path / "many.yaml",
        """
        name: many
        output_dtype: float64
        colour: blue
        stages:
          - reorinet
          - test_pipeline_probe: {count: many}
        """,
    )
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(path)
    message = str(info.value)
    assert "has 4 problem(s)" in message
    assert "unknown stage 'reorinet'; known stages: mask_slices, normalize" in message
    assert "'output_dtype' = 'float64' is not supported; use one of float32, float16" in message
    assert "unknown top-level key 'colour'" in message
    assert "key 'count' = 'many' must be an integer" in message


def test_missing_template_file_is_named_before_any_subject_runs(tmp_path):
    path = write_yaml(
        tmp_path / "tpl.yaml",
        """
        name: tpl
        stages:
          - test_pipeline_probe: {template: templates/missing.nii.gz}
        """,
    )
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(path)
    message = str(info.value)
    assert str(path) in message
    assert "key 'template' = 'templates/missing.nii.gz'" in message
    assert f"template file {tmp_path / 'templates/missing.nii.gz'} does not exist" in message
    assert "builtin template: mni152" in message


def test_unreadable_template_file_is_a_config_error(tmp_path):
    (tmp_path / "notes.nii.gz").write_text("not an image")
    doc = {"name": "tpl", "stages": [{"test_pipeline_probe": {"template": "notes.nii.gz"}}]}
    with pytest.raises(PipelineConfigError, match="the template cannot be read"):
        pipeline_from_dict(doc, source="tpl.yaml", base_dir=tmp_path)


def test_stage_entries_must_be_names_or_one_key_mappings():
    doc = {"name": "x", "stages": [{"test_pipeline_probe": None, "count": 2}]}
    with pytest.raises(PipelineConfigError, match="check the indentation of its parameters"):
        pipeline_from_dict(doc)


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nstages: [reorient\n")
    with pytest.raises(PipelineConfigError, match=f"pipeline file {path} is not valid YAML"):
        load_pipeline(path)


def test_hash_follows_content_not_wording_or_paths(tmp_path, small_template, monkeypatch):
    def pipe(**params):
        return pipeline_from_dict(
            {"name": "h", "description": "words", "stages": [{"test_pipeline_probe": params}]},
            base_dir=tmp_path,
        )

    base = pipe(template=str(small_template))
    assert len(base.hash) == 64
    assert pipe(template=str(small_template)).hash == base.hash
    # Defaults written out explicitly resolve to the same configuration.
    assert pipe(template=str(small_template), count=3).hash == base.hash
    assert pipe(template=str(small_template), count=4).hash != base.hash
    # The same template bytes under another name: same pipeline.
    moved = tmp_path / "elsewhere.nii.gz"
    shutil.copy(small_template, moved)
    assert pipe(template=str(moved)).hash == base.hash
    # Different template content: different pipeline.
    img = nib.load(small_template)
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj) * 2, img.affine), moved)
    assert pipe(template=str(moved)).hash != base.hash
    reworded = pipeline_from_dict(
        {"name": "h", "description": "other words",
         "stages": [{"test_pipeline_probe": {"template": str(small_template)}}]}
    )
    assert reworded.hash == base.hash
    monkeypatch.setattr(mriprep, "__version__", "99.0")
    assert pipe(template=str(small_template)).hash != base.hash


def test_names_resolve_from_the_pipelines_folder(tmp_path):
    assert resolve_pipeline_path("conform_1mm") == pipelines_dir() / "conform_1mm.yaml"
    with pytest.raises(PipelineConfigError) as info:
        resolve_pipeline_path("conform_2mm")
    assert "one of: conform_1mm, conform_min, t1w_mni_rigid" in str(info.value)
    with pytest.raises(PipelineConfigError, match="neither a YAML file"):
        resolve_pipeline_path(tmp_path / "absent.yaml")


def test_shipped_pipelines_validate_and_say_what_they_do():
    default = load_pipeline("t1w_mni_rigid")
    assert [s.name for s in default.steps] == [
        "reorient", "sanitize", "plausibility", "mask_slices", "register", "resample",
        "normalize", "validate"]
    assert default.params_of("register").template == "mni152"
    # The output grid is the template's, not written in the YAML (see the swap test).
    assert default.params_of("validate").expected_shape is None
    assert default.templates() == ["mni152"]
    conform = load_pipeline(pipelines_dir() / "conform_1mm.yaml")
    assert [s.name for s in conform.steps] == [
        "sanitize", "plausibility", "mask_slices", "normalize", "resample", "validate"]
    # FastSurfer's grid: LIA along the world axes, centred at c_ras.
    resample = conform.params_of("resample")
    assert resample.orientation == "LIA" and resample.axis_aligned
    assert resample.centre == "freesurfer"
    assert conform.params_of("normalize").mode == "conform"
    assert conform.params_of("resample").shape == (256, 256, 256)
    assert conform.params_of("resample").spacing == (1.0, 1.0, 1.0)
    assert conform.params_of("validate").expected_shape == (256, 256, 256)
    # Stages that need the cache dtype inherit the pipeline's.
    assert conform.params_of("sanitize").output_dtype == conform.output_dtype == "uint8"
    assert default.hash != conform.hash


def test_register_without_resample_and_contradicting_dtypes_are_refused():
    doc = {"name": "x", "output_dtype": "float16",
           "stages": ["register", {"sanitize": {"output_dtype": "float32"}}]}
    with pytest.raises(PipelineConfigError) as info:
        pipeline_from_dict(doc, source="x.yaml")
    message = str(info.value)
    assert "add a 'resample' step after 'register'" in message
    assert ("key 'output_dtype' = 'float32' contradicts the pipeline's output_dtype "
            "'float16'") in message


def test_an_output_orientation_after_register_is_refused_before_any_subject():
    doc = {"name": "x", "stages": ["register", {"resample": {"orientation": "LIA"}}]}
    with pytest.raises(PipelineConfigError, match="remove 'orientation' from the resample"):
        pipeline_from_dict(doc, source="x.yaml")
    conform = load_pipeline(pipelines_dir() / "conform_1mm.yaml")
    assert conform.params_of("resample").orientation == "LIA"


def test_a_wheel_in_a_fresh_virtualenv_runs_the_default_pipeline_by_name(tmp_path):
    """The pipelines are package data: a wheel installed into a new virtualenv outside
    the checkout loads both shipped pipelines by name, and ``mriprep run -p
    t1w_mni_rigid`` caches a one-subject cohort (a synthetic person, not the template)."""
    import json
    import os
    import shutil
    import site
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    import nibabel as nib

    from tests.stages.conftest import build_head

    repo = Path(__file__).resolve().parents[2]
    # Built from a copy: setuptools' build/ folder in a checkout keeps modules that were
    # moved or deleted since the last build, and they would ride along in the wheel.
    source = tmp_path / "source"
    shutil.copytree(repo, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        ".hypothesis", "demo_out"))
    wheel_dir, venv = tmp_path / "wheel", tmp_path / "venv"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(wheel_dir), str(source)], check=True, cwd=tmp_path)
    (wheel,) = wheel_dir.glob("mriprep-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packaged = set(archive.namelist())
    assert {"mriprep/pipelines/t1w_mni_rigid.yaml", "mriprep/pipelines/conform_1mm.yaml",
            "mriprep/run/subject.py"} <= packaged
    # No network here: the new virtualenv gets mriprep from the wheel and its
    # dependencies from this one's site-packages, added by path (a plain .pth line,
    # which does not run this environment's editable-install hook).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(pip + ["--python", str(python), "install", "--no-deps", "--no-index",
                          str(wheel)], check=True, cwd=tmp_path)
    venv_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                               check=True, capture_output=True, text=True).stdout.strip()
    Path(venv_site, "mriprep-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MRIPREP_DEBUG")}

    script = ("import mriprep; from mriprep.pipelines import load_pipeline; "
              "print(mriprep.__file__); print(load_pipeline().name, "
              "load_pipeline('conform_1mm').name)")
    out = subprocess.run([str(python), "-c", script], check=True, cwd=tmp_path, env=env,
                         capture_output=True, text=True).stdout.split("\n")
    assert out[0].startswith(str(venv))  # the installed copy, not the checkout
    assert out[1] == "t1w_mni_rigid conform_1mm"

    # The stage tests' person (built once per test run), scanned at 1 mm.
    head = build_head((1.0, 1.0, 1.0), seed=3)
    image, manifest = tmp_path / "sub-01_T1w.nii.gz", tmp_path / "cohort.csv"
    nib.save(nib.Nifti1Image(head.data, head.affine), image)
    manifest.write_text(f"subject_id,image\nsub-01,{image}\n")
    run = subprocess.run(
        [str(venv / "bin" / "mriprep"), "run", str(manifest), "-o",
         str(tmp_path / "cache"), "-p", "t1w_mni_rigid", "--scheduler", "sync", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["pipeline"]["name"] == "t1w_mni_rigid"
    assert summary["counts"] == {"cached": 1, "skipped": 0, "failed": 0, "total": 1}
    # The QC report's templates are package data too: the installed copy writes it.
    assert summary["qc_report_error"] is None
    assert (tmp_path / "cache" / "qc" / "index.html").is_file()


def test_compression_is_one_choice_for_every_tensor_or_one_per_tensor():
    stages = ["sanitize", "validate"]
    plain = pipeline_from_dict({"name": "x", "stages": stages}, source="x.yaml")
    none = pipeline_from_dict({"name": "x", "compression": "none", "stages": stages},
                              source="x.yaml")
    lz4 = pipeline_from_dict({"name": "x", "compression": "lz4", "stages": stages},
                             source="x.yaml")
    masks = pipeline_from_dict({"name": "x", "compression": {"valid": "zstd"},
                                "stages": stages}, source="x.yaml")
    assert plain.compression == none.compression == dict.fromkeys(
        ("image", "valid", "label"), "none")
    # Writing `none` changes nothing a cache depends on; any compression is another cache.
    assert plain.hash == none.hash
    assert len({plain.hash, lz4.hash, masks.hash}) == 3
    assert lz4.compression == dict.fromkeys(("image", "valid", "label"), "lz4")
    assert masks.compression == {"image": "none", "valid": "zstd", "label": "none"}
    with pytest.raises(PipelineConfigError) as info:
        pipeline_from_dict({"name": "x", "compression": {"mask": "lz4", "label": "gzip"},
                            "stages": stages}, source="x.yaml")
    message = str(info.value)
    assert "'compression' names tensor 'mask'; the tensors are image, valid, label" in message
    assert "'compression' of label = 'gzip' is not supported; use one of none, lz4, zstd" \
        in message
    with pytest.raises(PipelineConfigError, match="'compression' = 'blosc' is not supported"):
        pipeline_from_dict({"name": "x", "compression": "blosc", "stages": stages},
                           source="x.yaml")


def test_the_shipped_pipelines_store_float16_lz4_and_uint8_with_compressed_masks():
    default, conform = load_pipeline("t1w_mni_rigid"), load_pipeline("conform_1mm")
    assert default.output_dtype == "float16"
    assert default.compression == dict.fromkeys(("image", "valid", "label"), "lz4")
    assert conform.output_dtype == "uint8"
    assert conform.compression == {"image": "none", "valid": "lz4", "label": "lz4"}
    # The overrides give back the format every cache had before.
    before = load_pipeline("t1w_mni_rigid", output_dtype="float32", compression="none")
    assert before.output_dtype == "float32" and set(before.compression.values()) == {"none"}


def test_header_is_a_pipeline_option_covered_by_the_hash(tmp_path):
    stages = ["sanitize"]
    plain = pipeline_from_dict({"name": "x", "stages": stages}, base_dir=tmp_path)
    auto = pipeline_from_dict({"name": "x", "header": "auto", "stages": stages},
                              base_dir=tmp_path)
    sform = pipeline_from_dict({"name": "x", "header": "sform", "stages": stages},
                               base_dir=tmp_path)
    qform = pipeline_from_dict({"name": "x", "header": "qform", "stages": stages},
                               base_dir=tmp_path)
    assert plain.header == auto.header == "auto" and sform.header == "sform"
    # Writing the default changes nothing a cache depends on; a chosen form is another cache.
    assert plain.hash == auto.hash
    assert len({auto.hash, sform.hash, qform.hash}) == 3
    assert sform.resolved()["header"] == "sform" and "header" not in auto.resolved()
    with pytest.raises(PipelineConfigError) as info:
        pipeline_from_dict({"name": "x", "header": "best", "stages": stages})
    assert "'header' = 'best' is not supported; use one of auto, qform, sform" in str(info.value)
    path = write_yaml(tmp_path / "spm.yaml", "name: spm\nheader: sform\nstages: [sanitize]\n")
    assert load_pipeline(path).header == "sform"


def test_the_shipped_pipelines_keep_fastsurfers_header_rule():
    conform = load_pipeline("conform_1mm")
    assert conform.header == "auto"
    text = (pipelines_dir() / "t1w_mni_rigid.yaml").read_text()
    assert "\nheader: auto\n" in text
