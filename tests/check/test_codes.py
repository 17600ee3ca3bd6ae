"""The registry of finding codes against what the checks emit, `mriprep check --explain`,
and the table of codes in docs/qc.md.

Every finding a check emits carries a registered code (``Finding`` refuses any other),
and every registered code is emitted by some check: the source is read for the codes
it passes (:func:`emitted_codes`), and the checks are run over a damaged clone of the
demo cache and the demo manifest.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from mriprep import check as chk
from mriprep.check.codes import main as codes_main
from mriprep.check.codes import markdown_table, readme_table
from mriprep.check.tensors import CAST_UNDERFLOW_SHARE
from mriprep.cli import main as cli_main
from mriprep.core.finding_codes import CHECK, CODES, SPLITS, VERIFY
from mriprep.core.limits import CAST_LIMITS
from mriprep.inputs.headers import FORM_CONFLICT_LIMIT_MM
from mriprep.inputs.manifest import read_manifest
from mriprep.splits import IDENTITY_ERROR, check_manifest_splits
from tests.cache_clone import clone_cache, relabel_entry

ROOT = Path(__file__).resolve().parents[2]


def emitted_codes() -> dict[str, set[str]]:
    """Code -> the files that emit it, read from the source: the first argument of every
    ``Finding(...)``, of the tensor pass's ``report(...)`` and ``problems.append((...))``,
    and the code ``find_identical`` is given; a name stands for the string a module
    assigns to it (``UNREADABLE = "tensor-unreadable"``)."""
    trees = {path: ast.parse(path.read_text(), str(path))
             for path in sorted((ROOT / "mriprep").rglob("*.py"))}
    constants: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        constants.setdefault(target.id, set()).add(node.value.value)
    found: dict[str, set[str]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            arg = None
            if name in ("Finding", "report"):
                arg = node.args[0]
            elif name == "append" and getattr(node.func.value, "attr", "") == "problems":
                arg = node.args[0].elts[0] if isinstance(node.args[0], ast.Tuple) else None
            elif name == "find_identical" and len(node.args) > 2:
                arg = node.args[2]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                codes = {arg.value}
            elif isinstance(arg, ast.Name):
                codes = constants.get(arg.id, set())
            else:
                continue
            for code in codes:
                found.setdefault(code, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_code_in_the_source_is_registered_and_every_registered_code_is_used():
    emitted = emitted_codes()
    unregistered = {c: files for c, files in emitted.items() if c not in CODES}
    assert unregistered == {}
    assert set(CODES) - set(emitted) == set()  # no code left registered after its check went
    # the reading above finds each kind of call site
    assert {"non-finite", "meta-mismatch", "duplicate-tensor", "identity-leak"} <= set(emitted)


def test_the_numbers_in_the_meanings_are_the_checks_thresholds():
    float16 = CAST_LIMITS["float16"]
    assert f">= {IDENTITY_ERROR}" in CODES["identity-leak"].meaning
    assert f"{CAST_UNDERFLOW_SHARE:.1%}" in CODES["cast-underflow"].meaning
    assert f"|x| > {float16.max:g}" in CODES["extreme-values"].meaning
    assert f"above {float16.exact_int}" in CODES["cast-precision"].meaning
    assert f"more than {FORM_CONFLICT_LIMIT_MM:g} mm" in CODES["header-conflict"].meaning


def test_the_docs_table_is_the_registry_rendered():
    table = readme_table((ROOT / "docs" / "qc.md").read_text())
    assert table == markdown_table(), (
        "docs/qc.md's finding codes differ from the registry: paste the output of "
        "`python -m mriprep.check.codes --markdown` between its markers")
    rows = table.splitlines()[2:]
    assert [re.match(r"\| `([a-z-]+)` \|", row).group(1) for row in rows] == list(CODES)


def test_a_readme_without_the_markers_is_named():
    with pytest.raises(ValueError, match="no finding codes table"):
        readme_table("# a README\n")


def test_the_module_prints_the_table_and_the_list(capsys):
    assert codes_main(["--markdown"]) == 0
    assert capsys.readouterr().out.strip() == markdown_table()
    assert codes_main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(CODES)
    assert lines[0].split()[:2] == ["index-unreadable", "error"]


def test_explain_prints_severity_meaning_and_fix_without_a_cache(capsys):
    assert cli_main(["check", "--explain", "cast-underflow"]) == 0
    out = capsys.readouterr().out.splitlines()
    record = CODES["cast-underflow"]
    assert out == [
        "cast-underflow: warning (reported by mriprep check)",
        f"  meaning: {record.meaning}",
        f"  fix: {record.fix}",
    ]
    assert cli_main(["check", "--explain", "split-missing"]) == 0
    assert capsys.readouterr().out.startswith(
        "split-missing: error (reported by mriprep check, mriprep splits)\n")


def test_explain_as_json_gives_the_registry_entry(capsys):
    from mriprep.core.finding_codes import CODES

    assert cli_main(["check", "--explain", "identity-leak", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    record = CODES["identity-leak"]
    assert doc["code"] == "identity-leak" and doc["severity"] == record.severity.value == "error"
    assert doc["meaning"] == record.meaning and doc["fix"] == record.fix
    assert "mriprep check" in doc["found_by"]


def test_explain_of_an_unknown_code_is_a_usage_error_naming_close_codes(capsys):
    assert cli_main(["check", "--explain", "identiy-leak"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        "mriprep check: error: no finding code 'identiy-leak'; did you mean: "
        "identity-leak, possible-identity-leak?")
    assert cli_main(["check", "--explain", "xyzzy"]) == 2
    err = capsys.readouterr().err
    assert "no finding code 'xyzzy'; the codes are: index-unreadable," in err
    assert all(code in err for code in CODES)


def test_explain_checks_no_cache_and_a_check_needs_one(tmp_path, capsys):
    assert cli_main(["check", str(tmp_path), "--explain", "geometry"]) == 2
    assert "--explain geometry explains a code and checks no cache" in capsys.readouterr().err
    assert cli_main(["check"]) == 2
    assert "give the cache folder to check" in capsys.readouterr().err


# -- what the checks emit over a damaged cache --------------------------------------------


def assert_reported_by(findings, command: str) -> set[str]:
    codes = {f.code for f in findings}
    assert codes and codes <= set(CODES)
    wrong = {c for c in codes if command not in CODES[c].found_by}
    assert wrong == set(), f"registered without {command!r} in found_by: {sorted(wrong)}"
    for finding in findings:
        assert finding.severity is CODES[finding.code].severity
    return codes


@pytest.mark.slow
def test_the_codes_the_checks_emit_are_registered_for_their_command(
        demo_cache, demo_cohort, tmp_path):
    clone = clone_cache(demo_cache.path, tmp_path / "cache")
    entries = {e.subject_id: e.key for e in clone.entries() if not e.session_id}
    clone.tensor_path(entries["sub-06"], "valid").unlink()
    relabel_entry(clone, entries["sub-12"], "sub-03", "ses-9", "val")
    verified = assert_reported_by(chk.verify_cache(clone.root).findings, VERIFY)
    checked = assert_reported_by(
        chk.check_cache(clone.root, manifest=demo_cohort.manifest).findings, CHECK)
    assert "file-missing" in verified and verified < checked
    assert {"subject-split-leak", "duplicate-input", "manifest-failed"} <= checked
    # the demo manifest's planted leak: one image file under two ids, before any run
    splits = check_manifest_splits(read_manifest(demo_cohort.manifest))
    assert "duplicate-input" in assert_reported_by(splits.findings, SPLITS)
