"""The last check's findings, kept in the cache: ``CACHE/check/findings.json``.

``mriprep check`` (:func:`mriprep.check.check_cache`) writes what it found into the
cache, atomically: when, with which options (the ``--lut`` table and its hash), every
finding with the entries it names, and the state of every entry it judged (its key and
its files' checksums). Three readers use it:

- ``mriprep export --exclude-flagged`` and ``MRIDataset(exclude_flagged=...)`` leave out
  the entries it flags (:func:`exclude_flagged`);
- the QC report shows each entry's findings beside its per-structure table.

A record is only as good as the cache state it judged: an entry rebuilt since (its files'
checksums changed), or made after it (a key the record does not hold), is *stale*, and a
reader that would act on the record refuses it, naming the entries and the command that
judges them again (:meth:`CheckRecord.stale`).

The record belongs to the cache because the cache owns its folder, as the run report
does (:mod:`mriprep.cache.run_report`): its readers need no part of the check.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from mriprep.cache.entry import IndexEntry
from mriprep.core.atomic import write_text
from mriprep.core.errors import CacheError
from mriprep.core.findings import named

RECORD_DIR = "check"
RECORD_FILE = "findings.json"
RECORD_FORMAT = "mriprep-check-findings"
RECORD_VERSION = 1
# A finding's severity, lowest first: exclusion takes those at or above its choice.
SEVERITIES = ("info", "warning", "error")
# What ``exclude_flagged=`` takes besides True (warnings and errors) and False.
EXCLUDE_CHOICES = ("warning", "error")


def record_path(cache_root: str | os.PathLike) -> Path:
    """Where a cache keeps its last check's findings (it may not exist)."""
    return Path(cache_root) / RECORD_DIR / RECORD_FILE


def entry_state(entry: IndexEntry) -> dict[str, Any]:
    """What identifies the state of an entry a check judged: its ids, split and its
    tensors' checksums (the key itself is the record's key)."""
    return {"subject_id": entry.subject_id, "session_id": entry.session_id,
            "split": entry.split,
            "files": {name: record.xxh3_128 for name, record in sorted(entry.files.items())}}


@dataclass(frozen=True)
class KeptFinding:
    """A finding as the record keeps it (the JSON form of
    :class:`~mriprep.core.findings.Finding`)."""

    code: str
    severity: str
    message: str
    keys: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()

    @property
    def alone(self) -> bool:
        """True when the finding concerns one entry alone (not a pair or a split)."""
        return len(self.keys) == 1

    def at_least(self, severity: str) -> bool:
        return SEVERITIES.index(self.severity) >= SEVERITIES.index(severity)

    @classmethod
    def from_json(cls, doc: Any) -> "KeptFinding":
        if not isinstance(doc, Mapping) or doc.get("severity") not in SEVERITIES \
                or not isinstance(doc.get("code"), str):
            raise ValueError(f"not a finding: {str(doc)[:80]!r}")
        return cls(doc["code"], doc["severity"], str(doc.get("message", "")),
                   tuple(str(k) for k in doc.get("keys") or ()),
                   tuple(str(s) for s in doc.get("subjects") or ()))

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "message": self.message,
                "keys": list(self.keys), "subjects": list(self.subjects)}


@dataclass(frozen=True)
class CheckRecord:
    """The findings of one check and the cache state it judged.

    ``entries`` maps each judged key to :func:`entry_state` (plus ``label_voxels``, the
    voxels per label value its map held, when it has one); ``options`` are the check's
    (``dtype``, ``label_table`` with its ``source`` and ``sha256``, ...) and
    ``flags_again`` the command-line options that check the cache the same way (``--lut
    dkt``: :meth:`again`); ``label_names`` names the label values of the cohort from the
    check's label table; ``regions`` names the archive of the spatial label findings'
    voxels (:mod:`mriprep.cache.check_regions`) and what it holds per entry.
    """

    made: str
    version: str
    ok: bool
    options: Mapping[str, Any]
    flags_again: str
    entries: Mapping[str, Mapping[str, Any]]
    findings: tuple[KeptFinding, ...]
    label_names: Mapping[int, str] = field(default_factory=dict)
    # The flagged regions' archive (mriprep.cache.check_regions): its file and SHA-256,
    # and per entry, per code, how many voxels were flagged and kept. Empty in a record
    # written before regions were kept.
    regions: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def findings_of(self, key: str) -> list[KeptFinding]:
        """Every finding that names entry ``key``, alone or with others."""
        return [f for f in self.findings if key in f.keys]

    def flags(self, key: str, severity: str = "warning") -> list[KeptFinding]:
        """The findings at ``severity`` or above that concern entry ``key`` alone: what
        exclusion leaves it out for."""
        return [f for f in self.findings if f.alone and f.keys[0] == key
                and f.at_least(severity)]

    def stale(self, entries: Iterable[IndexEntry]) -> dict[str, str]:
        """Key -> why the record cannot speak for that entry: made after the check (the
        record does not hold its key), or rebuilt since (its files changed). Empty when
        the record judged every entry as it is now."""
        out = {}
        unjudged = ("not judged: the last check judged no entry (it could not read the "
                    "cache's index)" if not self.entries else
                    "not judged: made after the check")
        for entry in entries:
            judged = self.entries.get(entry.key)
            if judged is None:
                out[entry.key] = unjudged
            elif judged.get("files") != entry_state(entry)["files"]:
                out[entry.key] = "rebuilt since the check: its files changed"
        return out

    def regions_of(self, key: str) -> dict[str, Mapping[str, Any]]:
        """Code -> ``{"voxels", "kept", "whole_map"}`` of entry ``key``'s flagged
        regions as the check kept them (empty: none, or none kept)."""
        found = (self.regions.get("entries") or {}).get(key)
        return dict(found) if isinstance(found, Mapping) else {}

    def label_voxels(self, key: str) -> dict[int, int] | None:
        """Voxels per label value of entry ``key``'s map as the check counted them."""
        counts = self.entries.get(key, {}).get("label_voxels")
        if not isinstance(counts, Mapping):
            return None
        return {int(v): int(c) for v, c in counts.items()}

    def again(self, cache_root: str | os.PathLike) -> str:
        """The command that checks ``cache_root`` as this record's check did (the cache
        may have moved since: the record does not name its folder)."""
        return " ".join(filter(None, ("mriprep check", shlex.quote(str(cache_root)),
                                      self.flags_again)))

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else "the check record"

    def to_json(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, "version": RECORD_VERSION, "made": self.made,
                "mriprep": self.version, "ok": self.ok, "options": dict(self.options),
                "flags_again": self.flags_again,
                "label_names": {str(v): n for v, n in sorted(self.label_names.items())},
                "regions": dict(self.regions),
                "entries": {k: dict(v) for k, v in sorted(self.entries.items())},
                "findings": [f.to_json() for f in self.findings]}

    @classmethod
    def from_json(cls, doc: Any, path: Path | None = None) -> "CheckRecord":
        """Raises ValueError when ``doc`` is not a check record of this version."""
        if not isinstance(doc, Mapping) or doc.get("format") != RECORD_FORMAT:
            raise ValueError(f"it is not an mriprep check record (format "
                             f"{doc.get('format') if isinstance(doc, Mapping) else None!r})")
        if doc.get("version") != RECORD_VERSION:
            raise ValueError(f"it is version {doc.get('version')!r}; this mriprep reads "
                             f"version {RECORD_VERSION}")
        entries = doc.get("entries")
        if not isinstance(entries, Mapping) or not all(
                isinstance(v, Mapping) for v in entries.values()):
            raise ValueError("its 'entries' is not a mapping of entry states")
        names = doc.get("label_names") or {}
        return cls(made=str(doc.get("made", "")), version=str(doc.get("mriprep", "")),
                   ok=bool(doc.get("ok")), options=dict(doc.get("options") or {}),
                   flags_again=str(doc.get("flags_again", "")), entries=dict(entries),
                   findings=tuple(KeptFinding.from_json(f) for f in doc.get("findings", ())),
                   label_names={int(v): str(n) for v, n in names.items()},
                   regions=_regions(doc.get("regions")), path=path)


def _regions(doc: Any) -> dict[str, Any]:
    """A record's ``regions`` (absent in records written before regions were kept)."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping) or not isinstance(doc.get("entries", {}), Mapping):
        raise ValueError("its 'regions' is not a mapping with 'entries'")
    return dict(doc)


def write_check_record(cache_root: str | os.PathLike, record: CheckRecord) -> Path:
    """Write ``record`` into ``CACHE/check/findings.json`` atomically; OSError when the
    cache cannot be written (a read-only cache)."""
    path = record_path(cache_root)
    write_text(path, json.dumps(record.to_json(), indent=1))
    return path


def read_check_record(cache_root: str | os.PathLike) -> CheckRecord | None:
    """The last check's record of a cache; None when no check kept one.

    Raises
    ------
    CacheError
        The record exists but cannot be read or is not a check record.
    """
    path = record_path(cache_root)
    if not path.is_file():
        return None
    try:
        return CheckRecord.from_json(json.loads(path.read_text(encoding="utf-8")), path)
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError) as exc:
        # A field of the wrong type (null, a list for a mapping) is a damaged record too.
        raise CacheError(f"cannot read the check record {path}: {type(exc).__name__}: "
                         f"{exc}; run `mriprep check "
                         f"{Path(cache_root)}` again to write a new one") from exc


@dataclass(frozen=True)
class Exclusion:
    """What :func:`exclude_flagged` left out: ``excluded`` maps each left-out entry to its
    name and the findings it was left out for; ``chosen`` is how many entries were
    chosen before."""

    record: CheckRecord
    root: Path
    severity: str
    chosen: int
    excluded: Mapping[str, tuple[str, tuple[KeptFinding, ...]]]

    def lines(self) -> list[str]:
        """One line per left-out entry: its name, and each finding's code, severity and
        message."""
        return [f"{name}: " + "; ".join(f"{f.code} ({f.severity}): {f.message}"
                                        for f in found)
                for name, found in self.excluded.values()]

    def summary(self) -> str:
        what = "errors" if self.severity == "error" else "warnings or errors"
        if self.excluded:
            head = (f"left out {len(self.excluded)} of {self.chosen} entries that the check "
                    f"of {self.record.made} flagged with {what} about the entry alone "
                    f"(exclude_flagged=; the check record is {self.record.where})")
        else:
            head = (f"left out nothing (exclude_flagged=): the check of {self.record.made} "
                    f"flagged none of the {self.chosen} entries with {what} about the "
                    f"entry alone (the check record is {self.record.where})")
        if not self.record.options.get("label_table"):
            head += ("; that check ran without --lut, so no label map was judged against "
                     f"a label table: `{self.record.again(self.root)} --lut dkt` (or your "
                     "table) "
                     "judges them")
        return head

    def named(self) -> str:
        """The left-out entries with their codes, cut after a few."""
        return named([f"{name} ({', '.join(dict.fromkeys(f.code for f in found))})"
                      for name, found in self.excluded.values()])


def exclude_flagged(cache_root: str | os.PathLike, entries: list[IndexEntry],
                    exclude: bool | str) -> tuple[list[IndexEntry], Exclusion | None]:
    """``entries`` without those the last check flagged, and what was left out.

    ``exclude`` is False (nothing is read: ``entries`` and None), True or ``"warning"``
    (an entry that a warning or an error concerns alone is left out), or ``"error"``
    (errors only). Findings about several entries (an identity leak, a class absent from
    a split) leave nothing out: they are settled in the manifest, not by dropping both.
    Infos never leave anything out.

    Raises
    ------
    ValueError
        ``exclude`` is none of these.
    CacheError
        No check kept a record, or the record is stale for some of ``entries`` (rebuilt
        or made since the check): the message names them and the command to run. Or
        every entry is left out: nothing would be left to read.
    """
    if exclude is False or exclude is None:
        return list(entries), None
    severity = "warning" if exclude is True else exclude
    if severity not in EXCLUDE_CHOICES:
        raise ValueError(f"exclude_flagged={exclude!r}: choose True (leave out entries "
                         "flagged by a warning or an error), 'error' (errors only), "
                         "'warning' (as True) or False")
    root = Path(cache_root)
    record = read_check_record(root)
    if record is None:
        raise CacheError(
            f"cannot leave out the entries the last check flagged (exclude_flagged=): no "
            f"check has kept its findings in cache {root} ({record_path(root)} does not "
            f"exist); check it first: `mriprep check {root} --lut dkt` (or the --lut "
            "TABLE training uses)")
    stale = record.stale(entries)
    if stale:
        by_key = {e.key: e for e in entries}
        listed = named([f"{by_key[k].finding_name} ({why})" for k, why in stale.items()])
        raise CacheError(
            f"cannot leave out the entries the last check flagged (exclude_flagged=): the "
            f"check record {record.where} (written {record.made}) is stale for "
            f"{len(stale)} of the {len(entries)} chosen entries: {listed}; check the "
            f"cache again: `{record.again(root)}`")
    kept, excluded = [], {}
    for entry in entries:
        flags = record.flags(entry.key, severity)
        if flags:
            excluded[entry.key] = (entry.finding_name, tuple(flags))
        else:
            kept.append(entry)
    exclusion = Exclusion(record, root, severity, len(entries), excluded)
    if entries and not kept:
        raise CacheError(
            f"{exclusion.summary()}: {exclusion.named()}; nothing is left to read. Fix the "
            "entries (`mriprep check --explain CODE` says how)"
            + (", or leave out errors only (exclude_flagged='error')"
               if severity == "warning" else ""))
    return kept, exclusion
