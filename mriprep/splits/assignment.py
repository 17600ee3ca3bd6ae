"""Assign splits by subject, never by scan, reproducibly, in the counts asked for.

:func:`assign_splits` gives every subject of a manifest one split, so that no person's
anatomy is in two splits, and meets the fractions to within one subject per split
(:func:`split_targets`), within each stratum too when asked. The order in which subjects
are drawn comes from a hash of the id and a seed (:func:`subject_draw`), so the same seed
and cohort always give the same splits; subjects that already carry a split keep it
unless asked otherwise, which is how a cohort grows without moving anyone. Fractions are
written ``train=0.8,val=0.1,test=0.1`` (:func:`parse_fractions`).
:func:`assign_folds` adds K-fold cross-validation folds on top. The rows are returned
with their split (or fold) set; nothing is written.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from mriprep.core.findings import named
from mriprep.core.hashing import sha256_bytes


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
    digest = sha256_bytes(f"mriprep-split\0{seed}\0{subject_id}")
    return int.from_bytes(digest[:8], "big") / 2.0**64


@dataclass
class Assignment:
    """The result of :func:`assign_splits`: the new rows and how they were obtained."""

    rows: list[Any]
    kept: int = 0
    assigned: int = 0
    targets: dict[str, int] = field(default_factory=dict)
    strata: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def split_targets(n: int, fractions: Mapping[str, float]) -> dict[str, int]:
    """Whole subjects per split for ``n`` subjects: within one subject of each fraction
    (largest remainder; ties to the split named first), and no split that was given a
    fraction above 0 left empty while ``n`` allows one subject each (the subject moves
    from the split furthest above its share)."""
    names = list(fractions)
    ideal = {k: fractions[k] * n for k in names}
    counts = {k: math.floor(ideal[k] + 1e-9) for k in names}
    for k in sorted(names, key=lambda k: (counts[k] - ideal[k], names.index(k)))[
            : n - sum(counts.values())]:
        counts[k] += 1
    wanted = [k for k in names if fractions[k] > 0]
    if n >= len(wanted):
        for k in wanted:
            if counts[k] == 0:
                donor = max((d for d in wanted if counts[d] > 1),
                            key=lambda d: (counts[d] - ideal[d], -names.index(d)))
                counts[donor] -= 1
                counts[k] += 1
    return counts


def assign_splits(
    rows: Sequence[Any],
    fractions: Mapping[str, float],
    seed: int | str = 0,
    stratify: str | None = None,
    reassign: bool = False,
) -> Assignment:
    """Give every subject one split, deterministically, never splitting a subject, in
    counts that meet the fractions to within one subject.

    Parameters
    ----------
    rows : sequence of ManifestRow
        The manifest rows (several per subject when it has sessions).
    fractions : mapping
        Split name -> target fraction of subjects, summing to 1 (see
        :func:`parse_fractions`); the order given breaks ties. A split with fraction 0
        stays empty; every other split gets at least one subject when there are enough.
    seed : int or str
        Changes the draw; the same seed and subjects always give the same splits.
    stratify : str, optional
        A metadata column (e.g. ``"site"`` or ``"sex"``): each of its values gets the
        fractions as closely as whole subjects allow, while the totals still meet them
        to within one subject. Categorical values only. A value with fewer subjects than
        splits cannot be in every split: a note says so.
    reassign : bool
        Ignore the splits already in the manifest. By default a subject whose rows already
        carry one split keeps it, and only unassigned subjects are drawn.

    Returns
    -------
    Assignment
        Rows in the input order with their split set, the target counts, per-stratum
        counts and notes.

    Notes
    -----
    The target counts come from the whole cohort (:func:`split_targets`, per stratum
    too, rounded so that the strata add up to the totals). The subjects without a split
    are taken in the order of :func:`subject_draw` (a hash of id and seed), each into
    the split furthest below its target (in its stratum, then overall). Adding subjects
    later therefore keeps every existing assignment and fills the quotas of the grown
    cohort with the new ones; the quotas are met exactly unless the kept subjects
    already overfill a split, which only a change of fractions can cause.

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
    chosen = {} if reassign else existing_splits(by_subject, "split")
    result = Assignment(rows=[], kept=len(chosen))
    strata = _strata(by_subject, stratify, result.notes)
    result.targets = split_targets(len(by_subject), fractions)
    stratum_targets = _stratum_targets(strata, fractions, result.targets)
    totals = Counter(chosen[s] for s in chosen if chosen[s] in names)
    for value, subjects in sorted(strata.items()):
        counts = Counter(chosen[s] for s in subjects if s in chosen)
        pending = sorted((s for s in subjects if s not in chosen),
                         key=lambda s: (subject_draw(s, seed), s))
        target = stratum_targets[value]
        for subject in pending:
            split = max(names, key=lambda n: (target[n] - counts[n],
                                              result.targets[n] - totals[n], -names.index(n)))
            counts[split] += 1
            totals[split] += 1
            chosen[subject] = split
        if stratify is not None:
            result.strata[value or "(empty)"] = {n: counts[n] for n in names}
            present = sum(1 for n in names if fractions[n] > 0)
            if len(subjects) < present:
                result.notes.append(
                    f"{stratify} {value or '(empty)'!r} has {len(subjects)} subject(s), too few "
                    f"for all {present} splits: it is in "
                    f"{', '.join(n for n in names if counts[n])} only"
                )
        result.assigned += len(pending)
    result.rows = [dataclasses.replace(row, split=chosen[row.subject_id]) for row in rows]
    return result


def existing_splits(by_subject: Mapping[str, list[Any]], column: str) -> dict[str, str]:
    """Subject -> the one value its rows carry in ``column`` (``split``, or a metadata
    column such as ``fold``); subjects without one are left out.

    Raises
    ------
    ValueError
        Some subject's rows carry several values.
    """
    def value_of(row):
        return row.split if column == "split" else row.metadata.get(column, "")

    chosen, conflicts = {}, []
    for subject, subject_rows in by_subject.items():
        values = {value_of(r) for r in subject_rows if value_of(r)}
        if len(values) > 1:
            conflicts.append(f"{subject} ({', '.join(sorted(values))})")
        elif values:
            chosen[subject] = values.pop()
    if conflicts:
        what = "splits" if column == "split" else f"{column} values"
        raise ValueError(
            f"{len(conflicts)} subject(s) already have scans in several {what}: "
            f"{named(conflicts)}; fix the manifest or pass reassign=True to draw every "
            "subject again"
        )
    return chosen


def _strata(by_subject: Mapping[str, list[Any]], stratify: str | None,
            notes: list[str]) -> dict[str, list[str]]:
    """Stratum value -> its subjects (one stratum, "", without ``stratify``)."""
    if stratify is None:
        return {"": list(by_subject)}
    columns = {k for rows in by_subject.values() for row in rows for k in row.metadata}
    if stratify not in columns:
        raise ValueError(
            f"cannot stratify by {stratify!r}: the manifest has no such column "
            f"(its extra columns: {', '.join(sorted(columns)) or 'none'})"
        )
    strata: dict[str, list[str]] = defaultdict(list)
    for subject, subject_rows in by_subject.items():
        values = sorted({r.metadata.get(stratify, "") for r in subject_rows})
        if len(values) > 1:
            notes.append(f"subject {subject} has several {stratify} values {values}; "
                         f"stratified by {values[0]!r}")
        strata[values[0]].append(subject)
    return strata


def _stratum_targets(strata: Mapping[str, list[str]], fractions: Mapping[str, float],
                     totals: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Per stratum, whole subjects per split whose rows add up to the stratum's size and
    whose columns add up to ``totals`` wherever rounding allows: each cell is its share
    rounded down (less where the totals took a subject from a split so that another is
    not empty), and the units left go to the cells of largest remainder that both their
    stratum and their split still have room for."""
    names = list(fractions)
    ideal = {v: {k: len(s) * fractions[k] for k in names} for v, s in strata.items()}
    cells = {v: {k: math.floor(x + 1e-9) for k, x in row.items()} for v, row in ideal.items()}
    room_in_split = {k: totals[k] - sum(cells[v][k] for v in cells) for k in names}
    room_in_stratum = {v: len(strata[v]) - sum(cells[v].values()) for v in cells}
    for k in names:  # a split the totals gave up a subject from (so none stays empty)
        while room_in_split[k] < 0:
            v = max((v for v in cells if cells[v][k] > 0),
                    key=lambda v: (cells[v][k] - ideal[v][k], v))
            cells[v][k] -= 1
            room_in_split[k] += 1
            room_in_stratum[v] += 1
    remainders = sorted(((ideal[v][k] - cells[v][k], v, k) for v in cells for k in names),
                        key=lambda t: (-t[0], t[1], names.index(t[2])))
    for _, v, k in remainders:
        if room_in_stratum[v] > 0 and room_in_split[k] > 0:
            cells[v][k] += 1
            room_in_stratum[v] -= 1
            room_in_split[k] -= 1
    for v in cells:  # what rounding could not place within the totals
        while room_in_stratum[v] > 0:
            k = max(names, key=lambda n: (room_in_split[n], ideal[v][n] - cells[v][n],
                                          -names.index(n)))
            cells[v][k] += 1
            room_in_stratum[v] -= 1
            room_in_split[k] -= 1
    return cells


FOLD_COLUMN = "fold"


@dataclass
class FoldAssignment:
    """The result of :func:`assign_folds`."""

    rows: list[Any]
    folds: int
    kept: int = 0
    assigned: int = 0
    sizes: dict[str, int] = field(default_factory=dict)
    strata: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def assign_folds(
    rows: Sequence[Any],
    folds: int,
    seed: int | str = 0,
    stratify: str | None = None,
    within: str | None = "train",
    reassign: bool = False,
) -> FoldAssignment:
    """K-fold cross-validation folds by subject, written as a ``fold`` column (1..K).

    The subjects of split ``within`` (every subject when None) are dealt into ``folds``
    folds: all rows of one subject in one fold, so fold k's validation subjects are
    never in its training folds. The first time, scikit-learn's
    ``StratifiedGroupKFold`` (``GroupKFold``-like without ``stratify``: one stratum)
    deals them, shuffled by ``seed``: deterministic. Subjects that already carry a fold
    keep it (unless ``reassign``), and those without one go, in the order of their
    :func:`subject_draw`, to the fold with the fewest subjects of their stratum (then
    overall): a grown cohort moves nobody, which scikit-learn's splitters cannot do.
    Rows outside ``within`` get an empty fold.

    Raises
    ------
    ValueError
        ``folds`` < 2, fewer subjects than folds, a subject in several folds, or a
        ``stratify`` column that does not exist.
    """
    if folds < 2:
        raise ValueError(f"folds={folds}: K-fold needs at least 2 folds")
    members: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        if within is None or row.split == within:
            members[row.subject_id].append(row)
    where = f"split {within!r}" if within is not None else "the manifest"
    if len(members) < folds:
        raise ValueError(f"{where} has {len(members)} subject(s), fewer than the {folds} "
                         "folds asked for")
    result = FoldAssignment(rows=[], folds=folds)
    strata = _strata(members, stratify, result.notes)
    chosen = {} if reassign else existing_splits(members, FOLD_COLUMN)
    names = [str(k) for k in range(1, folds + 1)]
    strange = sorted({v for v in chosen.values() if v not in names})
    if strange:
        raise ValueError(f"the manifest's {FOLD_COLUMN} column holds {', '.join(strange)}, "
                         f"not folds 1..{folds}; pass reassign=True to deal the folds again")
    result.kept = len(chosen)
    stratum_of = {s: v for v, subjects in strata.items() for s in subjects}
    if not chosen:
        chosen = _sklearn_folds(members, stratum_of, folds, seed, result.notes)
    else:
        sizes = Counter(chosen.values())
        per_stratum = Counter((stratum_of[s], f) for s, f in chosen.items())
        for subject in sorted((s for s in members if s not in chosen),
                              key=lambda s: (subject_draw(s, seed), s)):
            v = stratum_of[subject]
            fold = min(names, key=lambda f: (per_stratum[(v, f)], sizes[f], names.index(f)))
            chosen[subject] = fold
            sizes[fold] += 1
            per_stratum[(v, fold)] += 1
    result.assigned = len(members) - result.kept
    result.sizes = {f: sum(1 for s in members if chosen[s] == f) for f in names}
    if stratify is not None:
        result.strata = {(v or "(empty)"): {f: sum(1 for s in subjects if chosen[s] == f)
                                            for f in names}
                         for v, subjects in sorted(strata.items())}
        small = [v or "(empty)" for v, subjects in strata.items() if len(subjects) < folds]
        if small:
            result.notes.append(f"{stratify} value(s) {', '.join(sorted(small))} have fewer "
                                f"subjects than the {folds} folds: not in every fold")
    result.rows = [
        dataclasses.replace(row, metadata={**row.metadata,
                                           FOLD_COLUMN: chosen.get(row.subject_id, "")
                                           if row.subject_id in members else ""})
        for row in rows
    ]
    return result


def _sklearn_folds(members: Mapping[str, list[Any]], stratum_of: Mapping[str, str],
                   folds: int, seed: int | str, notes: list[str]) -> dict[str, str]:
    """Subject -> fold ("1".."K") by ``StratifiedGroupKFold`` over the subjects' rows."""
    import warnings

    import numpy as np
    from sklearn.model_selection import StratifiedGroupKFold

    rows = [(s, r) for s, subject_rows in sorted(members.items()) for r in subject_rows]
    groups = np.array([s for s, _ in rows])
    labels = np.array([stratum_of[s] for s, _ in rows])
    random_state = int.from_bytes(sha256_bytes(f"mriprep-folds\0{seed}")[:4], "big")
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=random_state)
    chosen = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, (_, held_out) in enumerate(splitter.split(groups, labels, groups), start=1):
            for i in held_out:
                chosen[str(groups[i])] = str(k)
    for warning in caught:  # e.g. a stratum smaller than K: the note below says it plainly
        if "least populated class" not in str(warning.message):
            notes.append(f"scikit-learn: {warning.message}")
    return chosen
