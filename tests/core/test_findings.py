"""Tests of mriprep.core.findings: one severity, and the JSON form `--json` prints."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from mriprep.core.findings import Finding, FindingsMixin, Severity, named


def test_severity_is_a_plain_string_in_json_whichever_way_it_was_given():
    given_as_text = Finding("error", "split-missing", "1 scan has no split", ("line 2",), ("s",))
    given_as_member = Finding(
        Severity.ERROR, "split-missing", "1 scan has no split", ("line 2",), ("s",)
    )
    assert given_as_text == given_as_member and given_as_text.severity is Severity.ERROR
    assert json.dumps(given_as_member.to_json()) == (
        '{"severity": "error", "code": "split-missing", "message": "1 scan has no split", '
        '"keys": ["line 2"], "subjects": ["s"]}'
    )
    assert f"{given_as_member.severity}" == "error"


def test_an_unknown_severity_is_refused():
    with pytest.raises(ValueError, match="'fatal' is not a valid Severity"):
        Finding("fatal", "code", "message")


def test_a_report_is_ok_with_warnings_only():
    @dataclass
    class Report(FindingsMixin):
        findings: list[Finding] = field(default_factory=list)

    report = Report([Finding("warning", "near-duplicate", "close")])
    assert report.ok and report.errors == [] and len(report.warnings) == 1
    report.findings.append(Finding(Severity.ERROR, "geometry", "bad"))
    assert not report.ok and [f.code for f in report.errors] == ["geometry"]


def test_named_cuts_long_lists():
    assert named(["a", "b"]) == "a, b"
    assert named([f"sub-{i}" for i in range(10)]).endswith("sub-7 and 2 more")
