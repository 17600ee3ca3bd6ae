"""An entry as the index lists it: :class:`IndexEntry`, frozen, with typed fields over the
JSON document the index stores (``to_json`` gives that document back unchanged, so the
index file never changes by being read), :class:`MalformedEntry` for a document that is
not one, naming each missing or malformed field, and :class:`UnsafeEntry` for one that
would lead a reader outside the cache (:mod:`mriprep.cache.safety`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from mriprep.cache.formats import DEFAULT_CHOICE, tensor_file_name
from mriprep.cache.safety import entry_safety_problems
from mriprep.core.errors import CacheError


class MalformedEntry(CacheError, ValueError):
    """An index entry that is not well formed: ``problems`` says what it lacks or holds
    wrongly, each naming the field (``lacks 'pipeline_hash'``)."""

    def __init__(self, key: str, problems: list[str]):
        self.key = key
        self.problems = list(problems)
        super().__init__(
            f"index entry {key} {'; '.join(self.problems)}; rebuild it with "
            "`mriprep run --force` (`mriprep check` lists every such entry)"
        )


class UnsafeEntry(MalformedEntry):
    """An index entry that would lead a reader outside the cache (a key that is no digest,
    a file record that is no plain file name, an id against the manifest's rules:
    :mod:`mriprep.cache.safety`). Nothing may follow it; ``mriprep cache repair`` takes it
    out of the index and quarantines its folder."""

    def __init__(self, key: str, problems: list[str], index_path: Any = None):
        self.key = key
        self.problems = list(problems)
        where = index_path if index_path is not None else "index.json"
        cache = index_path.parent if index_path is not None else "CACHE"
        CacheError.__init__(
            self,
            f"{where}: index entry {key!r} is unsafe, not followed: "
            f"{'; '.join(self.problems)}; someone or something other than mriprep wrote "
            f"it: `mriprep cache repair {cache}` quarantines it (`mriprep check {cache}` "
            "lists every such entry)")


@dataclass(frozen=True)
class FileRecord:
    """How an entry lists one of its files: under ``files`` (the tensors: dtype and shape
    too) or ``extra_files`` (e.g. ``transform.tfm``). Values are as recorded, so that a
    check can quote them; ``bytes`` and ``xxh3_128`` are None when an extra file's record
    lacks them."""

    file: str  # the file's name inside the entry folder
    bytes: int | None
    xxh3_128: str | None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class IndexEntry:
    """One entry as the index lists it: its key and its sidecar without provenance (plus
    the split, once indexed).

    Made by :meth:`from_json` (an ``index.json`` entry) or :meth:`from_meta` (a sidecar),
    which refuse a document that would lead outside the cache (:class:`UnsafeEntry`) or
    is not well formed (:class:`MalformedEntry`); only
    ``subject_id``, ``pipeline_hash`` and the ``image`` and ``valid`` tensors' records are
    required. The document itself is kept, open-ended fields included (a stage's
    ``template_to_subject``), so :meth:`to_json` gives back exactly what the index stores.
    Optional fields an entry does not record read as None.
    """

    key: str
    _doc: dict[str, Any] = field(repr=False)
    files: Mapping[str, FileRecord] = field(init=False, repr=False, compare=False)
    extra_files: Mapping[str, FileRecord] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Safety first: a malformed entry's message may quote its paths, an unsafe one's
        # must be known as such before any caller builds a path from it.
        unsafe = entry_safety_problems(self.key, self._doc)
        if unsafe:
            raise UnsafeEntry(self.key, unsafe)
        problems = _entry_problems(self._doc)
        if problems:
            raise MalformedEntry(self.key, problems)
        files = {k: _file_record(k, v, tensor=True) for k, v in self._doc["files"].items()}
        extra = self._doc.get("extra_files") or {}
        object.__setattr__(self, "files", files)
        object.__setattr__(
            self, "extra_files", {k: _file_record(k, v, tensor=False) for k, v in extra.items()}
        )

    @classmethod
    def from_json(cls, key: str, doc: Any) -> "IndexEntry":
        """The entry ``index.json`` lists under ``key``. The entry keeps ``doc`` itself (a
        freshly parsed document: copying them all was a cost on every index read; see
        docs/benchmarks.md, "Cache and runner"),
        so the caller must not change it afterwards."""
        return cls(key, doc)

    @classmethod
    def from_meta(cls, key: str, meta: Mapping[str, Any]) -> "IndexEntry":
        """The index entry of a sidecar (``meta.json``): the sidecar without the bulky
        provenance, and without a split until :meth:`with_split`."""
        return cls.from_json(key, {k: v for k, v in meta.items() if k != "provenance"})

    def to_json(self) -> dict[str, Any]:
        """The document the index stores for this entry: a new top-level mapping whose
        nested values are the entry's own (read them, do not change them)."""
        return dict(self._doc)

    def with_split(self, split: str) -> "IndexEntry":
        """This entry in ``split`` (a split is a property of the manifest, not of the
        content: it lives in the index only)."""
        return IndexEntry(self.key, {**self._doc, "split": split})

    @property
    def ref(self) -> str:
        """How findings identify the entry: its key."""
        return self.key

    @property
    def finding_name(self) -> str:
        """How messages name the entry: ``subject/session [key prefix]``."""
        return entry_name(self.subject_id, self.session_id, self.key)

    @property
    def subject_id(self) -> str:
        return self._doc["subject_id"]

    @property
    def session_id(self) -> str:
        return self._doc.get("session_id") or ""

    @property
    def split(self) -> str:
        return self._doc.get("split") or ""

    @property
    def identity(self) -> tuple[str, str]:
        """(subject_id, session_id): an index keeps one entry per identity."""
        return self.subject_id, self.session_id

    @property
    def pipeline_name(self) -> str | None:
        return self._doc.get("pipeline_name")

    @property
    def pipeline_hash(self) -> str:
        return self._doc["pipeline_hash"]

    @property
    def output_dtype(self) -> str | None:
        return self._doc.get("output_dtype")

    @property
    def storage(self) -> str:
        """How the entry stores its tensors, for people: the image's dtype and each
        tensor's compression (``float16 lz4``; ``uint8, valid+label lz4``; ``float32``)."""
        files = self._doc.get("files", {})
        image = files.get("image", {})
        how = {n: (r.get("compression") or DEFAULT_CHOICE) for n, r in files.items()
               if isinstance(r, dict)}
        text = str(image.get("dtype", "?"))
        if len(set(how.values())) == 1:
            only = next(iter(how.values()), DEFAULT_CHOICE)
            return text if only == DEFAULT_CHOICE else f"{text} {only}"
        parts = {}
        for name, choice in how.items():
            if choice != DEFAULT_CHOICE:
                parts.setdefault(choice, []).append(name)
        return text + ", " + ", ".join(f"{'+'.join(n)} {c}" for c, n in parts.items())

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The output grid's shape as recorded."""
        return _tuple_or_none(self._doc.get("shape"))

    @property
    def spacing(self) -> tuple[float, ...] | None:
        """The output grid's voxel size (mm) as recorded."""
        return _tuple_or_none(self._doc.get("spacing"))

    @property
    def affine(self) -> np.ndarray | None:
        """The output grid's voxel-to-world affine, float64 [4, 4].

        Raises :class:`MalformedEntry` when the recorded affine is not a finite 4x4 matrix.
        """
        if "affine" not in self._doc:
            return None
        recorded = self._doc["affine"]
        try:
            affine = np.asarray(recorded, dtype=np.float64)
        except (TypeError, ValueError):
            affine = np.full((1,), np.nan)
        if affine.shape != (4, 4) or not np.isfinite(affine).all():
            raise MalformedEntry(self.key, [f"affine {recorded} is not a finite 4x4 matrix"])
        return affine

    @property
    def inputs(self) -> Mapping[str, Any] | list[Any]:
        """The inputs as recorded: role -> ``{"path", "sha256"}`` (empty when absent)."""
        return self._doc.get("inputs") or {}

    @property
    def header(self) -> str:
        """The NIfTI form the input was read with: ``qform``, ``sform``, or ``auto``
        (FastSurfer's rule; also for an entry made before the choice was recorded)."""
        value = self._doc.get("header")
        return value if value in ("qform", "sform") else "auto"

    @property
    def label_values(self) -> tuple[int, ...] | None:
        """The allowed label values the entry records (a stage declares them, e.g.
        validate's ``allowed_labels``); None when it records none."""
        values = self._doc.get("label_values")
        return tuple(values) if isinstance(values, list) else None

    @property
    def has_label(self) -> bool:
        """True when the entry has a label map."""
        return "label" in self.files


def _entry_problems(doc: Any) -> list[str]:
    """What keeps ``doc`` from being an index entry (empty when it is one)."""
    if not isinstance(doc, dict):
        return ["the index entry is not an object"]
    problems = [f"lacks {k!r}" for k in ("subject_id", "pipeline_hash", "files") if k not in doc]
    files = doc.get("files")
    if isinstance(files, dict):
        for kind in ("image", "valid"):
            if kind not in files:
                problems.append(f"lists no {kind} tensor")
        for kind, info in files.items():
            if not isinstance(info, dict) or not {"dtype", "shape", "bytes", "xxh3_128"} <= set(
                info
            ):
                problems.append(f"{kind} lacks dtype/shape/bytes/xxh3_128")
            else:
                problems += _record_problems(kind, info)
    elif "files" in doc:
        problems.append("'files' is not an object")
    extra = doc.get("extra_files")
    if isinstance(extra, dict):
        for name, info in extra.items():
            if isinstance(info, dict):
                problems += _record_problems(name, info)
            else:
                problems.append(f"extra file {name} is not an object")
    elif extra is not None:
        problems.append("'extra_files' is not an object")
    # (A recorded affine that is no finite 4x4 matrix is a geometry problem: see affine.)
    problems += [
        f"{name!r} is not a list"
        for name in ("shape", "spacing")
        if name in doc and not isinstance(doc[name], list)
    ]
    return problems


def _record_problems(name: str, info: dict[str, Any]) -> list[str]:
    problems = []
    if not isinstance(info.get("file", ""), str):
        problems.append(f"{name}'s file name is not a string")
    if "shape" in info and not isinstance(info["shape"], list):
        problems.append(f"{name}'s shape is not a list")
    return problems


def _file_record(name: str, info: dict[str, Any], tensor: bool) -> FileRecord:
    return FileRecord(
        # A record without a file name predates the formats: the default format's.
        file=info.get("file", tensor_file_name(name, DEFAULT_CHOICE) if tensor else name),
        bytes=info.get("bytes"),
        xxh3_128=info.get("xxh3_128"),
        dtype=info.get("dtype"),
        shape=_tuple_or_none(info.get("shape")),
    )


def _tuple_or_none(value: list | None) -> tuple | None:
    return None if value is None else tuple(value)


def entry_name(subject_id: Any, session_id: str, key: str) -> str:
    """How messages name an entry, from its parts (also for an index document that is not
    a well-formed entry)."""
    return f"{subject_id}{'/' + session_id if session_id else ''} [{key[:12]}]"
