"""Leaks between splits, found on scans described only by their ids and split.

The checks here read no file: each takes :class:`SplitMember` records (a cache entry for
``mriprep check``, a manifest row for ``mriprep splits``) and returns every problem as a
:class:`~mriprep.core.findings.Finding`, naming the scans by their ``ref``:

* :func:`find_unassigned`: every scan has a split (``split-missing``);
* :func:`find_subject_leaks`: all scans (sessions) of a subject share one split
  (``subject-split-leak``);
* :func:`find_identical`: the same content, given as hashes by the caller, under two
  subject ids or in two splits (an error under the caller's code), or repeated within one
  subject and split (``duplicate-session``, a warning).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping, Protocol

from mriprep.core.findings import Finding, named


class SplitMember(Protocol):
    """One scan as the split checks see it: a manifest row
    (:class:`~mriprep.inputs.manifest.ManifestRow`) or a cache entry
    (:class:`~mriprep.cache.IndexEntry`), both of which have these fields.

    ``ref`` identifies it in findings (a cache key, or ``"line 12"``); ``finding_name``
    is how messages show it.
    """

    @property
    def ref(self) -> str: ...
    @property
    def subject_id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def split(self) -> str: ...
    @property
    def finding_name(self) -> str: ...


def _entries(n: int) -> str:
    return f"{n} scan{'' if n == 1 else 's'}"


def find_unassigned(items: Iterable[SplitMember], fix: str) -> list[Finding]:
    """One error listing every scan without a split; ``fix`` says how to assign them."""
    loose = sorted((i for i in items if not i.split), key=lambda i: i.finding_name)
    if not loose:
        return []
    return [
        Finding(
            "split-missing",
            f"{_entries(len(loose))} {'has' if len(loose) == 1 else 'have'} no split: "
            f"{named([i.finding_name for i in loose])}; {fix}",
            tuple(i.ref for i in loose),
            tuple(sorted({i.subject_id for i in loose})),
        )
    ]


def find_subject_leaks(items: Iterable[SplitMember], fix: str) -> list[Finding]:
    """One error per subject whose scans (sessions) are in more than one split."""
    by_subject: dict[str, list[SplitMember]] = defaultdict(list)
    for item in items:
        by_subject[item.subject_id].append(item)
    findings = []
    for subject, scans in sorted(by_subject.items()):
        sessions: dict[str, list[str]] = defaultdict(list)
        for scan in scans:
            if scan.split:
                sessions[scan.split].append(scan.session_id or "(no session)")
        if len(sessions) > 1:
            where = "; ".join(
                f"{split}: {', '.join(sorted(s))}" for split, s in sorted(sessions.items())
            )
            findings.append(
                Finding(
                    "subject-split-leak",
                    f"subject {subject} is in {len(sessions)} splits ({where}): its scans "
                    f"leak between training and evaluation; {fix}",
                    tuple(sorted(s.ref for s in scans)),
                    (subject,),
                )
            )
    return findings


def find_identical(
    items: Iterable[SplitMember],
    hashes: Mapping[str, Iterable[str]],
    code: str,
    what: str,
    already_reported: list[set[str]] | None = None,
) -> list[Finding]:
    """Scans sharing a content hash under two subject ids or in two splits (errors).

    Parameters
    ----------
    items : iterable of SplitMember
    hashes : mapping
        ``ref`` -> the content hashes of that scan (e.g. the SHA-256 of its input image).
    code : str
        Finding code, e.g. ``"duplicate-input"``.
    what : str
        What the hash is of, with ``{}`` for the hash, e.g. ``"input image (sha256 {})"``.
    already_reported : list of set, optional
        Groups of refs already reported (by another hash); a group inside one of them is
        not reported again. The groups found here are appended.

    Notes
    -----
    Repeats of one scan within a single subject and split are warnings
    (``duplicate-session``): they leak nothing but weigh one scan twice.
    """
    items = {i.ref: i for i in items}
    reported = already_reported if already_reported is not None else []
    groups: dict[str, set[str]] = defaultdict(set)
    for ref, digests in hashes.items():
        if ref in items:
            for digest in digests:
                groups[digest].add(ref)
    findings = []
    for digest, refs in sorted(groups.items()):
        if len(refs) < 2 or any(refs <= seen for seen in reported):
            continue
        reported.append(set(refs))
        scans = sorted((items[r] for r in refs), key=lambda i: i.finding_name)
        subjects = sorted({s.subject_id for s in scans})
        splits = sorted({s.split or "(none)" for s in scans})
        where = named([f"{s.finding_name} ({s.split or 'no split'})" for s in scans])
        hashed = what.format(digest[:16])
        if len(subjects) == 1 and len(splits) == 1:
            findings.append(
                Finding(
                    "duplicate-session",
                    f"the same {hashed} appears for {_entries(len(scans))} of subject "
                    f"{subjects[0]}: {where}; drop the repeated scan from the manifest",
                    tuple(s.ref for s in scans),
                    tuple(subjects),
                )
            )
            continue
        findings.append(
            Finding(
                code,
                f"the same {hashed} appears {len(scans)} times under {len(subjects)} subject "
                f"id(s) in {len(splits)} split(s): {where}. One scan counted twice leaks "
                "between splits or inflates the score; keep one copy in the manifest",
                tuple(s.ref for s in scans),
                tuple(subjects),
            )
        )
    return findings

