"""The index rebuilt from the entries' own sidecars (``mriprep cache repair``).

Every entry folder holds a ``meta.json`` with everything the index lists but the split
(a split belongs to the manifest, not to the content). Repair reads each sidecar,
verifies the entry's files against it, and writes a new index of the sound ones:

* an entry whose sidecar is unreadable, unsafe or malformed, or whose files fail
  verification (missing, truncated, checksum, non-finite values), moves to
  ``CACHE/quarantine/<key>`` with a ``reason.txt``: it is never served, and nothing is
  deleted;
* an index entry that would lead outside the cache (:mod:`mriprep.cache.safety`) is
  never followed: its document is kept in ``CACHE/quarantine/unsafe-index-entries-<time>.json``
  with its reasons, and anything in ``entries/`` that no writer of mriprep made (a link,
  a folder not named by a key) moves to ``CACHE/quarantine`` as it is (a link itself, not
  what it points at), with ``<name>.reason.txt`` beside it. Nothing outside the cache
  folder is read, written or moved;
* its split comes from, in this order: the ``splits`` given (the run's manifest rows),
  a ``manifest``, the index itself when it is still readable, the run reports under
  ``CACHE/reports`` (each lists every subject's key and split). An entry whose split is
  known nowhere is left out of the index (reported, with the fix: give the manifest):
  a guessed split could leak a subject into validation;
* of several sound entries for one subject and session (an older run's, with other
  inputs or parameters), the one the index or the newest run report names is kept, else
  the newest; the others stay on disk, unindexed, for ``mriprep cache prune``;
* the previous ``index.json``, readable or not, is kept beside it as
  ``index.json.before-repair-<time>``.

Verification reads every byte (``verify="checksums"``, what ``repair`` does) or only
compares file sizes with the sidecar (``verify="sizes"``, what ``mriprep run`` does on
a damaged index so that it can go on at once; ``mriprep cache verify`` reads the rest).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from mriprep.cache import QUARANTINE_DIR, Cache, IndexEntry, read_entries
from mriprep.cache.run_report import read_run_report
from mriprep.core.errors import CacheError
from mriprep.core.findings import Severity
from mriprep.maintenance.inventory import entry_folders, stray_entry_paths

VERIFY_MODES = ("checksums", "sizes")
Identity = tuple[str, str]


@dataclass
class RepairReport:
    """What :func:`repair_index` did."""

    root: Path
    verified: str
    previous_problem: str | None = None  # why the old index could not be read
    backup: Path | None = None
    indexed: list[IndexEntry] = field(default_factory=list)
    quarantined: dict[str, str] = field(default_factory=dict)  # key -> reason
    # Index entries that would lead outside the cache: key as stored -> reason.
    unsafe: dict[str, str] = field(default_factory=dict)
    unassigned: list[IndexEntry] = field(default_factory=list)  # no split known
    superseded: list[IndexEntry] = field(default_factory=list)  # another entry kept

    def summary(self) -> str:
        parts = [f"indexed {len(self.indexed)} entr{'y' if len(self.indexed) == 1 else 'ies'} "
                 f"(files verified by {self.verified})"]
        if self.quarantined:
            parts.append(f"{len(self.quarantined)} damaged moved to "
                         f"{self.root / QUARANTINE_DIR}")
        if self.unsafe:
            parts.append(f"{len(self.unsafe)} unsafe index entr"
                         f"{'y' if len(self.unsafe) == 1 else 'ies'} taken out of the index, "
                         f"kept in {self.root / QUARANTINE_DIR} (never followed)")
        if self.unassigned:
            parts.append(f"{len(self.unassigned)} left out, their split known nowhere "
                         f"({', '.join(e.finding_name for e in self.unassigned[:3])}): "
                         "repair again with --manifest M")
        if self.superseded:
            parts.append(f"{len(self.superseded)} older entries of the same subjects left "
                         "unindexed (`mriprep cache prune` removes them)")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "cache": str(self.root), "verified": self.verified,
            "previous_problem": self.previous_problem,
            "backup": str(self.backup) if self.backup else None,
            "indexed": [e.key for e in self.indexed],
            "quarantined": self.quarantined,
            "unsafe": self.unsafe,
            "unassigned": [e.key for e in self.unassigned],
            "superseded": [e.key for e in self.superseded],
        }


def repair_index(
    cache: Cache,
    manifest: Any = None,
    *,
    splits: Mapping[Identity, str] | None = None,
    verify: str = "checksums",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RepairReport:
    """Rebuild ``cache``'s index from its entries' sidecars (see the module docstring).

    ``splits`` maps (subject_id, session_id) to a split; ``manifest`` is a path or a
    :class:`~mriprep.inputs.manifest.Manifest` whose rows give them. Raises
    :class:`ValueError` for an unknown ``verify`` mode.
    """
    if verify not in VERIFY_MODES:
        raise ValueError(f"repair_index: verify must be one of {VERIFY_MODES}, got {verify!r}")
    report = RepairReport(cache.root, verify)
    with cache.locked():
        old_index = _readable_index(cache, report)
        moved = _quarantine_strays(cache, report)
        candidates = _sidecar_entries(cache, report)
        _verify(cache, candidates, verify, workers, progress, report)
        for key, reason in report.quarantined.items():
            candidates.pop(key, None)
            if key not in moved:
                _quarantine(cache, key, reason)
        given = dict(splits or {})
        if manifest is not None:
            from mriprep.check.manifest import manifest_rows

            given.update({r.key: r.split for r in manifest_rows(manifest) if r.split})
        history = _report_history(cache)
        chosen = _choose(cache, candidates, old_index, history, report)
        for entry in chosen:
            split = (given.get(entry.identity) or _index_split(old_index, entry.key)
                     or history.splits.get(entry.key))
            if split:
                report.indexed.append(entry.with_split(split))
            else:
                report.unassigned.append(entry)
        report.backup = _keep_previous_index(cache)
        cache.write_index(report.indexed)
    return report


def _readable_index(cache: Cache, report: RepairReport) -> dict[str, Any]:
    """The old index's documents (for a split or a rank: plain strings, never followed);
    its unsafe ones are also kept in quarantine with their reasons and leave the index."""
    try:
        raw = cache.read_index()
    except CacheError as exc:
        report.previous_problem = str(exc)
        return {}
    unsafe = read_entries(raw).unsafe
    if unsafe:
        report.unsafe = {r.key: "; ".join(r.problems) for r in unsafe}
        kept = {r.key: {"reasons": r.problems, "document": raw[r.key]} for r in unsafe}
        path = _free_name(cache.root / QUARANTINE_DIR, f"unsafe-index-entries-{_now()}.json")
        _write_inside(path, json.dumps(kept, indent=1, default=str))
    return raw


def _quarantine_strays(cache: Cache, report: RepairReport) -> set[str]:
    """Move what no writer of mriprep put in ``entries/`` into quarantine, unread; the
    names moved."""
    moved = set()
    for path in stray_entry_paths(cache):
        what = "a link" if path.is_symlink() else "not a folder named by a key"
        reason = (f"entries/{path.name} is {what}: no writer of mriprep makes one, and "
                  "following it could lead outside the cache")
        target = _free_name(cache.root / QUARANTINE_DIR, path.name)
        os.rename(path, target)  # a link moves itself; what it points at stays untouched
        _write_inside(target.with_name(target.name + ".reason.txt"), reason + "\n")
        report.quarantined[path.name] = reason
        moved.add(path.name)
    return moved


def _sidecar_entries(cache: Cache, report: RepairReport) -> dict[str, IndexEntry]:
    entries = {}
    for key in entry_folders(cache):
        try:
            meta = cache.read_meta(key)
            if meta.get("key", key) != key:
                raise CacheError(f"its meta.json names key {meta.get('key')!r}")
            entries[key] = IndexEntry.from_meta(key, meta)
        except CacheError as exc:
            report.quarantined[key] = f"sidecar unusable: {exc}"
    return entries


def _verify(cache: Cache, entries: dict[str, IndexEntry], verify: str, workers, progress,
            report: RepairReport) -> None:
    if verify == "sizes":
        for done, key in enumerate(sorted(entries), 1):
            if not cache.has_entry(key):
                report.quarantined[key] = "a file is missing or its size differs from meta.json"
            if progress:
                progress(done, len(entries))
        return
    from mriprep.check.entries import scan_entries

    # float32: repair judges the entry's integrity, not what a cast to float16 loses.
    scans = scan_entries(cache, entries, workers, progress, "float32")
    for key, scan in scans.items():
        errors = [f.message for f in scan.findings if f.severity is Severity.ERROR]
        if errors:
            report.quarantined[key] = "; ".join(errors)


@dataclass
class _History:
    """What the run reports say, oldest first: key -> split, identity -> latest key."""

    splits: dict[str, str] = field(default_factory=dict)
    latest: dict[Identity, str] = field(default_factory=dict)


def _report_history(cache: Cache) -> _History:
    history = _History()
    # run-<UTC time>-<pid>.json sort by time; latest.json is a copy of the newest.
    for path in sorted(cache.reports_dir.glob("run-*.json")):
        try:
            run = read_run_report(path)
        except CacheError:
            continue  # a damaged report says nothing; the others still do
        for row in run.results:
            if not row.key:
                continue
            if row.split:
                history.splits[row.key] = row.split
            if row.status in ("cached", "skipped"):
                history.latest[row.identity] = row.key
    return history


def _index_split(index: dict[str, Any], key: str) -> str | None:
    doc = index.get(key)
    split = doc.get("split") if isinstance(doc, dict) else None
    return split if isinstance(split, str) else None


def _choose(cache: Cache, candidates: dict[str, IndexEntry], index: dict[str, Any],
            history: _History, report: RepairReport) -> list[IndexEntry]:
    by_identity: dict[Identity, list[IndexEntry]] = {}
    for entry in candidates.values():
        by_identity.setdefault(entry.identity, []).append(entry)
    chosen = []
    for identity, entries in sorted(by_identity.items()):
        def rank(entry: IndexEntry):
            # An entry folder is renamed into place once complete: its time is the write's.
            return (entry.key in index, history.latest.get(identity) == entry.key,
                    cache.entry_dir(entry.key).stat().st_mtime)
        entries.sort(key=rank, reverse=True)
        chosen.append(entries[0])
        report.superseded.extend(entries[1:])
    return chosen


def _now() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S%fZ}"


def _free_name(root: Path, name: str) -> Path:
    """``root/name``, or a timestamped name beside it when taken (quarantined before:
    keep both). Refuses a quarantine folder that is a link: moving into it would move
    entries out of the cache."""
    if root.is_symlink():
        raise CacheError(f"{root} is a link (to {os.readlink(root)}); quarantine must be a "
                         f"folder of the cache: remove the link and repair again")
    root.mkdir(exist_ok=True)
    target = root / name
    if target.exists() or target.is_symlink():
        target = root / f"{name}.{_now()}"
    return target


def _write_inside(path: Path, text: str) -> None:
    """Write ``path``, never through a link: a tampered entry may hold one where its
    ``reason.txt`` goes, pointing at a file outside the cache."""
    if path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _quarantine(cache: Cache, key: str, reason: str) -> Path:
    target = _free_name(cache.root / QUARANTINE_DIR, key)
    os.rename(cache.entry_dir(key), target)
    _write_inside(target / "reason.txt", reason + "\n")
    return target


def _keep_previous_index(cache: Cache) -> Path | None:
    if not cache.index_path.exists():
        return None
    backup = cache.index_path.with_name(f"index.json.before-repair-{_now()}")
    shutil.copy2(cache.index_path, backup)
    return backup
