"""Reading an index: every raw ``index.json`` document turned into an
:class:`~mriprep.cache.IndexEntry`, or refused with its reasons.

The one place where index documents become entries (:meth:`Cache.entries`,
``mriprep check``, ``mriprep cache ls | prune | repair`` and the QC report all read
through :func:`read_entries`), so that an entry that would lead outside the cache
(:class:`~mriprep.cache.UnsafeEntry`) or is not well formed
(:class:`~mriprep.cache.MalformedEntry`) is set aside the same way everywhere and
followed by nobody.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mriprep.cache.entry import IndexEntry, MalformedEntry, UnsafeEntry, entry_name


@dataclass(frozen=True)
class RefusedEntry:
    """An index document that is no usable entry: its key as stored, how messages name
    it, and the refusal (:class:`UnsafeEntry` or :class:`MalformedEntry`)."""

    key: str
    name: str
    error: MalformedEntry

    @property
    def unsafe(self) -> bool:
        return isinstance(self.error, UnsafeEntry)

    @property
    def problems(self) -> list[str]:
        return self.error.problems


@dataclass
class IndexReading:
    """What an index holds: the usable entries (key -> entry, in the stable order
    subject, session, key) and the refused documents, in the index's key order."""

    entries: dict[str, IndexEntry] = field(default_factory=dict)
    refused: list[RefusedEntry] = field(default_factory=list)

    @property
    def unsafe(self) -> list[RefusedEntry]:
        return [r for r in self.refused if r.unsafe]

    @property
    def malformed(self) -> list[RefusedEntry]:
        return [r for r in self.refused if not r.unsafe]

    def raise_first(self) -> None:
        """Raise the first refusal, an unsafe entry before a malformed one (for readers
        that serve the whole cache or nothing: the Dataset, export)."""
        if self.refused:
            raise (self.unsafe or self.malformed)[0].error


def read_entries(raw: Mapping[str, Any], index_path: Path | None = None) -> IndexReading:
    """Every document of ``raw`` (key -> document, as :meth:`Cache.read_index` gives it)
    as an entry or a refusal; never raises for a bad document. ``index_path``, the file
    ``raw`` was read from, is named in the refusals of unsafe entries."""
    reading = IndexReading()
    entries = []
    for key, doc in raw.items():
        try:
            entries.append(IndexEntry.from_json(key, doc))
        except MalformedEntry as exc:
            if isinstance(exc, UnsafeEntry) and index_path is not None:
                exc = UnsafeEntry(exc.key, exc.problems, Path(index_path))
            reading.refused.append(RefusedEntry(str(key), _name(key, doc, exc), exc))
    entries.sort(key=lambda e: (e.subject_id, e.session_id, e.key))
    reading.entries = {e.key: e for e in entries}
    return reading


def _name(key: Any, doc: Any, exc: MalformedEntry) -> str:
    ids = doc if isinstance(doc, dict) else {}
    subject, session = ids.get("subject_id", "?"), ids.get("session_id") or ""
    if isinstance(exc, UnsafeEntry):
        # Quoted whole: a name like '../../victim' must read as data, not as a path.
        return f"subject {subject!r}{f' session {session!r}' if session else ''} [{key!r}]"
    return entry_name(subject, session, str(key))
