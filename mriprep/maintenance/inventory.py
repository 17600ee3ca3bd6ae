"""What a cache holds: its indexed entries and the entry folders the index no longer
lists, with their sizes on disk (``mriprep cache ls``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from mriprep.cache import Cache, IndexEntry, IndexReading, is_key
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
    ``mriprep cache repair`` rebuilds it); ``unsafe`` lists index entries that would
    lead outside the cache (nothing of them is looked at: no size, no folder) and
    ``malformed`` those that are not well formed.
    """

    root: Path
    indexed: list[ListedEntry] = field(default_factory=list)
    unindexed: list[ListedEntry] = field(default_factory=list)
    index_problem: str | None = None
    malformed: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.indexed + self.unindexed)

    def to_json(self) -> dict:
        return {
            "cache": str(self.root),
            "index_problem": self.index_problem,
            "malformed": self.malformed,
            "unsafe": self.unsafe,
            "entries": [e.to_json() for e in self.indexed],
            "unindexed": [e.to_json() for e in self.unindexed],
            "bytes": self.bytes,
        }


def take_inventory(cache: Cache) -> Inventory:
    """Every entry folder of ``cache``, indexed or not, with its size on disk."""
    inventory = Inventory(cache.root)
    try:
        reading = cache.read_entries()
    except CacheError as exc:
        inventory.index_problem = str(exc)
        reading = IndexReading()
    inventory.unsafe = [str(r.error) for r in reading.unsafe]
    inventory.malformed = [str(r.error) for r in reading.malformed]
    entries = reading.entries
    on_disk = entry_folders(cache)
    for key in sorted(entries, key=lambda k: (entries[k].subject_id, entries[k].session_id, k)):
        inventory.indexed.append(ListedEntry(key, folder_bytes(cache.entry_dir(key)), entries[key]))
    # A refused entry is still indexed, not an older run's leftover for prune to delete.
    refused = {r.key for r in reading.refused}
    for key in sorted(set(on_disk) - set(entries) - refused):
        inventory.unindexed.append(ListedEntry(key, folder_bytes(cache.entry_dir(key))))
    return inventory


def entry_folders(cache: Cache) -> list[str]:
    """Keys of the entry folders on disk: real folders named by a key (the
    temporary-write folder, anything else and a link, which could lead outside the
    cache, are no entry folders: :func:`stray_entry_paths`)."""
    if not cache.entries_dir.is_dir():
        return []
    return sorted(p.name for p in cache.entries_dir.iterdir()
                  if is_key(p.name) and p.is_dir() and not p.is_symlink())


def stray_entry_paths(cache: Cache) -> list[Path]:
    """What ``entries/`` holds that no writer of mriprep made (the temporary-write folder
    aside): links, and names that are no key. Never followed; ``mriprep cache repair``
    moves them to quarantine (a link is moved itself, its target is not touched)."""
    if not cache.entries_dir.is_dir():
        return []
    return sorted(p for p in cache.entries_dir.iterdir()
                  if p != cache.tmp_dir and not (is_key(p.name) and p.is_dir()
                                                  and not p.is_symlink()))


def folder_bytes(folder: Path) -> int:
    if folder.is_symlink():
        return 0  # a link leads elsewhere: what it points at is not the cache's to list
    total = 0
    try:
        with os.scandir(folder) as it:
            for item in it:
                if item.is_file(follow_symlinks=False):
                    total += item.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0
    return total
