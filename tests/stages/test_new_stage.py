"""A new stage needs its module and nothing else (docs/pipelines.md, "Adding a stage";
mriprep/stages/__init__.py).

The stage below is defined here, in the test module, with its QC declaration, and no
other file knows it. A pipeline written as data names it; a run of two tiny subjects
(20 mm heads, milliseconds a stage) shows it in the run report, and the QC report shows
the measure it declares, with its label, and colours the voxels it invalidates by the
cause it declares.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass

import nibabel as nib
import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.pipelines import pipeline_from_dict
from mriprep.qc.store import read_qc
from mriprep.run.cohort import cohort_rows, run_cohort
from mriprep.stages import StageOutput, all_stages, get_stage, stage
from mriprep.stages.qc_declaration import InvalidCause, QCMetric, StageQC


@dataclass(frozen=True)
class CeilingParams:
    ceiling: float = 500.0


@stage("test_new_ceiling", CeilingParams, qc=StageQC(
    metrics=(QCMetric("ceiling_voxels", "over the ceiling",
                      "voxels above the ceiling, clipped to it and marked invalid",
                      key="clipped", unit="voxels", judge="high", column=True),),
    causes=(InvalidCause("over the ceiling", "clipped to the ceiling by the test stage",
                         "#00ff00", "green"),),
))
def _ceiling(volume, params):
    over = volume.valid & (volume.data > params.ceiling)
    data = np.where(over, np.float32(params.ceiling), volume.data)
    return StageOutput(volume.replace(data=data, valid=volume.valid & ~over),
                       {"clipped": int(np.count_nonzero(over))})


# Hot voxels planted per subject (a cube of this edge inside the ball): a run must count
# exactly these.
HOT_EDGE = {"sub-01": 0, "sub-02": 3}
HOT = {sid: edge ** 3 for sid, edge in HOT_EDGE.items()}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Two 24 mm subjects (a bright ball on noise), processed by a pipeline of the new
    stage alone, with the QC report."""
    root = tmp_path_factory.mktemp("new_stage")
    rng = np.random.default_rng(3)
    ijk = np.indices((24, 24, 24)) - 11.5
    ball = np.sqrt((ijk ** 2).sum(0)) < 8
    rows = []
    for sid, edge in HOT_EDGE.items():
        data = np.where(ball, 300.0, 20.0) + rng.normal(0, 5, ball.shape)
        data[14:14 + edge, 9:9 + edge, 12:12 + edge] = 5000.0
        path = root / f"{sid}_T1w.nii.gz"
        nib.save(nib.Nifti1Image(data.astype(np.float32), np.eye(4)), path)
        rows.append({"subject_id": sid, "session_id": "", "image": path.name, "split": "train"})
    with open(root / "cohort.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    pipeline = pipeline_from_dict({"name": "new_stage", "output_dtype": "float32",
                                   "stages": [{"test_new_ceiling": {"ceiling": 500.0}}]})
    result = run_cohort(cohort_rows(root / "cohort.csv"), root / "cache", pipeline,
                        scheduler="threads", workers=1, report=True)
    return root / "cache", pipeline, result


def test_the_new_stage_is_known_by_name_and_listed():
    assert get_stage("test_new_ceiling").qc.metrics[0].name == "ceiling_voxels"
    assert "test_new_ceiling" in [s.name for s in all_stages()]


def test_a_pipeline_as_data_names_the_new_stage(tiny_run):
    _, pipeline, _ = tiny_run
    assert [step.name for step in pipeline.steps] == ["test_new_ceiling"]
    assert pipeline.resolved()["stages"][0]["params"] == {"ceiling": 500.0}


def test_the_run_report_shows_the_new_stage_metrics(tiny_run):
    cache_root, _, result = tiny_run
    assert {r.subject_id: r.status for r in result.results} == dict.fromkeys(HOT, "cached")
    doc = json.loads((cache_root / "reports" / "latest.json").read_text())
    rows = {r["subject_id"]: r for r in doc["subjects"]}
    for sid, hot in HOT.items():
        assert rows[sid]["metrics"]["test_new_ceiling"]["clipped"] == hot


def test_the_qc_report_shows_the_declared_measure_and_cause(tiny_run):
    cache_root, _, _ = tiny_run
    keys = {e.subject_id: e.key for e in Cache(cache_root).entries()}
    for sid, hot in HOT.items():
        qc = read_qc(cache_root, keys[sid])
        assert qc["metrics"]["ceiling_voxels"] == hot
        assert qc["metric_info"]["ceiling_voxels"]["label"] == "over the ceiling"
        assert qc["metric_info"]["ceiling_voxels"]["unit"] == "voxels"
        # The voxels it invalidated are drawn as its declared cause, and only where it did.
        assert ("over the ceiling" in qc["legends"]["output"]) == (hot > 0)
    index = (cache_root / "qc" / "index.html").read_text()
    assert ">over the ceiling</th>" in index  # a column of the index table, as declared
    page = next((cache_root / "qc" / "subjects").glob("sub-02*.html")).read_text()
    assert "over the ceiling" in page and "27 voxels" in page
