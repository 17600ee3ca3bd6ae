"""Assign splits by subject, never by scan, reproducibly.

:func:`assign_splits` gives every subject of a manifest one split, so that no person's
anatomy is in two splits. A subject's draw (:func:`subject_draw`) comes from a hash of its
id and a seed alone, so that the same seed always gives the same splits and adding
subjects later moves none of the existing ones; subjects that already carry a split keep
it unless asked otherwise. Fractions are written ``train=0.8,val=0.1,test=0.1``
(:func:`parse_fractions`). The rows are returned with their split set (an
:class:`Assignment`); nothing is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from mriprep.core.findings import named


def parse_fractions(
    text: str, allowed: Sequence[str] = ("train", "val", "test")
) -> dict[str, float]:
    """``"train=0.8,val=0.1,test=0.1"`` -> ``{"train": 0.8, "val": 0.1, "test": 0.1}``.

    Raises
    ------
    ValueError
        When a part is not ``name=fraction``, a name is unknown or repeated, a fraction
        is outside [0, 1], or the fractions do not sum to 1.
    """
    fractions: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep:
            raise ValueError(f"{part!r} is not name=fraction (e.g. train=0.8)")
        if name not in allowed:
            raise ValueError(f"split {name!r} is not one of {', '.join(allowed)}")
        if name in fractions:
            raise ValueError(f"split {name!r} is given twice")
        try:
            fraction = float(value)
        except ValueError:
            raise ValueError(f"fraction {value!r} of {name} is not a number") from None
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction {fraction} of {name} is outside [0, 1]")
        fractions[name] = fraction
    total = sum(fractions.values())
    if not fractions or abs(total - 1) > 1e-6:
        raise ValueError(f"fractions {text!r} sum to {total:g}, not 1")
    return fractions


def subject_draw(subject_id: str, seed: int | str) -> float:
    """A number in [0, 1) fixed by the subject id and the seed alone (SHA-256 based)."""
    digest = hashlib.sha256(f"mriprep-split\0{seed}\0{subject_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


@dataclass
class Assignment:
    """The result of :func:`assign_splits`: the new rows and how they were obtained."""

    rows: list[Any]
    kept: int = 0
    assigned: int = 0
    strata: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def assign_splits(
    rows: Sequence[Any],
    fractions: Mapping[str, float],
    seed: int | str = 0,
    stratify: str | None = None,
    reassign: bool = False,
) -> Assignment:
    """Give every subject one split, deterministically, never splitting a subject.

    Parameters
    ----------
    rows : sequence of ManifestRow
        The manifest rows (several per subject when it has sessions).
    fractions : mapping
        Split name -> target fraction of subjects, summing to 1 (see
        :func:`parse_fractions`); the order given breaks ties.
    seed : int or str
        Changes the draw; the same seed and subject always give the same split.
    stratify : str, optional
        A metadata column (e.g. ``"site"`` or ``"sex"``): each of its values gets the
        fractions as closely as whole subjects allow. Categorical values only.
    reassign : bool
        Ignore the splits already in the manifest. By default a subject whose rows already
        carry one split keeps it, and only unassigned subjects are drawn, so that adding
        subjects to an assigned manifest moves nobody.

    Returns
    -------
    Assignment
        Rows in the input order with their split set, and counts.

    Notes
    -----
    Without ``stratify`` a subject's split depends only on its id and the seed: it falls
    in the split whose cumulative fraction interval holds :func:`subject_draw`. So even
    re-assigning the whole cohort after adding subjects moves nobody. With ``stratify``
    the unassigned subjects of a stratum are taken in the order of their draws, each into
    the split furthest below its target count; this keeps small strata balanced, but a
    subject's split then depends on the others in its stratum: to grow a stratified
    cohort, assign the new rows of the already-assigned manifest (existing splits are kept).

    Raises
    ------
    ValueError
        When a subject's rows carry different splits and ``reassign`` is off, or
        ``stratify`` is not a column of the manifest.
    """
    names = list(fractions)
    by_subject: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_subject[row.subject_id].append(row)
    if stratify is not None:
        columns = {k for row in rows for k in row.metadata}
        if stratify not in columns:
            raise ValueError(
                f"cannot stratify by {stratify!r}: the manifest has no such column "
                f"(its extra columns: {', '.join(sorted(columns)) or 'none'})"
            )
    result = Assignment(rows=[])
    chosen: dict[str, str] = {}
    if not reassign:
        conflicts = []
        for subject, subject_rows in by_subject.items():
            existing = {r.split for r in subject_rows if r.split}
            if len(existing) > 1:
                conflicts.append(f"{subject} ({', '.join(sorted(existing))})")
            elif existing:
                chosen[subject] = existing.pop()
        if conflicts:
            raise ValueError(
                f"{len(conflicts)} subject(s) already have scans in several splits: "
                f"{named(conflicts)}; fix the manifest or pass --reassign to draw every "
                "subject again"
            )
    result.kept = len(chosen)
    pending = sorted(
        (s for s in by_subject if s not in chosen), key=lambda s: (subject_draw(s, seed), s)
    )
    if stratify is None:
        for subject in pending:
            chosen[subject] = _by_interval(subject_draw(subject, seed), names, fractions)
    else:
        strata: dict[str, list[str]] = defaultdict(list)
        for subject, subject_rows in by_subject.items():
            values = {r.metadata.get(stratify, "") for r in subject_rows}
            if len(values) > 1:
                result.notes.append(
                    f"subject {subject} has several {stratify} values {sorted(values)}; "
                    f"stratified by {sorted(values)[0]!r}"
                )
            strata[sorted(values)[0]].append(subject)
        for value, subjects in sorted(strata.items()):
            counts = Counter(chosen[s] for s in subjects if s in chosen)
            done = sum(counts.values())
            members = set(subjects)
            for subject in (s for s in pending if s in members):
                done += 1
                split = max(names, key=lambda n: (fractions[n] * done - counts[n], -names.index(n)))
                counts[split] += 1
                chosen[subject] = split
            result.strata[value or "(empty)"] = {n: counts[n] for n in names}
    result.assigned = len(pending)
    result.rows = [dataclasses.replace(row, split=chosen[row.subject_id]) for row in rows]
    return result


def _by_interval(draw: float, names: Sequence[str], fractions: Mapping[str, float]) -> str:
    edge = 0.0
    for name in names:
        edge += fractions[name]
        if draw < edge:
            return name
    # the draw fell in the rounding gap below 1.0: the last split that takes subjects
    return [name for name in names if fractions[name] > 0][-1]
