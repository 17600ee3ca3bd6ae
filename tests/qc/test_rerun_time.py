"""After a rerun, the QC report shows the time of the run that made each entry.

A rerun skips the subjects already cached in a fraction of a second; that skip is not
the subject's preprocessing time. The run that made the entry records its time in the
subject's ``qc.json``, and the page of a reused entry shows it and says it was reused.
"""

from __future__ import annotations

import nibabel as nib
import numpy as np
from scipy import ndimage

from mriprep.cache.run_report import read_run_report
from mriprep.inputs.templates import load_template
from mriprep.pipelines import load_pipeline
from mriprep.qc.gather import gather
from mriprep.qc.store import read_qc
from mriprep.run.cohort import cohort_rows, run_cohort


def _cohort(root):
    mni = load_template("mni152")
    data = ndimage.zoom(mni.data, 0.25, order=1).astype(np.float32)  # 4 mm: fast
    affine = mni.affine @ np.diag([4.0, 4.0, 4.0, 1.0])
    nib.save(nib.Nifti1Image(data, affine), root / "sub-01.nii.gz")
    (root / "cohort.csv").write_text("subject_id,image\nsub-01,sub-01.nii.gz\n")
    (root / "p.yaml").write_text("name: rerun\nstages:\n  - sanitize\n  - normalize\n")
    return cohort_rows(root / "cohort.csv"), load_pipeline(root / "p.yaml")


def test_a_rerun_keeps_the_time_of_the_run_that_made_the_entry(tmp_path):
    rows, pipeline = _cohort(tmp_path)
    cache = tmp_path / "cache"
    first = run_cohort(rows, cache, pipeline, scheduler="sync")
    made = next(r for r in first.results if r.status == "cached")
    again = run_cohort(rows, cache, pipeline, scheduler="sync")
    skipped = next(r for r in again.results if r.status == "skipped")
    assert skipped.seconds != made.seconds

    qc = read_qc(cache, made.key)
    assert qc["made_by_run"]["seconds"] == made.seconds
    assert qc["made_by_run"]["run_started"] == \
        read_run_report(first.report_paths["json_copy"]).header["started"]
    subject = next(s for s in gather(cache).subjects if s.key == made.key)
    assert subject.seconds == made.seconds and subject.reused
    page = (cache / "qc" / "subjects" / subject.page).read_text()
    assert f"{made.seconds:.1f} s" in page and "reused" in page
