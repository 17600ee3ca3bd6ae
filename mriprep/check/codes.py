"""The finding codes as people read them: ``mriprep check --explain CODE`` and docs/qc.md.

The codes themselves, with their severity, meaning and fix, are the registry
:data:`~mriprep.core.finding_codes.CODES`; this module only renders it. The table of
finding codes in docs/qc.md is :func:`markdown_table`, between :data:`TABLE_START` and
:data:`TABLE_END` (a test keeps the two equal). After adding or changing a code::

    python -m mriprep.check.codes --markdown     # paste between docs/qc.md's markers
"""

from __future__ import annotations

import argparse
import sys

from mriprep.core.finding_codes import CODES, FindingCode
from mriprep.core.findings import close_codes

TABLE_START = "<!-- finding codes: `python -m mriprep.check.codes --markdown` -->"
TABLE_END = "<!-- end of finding codes -->"


def _commands(code: FindingCode) -> str:
    return ", ".join(f"mriprep {command}" for command in code.found_by)


def explain(code: str) -> str:
    """What ``mriprep check --explain CODE`` prints; KeyError for an unknown code."""
    record = CODES[code]
    return "\n".join([
        f"{record.code}: {record.severity} (reported by {_commands(record)})",
        f"  meaning: {record.meaning}",
        f"  fix: {record.fix}",
    ])


def explain_json(code: str) -> dict[str, object]:
    """``--explain CODE --json``: the registry's entry as a JSON object; KeyError for an
    unknown code."""
    record = CODES[code]
    return {"code": record.code, "severity": record.severity.value,
            "meaning": record.meaning, "fix": record.fix,
            "found_by": [f"mriprep {command}" for command in record.found_by]}


def unknown(code: str) -> str:
    """Why ``code`` cannot be explained, and the codes it may have meant."""
    close = close_codes(code)
    if close:
        return f"no finding code {code!r}; did you mean: {', '.join(close)}?"
    return f"no finding code {code!r}; the codes are: {', '.join(CODES)}"


def markdown_table() -> str:
    """Every registered code as a Markdown table, in the registry's order."""
    rows = ["| code | severity | reported by | meaning | fix |", "|---|---|---|---|---|"]
    for record in CODES.values():
        cells = (f"`{record.code}`", str(record.severity), _commands(record), record.meaning,
                 record.fix)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def readme_table(readme_text: str) -> str:
    """The table between a document's markers (ValueError when a marker is missing)."""
    start, end = readme_text.find(TABLE_START), readme_text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"the document has no finding codes table between {TABLE_START!r} "
                         f"and {TABLE_END!r}; add the markers around the table")
    return readme_text[start + len(TABLE_START):end].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mriprep.check.codes",
        description="List the finding codes of `mriprep check` and `mriprep splits`.")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table of finding codes of docs/qc.md")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table())
    else:
        width = max(len(code) for code in CODES)
        for record in CODES.values():
            print(f"{record.code:<{width}}  {record.severity:<8} {record.meaning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
