"""Falsely fine inputs through a run: measured by the plausibility step, a
`resolution-falsely-fine` warning of `mriprep check` naming the subject, the axes, their
claimed and measured sizes and the fix, and a column of the QC report.

Two phantoms (tissue classes cut from a smooth random field, with noise): sub-01 made on
its own 1 mm grid, sub-02 made at 1 mm and written at 0.5 mm by zero-filling its
spectrum (as a scanner's reconstruction does). The pipeline is sanitize and plausibility
with every head check only warning (a phantom is no head).
"""

from __future__ import annotations

import re

import nibabel as nib
import numpy as np
import pytest

from mriprep import check as chk
from mriprep.cache import Cache
from mriprep.core.finding_codes import CODES
from mriprep.demo.resolution_sets import written_finer
from mriprep.demo.scanner import Scan
from mriprep.pipelines import load_pipeline
from mriprep.qc.store import read_qc
from mriprep.run.cohort import cohort_rows, run_cohort
from mriprep.stages.acquired_resolution import CLAIMED_FINER_RATIO
from tests.stages.test_acquired_resolution import phantom


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("resolution_cohort")
    nib.save(nib.Nifti1Image(phantom((80, 80, 80), 1), np.eye(4)), root / "sub-01.nii.gz")
    coarse = Scan(phantom((64, 64, 64), 2), None, np.eye(4), np.eye(4), None)
    fine = written_finer(coarse, (2, 2, 2), "fft")
    nib.save(nib.Nifti1Image(fine.data, fine.affine), root / "sub-02.nii.gz")
    (root / "cohort.csv").write_text("subject_id,image,split\nsub-01,sub-01.nii.gz,train\n"
                                     "sub-02,sub-02.nii.gz,train\n")
    (root / "pipeline.yaml").write_text(
        "name: resolution-test\noutput_dtype: float32\nstages:\n  - sanitize\n"
        "  - plausibility:\n      warn: [voxel_size, shear, no_head, head_size]\n")
    out = root / "cache"
    result = run_cohort(cohort_rows(root / "cohort.csv"), out,
                        load_pipeline(root / "pipeline.yaml"), scheduler="sync", workers=1,
                        report=True)
    assert all(r.status == "cached" for r in result.results), result.results
    return out


def test_a_falsely_fine_input_is_a_check_warning_naming_axes_sizes_and_fix(cache):
    report = chk.check_cache(cache)
    found = [f for f in report.findings if f.code == "resolution-falsely-fine"]
    assert [f.subjects for f in found] == [("sub-02",)]
    (finding,) = found
    assert finding.severity == "warning" and report.ok
    for axis in range(3):  # written from 1 mm: about 1 mm, not 0.8 or 1.3
        assert re.search(rf"voxel axis {axis}: 0\.5 mm claimed, about (0\.9\d|1|1\.0\d) mm "
                         "carried", finding.message), finding.message
    assert f"at least {CLAIMED_FINER_RATIO:g}x finer" in finding.message
    assert "true resolution" in finding.message and "re-export" in finding.message
    key = {e["subject_id"]: k for k, e in Cache(cache).read_index().items()}["sub-02"]
    assert finding.keys == (key,)


def test_the_registry_states_the_stages_threshold():
    assert f"at least {CLAIMED_FINER_RATIO:g}x finer" in CODES["resolution-falsely-fine"].meaning


def test_the_qc_report_shows_the_ratio_as_a_column(cache):
    head = (cache / "qc" / "index.html").read_text().split("</thead>")[0]
    assert ">claimed finer</th>" in head
    keys = {e["subject_id"]: k for k, e in Cache(cache).read_index().items()}
    ratio = {sid: read_qc(cache, key)["metrics"]["acquired_resolution_ratio"]
             for sid, key in keys.items()}
    assert ratio["sub-01"] == 1.0 and 1.9 <= ratio["sub-02"] <= 2.1
