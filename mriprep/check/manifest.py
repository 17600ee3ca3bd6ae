"""The cache against its manifest: every row cached in the manifest's split. A row that
failed (the run report ``CACHE/reports/latest.json`` says at which stage and why) or is
missing is an error, unless it is listed as a known exclusion: a training job gated on
the check must not start on part of its cohort by accident."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, Iterable

from mriprep.cache import IndexEntry
from mriprep.cache.run_report import RunReport
from mriprep.check.report import subjects_of
from mriprep.core.errors import CacheError
from mriprep.core.findings import Finding, named


def check_against_manifest(
    index: dict[str, IndexEntry],
    rows: Iterable[Any],
    run_report: RunReport | None,
    manifest_name: str = "the manifest",
    excluded: Collection[str] = (),
) -> list[Finding]:
    """Every manifest row is cached, in the split the manifest gives.

    ``rows`` are manifest rows with ``subject_id``, ``session_id`` and ``split``.
    ``excluded`` names rows known not to be cached (``sub-01`` for every session of a
    subject, ``sub-01/ses-2`` for one): those are warnings (``manifest-excluded``), every
    other failed or missing row an error.
    """
    excluded = set(excluded)
    reported = run_report.by_identity() if run_report is not None else {}
    excluded_rows: list[str] = []
    cached = {e.identity: k for k, e in index.items()}
    listed = set()
    findings = []
    missing: list[str] = []
    missing_subjects: list[str] = []
    for row in rows:
        ident = (str(row.subject_id), str(row.session_id or ""))
        listed.add(ident)
        name = f"{ident[0]}{'/' + ident[1] if ident[1] else ''}"
        key = cached.get(ident)
        if key is not None:
            cache_split = index[key].split
            if row.split and row.split != cache_split:
                findings.append(
                    Finding(
                        "manifest-split-mismatch",
                        f"{name} is in split {row.split!r} in {manifest_name} but in "
                        f"{cache_split or 'no split'!r} in the cache; rerun `mriprep run` with "
                        "this manifest so the cache follows it",
                        (key,),
                        (ident[0],),
                    )
                )
            continue
        if name in excluded or ident[0] in excluded:
            excluded_rows.append(name)
            continue
        result = reported.get(ident) or reported.get((ident[0], ""))
        if result is not None and result.failed:
            at = f" at stage {result.stage!r}" if result.stage else ""
            findings.append(
                Finding(
                    "manifest-failed",
                    f"{name} failed preprocessing{at} and is not cached: "
                    f"{result.reason or 'no reason recorded'}. Fix it and rerun, or, "
                    "to train without it on purpose, list it in an exclusions file "
                    "(`mriprep check --exclude FILE`)",
                    (),
                    (ident[0],),
                )
            )
            continue
        missing.append(name)
        missing_subjects.append(ident[0])
    if missing:
        why = (
            "no run report at reports/latest.json lists them as failed"
            if run_report is None
            else "the run report does not list them as failed"
        )
        findings.append(
            Finding(
                "manifest-missing",
                f"{len(missing)} row(s) of {manifest_name} are not in the cache and {why}: "
                f"{named(missing)}; run `mriprep run` on the manifest to complete the cache",
                (),
                tuple(sorted(set(missing_subjects))),
            )
        )
    if excluded_rows:
        findings.append(
            Finding(
                "manifest-excluded",
                f"{len(excluded_rows)} row(s) of {manifest_name} are not cached and listed "
                f"as known exclusions: {named(excluded_rows)}",
                (),
                tuple(sorted({n.split('/')[0] for n in excluded_rows})),
            )
        )
    extra = sorted(k for ident, k in cached.items() if ident not in listed)
    if extra:
        findings.append(
            Finding(
                "not-in-manifest",
                f"{len(extra)} cache entr{'y is' if len(extra) == 1 else 'ies are'} not in "
                f"{manifest_name}: {named([index[k].finding_name for k in extra])}; "
                "a Dataset over the cache will still train on them",
                tuple(extra),
                subjects_of(index, extra),
            )
        )
    return findings


def manifest_rows(manifest: Any) -> list[Any]:
    """The rows of a Manifest (anything with ``rows``), or of the manifest file at a path."""
    if hasattr(manifest, "rows"):
        return list(manifest.rows)
    from mriprep.inputs.manifest import read_manifest

    # The images need not be on the training machine: only the ids and splits matter.
    return list(read_manifest(manifest, check_files=False).rows)


def manifest_name(manifest: Any) -> str:
    """How messages name a manifest: its path when known, else ``"the manifest"``."""
    if getattr(manifest, "path", None):
        return str(manifest.path)
    return "the manifest" if hasattr(manifest, "rows") else str(manifest)


def read_exclusions(path: str | Path) -> set[str]:
    """Row names from an exclusions file: one ``subject`` or ``subject/session`` per line;
    blank lines and text after ``#`` are ignored."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CacheError(f"cannot read the exclusions file {path}: {exc}; give a text file "
                         "with one subject (or subject/session) per line") from exc
    names = {line.split("#", 1)[0].strip() for line in text.splitlines()}
    return {n for n in names if n}
