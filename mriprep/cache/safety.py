"""What an index entry must be before anything follows it to the disk.

A cache is often shared on a cluster, so ``index.json`` may have been written by anyone
who can write one file of it. Every path mriprep builds from an index entry joins the
entry's key to ``entries/`` and each file record to the entry's folder, so a key or a file
name holding ``..`` or a ``/`` would reach outside the cache. An entry is therefore
*unsafe* unless:

* its key is a 64-character lowercase hex digest (what :func:`mriprep.cache.entry_key`
  makes);
* each file record, and the name it is listed under, names a plain file inside its
  entry folder (no separator, no ``..``, not hidden);
* its subject and session ids obey the manifest's rules (:func:`mriprep.core.ids.id_problems`):
  ids end up in file names downstream (export, QC pages).

:class:`~mriprep.cache.IndexEntry` refuses an unsafe document with
:class:`~mriprep.cache.UnsafeEntry`, so every entry a command holds passed these rules.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from mriprep.core.ids import id_problems

KEY_PATTERN = re.compile(r"[0-9a-f]{64}")
# What every name mriprep writes looks like (sub-01, image.npy, transform.tfm): such a
# name is safe at a regex's cost; anything else gets the full rules (an index of 10,000
# entries is read on every check, so the common case must stay cheap).
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
KEY_FIX = "a key is the 64-character hex SHA-256 that `mriprep run` names each entry by"


def is_key(value: Any) -> bool:
    """True for a cache key: 64 lowercase hex characters."""
    return isinstance(value, str) and KEY_PATTERN.fullmatch(value) is not None


def key_problems(key: Any) -> list[str]:
    """Why ``key`` is no cache key (empty when it is one)."""
    if is_key(key):
        return []
    return [f"key {key!r} is not a 64-character hex digest ({KEY_FIX})"]


def file_name_problems(name: Any, what: str) -> list[str]:
    """Why ``name`` (a file record of ``what``) is not a plain file name inside its entry."""
    if not isinstance(name, str):
        return []  # not a string at all: a malformed record, not a path (see entry.py)
    if _is_plain(name):
        return []
    if (not name or "/" in name or "\\" in name or name.startswith(".")
            or any(unicodedata.category(ch).startswith("C") for ch in name)):
        return [f"the file record of {what} names {name!r}, which is not a plain file "
                "name inside its entry (no path separator, no '..', not hidden)"]
    return []


def entry_safety_problems(key: Any, doc: Any) -> list[str]:
    """Why the index entry ``doc`` under ``key`` is unsafe to follow (empty when safe).

    Only what could lead outside the cache is judged here; a missing or mistyped field is
    :func:`mriprep.cache.entry._entry_problems`' business.
    """
    problems = key_problems(key)
    if not isinstance(doc, dict):
        return problems
    bad: dict[str, list[str]] = {}  # file name -> the records naming it: one message each
    for field, tensor in (("files", True), ("extra_files", False)):
        records = doc.get(field)
        if not isinstance(records, dict):
            continue
        for name, info in records.items():
            # The file a record names; without one, the name it is read from (entry.py).
            default = f"{name}.npy" if tensor else name
            file = info.get("file", default) if isinstance(info, dict) else default
            # The record's own name is a file name too, whatever its "file" says:
            # tensor_path makes <name>.npy of it, and export writes an extra file under it.
            for named in dict.fromkeys((file, default)):
                if file_name_problems(named, ""):
                    bad.setdefault(named, []).append(
                        str(name) if tensor else f"extra file {name}")
    for file, names in bad.items():
        problems += file_name_problems(file, ", ".join(names))
    for field in ("subject_id", "session_id"):
        value = doc.get(field)
        if field == "session_id" and not value:
            continue  # no session: the manifest allows that
        if isinstance(value, str) and not _is_plain(value):
            # The manifest's fix ("use letters...") is not this reader's: see UnsafeEntry.
            problems += [p.split(";")[0] for p in id_problems(value, field)]
    return problems


def _is_plain(name: str) -> bool:
    return _PLAIN.fullmatch(name) is not None and ".." not in name
