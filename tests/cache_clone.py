"""Cheap private copies of a cache for tests that corrupt one.

A demo cache holds about 60 MB per entry, too much to copy for every test. A clone
hard-links each entry's data files (tensors, transforms) and copies the JSON files
(index, sidecars, reports), which tests rewrite. A hard link shares its inode with the
original, so a clone's data file must never be written in place: every edit here writes
a new file beside it and renames it over the old name (``os.replace``), which gives the
clone a new inode and leaves the original's bytes as they were. The cache library itself
only ever writes that way (temporary file, then rename).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterable

import numpy as np

from mriprep.cache import Cache, IndexEntry, entry_key
from mriprep.cache.formats import format_of, read_tensor
from mriprep.core.hashing import checksum_file

COPIED_SUFFIXES = {".json", ".csv"}  # small files that tests rewrite: real copies


def clone_cache(source: str | os.PathLike, target: str | os.PathLike,
                drop_subjects: Iterable[str] = ()) -> Cache:
    """Clone the cache ``source`` into the new folder ``target``.

    Entry data files are hard links to the source's; JSON and CSV files are copies.
    Entries of ``drop_subjects`` are left out of the clone and of its index.
    """
    source, target = Path(source), Path(target)
    drop = set(drop_subjects)
    dropped = {entry.key for entry in Cache(source).entries() if entry.subject_id in drop}

    def clone_file(src: str, dst: str) -> None:
        # Empty files (the lock file) are copied too: a clone must not share its lock.
        if Path(src).suffix in COPIED_SUFFIXES or Path(src).stat().st_size == 0:
            shutil.copy2(src, dst)
        else:
            os.link(src, dst)

    def ignore(folder: str, names: list[str]) -> set[str]:
        if Path(folder) == source / "entries":
            return {name for name in names if name in dropped or name == ".tmp"}
        return set()

    shutil.copytree(source, target, copy_function=clone_file, ignore=ignore)
    clone = Cache(target)
    if dropped:
        clone.remove_from_index(sorted(dropped))
    return clone


def replace_bytes(path: Path, data: bytes) -> None:
    """Give ``path`` the content ``data`` through a new file (never writing in place)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def read_array(path: Path) -> np.ndarray:
    """A tensor file's values as a writable array (``.npy`` or ``.b2nd``)."""
    return np.array(read_tensor(path, mmap=False))


def replace_array(path: Path, array: np.ndarray) -> None:
    """Save ``array`` in the format of the tensor file ``path`` (its first choice:
    ``.npy``, or LZ4 for a ``.b2nd``) through a new file, bypassing the cache (as a stray
    script would: the checksums in the sidecar and index are left stale)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    fmt = format_of(path)
    with open(tmp, "wb") as fh:
        fmt.write(fh, np.ascontiguousarray(array), fmt.choices[0])
    os.replace(tmp, path)


def rerecord(cache: Cache, key: str, name: str) -> None:
    """Record tensor ``name`` of entry ``key`` as it is now (size and checksum, in the
    sidecar and the index), as a forger or a careless re-indexing script would: what is
    left to catch a changed value is reading the values."""
    path = cache.tensor_path(key, name)
    record = {"bytes": path.stat().st_size, "xxh3_128": checksum_file(path)}
    for doc_path, files_of in ((cache.entry_dir(key) / "meta.json", lambda d: d["files"]),
                               (cache.index_path, lambda d: d["entries"][key]["files"])):
        doc = json.loads(doc_path.read_text())
        files_of(doc)[name].update(record)
        doc_path.write_text(json.dumps(doc, indent=1))


def relabel_entry(cache: Cache, key: str, subject_id: str, session_id: str, split: str) -> str:
    """Index entry ``key``'s scan as session ``session_id`` of ``subject_id`` in ``split``.

    The result is the entry ``mriprep run`` writes for a manifest row that names this
    scan so: the same tensors (the stages never read the ids), a sidecar with the new ids,
    under the key those ids give. The old entry leaves the index. Returns the new key.
    """
    meta = cache.read_meta(key)
    hashes = {role: info["sha256"] for role, info in meta["inputs"].items()}
    new_key = entry_key(subject_id, session_id, hashes, meta["pipeline_hash"])
    old_dir, new_dir = cache.entry_dir(key), cache.entry_dir(new_key)
    new_dir.mkdir()
    for path in old_dir.iterdir():
        if path.name != "meta.json":
            os.link(path, new_dir / path.name)
    meta.update(subject_id=subject_id, session_id=session_id, key=new_key)
    (new_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    cache.remove_from_index([key])
    cache.update_index([IndexEntry.from_meta(new_key, meta).with_split(split)])
    return new_key


def file_checksums(root: str | os.PathLike) -> dict[str, str]:
    """Relative path -> xxh3 checksum of every file of the cache's entries and its index."""
    root = Path(root)
    files = [p for p in (root / "entries").rglob("*") if p.is_file()]
    files.append(root / "index.json")
    return {str(p.relative_to(root)): checksum_file(p) for p in sorted(files)}


def shares_inode(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` are hard links to one file."""
    return os.stat(a).st_ino == os.stat(b).st_ino

