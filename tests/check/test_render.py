"""The check's text for people (mriprep.check.render): a summary by code before the
verdict."""

from __future__ import annotations

from mriprep.check.render import MAX_FINDINGS_PER_CODE, render_report
from mriprep.check.report import CheckReport
from mriprep.core.findings import Finding


def test_the_text_ends_with_a_summary_by_code_before_the_verdict():
    findings = ([Finding("qc-outlier", f"sub-{i}: snr_total = 1", (f"k{i}",), (f"sub-{i}",))
                 for i in range(MAX_FINDINGS_PER_CODE + 3)]
                + [Finding("identity-leak", "sub-1 and sub-2 show the same person",
                           ("k1", "k2"), ("sub-1", "sub-2"))])
    text = render_report(CheckReport(cache="/c", entries=30, findings=findings))
    lines = text.splitlines()
    start = lines.index("findings by code:")
    summary = lines[start + 1:start + 3]
    # errors first, each code with its severity and its count (all of them, not the
    # ones shown)
    assert summary[0].split() == ["ERROR", "identity-leak", "1"]
    assert summary[1].split() == ["WARNING", "qc-outlier", str(MAX_FINDINGS_PER_CODE + 3)]
    assert lines[start + 3] == "" and lines[-1] == "FAILED: 1 error(s), 23 warning(s)"
    assert start > max(i for i, line in enumerate(lines) if "snr_total" in line)


def test_a_clean_report_has_no_summary():
    text = render_report(CheckReport(cache="/c", entries=3))
    assert "findings by code" not in text and text.splitlines()[-1].startswith("OK")


def test_a_cohort_too_small_for_the_volume_check_is_said_to_be():
    table = {"source": "dkt", "processing": "aparc", "cortex": "fuse", "unknown": "error",
             "absent_classes": "error", "classes": {"axial": 79, "coronal": 79,
                                                    "sagittal": 51},
             "label_maps": 3, "without_label_map": 0, "seconds": 1.0,
             "volumes": {"maps": 3, "judged": False, "min_maps": 6}}
    text = render_report(CheckReport(cache="/c", entries=3, label_table=table))
    assert "structure volumes and missing structures not judged: 3 label map(s), at " \
           "least 6 needed" in text
    table["volumes"] = {"maps": 8, "judged": True, "min_maps": 6}
    assert "not judged" not in render_report(CheckReport(cache="/c", entries=8,
                                                         label_table=table))
