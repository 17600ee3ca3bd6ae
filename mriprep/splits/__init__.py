"""Honest splits: find leaks between train/val/test, and assign splits by subject.

A validation score is only honest when no person's anatomy is in two splits. This module
holds the checks that prove it, shared by ``mriprep splits`` (on a manifest, before any
preprocessing) and ``mriprep check`` (on a cache, after):

* :func:`find_unassigned`, :func:`find_subject_leaks`: every scan has a split, and all
  scans (sessions) of a subject share one;
* :func:`find_identical`: the same content (a SHA-256 of the input file, or the checksum
  of the cached tensor) under two subject ids or in two splits;
* :func:`find_near_duplicates`: images that are almost the same (the same scan re-encoded,
  re-registered or lightly edited), on small fingerprints, without comparing every pair;
* :func:`check_manifest_splits`: all of the above that need no tensors, on a manifest;
* :func:`assign_splits`: a split per subject (never per scan) from a hash of the subject
  id and a seed, so that adding subjects later does not move existing ones.

Every problem is a :class:`Finding`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

Severity = Literal["error", "warning"]

NEAR_DUPLICATE_THRESHOLD = 0.95
EXACT_SEARCH_MAX = 4096
_MAX_NAMED = 8  # items named in one message; the finding's keys list them all


@dataclass(frozen=True)
class Finding:
    """One problem: its severity, a stable code, a message a person can act on, and what it
    concerns: ``keys`` (cache keys for ``check``, manifest lines such as ``"line 12"`` for
    ``splits``) and ``subjects`` (subject ids)."""

    severity: Severity
    code: str
    message: str
    keys: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "keys": list(self.keys),
            "subjects": list(self.subjects),
        }


class FindingsMixin:
    """``errors``, ``warnings`` and ``ok`` of a report holding a ``findings`` list."""

    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class SplitItem:
    """One scan as the split checks see it: a cache entry or a manifest row.

    ``ref`` identifies it in findings (a cache key, or ``"line 12"``); ``name`` is how
    messages show it.
    """

    ref: str
    subject_id: str
    session_id: str
    split: str
    name: str


def named(labels: Sequence[str]) -> str:
    """A list of names for a message, cut after a few."""
    shown = ", ".join(labels[:_MAX_NAMED])
    more = len(labels) - _MAX_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def _entries(n: int) -> str:
    return f"{n} scan{'' if n == 1 else 's'}"


# -- leaks -----------------------------------------------------------------------------


def find_unassigned(items: Iterable[SplitItem], fix: str) -> list[Finding]:
    """One error listing every scan without a split; ``fix`` says how to assign them."""
    loose = sorted((i for i in items if not i.split), key=lambda i: i.name)
    if not loose:
        return []
    return [
        Finding(
            "error",
            "split-missing",
            f"{_entries(len(loose))} {'has' if len(loose) == 1 else 'have'} no split: "
            f"{named([i.name for i in loose])}; {fix}",
            tuple(i.ref for i in loose),
            tuple(sorted({i.subject_id for i in loose})),
        )
    ]


def find_subject_leaks(items: Iterable[SplitItem], fix: str) -> list[Finding]:
    """One error per subject whose scans (sessions) are in more than one split."""
    by_subject: dict[str, list[SplitItem]] = defaultdict(list)
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
                    "error",
                    "subject-split-leak",
                    f"subject {subject} is in {len(sessions)} splits ({where}): its scans "
                    f"leak between training and evaluation; {fix}",
                    tuple(sorted(s.ref for s in scans)),
                    (subject,),
                )
            )
    return findings


def find_identical(
    items: Iterable[SplitItem],
    hashes: Mapping[str, Iterable[str]],
    code: str,
    what: str,
    already_reported: list[set[str]] | None = None,
) -> list[Finding]:
    """Scans sharing a content hash under two subject ids or in two splits (errors).

    Parameters
    ----------
    items : iterable of SplitItem
    hashes : mapping
        ``ref`` -> the content hashes of that scan (e.g. the SHA-256 of its input image).
    code : str
        Finding code, e.g. ``"duplicate-input"``.
    what : str
        What the hash is of, with ``{}`` for the hash, e.g. ``"input image (sha256 {})"``.
    already_reported : list of set, optional
        Groups of refs already reported (by another hash); a group inside one of them is
        not reported again. The groups found here are appended.

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
        scans = sorted((items[r] for r in refs), key=lambda i: i.name)
        subjects = sorted({s.subject_id for s in scans})
        splits = sorted({s.split or "(none)" for s in scans})
        where = named([f"{s.name} ({s.split or 'no split'})" for s in scans])
        label = what.format(digest[:16])
        if len(subjects) == 1 and len(splits) == 1:
            findings.append(
                Finding(
                    "warning",
                    "duplicate-session",
                    f"the same {label} appears for {_entries(len(scans))} of subject "
                    f"{subjects[0]}: {where}; drop the repeated scan from the manifest",
                    tuple(s.ref for s in scans),
                    tuple(subjects),
                )
            )
            continue
        findings.append(
            Finding(
                "error",
                code,
                f"the same {label} appears {len(scans)} times under {len(subjects)} subject "
                f"id(s) in {len(splits)} split(s): {where}. One scan counted twice leaks "
                "between splits or inflates the score; keep one copy in the manifest",
                tuple(s.ref for s in scans),
                tuple(subjects),
            )
        )
    return findings


# -- near-duplicates -------------------------------------------------------------------


def normalise_fingerprints(fingerprints: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centre fingerprints on the cohort mean and scale each to zero mean, unit norm.

    Registered brains share most of their coarse anatomy, so the raw block means of two
    different people correlate highly; only the deviation from the cohort identifies a
    scan. Returns the normalised rows (float32) and a mask of usable rows (a row equal to
    the cohort mean carries no identity). The dot product of two normalised rows is the
    Pearson correlation of their deviations from the cohort.
    """
    f = np.asarray(fingerprints, dtype=np.float64)
    f = f - f.mean(axis=0, keepdims=True)
    f -= f.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(f, axis=1)
    usable = norms > 1e-9 * max(1.0, float(norms.max(initial=0.0)))
    f[usable] /= norms[usable, None]
    f[~usable] = 0.0
    return f.astype(np.float32), usable


def find_near_duplicates(
    fingerprints: np.ndarray,
    threshold: float = NEAR_DUPLICATE_THRESHOLD,
    *,
    method: str = "auto",
    seed: int = 0,
    miss_probability: float = 1e-4,
    info: dict[str, Any] | None = None,
) -> list[tuple[int, int, float]]:
    """Pairs of rows whose centred fingerprints correlate at or above ``threshold``.

    Parameters
    ----------
    fingerprints : ndarray, shape (n, d)
        One fingerprint per image (e.g. 8x8x8 block means, flattened). At least 3 rows
        are needed for the cohort centring to mean anything.
    threshold : float
        Correlation from which a pair is reported, in (0, 1).
    method : {"auto", "exact", "lsh"}
        ``exact`` compares every pair by a blocked matrix product: O(n^2 d), exact, and
        fast while n is a few thousand. ``lsh`` hashes the rows with random hyperplanes
        (SimHash) in bands and only looks at rows sharing a bucket in some band; the
        candidates are filtered by the Hamming distance of their full signatures, then
        their correlation is computed exactly, so nothing below the threshold is ever
        reported, and a pair at the threshold is missed with probability below
        ``miss_probability``. Its cost grows about as n^1.2. ``auto`` is exact up to
        :data:`EXACT_SEARCH_MAX` rows.
    seed : int
        Seed of the random hyperplanes: the same input gives the same answer.
    miss_probability : float
        LSH only: the chance of missing a pair exactly at the threshold.
    info : dict, optional
        Filled with the method used, the pairs whose correlation was computed, and the
        LSH parameters.

    Returns
    -------
    list of (i, j, correlation)
        Row indices with i < j, by decreasing correlation.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> prints = rng.standard_normal((50, 512))
    >>> prints[49] = prints[3] + 0.01 * rng.standard_normal(512)
    >>> [(i, j) for i, j, _ in find_near_duplicates(prints, 0.95)]
    [(3, 49)]
    """
    if not 0 < threshold < 1:
        raise ValueError(f"near-duplicate threshold must be in (0, 1), got {threshold}")
    info = info if info is not None else {}
    normalised, usable = normalise_fingerprints(fingerprints)
    rows = np.flatnonzero(usable)
    vectors = normalised[rows]
    n = len(rows)
    if method == "auto":
        method = "exact" if n <= EXACT_SEARCH_MAX else "lsh"
    if method not in ("exact", "lsh"):
        raise ValueError(f"unknown near-duplicate method {method!r}; use auto, exact or lsh")
    info.update(method=method, entries=int(n), threshold=threshold)
    if n < 2:
        info["pairs_compared"] = 0
        return []
    if method == "exact":
        pairs = _exact_pairs(vectors, threshold)
        info["pairs_compared"] = n * (n - 1) // 2
    else:
        candidates = _lsh_candidates(vectors, threshold, seed, miss_probability, info)
        info["pairs_compared"] = int(len(candidates))
        pairs = _verify_pairs(vectors, candidates, threshold)
    found = [(int(rows[i]), int(rows[j]), float(c)) for i, j, c in pairs]
    return sorted(found, key=lambda p: (-p[2], p[0], p[1]))


def _exact_pairs(vectors: np.ndarray, threshold: float, block: int = 1024) -> list:
    pairs = []
    n = len(vectors)
    for start in range(0, n, block):
        stop = min(n, start + block)
        sims = vectors[start:stop] @ vectors[start:].T
        sims[np.tril_indices(stop - start, 0, sims.shape[1])] = -np.inf  # keep j > i
        ii, jj = np.nonzero(sims >= threshold)
        pairs += [(start + i, start + j, sims[i, j]) for i, j in zip(ii.tolist(), jj.tolist())]
    return pairs


_POPCOUNT = np.array([bin(b).count("1") for b in range(256)], dtype=np.uint16)


def _lsh_candidates(
    vectors: np.ndarray, threshold: float, seed: int, miss_probability: float, info: dict
) -> np.ndarray:
    n, d = vectors.shape
    # A random hyperplane separates two unit vectors at angle theta with probability
    # theta/pi. With k bits per band, unrelated rows share a bucket with probability about
    # 2^-k, so k = log2(n) + 4 keeps the chance pairs per band near n/16 (real cohorts are
    # not isotropic: fewer bits let too many loosely similar pairs through); enough bands
    # make a pair at the threshold share a bucket in at least one band.
    bits = int(min(62, max(8, math.ceil(math.log2(n)) + 4)))
    p_bit = 1.0 - math.acos(threshold) / math.pi
    bands = int(math.ceil(math.log(miss_probability) / math.log1p(-(p_bit**bits))))
    info.update(bits_per_band=bits, bands=bands)
    planes = np.random.default_rng(seed).standard_normal((d, bits * bands)).astype(np.float32)
    signs = (vectors @ planes) > 0
    codes = np.packbits(
        np.pad(signs.reshape(n, bands, bits), ((0, 0), (0, 0), (0, 64 - bits))),
        axis=2,
        bitorder="little",
    ).view(np.uint64)[:, :, 0]
    pair_codes = [p for band in codes.T for p in _bucket_pairs(band)]
    if not pair_codes:
        return np.zeros((0, 2), dtype=np.int64)
    unique = np.unique(np.concatenate(pair_codes))
    candidates = np.stack([unique // n, unique % n], axis=1)
    # The full signature (bits x bands hyperplanes) estimates each candidate's angle:
    # chance collisions sit near half the bits apart, a pair at the threshold near
    # p_miss = theta/pi. A margin of 8 standard deviations loses no true pair in practice.
    signature = np.packbits(signs, axis=1)
    m = bits * bands
    q = 1.0 - p_bit
    limit = q * m + 8.0 * math.sqrt(m * q * (1 - q)) + 1
    keep = []
    for start in range(0, len(candidates), 1 << 16):
        part = candidates[start : start + (1 << 16)]
        differing = _POPCOUNT[signature[part[:, 0]] ^ signature[part[:, 1]]].sum(axis=1)
        keep.append(part[differing <= limit])
    info["lsh_candidates"] = int(len(candidates))
    return np.concatenate(keep)


def _bucket_pairs(codes: np.ndarray) -> list[np.ndarray]:
    """All pairs of rows sharing a code, each as ``i * n + j`` with i < j.

    After sorting, the rows of a bucket are contiguous: pairing every row with the one
    ``gap`` places later, for gap = 1, 2, ... until no bucket is that large, enumerates
    every pair with vector operations instead of a loop over buckets.
    """
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    pairs = []
    for gap in range(1, n):
        same = np.flatnonzero(ordered[gap:] == ordered[:-gap])
        if not same.size:
            break
        a, b = order[same], order[same + gap]
        pairs.append(np.minimum(a, b).astype(np.int64) * n + np.maximum(a, b))
    return pairs


def _verify_pairs(vectors: np.ndarray, candidates: np.ndarray, threshold: float) -> list:
    pairs = []
    for start in range(0, len(candidates), 4096):
        part = candidates[start : start + 4096]
        corr = np.einsum("ij,ij->i", vectors[part[:, 0]], vectors[part[:, 1]])
        for k in np.flatnonzero(corr >= threshold).tolist():
            pairs.append((int(part[k, 0]), int(part[k, 1]), float(corr[k])))
    return pairs


# -- manifests -------------------------------------------------------------------------


@dataclass
class SplitsReport(FindingsMixin):
    """What :func:`check_manifest_splits` found; ``ok`` when no finding is an error."""

    manifest: str
    rows: int = 0
    findings: list[Finding] = field(default_factory=list)
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    files_hashed: int = 0


    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "ok": self.ok,
            "rows": self.rows,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.to_json() for f in self.findings],
            "splits": self.splits,
            "files_hashed": self.files_hashed,
        }


def row_item(row: Any) -> SplitItem:
    """A manifest row (``mriprep.inputs.manifest.ManifestRow``) as a :class:`SplitItem`."""
    session = row.session_id or ""
    name = f"{row.subject_id}/{session}" if session else row.subject_id
    return SplitItem(
        f"line {row.row}", row.subject_id, session, row.split, f"{name} (line {row.row})"
    )


def split_counts(rows: Iterable[Any]) -> dict[str, dict[str, int]]:
    """Split name (``""`` for unassigned) -> numbers of subjects and scans."""
    subjects: dict[str, set] = defaultdict(set)
    scans: Counter = Counter()
    for row in rows:
        subjects[row.split].add(row.subject_id)
        scans[row.split] += 1
    return {s: {"subjects": len(subjects[s]), "scans": scans[s]} for s in sorted(scans)}


def hash_images(paths: Iterable[Path], workers: int | None = None) -> dict[Path, str]:
    """SHA-256 of every file that shares its byte size with another one.

    Files of different sizes cannot be identical, so most of a cohort is never read.
    """
    from mriprep.cache import sha256_file

    by_size: dict[int, list[Path]] = defaultdict(list)
    for path in set(paths):
        by_size[path.stat().st_size].append(path)
    suspects = sorted(p for group in by_size.values() if len(group) > 1 for p in group)
    workers = workers or min(4, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(zip(suspects, pool.map(sha256_file, suspects)))


def check_manifest_splits(
    manifest: Any, hash_files: bool = True, workers: int | None = None
) -> SplitsReport:
    """The split checks that need no tensors, on a manifest, before preprocessing.

    Every row has a split; all sessions of a subject share one split; no image file
    content (SHA-256) appears under two subject ids or in two splits.

    Parameters
    ----------
    manifest : Manifest
        As returned by :func:`mriprep.inputs.manifest.read_manifest`.
    hash_files : bool
        Compare image contents (files of equal size are hashed). Without it only ids and
        splits are checked.
    workers : int, optional
        Threads hashing files.
    """
    rows = list(manifest.rows)
    report = SplitsReport(manifest=str(getattr(manifest, "path", "")), rows=len(rows))
    items = [row_item(r) for r in rows]
    report.findings += find_unassigned(
        items, "assign splits per subject with `mriprep splits MANIFEST --assign ... -o OUT`"
    )
    report.findings += find_subject_leaks(
        items, "put every session of a subject in one split (`mriprep splits --assign --reassign`)"
    )
    if hash_files:
        digests = hash_images([r.image for r in rows], workers)
        report.files_hashed = len(digests)
        hashes = {
            item.ref: [digests[r.image]] for item, r in zip(items, rows) if r.image in digests
        }
        report.findings += find_identical(
            items, hashes, "duplicate-input", "image file (sha256 {})"
        )
    report.splits = split_counts(rows)
    return report


# -- assignment ------------------------------------------------------------------------


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
