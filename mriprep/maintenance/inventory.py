"""What a cache holds: its indexed entries and the entry folders the index no longer
lists, with their sizes on disk (``mriprep cache ls``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from mriprep.cache import Cache, IndexEntry
from mriprep.core.errors import CacheError


@dataclass(frozen=True)
class ListedEntry:
    """One entry folder: what its index entry (or, for an unindexed one, nothing) says."""

    key: str
    bytes: int
    entry: IndexEntry | None = None  # None: on disk, not in the index

    @property
    def indexed(self) -> bool:
        return self.entry is not None

    def to_json(self) -> dict:
        e = self.entry
        return {
            "key": self.key, "bytes": self.bytes, "indexed": self.indexed,
            "subject_id": e.subject_id if e else None,
            "session_id": e.session_id if e else None,
            "split": e.split if e else None,
            "pipeline_name": e.pipeline_name if e else None,
            "pipeline_hash": e.pipeline_hash if e else None,
            "storage": e.storage if e else None,
        }


@dataclass
class Inventory:
    """Indexed entries (in the index's order: subject, session) and unindexed folders.

    ``index_problem`` says why the index could not be read (then nothing is indexed and
    ``mriprep cache repair`` rebuilds it); ``malformed`` lists index entries that are
    not well formed.
    """

    root: Path
    indexed: list[ListedEntry] = field(default_factory=list)
    unindexed: list[ListedEntry] = field(default_factory=list)
    index_problem: str | None = None
    malformed: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.indexed + self.unindexed)

    def to_json(self) -> dict:
        return {
            "cache": str(self.root),
            "index_problem": self.index_problem,
            "malformed": self.malformed,
            "entries": [e.to_json() for e in self.indexed],
            "unindexed": [e.to_json() for e in self.unindexed],
            "bytes": self.bytes,
        }


def take_inventory(cache: Cache) -> Inventory:
    """Every entry folder of ``cache``, indexed or not, with its size on disk."""
    inventory = Inventory(cache.root)
    try:
        raw = cache.read_index()
    except CacheError as exc:
        inventory.index_problem = str(exc)
        raw = {}
    entries: dict[str, IndexEntry] = {}
    for key, doc in raw.items():
        try:
            entries[key] = IndexEntry.from_json(key, doc)
        except CacheError as exc:
            inventory.malformed.append(str(exc))
    on_disk = entry_folders(cache)
    for key in sorted(entries, key=lambda k: (entries[k].subject_id, entries[k].session_id, k)):
        inventory.indexed.append(ListedEntry(key, folder_bytes(cache.entry_dir(key)), entries[key]))
    for key in sorted(set(on_disk) - set(entries)):
        inventory.unindexed.append(ListedEntry(key, folder_bytes(cache.entry_dir(key))))
    return inventory


def entry_folders(cache: Cache) -> list[str]:
    """Names of the entry folders on disk (the temporary-write folder excluded)."""
    if not cache.entries_dir.is_dir():
        return []
    return sorted(p.name for p in cache.entries_dir.iterdir()
                  if p.is_dir() and not p.name.startswith("."))


def folder_bytes(folder: Path) -> int:
    total = 0
    try:
        with os.scandir(folder) as it:
            for item in it:
                if item.is_file(follow_symlinks=False):
                    total += item.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0
    return total
