"""Which entries leave the cache: by subject (and session) or by split.

Both commands that take data out of a cache name subjects, and a name that is not there
must say which are (a typo, the wrong cache): :func:`entry_for` finds one subject's
entry, :func:`entries_for` the entries of several subjects or of a split, and both refuse
with :class:`~mriprep.core.errors.CacheError` what they cannot find, naming what exists.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence

from mriprep.cache import Cache, IndexEntry
from mriprep.core.errors import CacheError

# Subject ids quoted when one asked for is not in the cache.
_QUOTED = 5


def entry_for(cache: Cache, subject_id: str, session_id: str | None = None) -> IndexEntry:
    """The indexed entry of ``subject_id`` (and ``session_id``).

    ``session_id`` None takes the subject's only entry; a subject cached with several
    sessions then needs one (``""`` is the entry without a session).

    Raises
    ------
    CacheError
        The subject is not in the cache (the message names a few that are), the session
        is not one of the subject's, or the subject has several and none was given.
    """
    mine = _of_subject(cache, cache.entries(), subject_id)
    sessions = [e.session_id for e in mine]
    if session_id is None:
        if len(mine) == 1:
            return mine[0]
        raise CacheError(
            f"subject {subject_id!r} has {len(mine)} sessions in cache {cache.root} "
            f"({_sessions_text(sessions)}); name one (session_id=)"
        )
    for entry in mine:
        if entry.session_id == (session_id or ""):
            return entry
    raise CacheError(
        f"subject {subject_id!r} has no session {session_id!r} in cache {cache.root}; it "
        f"has {_sessions_text(sessions)}"
    )


def entries_for(cache: Cache, subject_ids: Sequence[str] = (),
                split: str | None = None) -> list[IndexEntry]:
    """The entries of ``subject_ids`` (all their sessions; every subject when empty),
    of ``split`` only when given, in the index's order (subject, session).

    Raises
    ------
    CacheError
        A subject id that is not in the cache (naming a few that are), a split that no
        entry is in (naming the splits), or nothing left to take.
    """
    entries = cache.entries()
    if split is not None and split not in {e.split for e in entries}:
        splits = sorted({e.split for e in entries})
        raise CacheError(
            f"no entry of cache {cache.root} is in split {split!r}; its splits are "
            f"{', '.join(repr(s) for s in splits) or 'none (the index is empty)'}"
        )
    if subject_ids:
        chosen = [e for sid in dict.fromkeys(subject_ids)
                  for e in _of_subject(cache, entries, sid)]
    else:
        chosen = list(entries)
    if split is not None:
        chosen = [e for e in chosen if e.split == split]
    if not chosen:
        what = f"of subject(s) {', '.join(subject_ids)} " if subject_ids else ""
        where = f"in split {split!r} " if split is not None else ""
        raise CacheError(f"cache {cache.root} holds no entry {what}{where}to take out")
    return chosen


def _of_subject(cache: Cache, entries: Iterable[IndexEntry], subject_id: str) -> list[IndexEntry]:
    entries = list(entries)
    mine = [e for e in entries if e.subject_id == subject_id]
    if mine:
        return mine
    known = sorted({e.subject_id for e in entries})
    close = difflib.get_close_matches(subject_id, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    listed = ", ".join(known[:_QUOTED]) + (f" ... ({len(known)} in all)"
                                            if len(known) > _QUOTED else "")
    raise CacheError(
        f"subject {subject_id!r} is not in cache {cache.root}, which holds "
        f"{listed or 'no entry'}{hint} (`mriprep cache ls {cache.root}` lists them)"
    )


def _sessions_text(sessions: Sequence[str]) -> str:
    return ", ".join(repr(s) if s else "'' (no session)" for s in sessions)
