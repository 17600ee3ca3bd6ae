"""`mriprep check`'s identity search: one person's anatomy under two subject ids.

For every group of entries of one pipeline and grid, the identity descriptors (made by
the check's tensor pass, :mod:`mriprep.check.tensors`) are compared pairwise by
:func:`~mriprep.splits.find_identity_matches`:

* on the reference grid (``t1w_mni_rigid``'s MNI152 1 mm, :mod:`mriprep.splits.reference`)
  as deviations from the shipped reference population, so that a pair's score does not
  depend on who else is in the cache: from 2 entries on, whatever the cache holds;
* on any other grid as deviations from the group's own mean (nothing else describes an
  average person there), from :data:`COHORT_CENTRED_MIN` entries on; a smaller group is
  said to be too few to judge in the search's summary (``notes``). Without registration (no ``transform.tfm``, e.g.
  ``conform_1mm``) two scans of one person are not on one grid, and only identical
  acquisitions are found: the search's summary says so.

A group whose deviations are mostly shared (:data:`~mriprep.splits.identity.
UNIFORM_DEVIATION`) is an ``identity-too-uniform`` warning: the pairs it names may be one
person or one scanner.

The matched pairs are joined into people: the subject ids linked by a chain of matches
are one person, and one finding (:func:`person_finding`) names them all with their
splits, the strongest and the weakest pair, and keeps every pair in its ``details``
(``--json``). One person under 5 ids is one finding, not 10 pairs. Its code:
``identity-leak`` (error) when matches at or above the error threshold join ids of two
splits, ``possible-identity-leak`` (warning) when the person spans two splits only
through weaker matches, ``near-duplicate`` (warning) when all its ids are in one split
(or have none).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from mriprep.cache import IndexEntry
from mriprep.core.findings import Finding, named
from mriprep.splits.identity import (
    COHORT_CENTRED_MIN,
    IDENTITY_ERROR,
    UNIFORM_DEVIATION,
    find_identity_matches,
    shared_deviation,
)
from mriprep.splits.reference import load_reference

# What the register stage writes into a registered entry (mriprep.stages.register's
# TRANSFORM_FILE; not imported: that module loads SimpleITK, which the check never needs).
REGISTERED_MARK = "transform.tfm"
UNREGISTERED_NOTE = ("{n} entr{ies} of pipeline {pipeline} are not registered: two scans of "
                     "one person are not on one grid there, so only identical acquisitions "
                     "(copies, re-encodings, added noise) are found, not rescans; use "
                     "t1w_mni_rigid to find one person under two ids")


def check_identity(
    index: dict[str, IndexEntry],
    fingerprints: dict[str, np.ndarray],
    threshold: float,
    method: str,
    exact_groups: list[set[str]],
    info: dict[str, Any],
) -> list[Finding]:
    """Findings for one person's anatomy under two subject ids, except pairs already
    reported as identical (``exact_groups``), and for groups too small or too uniform
    to judge. ``info`` is filled with how the search ran (``notes`` among it)."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for key in sorted(k for k, f in fingerprints.items() if k in index and f is not None):
        entry = index[key]
        groups[(entry.pipeline_hash, entry.shape or (), len(fingerprints[key]))].append(key)
    reference = load_reference()
    findings: list[Finding] = []
    notes: list[str] = []
    pairs: list[tuple[str, str, float]] = []
    searched = 0
    start = time.perf_counter()
    for keys in groups.values():
        entries = [index[k] for k in keys]
        on_reference = reference.fits(entries[0].shape or (), entries[0].affine) and all(
            reference.fits(e.shape or (), e.affine) for e in entries)
        unregistered = [e for e in entries if REGISTERED_MARK not in e.extra_files]
        if unregistered:
            notes.append(UNREGISTERED_NOTE.format(
                n=len(unregistered), ies="y" if len(unregistered) == 1 else "ies",
                pipeline=unregistered[0].pipeline_name or unregistered[0].pipeline_hash[:12]))
        if len(keys) < 2:  # nothing to compare, and nothing that could leak
            continue
        if not on_reference and len(keys) < COHORT_CENTRED_MIN:
            # a note, not a warning: two entries hold no leak worth failing --strict for
            notes.append(_too_few_note(entries))
            continue
        matrix = np.stack([fingerprints[k] for k in keys])
        centre = reference if on_reference else "cohort"
        group_info: dict[str, Any] = {}
        for i, j, corr in find_identity_matches(matrix, threshold, centre=centre,
                                                method=method, info=group_info):
            pairs.append((keys[i], keys[j], corr))
        searched += 1
        if group_info.get("entries", 0) >= info.get("entries", 0):
            info.update(group_info, centre="reference" if on_reference else "cohort")
        subjects = np.array([e.subject_id for e in entries])
        if on_reference and len(set(subjects.tolist())) > 1:
            shared = shared_deviation(matrix, subjects, centre)
            if shared >= UNIFORM_DEVIATION:
                findings.append(_too_uniform(entries, shared))
    if not searched:
        info.update(method="skipped", entries=sum(len(k) for k in groups.values()),
                    reason=f"no group of 2 entries on the reference grid or of "
                           f"{COHORT_CENTRED_MIN} on another grid")
    info["groups"] = searched
    info["seconds"] = round(time.perf_counter() - start, 4)
    if notes:
        info["notes"] = notes
    # Two ids already reported as holding identical content (any of their sessions) are
    # one finding already: a rescan of a copied subject repeats nothing new.
    reported = [{index[k].subject_id for k in g if k in index} for g in exact_groups]
    kept = []
    for a, b, corr in pairs:
        ea, eb = index[a], index[b]
        if ea.subject_id == eb.subject_id or any(
            {ea.subject_id, eb.subject_id} <= g for g in reported
        ):
            continue
        kept.append((ea, eb, corr))
    findings += [person_finding(group, threshold) for group in people(kept)]
    return findings


Pair = tuple[IndexEntry, IndexEntry, float]


def _roots(links) -> Callable[[str], str]:
    """The connected components of ``links`` (pairs of names), as a function naming the
    component of a name (union-find)."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in links:
        parent[root(a)] = root(b)
    return root


def people(pairs: list[Pair]) -> list[list[Pair]]:
    """The matched pairs joined into people: each list holds the pairs of the subject ids
    a chain of matches links, strongest pair first; the people in the order of their
    strongest pair."""
    root = _roots((ea.subject_id, eb.subject_id) for ea, eb, _ in pairs)
    groups: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        groups[root(pair[0].subject_id)].append(pair)
    ordered = [sorted(g, key=lambda p: (-p[2], p[0].finding_name, p[1].finding_name))
               for g in groups.values()]
    return sorted(ordered, key=lambda g: (-g[0][2], g[0][0].finding_name))


def _joins_splits(pairs: list[Pair]) -> bool:
    """Whether a chain of these pairs joins entries of two different splits."""
    root = _roots((ea.key, eb.key) for ea, eb, _ in pairs)
    splits: dict[str, set[str]] = defaultdict(set)
    for ea, eb, _ in pairs:
        for e in (ea, eb):
            if e.split:
                splits[root(e.key)].add(e.split)
    return any(len(s) > 1 for s in splits.values())


def person_finding(pairs: list[Pair], threshold: float) -> Finding:
    """One person under several subject ids, from the matched pairs that join them
    (one of :func:`people`).

    In two splits an ``identity-leak`` error when matches of at least
    ``max(threshold, IDENTITY_ERROR)`` alone join ids of two splits (each such link is
    the same person, so a chain of them is), else a ``possible-identity-leak`` warning;
    in one split (or without splits) a ``near-duplicate`` warning, which inflates no
    score but still counts one person twice. ``details`` keeps the ids, the splits and
    every pair with its correlation."""
    sure = max(threshold, IDENTITY_ERROR)
    entries = {e.key: e for ea, eb, _ in pairs for e in (ea, eb)}
    ordered = sorted(entries.values(), key=lambda e: (e.split or "~", e.finding_name))
    ids = sorted({e.subject_id for e in ordered})
    splits = sorted({e.split for e in ordered if e.split})
    names = named([f"{e.finding_name} ({e.split or 'no split'})" for e in ordered])

    def pair(p: Pair) -> str:
        return f"{p[2]:.3f} ({p[0].finding_name} ~ {p[1].finding_name})"

    scores = (f"identity correlation {pair(pairs[0])}" if len(pairs) == 1 else
              f"{len(pairs)} matched pairs, identity correlation from {pair(pairs[0])} "
              f"down to {pair(pairs[-1])}")
    if len(ids) == 2:
        who = {"sure": f"{names} show the same person's anatomy",
               "maybe": f"{names} may show the same person",
               "one split": f"{names} look like the same person"}
    else:
        who = {"sure": f"one person's anatomy is under {len(ids)} subject ids: {names},",
               "maybe": f"{len(ids)} subject ids may show the same person: {names},",
               "one split": f"{len(ids)} subject ids look like the same person: {names},"}
    details = {
        "ids": ids, "splits": splits,
        "strongest": round(pairs[0][2], 6), "weakest": round(pairs[-1][2], 6),
        "pairs": [{"keys": [a.key, b.key], "subjects": [a.subject_id, b.subject_id],
                   "splits": [a.split, b.split], "correlation": round(corr, 6)}
                  for a, b, corr in pairs]}
    keys, subjects = tuple(e.key for e in ordered), tuple(ids)
    if len(splits) > 1 and _joins_splits([p for p in pairs if p[2] >= sure]):
        return Finding(
            "identity-leak",
            f"{who['sure']} in {len(splits)} splits ({scores}; >= {sure} is certain): one "
            f"person in two splits makes the {'/'.join(splits)} score optimistic. Give the "
            "ids one subject id in the manifest and reassign splits by subject (`mriprep "
            "splits --assign`), then rerun `mriprep run`", keys, subjects, details)
    if len(splits) > 1:
        return Finding(
            "possible-identity-leak",
            f"{who['maybe']} in {len(splits)} splits ({scores}; from {threshold}, {sure} is "
            "certain): compare the scans, and if they are one person give them one subject "
            "id and reassign splits by subject (`mriprep splits --assign`)",
            keys, subjects, details)
    return Finding(
        "near-duplicate",
        f"{who['one split']} ({scores}, >= {threshold}); if they are one person under "
        "several ids, merge the ids in the manifest", keys, subjects, details)


def _grid(entry: IndexEntry) -> str:
    return f"pipeline {entry.pipeline_name or entry.pipeline_hash[:12]}, shape " \
           f"{list(entry.shape or ())}"


def _too_few_note(entries: list[IndexEntry]) -> str:
    return (
        f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} ({_grid(entries[0])}: "
        f"{named([e.finding_name for e in entries])}) are too few to judge identity: their "
        "grid is not the reference population's (t1w_mni_rigid's MNI152 1 mm), so they "
        f"can only be compared with their own average, which needs {COHORT_CENTRED_MIN} "
        "entries; one person under two ids is not looked for here. Preprocess with "
        "t1w_mni_rigid, or check the cohort as a whole")


def _too_uniform(entries: list[IndexEntry], shared: float) -> Finding:
    return Finding(
        "identity-too-uniform",
        f"{len(entries)} entries ({_grid(entries[0])}) deviate from the reference "
        f"population alike (mean identity correlation of different ids {shared:.2f} >= "
        f"{UNIFORM_DEVIATION}): either one person is under most of their ids, or the "
        "images differ from the reference people all the same way (another contrast, "
        "scanner or population), and then different people correlate too. Identity "
        "findings here may name different people: compare the named scans",
        tuple(e.key for e in entries), tuple(sorted({e.subject_id for e in entries})))
