"""The cache folder: :class:`Cache` writes entries atomically, verifies them, and keeps
the index under a lock (see the package docstring for the layout and the guarantees)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from mriprep.cache.entry import IndexEntry
from mriprep.cache.index_reader import IndexReading, read_entries
from mriprep.cache.safety import key_problems
from mriprep.cache.files import drop_written_pages, file_record
from mriprep.cache.formats import (
    DEFAULT_CHOICE,
    format_for,
    open_tensor,
    read_tensor,
    tensor_file_name,
    tensor_file_names,
)
from mriprep.core.atomic import fsync_dir, move_folder_into_place, sweep_stale, write_text
from mriprep.core.errors import CacheError
from mriprep.core.hashing import checksum_file, hash_json
from mriprep.core.volume import jsonable

FORMAT_NAME = "mriprep-cache"
FORMAT_VERSION = 1
TENSOR_NAMES = ("image", "valid", "label")
REPORTS_DIR = "reports"  # run reports (mriprep.run.reports writes them)
QC_DIR = "qc"  # QC pictures, metrics and the HTML report (mriprep.qc writes them)
QUARANTINE_DIR = "quarantine"  # damaged entries (mriprep.maintenance.repair moves them)
# What training derives from the entries (classes per view, view-ordered copies), one
# folder per entry key below it (mriprep.training.labels.derived writes them).
DERIVED_DIR = "derived"
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


def entry_key(
    subject_id: str, session_id: str, input_hashes: dict[str, str], pipeline_hash: str,
    header: str = "auto",
) -> str:
    """Content address of one cache entry (hex SHA-256).

    ``header`` is the NIfTI form the input was read with (``auto``, ``qform``, ``sform``:
    a manifest row's ``header``, else the pipeline's): another form is another geometry,
    so another key. ``auto`` leaves the key as it was before the choice existed.
    """
    content = {
        "subject_id": subject_id,
        "session_id": session_id or "",
        "inputs": dict(sorted(input_hashes.items())),
        "pipeline": pipeline_hash,
    }
    if header and header != "auto":
        content["header"] = header
    return hash_json(content)



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
            (self.root / REPORTS_DIR).mkdir(exist_ok=True)
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
        self.reports_dir = self.root / REPORTS_DIR
        self.index_path = self.root / "index.json"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.reports_dir.mkdir(exist_ok=True)

    # -- entries ---------------------------------------------------------------------

    def entry_dir(self, key: str) -> Path:
        """The folder of entry ``key``. Refuses (:class:`CacheError`) a key that is no
        digest: the last guard between a tampered index and a path outside the cache."""
        problems = key_problems(key)
        if problems:
            raise CacheError(f"{self.index_path}: {problems[0]}; `mriprep cache repair "
                             f"{self.root}` quarantines entries under such keys")
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
        """The file of tensor ``name`` of an entry known by its key only: the one of its
        possible names (one per storage format) that exists, else ``<name>.npy`` (which
        then does not exist). With the entry's index record at hand, :meth:`entry_file`
        reads the name from it instead, without looking at the disk."""
        folder = self.entry_dir(key)
        default, *others = (folder / file for file in tensor_file_names(name))
        return next((path for path in others if path.is_file()), default)

    def entry_file(self, entry: IndexEntry, name: str) -> Path:
        """The file of tensor ``name`` as ``entry``'s record names it (its suffix says its
        format); :meth:`tensor_path` for a tensor the record does not list."""
        record = entry.files.get(name)
        if record is None:
            return self.tensor_path(entry.key, name)
        return self.entry_dir(entry.key) / record.file

    def load_tensor(self, key: str, name: str, mmap: bool = True) -> np.ndarray:
        """A tensor of an entry as a NumPy array, never unpickled: a ``.npy`` memory-mapped
        read-only by default, a compressed one decoded whole (:meth:`open_tensor` decodes
        only the region sliced; :mod:`mriprep.cache.formats`)."""
        return read_tensor(self._existing_tensor(key, name), mmap=mmap)

    def open_tensor(self, key: str, name: str) -> Any:
        """A tensor of an entry as an array-like that reads only what is sliced from it
        (:func:`mriprep.cache.formats.open_tensor`): what the Dataset reads patches and
        slices from."""
        return open_tensor(self._existing_tensor(key, name))

    def _existing_tensor(self, key: str, name: str) -> Path:
        path = self.tensor_path(key, name)
        if not path.is_file():
            if name == "label" and _never_had(self, key, name):
                # Not lost: the manifest row gave no label map, so none was made.
                raise CacheError(
                    f"cache entry {key} has no label map: its manifest row gave none (no "
                    "'label' column, or an empty cell), so it was cached as an image only; "
                    "add each subject's label map in a 'label' column of the manifest and "
                    "rerun `mriprep run` on it"
                )
            raise CacheError(
                f"cache entry {key} is missing {path.name} ({path}); "
                "rerun `mriprep run` to rebuild it"
            )
        return path

    def write_entry(
        self,
        key: str,
        tensors: dict[str, np.ndarray],
        meta: dict[str, Any],
        replace: bool = False,
        extra_files: dict[str, str | bytes] | None = None,
        compression: str | dict[str, str] = "none",
    ) -> IndexEntry:
        """Write one entry atomically and return its index entry (without a split).

        ``meta`` must hold at least :data:`REQUIRED_META` (subject and session ids,
        pipeline name and hash, the inputs' paths and SHA-256, the output grid's affine,
        spacing and shape, and the provenance records). The runner gives the entry its
        ``split`` when it indexes it (:meth:`IndexEntry.with_split`): a split is a property
        of the manifest, not of the content, so it lives in the index only.

        ``tensors`` holds ``image`` and ``valid`` and optionally ``label``. ``meta`` is any
        JSON-able sidecar content; this adds ``key``, ``files`` (dtype, shape, byte size and
        checksum of each tensor) and the format version. With ``replace`` an existing entry
        of the same key is swapped out (``--force``); otherwise an existing complete entry
        wins and ours is discarded (two runs computed the same content).

        ``extra_files`` maps a plain file name (e.g. ``transform.tfm``) to its text or
        bytes; each is written inside the entry folder with the same atomicity and listed
        with its size and checksum under ``extra_files`` in the sidecar (``files`` keeps
        listing tensors only).

        ``compression`` is how the tensors are stored, a choice of a registered format
        (:mod:`mriprep.cache.formats`): ``"none"`` (``.npy``), ``"lz4"`` or ``"zstd"``
        (``.b2nd``), for all of them or per tensor name (a name left out is ``none``).
        Each tensor's record says its file, and its choice unless it is ``none``.

        Raises
        ------
        CacheError
            The disk is full (or over quota): the message names the cache folder and the
            space the entry needs; nothing of the entry is left.
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
        per_tensor = (dict(compression) if isinstance(compression, dict)
                      else dict.fromkeys(tensors, compression))
        how = {name: per_tensor.get(name, DEFAULT_CHOICE) for name in tensors}
        formats = {name: format_for(choice) for name, choice in how.items()}  # before any I/O
        reserved = {"meta.json"} | {file for name in TENSOR_NAMES
                                    for file in tensor_file_names(name)}
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
                path = tmp / tensor_file_name(name, how[name])
                with open(path, "wb") as fh:
                    formats[name].write(fh, array, how[name])
                    fh.flush()
                    os.fsync(fh.fileno())
                    drop_written_pages(fh.fileno())
                files[name] = file_record(path, array)
                if how[name] != DEFAULT_CHOICE:
                    files[name]["compression"] = how[name]
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
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            need = sum(np.asarray(a).nbytes for a in tensors.values()) / 1e6
            free = shutil.disk_usage(self.root).free / 1e6
            raise CacheError(
                f"no space left on the disk of cache {self.root} while writing the entry of "
                f"{meta.get('subject_id')!r} ({exc.strerror}): it needs up to {need:.0f} MB "
                f"(uncompressed), {free:.0f} MB are free. Nothing of the entry was kept; "
                "free space (or move the cache with -o) and rerun: finished entries are "
                "skipped"
            ) from exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return IndexEntry.from_meta(key, self.read_meta(key))

    def _move_into_place(self, tmp: Path, key: str, replace: bool) -> None:
        final = self.entry_dir(key)
        if not move_folder_into_place(tmp, final, self.tmp_dir, replace):
            # Another writer finished the same content first. Keep theirs if it is whole.
            if not self.has_entry(key):
                raise CacheError(
                    f"cache entry {final} exists but is incomplete; remove it and rerun"
                )

    def _sweep_stale_tmp(self) -> None:
        """Remove temporary folders left by crashed writers."""
        sweep_stale(self.tmp_dir)

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

    def read_index(self) -> dict[str, Any]:
        """Key -> the JSON document of every live entry, as stored (empty for a new cache).

        The documents are not checked: :meth:`read_entries` and :meth:`entries` give them
        as :class:`IndexEntry`, refusing unsafe and malformed ones.
        """
        if not self.index_path.exists():
            return {}
        index = _read_json(self.index_path)
        if not isinstance(index, dict) or index.get("version") != FORMAT_VERSION \
                or not isinstance(index.get("entries"), dict):
            raise CacheError(
                f"{self.index_path} is not a version-{FORMAT_VERSION} mriprep index; "
                f"`mriprep cache repair {self.root}` rebuilds it from the entries' sidecars"
            )
        return index["entries"]

    def read_entries(self) -> IndexReading:
        """The index as usable entries and refused documents (unsafe or malformed), for
        the commands that report the refused ones and go on without them."""
        return read_entries(self.read_index(), self.index_path)

    def entries(self, split: str | None = None) -> list[IndexEntry]:
        """Live entries, optionally of one split, in a stable order (subject, session).

        Raises :class:`UnsafeEntry` for an index entry that would lead outside the cache
        and :class:`MalformedEntry` for one that is not well formed: a reader of the
        whole cache (the Dataset, export) serves none of it then.
        """
        reading = self.read_entries()
        reading.raise_first()
        entries = list(reading.entries.values())
        if split is not None:
            entries = [e for e in entries if e.split == split]
        return sorted(entries, key=lambda e: (e.subject_id, e.session_id, e.key))

    def update_index(
        self,
        entries: Iterable[IndexEntry],
        retire: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Add or refresh entries (each with its split, :meth:`IndexEntry.with_split`)
        under the lock.

        An entry for a (subject_id, session_id) that already has another key replaces it.
        ``retire`` lists (subject_id, session_id) pairs whose entries leave the index
        (subjects that failed this run: their old entry no longer matches their inputs).
        """
        incoming = {e.key: e for e in entries}
        retire = {(str(s), str(e or "")) for s, e in retire}
        if not incoming and not retire:
            return
        with self.locked():
            index = self.read_index()
            replaced = {e.identity for e in incoming.values()} | retire
            index = {k: doc for k, doc in index.items() if _identity(doc) not in replaced}
            index.update({k: jsonable(e.to_json()) for k, e in incoming.items()})
            doc = {"version": FORMAT_VERSION, "entries": dict(sorted(index.items()))}
            write_text(self.index_path, json.dumps(doc, indent=1))

    def write_index(self, entries: Iterable[IndexEntry]) -> None:
        """Replace the whole index with ``entries`` (each with its split), atomically.

        For :func:`mriprep.maintenance.repair_index`, which holds :meth:`locked` already
        (``flock`` locks are per open file, so taking it again here would deadlock).
        """
        index = {e.key: jsonable(e.to_json()) for e in entries}
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


def _identity(doc: Any) -> tuple[Any, str] | None:
    """(subject_id, session_id) of a stored index document; None for a document without a
    subject (malformed: it stays until ``mriprep check`` reports it)."""
    if not isinstance(doc, dict) or "subject_id" not in doc:
        return None
    return doc["subject_id"], doc.get("session_id") or ""


def _never_had(cache: "Cache", key: str, name: str) -> bool:
    """True when entry ``key``'s sidecar lists its tensors and ``name`` is not one."""
    try:
        files = cache.read_meta(key).get("files")
    except (CacheError, OSError, ValueError):
        return False
    return isinstance(files, dict) and name not in files


def _only_cache_layout(root: Path) -> bool:
    """True when ``root`` holds nothing but what creating a cache makes.

    Two runs started at once on a new folder both find no marker; the second must see the
    first one's half-made layout as a cache being created, not as a foreign folder.
    """
    made_by_cache = {"entries", REPORTS_DIR, QC_DIR, QUARANTINE_DIR, DERIVED_DIR, "check",
                     ".lock", "mriprep-cache.json"}
    return all(
        p.name in made_by_cache or p.name.startswith(".mriprep-cache.json.")
        for p in root.iterdir()
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CacheError(f"cannot read {path}: {exc}; the cache may be corrupt") from exc
