"""What to remove from a cache, shown before it goes (``mriprep cache prune``).

:func:`plan_prune` lists, without touching anything:

* indexed entries whose subject and session are not rows of the given manifest (a
  subject dropped from the cohort, which ``MRIDataset`` would otherwise still serve);
* indexed entries of another pipeline than the one kept (a cache mixes pipelines only
  by mistake; the Dataset refuses such a cache);
* entry folders the index no longer lists (an older run's entry of a subject whose
  inputs or parameters changed), and QC and derived-label folders of keys no longer
  indexed.

:func:`apply_prune` first takes the entries out of the index, under its lock, then
deletes their folders: a reader never finds an indexed entry without its files.
An unindexed folder younger than :data:`PRUNE_GRACE_SECONDS` is left alone: it may be a
running ``mriprep run``'s entry, written but not yet indexed (the runner indexes every
few seconds).
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mriprep.cache import DERIVED_DIR, QC_DIR, Cache, IndexEntry, is_key
from mriprep.cache.run_report import read_latest_run_report
from mriprep.core.errors import CacheError
from mriprep.maintenance.inventory import folder_bytes, take_inventory

# Ten minutes: 60 times the runner's index flush interval (10 s), and far less than the
# time between a run and the clean-up after it.
PRUNE_GRACE_SECONDS = 600.0


@dataclass(frozen=True)
class Removal:
    """One folder to remove and why; ``entry`` is its index entry when indexed."""

    key: str
    bytes: int
    reason: str
    entry: IndexEntry | None = None
    folder: str = "entries"  # or QC_DIR, or a folder under DERIVED_DIR

    def to_json(self) -> dict[str, Any]:
        e = self.entry
        return {"key": self.key, "bytes": self.bytes, "reason": self.reason,
                "folder": self.folder, "subject_id": e.subject_id if e else None,
                "session_id": e.session_id if e else None, "split": e.split if e else None}


@dataclass
class PrunePlan:
    """What :func:`apply_prune` would remove; ``kept`` indexed entries stay."""

    root: Path
    kept_pipeline: str | None
    kept: int = 0
    removals: list[Removal] = field(default_factory=list)
    too_young: list[str] = field(default_factory=list)  # unindexed, maybe a run's

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removals)

    def to_json(self) -> dict[str, Any]:
        return {"cache": str(self.root), "kept_pipeline": self.kept_pipeline,
                "kept": self.kept, "bytes": self.bytes, "too_young": self.too_young,
                "removals": [r.to_json() for r in self.removals]}


def plan_prune(cache: Cache, manifest: Any = None, pipeline: str | None = None,
               grace_seconds: float = PRUNE_GRACE_SECONDS) -> PrunePlan:
    """The removals that leave ``cache`` holding only the manifest's rows (when given),
    made by one pipeline (``pipeline``: a name or hash prefix; default: the index's only
    one, or the last run's), and only indexed folders.

    Raises :class:`CacheError` when the index cannot be read or holds an unsafe or
    malformed entry (repair it first) or when the cache mixes pipelines and none is named.
    """
    inventory = take_inventory(cache)
    if inventory.index_problem or inventory.unsafe or inventory.malformed:
        problem = inventory.index_problem or (inventory.unsafe + inventory.malformed)[0]
        raise CacheError(f"{problem}; run `mriprep cache repair {cache.root}` before pruning")
    indexed = [listed.entry for listed in inventory.indexed]
    kept_hash = _kept_pipeline(cache, indexed, pipeline)
    rows = None
    if manifest is not None:
        from mriprep.check.manifest import manifest_name, manifest_rows

        rows = {r.key for r in manifest_rows(manifest)}
        name = manifest_name(manifest)
    plan = PrunePlan(cache.root, kept_hash)
    for listed in inventory.indexed:
        entry = listed.entry
        if kept_hash and entry.pipeline_hash != kept_hash:
            reason = (f"pipeline {entry.pipeline_name} ({entry.pipeline_hash[:12]}), not the "
                      f"kept {kept_hash[:12]}")
        elif rows is not None and entry.identity not in rows:
            reason = f"not a row of {name}"
        else:
            plan.kept += 1
            continue
        plan.removals.append(Removal(entry.key, listed.bytes, reason, entry))
    now = time.time()
    for listed in inventory.unindexed:
        age = now - cache.entry_dir(listed.key).stat().st_mtime
        if age < grace_seconds:
            plan.too_young.append(listed.key)
            continue
        plan.removals.append(Removal(listed.key, listed.bytes, _unindexed_reason(cache, listed.key)))
    staying = {listed.key for listed in inventory.indexed} - {r.key for r in plan.removals}
    derived = cache.root / DERIVED_DIR
    kinds = [(cache.root / QC_DIR, "QC")]
    if derived.is_dir():
        kinds += [(d, "derived labels") for d in sorted(derived.iterdir()) if d.is_dir()]
    for parent, what in kinds:
        if not parent.is_dir():
            continue
        for folder in sorted(parent.iterdir()):
            if folder.is_dir() and is_key(folder.name) and folder.name not in staying \
                    and folder.name not in plan.too_young:
                plan.removals.append(Removal(
                    folder.name, folder_bytes(folder), f"{what} of an entry no longer indexed",
                    folder=str(parent.relative_to(cache.root))))
    return plan


def apply_prune(cache: Cache, plan: PrunePlan) -> int:
    """Remove what ``plan`` lists; return the bytes freed."""
    cache.remove_from_index([r.key for r in plan.removals if r.entry is not None])
    freed = 0
    for removal in plan.removals:
        folder = cache.root / removal.folder / removal.key
        if not folder.is_dir():
            continue
        # Renamed out of sight first: a half-deleted folder never looks like an entry.
        doomed = cache.tmp_dir / f"pruned-{removal.key}-{uuid.uuid4().hex[:8]}"
        folder.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        freed += removal.bytes
    return freed


def _kept_pipeline(cache: Cache, entries: list[IndexEntry], wanted: str | None) -> str | None:
    hashes = Counter(e.pipeline_hash for e in entries)
    names = {e.pipeline_hash: e.pipeline_name for e in entries}
    if wanted:
        matches = [h for h in hashes if h.startswith(wanted) or names[h] == wanted]
        if len(matches) == 1:
            return matches[0]
        listed = ", ".join(f"{names[h]} ({h[:12]}, {n} entries)" for h, n in hashes.items())
        raise CacheError(
            f"--pipeline {wanted!r} matches {len(matches)} of the cache's pipelines "
            f"({listed or 'none'}); give a name or a longer hash prefix")
    if len(hashes) <= 1:
        return next(iter(hashes), None)
    last = _last_run_pipeline(cache)
    if last in hashes:
        return last
    listed = ", ".join(f"{names[h]} ({h[:12]}, {n} entries)" for h, n in hashes.most_common())
    raise CacheError(f"cache {cache.root} mixes {len(hashes)} pipelines: {listed}; say which "
                     "to keep with --pipeline NAME_OR_HASH")


def _last_run_pipeline(cache: Cache) -> str | None:
    """The pipeline hash of the last run's report; None without a readable one (prune
    then asks which pipeline to keep)."""
    try:
        report = read_latest_run_report(cache.root)
    except CacheError:
        return None
    pipeline = report.header.get("pipeline") if report is not None else None
    return pipeline.get("hash") if isinstance(pipeline, dict) else None


def _unindexed_reason(cache: Cache, key: str) -> str:
    try:
        meta = cache.read_meta(key)
        who = meta.get("subject_id", "?") + (f"/{meta['session_id']}" if meta.get("session_id") else "")
        return f"not indexed (an older entry of {who}, replaced or retired)"
    except CacheError:
        return "not indexed, and its meta.json is unreadable (a write that never finished)"
