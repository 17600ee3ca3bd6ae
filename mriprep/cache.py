"""The tensor cache: content-addressed, atomic, checksummed, memory-mappable, no pickle.

Layout of a cache folder::

    CACHE/
      mriprep-cache.json          marker: format name and version
      index.json                  the live entries (one per subject/session) and their split
      entries/<key>/image.npy     float32, float16 or uint8 [X, Y, Z], C order
      entries/<key>/valid.npy     bool [X, Y, Z]: False where a voxel was filled or masked
      entries/<key>/label.npy     int16 [X, Y, Z] (only when the subject has a label map)
      entries/<key>/meta.json     sidecar: geometry, inputs, checksums, provenance
      entries/<key>/transform.tfm registration transform, ITK format (registered entries)
      entries/.tmp/               entries being written (never read)
      reports/latest.json|csv     the last run's per-subject report (+ timestamped copies)

Identity. ``<key>`` is the SHA-256 of the subject and session ids, the SHA-256 of every
input file's bytes and the pipeline hash (:func:`entry_key`). Changing an input byte or a
parameter gives a new key, so a rerun recomputes exactly what changed and skips the rest.

Atomicity. An entry is written into a private folder under ``entries/.tmp``, every file
is fsynced, ``meta.json`` is written last, and the folder is renamed into place in one
``rename(2)``. A reader therefore sees either no entry or a complete one; a crash leaves
only a stale temporary folder, which is never read and is swept by the next writer. Once
on disk, a tensor's pages leave the page cache (:func:`drop_written_pages`).

Index. ``index.json`` maps each live key to its summary (everything a reader needs except
provenance) and its split. Several runs may share a cache: every update is a
read-modify-write under an exclusive ``flock`` on ``.lock``, written atomically. An index
keeps one entry per (subject_id, session_id): indexing a new key for a subject retires the
old one from the index (its folder stays on disk until a clean-up).

Checksums. Each tensor file's bytes are hashed with XXH3-128 (``xxhash``): not a security
hash, but it detects flipped bits at memory speed, which is what a pre-training check needs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import xxhash

from mriprep.core.atomic import fsync_dir, write_text
from mriprep.core.errors import CacheError
from mriprep.core.hashing import checksum_file
from mriprep.core.volume import jsonable

FORMAT_NAME = "mriprep-cache"
FORMAT_VERSION = 1
TENSOR_NAMES = ("image", "valid", "label")
REQUIRED_META = (
    "subject_id",
    "session_id",
    "pipeline_name",
    "pipeline_hash",
    "inputs",
    "affine",
    "spacing",
    "shape",
    "provenance",
)


def npy_header(array: np.ndarray) -> bytes:
    """The header ``np.save`` writes before the bytes of a C-contiguous ``array``."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    return header.getvalue()


def npy_checksum(array: np.ndarray, header: bytes | None = None) -> tuple[str, int]:
    """XXH3-128 and size of the ``.npy`` file ``np.save`` writes for a C-contiguous
    ``array`` (header, then the raw bytes), computed from memory; ``header`` is
    :func:`npy_header` of ``array`` when the caller has it already."""
    header = npy_header(array) if header is None else header
    digest = xxhash.xxh3_128(header)
    digest.update(array.reshape(-1).view(np.uint8))  # the bytes, without a copy
    return digest.hexdigest(), len(header) + array.nbytes


def drop_written_pages(fd: int) -> None:
    """Let the kernel drop a file's pages from the page cache once they are on disk.

    A cache entry is written once and read at training time, usually long after or on
    another machine: its pages are not worth keeping here. Kept, they also made every
    entry cost fresh memory. A worker keeps its own freed memory for the next subject
    (see ``mriprep.run.scheduling``), so the page cache grew out of memory the kernel had
    not touched for a while, and on the CI VM each such page cost 7 us (the hypervisor
    hands it back): 0.1 s to write a 60 MB entry. The next entry now reuses the dropped
    pages: 0.015 s. Only clean pages can be dropped, so this follows the fsync. Without
    ``posix_fadvise`` (macOS) it does nothing.
    """
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def file_record(path: Path, array: np.ndarray | None = None) -> dict[str, Any]:
    """How the sidecar lists one file of an entry: name, size, checksum (and for a
    tensor, its dtype and shape).

    A tensor just saved from ``array`` is hashed from memory rather than read back, when
    the file starts with the header this module expects and has the expected size; any
    other file (a NumPy that lays out its header differently) is read and hashed.
    """
    record: dict[str, Any] = {"file": path.name}
    size = path.stat().st_size
    checksum = None
    if array is not None:
        record.update(dtype=str(array.dtype), shape=list(array.shape))
        if array.flags.c_contiguous:
            header = npy_header(array)
            with open(path, "rb") as fh:
                written = fh.read(len(header))
            if written == header and size == len(header) + array.nbytes:
                checksum = npy_checksum(array, header)[0]
    record.update(bytes=size, xxh3_128=checksum or checksum_file(path))
    return record


def entry_key(
    subject_id: str, session_id: str, input_hashes: dict[str, str], pipeline_hash: str
) -> str:
    """Content address of one cache entry (hex SHA-256)."""
    payload = json.dumps(
        {
            "subject_id": subject_id,
            "session_id": session_id or "",
            "inputs": dict(sorted(input_hashes.items())),
            "pipeline": pipeline_hash,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class EntryRef:
    """One live index entry: its key and summary (see :meth:`Cache.write_entry`)."""

    key: str
    summary: dict[str, Any]

    @property
    def subject_id(self) -> str:
        return self.summary["subject_id"]

    @property
    def session_id(self) -> str:
        return self.summary.get("session_id", "")

    @property
    def split(self) -> str:
        return self.summary.get("split", "")

    @property
    def pipeline_hash(self) -> str:
        return self.summary["pipeline_hash"]


class Cache:
    """A cache folder. ``Cache(path)`` opens an existing one; ``create=True`` makes it."""

    def __init__(self, root: str | os.PathLike, create: bool = False):
        self.root = Path(root)
        marker = self.root / "mriprep-cache.json"
        if not marker.exists():
            if not create:
                raise CacheError(
                    f"{self.root} is not an mriprep cache (no {marker.name}); "
                    "create one with `mriprep run MANIFEST -o CACHE`"
                )
            if self.root.exists() and not _only_cache_layout(self.root):
                raise CacheError(
                    f"{self.root} exists, is not empty and is not an mriprep cache; "
                    "choose an empty or new folder for -o"
                )
            (self.root / "entries" / ".tmp").mkdir(parents=True, exist_ok=True)
            (self.root / "reports").mkdir(exist_ok=True)
            write_text(
                marker, json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION})
            )
        else:
            info = _read_json(marker)
            if info.get("format") != FORMAT_NAME or info.get("version") != FORMAT_VERSION:
                raise CacheError(
                    f"{marker} describes format {info.get('format')!r} version "
                    f"{info.get('version')!r}; this mriprep reads {FORMAT_NAME!r} version "
                    f"{FORMAT_VERSION}. Rebuild the cache with this version."
                )
        self.entries_dir = self.root / "entries"
        self.tmp_dir = self.entries_dir / ".tmp"
        self.reports_dir = self.root / "reports"
        self.index_path = self.root / "index.json"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.reports_dir.mkdir(exist_ok=True)

    # -- entries ---------------------------------------------------------------------

    def entry_dir(self, key: str) -> Path:
        return self.entries_dir / key

    def has_entry(self, key: str, verify: bool = False) -> bool:
        """True when the entry is complete (and, with ``verify``, its checksums match)."""
        try:
            meta = self.read_meta(key)
            listed = list(meta["files"].values()) + list(meta.get("extra_files", {}).values())
            for info in listed:
                path = self.entry_dir(key) / info["file"]
                if not path.is_file() or path.stat().st_size != info["bytes"]:
                    return False
                if verify and checksum_file(path) != info["xxh3_128"]:
                    return False
        except (CacheError, KeyError, TypeError, AttributeError, OSError):
            # A sidecar without the fields it must have is as good as no entry.
            return False
        return True

    def read_meta(self, key: str) -> dict[str, Any]:
        path = self.entry_dir(key) / "meta.json"
        if not path.is_file():
            raise CacheError(f"cache entry {key} has no meta.json at {path}")
        return _read_json(path)

    def tensor_path(self, key: str, name: str) -> Path:
        return self.entry_dir(key) / f"{name}.npy"

    def load_tensor(self, key: str, name: str, mmap: bool = True) -> np.ndarray:
        """A tensor of an entry, memory-mapped read-only by default (never unpickled)."""
        path = self.tensor_path(key, name)
        if not path.is_file():
            raise CacheError(
                f"cache entry {key} is missing {path.name} ({path}); "
                "rerun `mriprep run` to rebuild it"
            )
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)

    def write_entry(
        self,
        key: str,
        tensors: dict[str, np.ndarray],
        meta: dict[str, Any],
        replace: bool = False,
        extra_files: dict[str, str | bytes] | None = None,
    ) -> dict[str, Any]:
        """Write one entry atomically and return its summary for the index.

        ``meta`` must hold at least :data:`REQUIRED_META` (subject and session ids,
        pipeline name and hash, the inputs' paths and SHA-256, the output grid's affine,
        spacing and shape, and the provenance records). The runner adds ``split`` to the
        summary when it indexes the entry: a split is a property of the manifest, not of
        the content, so it lives in the index only.

        ``tensors`` holds ``image`` and ``valid`` and optionally ``label``. ``meta`` is any
        JSON-able sidecar content; this adds ``key``, ``files`` (dtype, shape, byte size and
        checksum of each tensor) and the format version. With ``replace`` an existing entry
        of the same key is swapped out (``--force``); otherwise an existing complete entry
        wins and ours is discarded (two runs computed the same content).

        ``extra_files`` maps a plain file name (e.g. ``transform.tfm``) to its text or
        bytes; each is written inside the entry folder with the same atomicity and listed
        with its size and checksum under ``extra_files`` in the sidecar (``files`` keeps
        listing tensors only).
        """
        missing = [k for k in REQUIRED_META if k not in meta]
        if missing:
            raise ValueError(f"write_entry: meta lacks {missing}")
        unknown = set(tensors) - set(TENSOR_NAMES)
        if unknown or not {"image", "valid"} <= set(tensors):
            raise ValueError(
                f"write_entry needs tensors image, valid [, label]; got {sorted(tensors)}"
            )
        extra_files = dict(extra_files or {})
        reserved = {"meta.json"} | {f"{name}.npy" for name in TENSOR_NAMES}
        for name in extra_files:
            if Path(name).name != name or name.startswith(".") or name in reserved:
                raise ValueError(
                    f"write_entry: extra file name {name!r} must be a plain file name, not "
                    f"hidden and not one of {sorted(reserved)}"
                )
        self._sweep_stale_tmp()
        tmp = self.tmp_dir / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            files = {}
            for name, array in tensors.items():
                array = np.ascontiguousarray(array)
                path = tmp / f"{name}.npy"
                with open(path, "wb") as fh:
                    np.save(fh, array, allow_pickle=False)
                    fh.flush()
                    os.fsync(fh.fileno())
                    drop_written_pages(fh.fileno())
                files[name] = file_record(path, array)
            extras = {}
            for name, content in extra_files.items():
                path = tmp / name
                with open(path, "wb") as fh:
                    fh.write(content.encode() if isinstance(content, str) else content)
                    fh.flush()
                    os.fsync(fh.fileno())
                extras[name] = file_record(path)
            full_meta = dict(jsonable(meta))
            full_meta.update(format_version=FORMAT_VERSION, key=key, files=files)
            if extras:
                full_meta["extra_files"] = extras
            write_text(tmp / "meta.json", json.dumps(full_meta, indent=1))
            fsync_dir(tmp)
            self._move_into_place(tmp, key, replace)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return summary_of(self.read_meta(key))

    def _move_into_place(self, tmp: Path, key: str, replace: bool) -> None:
        final = self.entry_dir(key)
        if replace and final.exists():
            trash = self.tmp_dir / f"{key}.old.{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            # Another writer finished the same content first. Keep theirs if it is whole.
            if not self.has_entry(key):
                raise CacheError(
                    f"cache entry {final} exists but is incomplete; remove it and rerun"
                ) from exc
        fsync_dir(self.entries_dir)

    def _sweep_stale_tmp(self, max_age_s: float = 24 * 3600) -> None:
        """Remove temporary folders left by crashed writers (older than a day)."""
        import time

        now = time.time()
        for path in self.tmp_dir.iterdir():
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > max_age_s:
                    shutil.rmtree(path, ignore_errors=True)

    # -- index -----------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive lock over the index, shared by every process using this cache."""
        with open(self.root / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def read_index(self) -> dict[str, dict[str, Any]]:
        """Key -> summary of every live entry (empty for a new cache)."""
        if not self.index_path.exists():
            return {}
        index = _read_json(self.index_path)
        if index.get("version") != FORMAT_VERSION or "entries" not in index:
            raise CacheError(
                f"{self.index_path} is not a version-{FORMAT_VERSION} mriprep index; "
                "rebuild the cache with `mriprep run --force`"
            )
        return index["entries"]

    def entries(self, split: str | None = None) -> list[EntryRef]:
        """Live entries, optionally of one split, in a stable order (subject, session)."""
        refs = [EntryRef(k, s) for k, s in self.read_index().items()]
        if split is not None:
            refs = [r for r in refs if r.split == split]
        return sorted(refs, key=lambda r: (r.subject_id, r.session_id, r.key))

    def update_index(
        self,
        summaries: dict[str, dict[str, Any]],
        retire: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Add or refresh entries (key -> summary, including ``split``) under the lock.

        An entry for a (subject_id, session_id) that already has another key replaces it.
        ``retire`` lists (subject_id, session_id) pairs whose entries leave the index
        (subjects that failed this run: their old entry no longer matches their inputs).
        """
        retire = {(str(s), str(e or "")) for s, e in retire}
        if not summaries and not retire:
            return
        with self.locked():
            index = self.read_index()
            incoming = {(s["subject_id"], s.get("session_id", "")) for s in summaries.values()}
            incoming |= retire
            index = {
                k: s
                for k, s in index.items()
                if (s["subject_id"], s.get("session_id", "")) not in incoming
            }
            index.update(jsonable(summaries))
            doc = {"version": FORMAT_VERSION, "entries": dict(sorted(index.items()))}
            write_text(self.index_path, json.dumps(doc, indent=1))

    def remove_from_index(self, keys: list[str]) -> None:
        with self.locked():
            index = self.read_index()
            for key in keys:
                index.pop(key, None)
            doc = {"version": FORMAT_VERSION, "entries": dict(sorted(index.items()))}
            write_text(self.index_path, json.dumps(doc, indent=1))

    def write_report(self, name: str, text: str) -> Path:
        """Write ``reports/<name>`` atomically (readers never see half a report)."""
        path = self.reports_dir / name
        write_text(path, text)
        return path


def summary_of(meta: dict[str, Any]) -> dict[str, Any]:
    """The index summary of an entry: its sidecar without the bulky provenance."""
    return {k: v for k, v in meta.items() if k != "provenance"}


def _only_cache_layout(root: Path) -> bool:
    """True when ``root`` holds nothing but what creating a cache makes.

    Two runs started at once on a new folder both find no marker; the second must see the
    first one's half-made layout as a cache being created, not as a foreign folder.
    """
    made_by_cache = {"entries", "reports", ".lock", "mriprep-cache.json"}
    return all(
        p.name in made_by_cache or p.name.startswith(".mriprep-cache.json.")
        for p in root.iterdir()
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CacheError(f"cannot read {path}: {exc}; the cache may be corrupt") from exc
