"""Tests of mriprep.core.findings: registered codes, their severity, and the JSON form
`--json` prints."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from mriprep.core.finding_codes import CODES, Severity
from mriprep.core.findings import (
    Finding,
    FindingsMixin,
    UnknownFindingCode,
    close_codes,
    named,
    registered,
)


def test_severity_comes_from_the_registry_and_is_a_plain_string_in_json():
    error = Finding("split-missing", "1 scan has no split", ("line 2",), ("s",))
    warning = Finding("near-duplicate", "close")
    assert error.severity is Severity.ERROR and warning.severity is Severity.WARNING
    assert json.dumps(error.to_json()) == (
        '{"severity": "error", "code": "split-missing", "message": "1 scan has no split", '
        '"keys": ["line 2"], "subjects": ["s"]}'
    )
    assert f"{error.severity}" == "error" and error.severity == "error"


def test_an_unregistered_code_is_refused_with_the_codes_it_may_mean():
    with pytest.raises(UnknownFindingCode, match=r"'identity-leek' is not registered "
                       r"\(close: identity-leak.*finding_codes.py"):
        Finding("identity-leek", "message")
    with pytest.raises(UnknownFindingCode, match=r"'fatal' is not registered; add it"):
        registered("fatal")
    assert close_codes("file-mising")[0] == "file-missing"
    assert close_codes("nothing like a code") == []


def test_the_severity_cannot_be_given_at_a_call_site():
    with pytest.raises(TypeError):
        Finding("geometry", "bad", severity=Severity.WARNING)  # type: ignore[call-arg]


def test_every_registered_code_is_explained_in_one_line():
    for code, record in CODES.items():
        assert record.code == code and isinstance(record.severity, Severity)
        for text in (record.meaning, record.fix):
            assert text.strip() == text and text and "\n" not in text, code
        assert record.found_by and set(record.found_by) <= {"check", "cache verify", "splits"}


def test_a_report_is_ok_with_warnings_only():
    @dataclass
    class Report(FindingsMixin):
        findings: list[Finding] = field(default_factory=list)

    report = Report([Finding("near-duplicate", "close")])
    assert report.ok and report.errors == [] and len(report.warnings) == 1
    report.findings.append(Finding("geometry", "bad"))
    assert not report.ok and [f.code for f in report.errors] == ["geometry"]


def test_named_cuts_long_lists():
    assert named(["a", "b"]) == "a, b"
    assert named([f"sub-{i}" for i in range(10)]).endswith("sub-7 and 2 more")
